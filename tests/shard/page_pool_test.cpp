#include "shard/page_pool.hpp"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>

namespace metad::shard {
namespace {

class PagePoolSizes : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(PagePoolSizes, HandsOutEveryPageLowestFirstThenRunsDry) {
  const std::uint32_t n = GetParam();
  page_pool pool(n);
  EXPECT_EQ(pool.num_pages(), n);
  EXPECT_EQ(pool.free_count(), n);
  for (std::uint32_t p = 0; p < n; ++p) ASSERT_EQ(pool.take_lowest(), p);
  EXPECT_EQ(pool.free_count(), 0u);
  EXPECT_EQ(pool.reserved_count(), n);
  EXPECT_EQ(pool.check(), "");
}

TEST_P(PagePoolSizes, ReleasedPagesComeBackLowestFirstAcrossWords) {
  const std::uint32_t n = GetParam();
  page_pool pool(n);
  for (std::uint32_t p = 0; p < n; ++p) pool.take_lowest();
  // Release a spread of pages (word boundaries included), highest first.
  std::set<std::uint32_t> released;
  for (std::uint32_t p : {n - 1, n / 2, 4096u, 4095u, 65u, 64u, 63u, 1u, 0u}) {
    if (p >= n || !released.insert(p).second) continue;
    pool.release(p);
    ASSERT_EQ(pool.check(), "");
  }
  for (std::uint32_t p : released) ASSERT_EQ(pool.take_lowest(), p);
  EXPECT_EQ(pool.free_count(), 0u);
  EXPECT_EQ(pool.check(), "");
}

TEST_P(PagePoolSizes, CostsAtMostOneBytePerPageHandedOut) {
  const std::uint32_t n = GetParam();
  page_pool pool(n);
  EXPECT_EQ(pool.memory_bytes(), 0u);  // nothing handed out yet: nothing held
  for (std::uint32_t p = 0; p < n; ++p) pool.take_lowest();
  // Two bitmaps plus summaries, grown by doubling; small pools pay a few words.
  EXPECT_LE(pool.memory_bytes(), n / 3 + 256);
}

INSTANTIATE_TEST_SUITE_P(WordBoundaries, PagePoolSizes,
                         ::testing::Values(1u, 2u, 63u, 64u, 65u, 127u, 128u, 4095u, 4096u, 4097u,
                                           100000u, 262145u));

TEST(PagePool, StatesFollowReserveBindRelease) {
  page_pool pool(10);
  const auto p = pool.take_lowest();
  EXPECT_EQ(pool.state(p), page_state::reserved);
  EXPECT_EQ(pool.state(p + 1), page_state::free);
  pool.bind(p);
  EXPECT_EQ(pool.state(p), page_state::bound);
  EXPECT_EQ(pool.bound_count(), 1u);
  EXPECT_EQ(pool.reserved_count(), 0u);
  const auto q = pool.take_lowest();
  EXPECT_EQ(q, 1u);
  pool.release(q);
  EXPECT_EQ(pool.state(q), page_state::free);
  EXPECT_EQ(pool.free_count(), 9u);
  EXPECT_EQ(pool.check(), "");
}

TEST(PagePool, GrowthKeepsExistingStatesAndAddsFreePages) {
  page_pool pool(70);
  for (int i = 0; i < 70; ++i) pool.take_lowest();
  pool.bind(3);
  pool.bind(69);
  pool.release(10);
  pool.grow(5000);
  EXPECT_EQ(pool.check(), "");
  EXPECT_EQ(pool.num_pages(), 5000u);
  EXPECT_EQ(pool.free_count(), 5000u - 70 + 1);
  EXPECT_EQ(pool.bound_count(), 2u);
  EXPECT_EQ(pool.state(3), page_state::bound);
  EXPECT_EQ(pool.state(69), page_state::bound);
  EXPECT_EQ(pool.state(5), page_state::reserved);
  EXPECT_EQ(pool.take_lowest(), 10u);
  EXPECT_EQ(pool.take_lowest(), 70u);
  pool.grow(5000);  // same size: nothing changes
  EXPECT_EQ(pool.free_count(), 5000u - 72 + 1);
  pool.grow(300000);  // adds summary levels
  EXPECT_EQ(pool.check(), "");
  for (std::uint32_t p = 71; p < 300000; ++p) ASSERT_EQ(pool.take_lowest(), p);
  EXPECT_EQ(pool.free_count(), 0u);
  EXPECT_EQ(pool.check(), "");
}

TEST(PagePool, GrowthFromAFullPoolServesTheNewPages) {
  page_pool pool(64);
  for (int i = 0; i < 64; ++i) pool.take_lowest();
  pool.grow(65);
  EXPECT_EQ(pool.take_lowest(), 64u);
  EXPECT_EQ(pool.check(), "");
}

// Shrinks across word and summary-level boundaries: the pages below keep their state,
// nothing past the end is ever handed out, and growth afterwards adds free pages again.
TEST(PagePool, ShrinkKeepsThePagesBelowTheNewEnd) {
  for (const std::uint32_t to : {1u, 63u, 64u, 65u, 130u, 4095u, 4096u}) {
    SCOPED_TRACE(to);
    page_pool pool(5000);
    for (std::uint32_t p = 0; p < to; p += 2) pool.take(p);  // every other page reserved
    pool.shrink(to);
    EXPECT_EQ(pool.num_pages(), to);
    EXPECT_EQ(pool.check(), "");
    EXPECT_EQ(pool.free_count(), to / 2);
    for (std::uint32_t n = pool.free_count(); n > 0; --n) EXPECT_LT(pool.take_lowest(), to);
    EXPECT_EQ(pool.free_count(), 0u);
    pool.grow(to + 70);
    EXPECT_EQ(pool.take_lowest(), to);
    EXPECT_EQ(pool.check(), "");
  }
}

TEST(PagePool, AHugePoolCostsOnlyWhatItHandsOut) {
  const std::uint64_t n = std::uint64_t{1} << 40;
  page_pool pool(n);
  EXPECT_EQ(pool.memory_bytes(), 0u);
  EXPECT_EQ(pool.free_count(), n);
  EXPECT_EQ(pool.state(n - 1), page_state::free);
  for (std::uint32_t p = 0; p < 100000; ++p) ASSERT_EQ(pool.take_lowest(), p);
  EXPECT_EQ(pool.high_water(), 100000u);
  EXPECT_LE(pool.memory_bytes(), 100000u / 2 + 256);  // ~2 bits a page, doubled at most
  pool.release(77);
  pool.bind(5);
  EXPECT_EQ(pool.take_lowest(), 77u);  // the lowest free page, below the mark
  EXPECT_EQ(pool.take_lowest(), 100000u);
  EXPECT_EQ(pool.free_count(), n - 100001);
  pool.grow(page_pool::pages_max);  // O(1)
  EXPECT_EQ(pool.free_count(), page_pool::pages_max - 100001);
  EXPECT_EQ(pool.check(), "");
}

TEST(PagePool, AvailablePagesStopAtHeldMax) {
  page_pool pool(std::uint64_t{1} << 40);
  EXPECT_EQ(pool.available(), page_pool::held_max);
  pool.take(1000);  // recovery: the pages below become free below the mark
  EXPECT_EQ(pool.high_water(), 1001u);
  EXPECT_EQ(pool.available(), page_pool::held_max - 1);
  EXPECT_EQ(pool.take_lowest(), 0u);
  EXPECT_FALSE(pool.can_take(1000));
  EXPECT_FALSE(pool.can_take(page_pool::held_max));
  EXPECT_TRUE(pool.can_take(page_pool::held_max - 1));
  EXPECT_EQ(pool.check(), "");
}

// Random operations against a set-based model, on small pools and on pools of 2^40 pages:
// the same states, counts and lowest-free-first order, and check() after every step.
TEST(PagePoolRandom, AgreesWithASetModel) {
  const std::uint64_t base = std::random_device{}();
  for (int seed = 0; seed < 40; ++seed) {
    std::mt19937_64 rng(base + static_cast<std::uint64_t>(seed));
    SCOPED_TRACE("seed " + std::to_string(base + static_cast<std::uint64_t>(seed)));
    auto pick = [&](std::uint64_t lo, std::uint64_t hi) {
      return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
    };
    std::uint64_t n = pick(0, 1) ? pick(1, 300) : (std::uint64_t{1} << 40) + pick(0, 5);
    page_pool pool(n);
    std::set<std::uint64_t> reserved, bound;
    auto held = [&](std::uint64_t p) { return reserved.count(p) + bound.count(p) > 0; };
    auto any_of = [&](const std::set<std::uint64_t>& s) {
      auto it = s.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(pick(0, s.size() - 1)));
      return *it;
    };
    for (int op = 0; op < 3000; ++op) {
      const auto kind = pick(0, 99);
      if (kind < 40) {
        if (reserved.size() + bound.size() == n) continue;
        std::uint64_t lowest = 0;
        while (held(lowest)) ++lowest;
        ASSERT_EQ(pool.take_lowest(), lowest);
        reserved.insert(lowest);
      } else if (kind < 50) {
        const std::uint64_t p = pick(0, std::min<std::uint64_t>(n - 1, 400));
        ASSERT_EQ(pool.can_take(p), !held(p));
        if (held(p)) continue;
        pool.take(static_cast<std::uint32_t>(p));
        reserved.insert(p);
      } else if (kind < 65 && !reserved.empty()) {
        const std::uint64_t p = any_of(reserved);
        pool.bind(static_cast<std::uint32_t>(p));
        reserved.erase(p);
        bound.insert(p);
      } else if (kind < 80 && !reserved.empty()) {
        const std::uint64_t p = any_of(reserved);
        pool.release(static_cast<std::uint32_t>(p));
        reserved.erase(p);
      } else if (kind < 92 && !bound.empty()) {
        const std::uint64_t p = any_of(bound);
        pool.free_bound(static_cast<std::uint32_t>(p));
        bound.erase(p);
      } else if (kind < 96) {
        n += pick(0, 70);
        pool.grow(n);
      } else {
        std::uint64_t top = 0;  // shrink to just past the highest held page, or more
        for (const auto* s : {&reserved, &bound})
          if (!s->empty()) top = std::max(top, *s->rbegin() + 1);
        const std::uint64_t to = std::min(n, std::max<std::uint64_t>(1, top) + pick(0, 3));
        pool.shrink(to);
        n = to;
      }
      ASSERT_EQ(pool.check(), "");
      ASSERT_EQ(pool.num_pages(), n);
      ASSERT_EQ(pool.free_count(), n - reserved.size() - bound.size());
      ASSERT_EQ(pool.bound_count(), bound.size());
      ASSERT_EQ(pool.reserved_count(), reserved.size());
      for (int probe = 0; probe < 4; ++probe) {
        const std::uint64_t p = pick(0, std::min<std::uint64_t>(n - 1, 500));
        const page_state want = bound.count(p)      ? page_state::bound
                                : reserved.count(p) ? page_state::reserved
                                                    : page_state::free;
        ASSERT_EQ(pool.state(p), want);
      }
      // The bitmaps cover the high-water mark, no more than twice over.
      ASSERT_LE(pool.memory_bytes(), pool.high_water() / 2 + 512);
    }
  }
}

}  // namespace
}  // namespace metad::shard
