#include "shard/page_pool.hpp"

#include <gtest/gtest.h>

#include <set>

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

TEST_P(PagePoolSizes, CostsAtMostOneBytePerPage) {
  const std::uint32_t n = GetParam();
  page_pool pool(n);
  // Two bitmaps plus summaries; small pools pay a few words of fixed overhead.
  EXPECT_LE(pool.memory_bytes(), n / 3 + 128);
}

TEST_P(PagePoolSizes, BytesForPredictsTheBitmaps) {
  const std::uint32_t n = GetParam();
  page_pool pool(n);
  // What the memory budget charges before a rank is created: the bitmaps exactly (the
  // vector of levels adds its own few words).
  EXPECT_LE(page_pool::bytes_for(n), pool.memory_bytes());
  EXPECT_GE(page_pool::bytes_for(n) + 8 * sizeof(std::vector<std::uint64_t>), pool.memory_bytes());
  page_pool grown(n / 2 + 1);
  grown.grow(n + 1);
  EXPECT_LE(page_pool::bytes_for(n + 1), grown.memory_bytes());
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

TEST(PagePool, LargestPoolStaysUnderOneBytePerPage) {
  const std::uint32_t n = std::uint32_t{1} << 28;
  page_pool pool(n);
  EXPECT_LE(pool.memory_bytes(), n / 3);
  EXPECT_EQ(pool.take_lowest(), 0u);
  pool.release(0);
  EXPECT_EQ(pool.free_count(), n);
}

}  // namespace
}  // namespace metad::shard
