#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "rank_table_helpers.hpp"
#include "shard/directory.hpp"
#include "shard/rank_table.hpp"

// Keys of 32 lowercase hex characters are stored packed; every other key keeps its
// bytes. Both forms must behave identically, and never be confused with each other.
namespace metad::shard {
namespace {

using namespace testing_helpers;

const std::string lower = "0123456789abcdef0123456789abcdef";
const std::string upper = "0123456789ABCDEF0123456789ABCDEF";
const std::string zeros(32, '0');
const std::string sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

TEST(KeyForms, UppercaseAndLowercaseHexAreDifferentKeys) {
  rank_table t;
  t.initialize(0, 10);
  EXPECT_EQ(pages_of(t, 0, {lower, upper, zeros, sha, lower.substr(1)}), (V{0, 1, 2, 3, 4}));
  EXPECT_EQ(confirm(t, 0, {upper, zeros}, {1, 2}).outcome, confirm_outcome::ok);
  EXPECT_EQ(confirmed(t, 0, {lower, upper, zeros, sha}), (V{-1, 1, 2, -1}));
  EXPECT_EQ(t.check_invariants(), "");
  directory d;
  d.add_confirmation(lower, 2, 0);
  d.add_confirmation(upper, 1, 0);
  EXPECT_FALSE(d.complete(lower));
  EXPECT_TRUE(d.complete(upper));
  EXPECT_FALSE(d.complete(zeros));
  EXPECT_EQ(d.size(), 2u);
}

TEST(KeyForms, MessagesNameThePackedKeyExactly) {
  rank_table t;
  t.initialize(4, 10);
  pages_of(t, 4, {lower, zeros});
  const auto c = confirm(t, 4, {lower}, {1});
  EXPECT_EQ(c.outcome, confirm_outcome::bad_request);
  EXPECT_EQ(c.detail, "Page 1 is not reserved for key " + lower + " on rank 4");
}

TEST(KeyForms, ReleasingReservedPackedKeysFreesThem) {
  rank_table t;
  t.initialize(0, 3);
  EXPECT_EQ(pages_of(t, 0, {lower, zeros, upper}), (V{0, 1, 2}));
  EXPECT_EQ(confirm(t, 0, {}, {}, {0, 1, 2}).outcome, confirm_outcome::ok);
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({3, 3, 0, 0}));
  EXPECT_EQ(confirmed(t, 0, {lower, zeros, upper}), (V{-1, -1, -1}));
  EXPECT_EQ(pages_of(t, 0, {zeros}), (V{0}));
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(KeyForms, DirectoryCountsPackedKeysPastSixteenBits) {
  directory d;
  // tp beyond the packed form's 16 bits: the key keeps full counts elsewhere.
  for (int n = 0; n < 70000; ++n) {
    EXPECT_FALSE(d.complete(lower)) << n;
    d.add_confirmation(lower, 70000, 0);
  }
  EXPECT_TRUE(d.complete(lower));
  // tp at the packed limit, and confirmations beyond it (the count saturates).
  for (int n = 0; n < 65535; ++n) {
    EXPECT_FALSE(d.complete(zeros)) << n;
    d.add_confirmation(zeros, 65535, 0);
  }
  EXPECT_TRUE(d.complete(zeros));
  for (int n = 0; n < 10; ++n) d.add_confirmation(zeros, 1, 0);
  EXPECT_TRUE(d.complete(zeros));
  d.add_confirmation(sha, -5, 0);
  EXPECT_TRUE(d.complete(sha));
  d.add_confirmation(upper, 0, 0);
  EXPECT_TRUE(d.complete(upper));
  EXPECT_EQ(d.size(), 4u);
}

TEST(KeyForms, SnapshotsGiveBackTheExactKeys) {
  rank_table t;
  t.initialize(2, 10);
  pages_of(t, 2, {lower, upper, zeros, sha});
  confirm(t, 2, {upper, zeros}, {1, 2});
  std::set<std::tuple<std::int64_t, std::string, std::int64_t, bool>> entries;
  t.for_each_entry([&](std::int64_t rank, std::string_view key, std::int64_t page, bool c) {
    entries.emplace(rank, std::string(key), page, c);
  });
  EXPECT_EQ(
      entries,
      (std::set<std::tuple<std::int64_t, std::string, std::int64_t, bool>>{
          {2, lower, 0, false}, {2, upper, 1, true}, {2, zeros, 2, true}, {2, sha, 3, false}}));

  directory d;
  d.add_confirmation(lower, 8, 0);
  d.add_confirmation(lower, 8, 0);
  d.add_confirmation(upper, 70000, 0);
  d.add_confirmation(sha, 2, 0);
  std::set<std::tuple<std::string, std::int32_t, std::int32_t>> keys;
  d.for_each_key([&](std::string_view key, std::int32_t tp, std::int32_t count) {
    keys.emplace(std::string(key), tp, count);
  });
  EXPECT_EQ(keys, (std::set<std::tuple<std::string, std::int32_t, std::int32_t>>{
                      {lower, 8, 2}, {upper, 70000, 1}, {sha, 2, 1}}));
  directory r;
  r.add_confirmation(lower, 1, 0);  // restore replaces what a key had
  for (const auto& [key, tp, count] : keys) r.restore(key, tp, count, 0);
  r.restore(zeros, 70000, 70000, 0);
  r.restore("k", 3, 0, 0);
  EXPECT_EQ(r.size(), 5u);
  EXPECT_FALSE(r.complete(lower));
  r.add_confirmation(lower, 1, 0);  // 3 of 8
  for (int n = 0; n < 5; ++n) {
    EXPECT_FALSE(r.complete(lower));
    r.add_confirmation(lower, 1, 0);
  }
  EXPECT_TRUE(r.complete(lower));
  EXPECT_FALSE(r.complete(upper));
  EXPECT_TRUE(r.complete(zeros));
  EXPECT_FALSE(r.complete("k"));
  r.add_confirmation(sha, 2, 0);
  EXPECT_TRUE(r.complete(sha));
}

// The same random operations on two tables: one with keys of every form, one with the
// same keys made unpackable (a '!' appended). Their answers must agree exactly.
TEST(KeyForms, PackedKeysBehaveExactlyLikeOtherKeys) {
  std::mt19937 rng(17);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::vector<std::string> universe{zeros, lower, upper, sha, "k", ""};
  for (int i = 0; i < 60; ++i) universe.push_back(fmt::format("{:032x}", i * 2654435761u));
  // The wide form's shapes: 64 lowercase, 64 uppercase, 32 uppercase hex.
  for (int i = 0; i < 20; ++i) {
    universe.push_back(fmt::format("{:064x}", i * 2654435761u));
    universe.push_back(fmt::format("{:064X}", i * 2654435761u + 10));
    universe.push_back(fmt::format("{:032X}", i * 2654435761u + 10));
  }
  std::vector<std::string> other;
  for (const auto& k : universe) other.push_back(k + "!");
  rank_table packed, plain;
  for (rank_table* t : {&packed, &plain}) t->initialize(1, 50);
  for (int step = 0; step < 20000; ++step) {
    SCOPED_TRACE(step);
    std::vector<std::string_view> a, b;
    for (int n = pick(10); n > 0; --n) {
      const int k = pick(static_cast<int>(universe.size()));
      a.push_back(universe[k]);
      b.push_back(other[k]);
    }
    const int op = pick(10);
    if (op < 4) {
      const auto x = allocate(packed, 1, a), y = allocate(plain, 1, b);
      ASSERT_EQ(x.distinct, y.distinct);
      ASSERT_EQ(x.pages, y.pages);
    } else if (op < 8) {
      std::vector<std::int64_t> pages, releases;
      for (std::size_t i = 0; i < a.size(); ++i) pages.push_back(pick(52));
      for (int n = pick(5); n > 0; --n) releases.push_back(pick(50));
      // Mostly valid: the pages the keys hold.
      if (pick(2) == 0) {
        const auto held = allocate(packed, 1, a);
        allocate(plain, 1, b);
        if (held.pages.size() == a.size() &&
            std::find(held.pages.begin(), held.pages.end(), -1) == held.pages.end()) {
          pages = held.pages;
        }
      }
      const auto x = confirm(packed, 1, a, pages, releases);
      const auto y = confirm(plain, 1, b, pages, releases);
      ASSERT_EQ(x.outcome, y.outcome);
      std::string expected = y.detail;
      if (const auto at = expected.find("! on rank"); at != std::string::npos)
        expected.erase(at, 1);
      ASSERT_EQ(x.detail, expected);
      ASSERT_EQ(x.newly, y.newly);
    } else {
      ASSERT_EQ(confirmed(packed, 1, a), confirmed(plain, 1, b));
    }
    ASSERT_EQ(stats_tuple(*packed.stats(1)), stats_tuple(*plain.stats(1)));
    ASSERT_EQ(packed.refused_releases(), plain.refused_releases());
    ASSERT_EQ(packed.check_invariants(), "");
    ASSERT_EQ(plain.check_invariants(), "");
  }
}

}  // namespace
}  // namespace metad::shard
