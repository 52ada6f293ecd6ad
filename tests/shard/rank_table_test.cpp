#include "shard/state.hpp"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

namespace shard {
namespace {

using keys_t = std::vector<std::string_view>;

struct allocation {
  std::vector<std::uint32_t> distinct;
  std::vector<std::int64_t> pages;
};

allocation allocate(rank_table& t, std::int64_t rank, const keys_t& keys) {
  allocation a;
  EXPECT_TRUE(t.allocate(rank, keys, a.distinct, a.pages));
  EXPECT_EQ(a.distinct.size(), a.pages.size());
  return a;
}

std::vector<std::int64_t> pages_of(rank_table& t, std::int64_t rank, const keys_t& keys) {
  return allocate(t, rank, keys).pages;
}

struct confirmation {
  confirm_outcome outcome;
  std::string detail;
  std::vector<std::uint32_t> newly;
};

confirmation confirm(rank_table& t, std::int64_t rank, const keys_t& keys,
                     const std::vector<std::int64_t>& pages,
                     const std::vector<std::int64_t>& releases = {}) {
  confirmation c;
  c.outcome = t.confirm(rank, keys, pages, releases, c.detail, c.newly);
  return c;
}

std::vector<std::int64_t> confirmed(const rank_table& t, std::int64_t rank, const keys_t& keys) {
  std::vector<std::int64_t> out(keys.size(), -7);
  EXPECT_TRUE(t.confirmed_pages(rank, keys, out));
  return out;
}

// {num_pages, free, reserved, bound}, comparable and printable.
std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t> tie(const rank_stats& s) {
  return {s.num_pages, s.free, s.reserved, s.bound};
}

using V = std::vector<std::int64_t>;
using U = std::vector<std::uint32_t>;

TEST(RankTable, InitializeCreatesGrowsAndRefusesShrink) {
  rank_table t;
  EXPECT_FALSE(t.contains(3));
  auto r = t.initialize(3, 100);
  EXPECT_EQ(r.outcome, init_outcome::created);
  EXPECT_EQ(r.old_pages, 0);
  EXPECT_TRUE(t.contains(3));
  r = t.initialize(3, 100);
  EXPECT_EQ(r.outcome, init_outcome::unchanged);
  EXPECT_EQ(r.old_pages, 100);
  r = t.initialize(3, 50);
  EXPECT_EQ(r.outcome, init_outcome::shrink_refused);
  EXPECT_EQ(r.old_pages, 100);
  EXPECT_EQ(t.stats(3)->num_pages, 100);
  r = t.initialize(3, 200);
  EXPECT_EQ(r.outcome, init_outcome::grown);
  EXPECT_EQ(r.old_pages, 100);
  EXPECT_EQ(tie(*t.stats(3)), tie({200, 200, 0, 0}));
  EXPECT_EQ(t.rank_count(), 1u);
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(RankTable, GrowthKeepsReservationsAndConfirmations) {
  rank_table t;
  t.initialize(0, 2);
  EXPECT_EQ(pages_of(t, 0, {"a", "b"}), (V{0, 1}));
  EXPECT_EQ(confirm(t, 0, {"a"}, {0}).outcome, confirm_outcome::ok);
  EXPECT_EQ(pages_of(t, 0, {"c"}), (V{-1}));
  t.initialize(0, 4);
  EXPECT_EQ(pages_of(t, 0, {"a", "b", "c", "d"}), (V{0, 1, 2, 3}));
  EXPECT_EQ(tie(*t.stats(0)), tie({4, 0, 3, 1}));
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(RankTable, UninitialisedRankIsReported) {
  rank_table t;
  allocation a;
  EXPECT_FALSE(t.allocate(1, keys_t{"a"}, a.distinct, a.pages));
  EXPECT_TRUE(a.distinct.empty());
  EXPECT_TRUE(a.pages.empty());
  EXPECT_EQ(confirm(t, 1, {"a"}, {0}).outcome, confirm_outcome::not_initialized);
  std::vector<std::int64_t> out(1);
  EXPECT_FALSE(t.confirmed_pages(1, keys_t{"a"}, out));
  EXPECT_FALSE(t.stats(1).has_value());
}

TEST(RankTable, AllocateHandsOutLowestPagesInKeyOrder) {
  rank_table t;
  t.initialize(0, 8);
  auto a = allocate(t, 0, {"x", "y", "z"});
  EXPECT_EQ(a.distinct, (U{0, 1, 2}));
  EXPECT_EQ(a.pages, (V{0, 1, 2}));
  EXPECT_EQ(pages_of(t, 0, {"w"}), (V{3}));
  EXPECT_EQ(tie(*t.stats(0)), tie({8, 4, 4, 0}));
}

TEST(RankTable, AllocateDedupesKeysInFirstOccurrenceOrder) {
  rank_table t;
  t.initialize(0, 3);
  auto a = allocate(t, 0, {"b", "a", "b", "c", "a", "a"});
  EXPECT_EQ(a.distinct, (U{0, 1, 3}));
  EXPECT_EQ(a.pages, (V{0, 1, 2}));
  EXPECT_EQ(t.stats(0)->free, 0);
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(RankTable, DuplicatesDoNotCountAgainstThePool) {
  rank_table t;
  t.initialize(0, 1);
  auto a = allocate(t, 0, {"k", "k", "k"});
  EXPECT_EQ(a.distinct, (U{0}));
  EXPECT_EQ(a.pages, (V{0}));
}

TEST(RankTable, AllocateAppendsToTheOutputVectors) {
  rank_table t;
  t.initialize(0, 4);
  std::vector<std::uint32_t> distinct{99};
  std::vector<std::int64_t> pages{-5};
  ASSERT_TRUE(t.allocate(0, keys_t{"a", "a", "b"}, distinct, pages));
  EXPECT_EQ(distinct, (U{99, 0, 2}));
  EXPECT_EQ(pages, (V{-5, 0, 1}));
}

TEST(RankTable, ReservedKeyReallocatedGetsTheSamePage) {
  rank_table t;
  t.initialize(0, 4);
  EXPECT_EQ(pages_of(t, 0, {"a", "b"}), (V{0, 1}));
  EXPECT_EQ(pages_of(t, 0, {"b", "c", "a"}), (V{1, 2, 0}));
  EXPECT_EQ(t.stats(0)->reserved, 3);
}

TEST(RankTable, ConfirmedKeyIsAHitAndTakesNoPage) {
  rank_table t;
  t.initialize(0, 2);
  EXPECT_EQ(pages_of(t, 0, {"a"}), (V{0}));
  ASSERT_EQ(confirm(t, 0, {"a"}, {0}).outcome, confirm_outcome::ok);
  EXPECT_EQ(pages_of(t, 0, {"a", "b"}), (V{0, 1}));
  // Pool empty now; hits are still served.
  EXPECT_EQ(pages_of(t, 0, {"a", "b"}), (V{0, 1}));
  EXPECT_EQ(tie(*t.stats(0)), tie({2, 0, 1, 1}));
}

TEST(RankTable, ExhaustionIsAllOrNothingAndHitsStillServed) {
  rank_table t;
  t.initialize(0, 4);
  EXPECT_EQ(pages_of(t, 0, {"h"}), (V{0}));
  ASSERT_EQ(confirm(t, 0, {"h"}, {0}).outcome, confirm_outcome::ok);
  const auto before = *t.stats(0);
  // Four keys need a page, three are free: all four get -1, the hit keeps its page.
  EXPECT_EQ(pages_of(t, 0, {"n1", "h", "n2", "n3", "n4", "n1"}), (V{-1, 0, -1, -1, -1}));
  EXPECT_EQ(tie(*t.stats(0)), tie(before));
  EXPECT_EQ(t.check_invariants(), "");
  // Exactly enough: all served.
  EXPECT_EQ(pages_of(t, 0, {"n1", "h", "n2", "n3"}), (V{1, 0, 2, 3}));
  EXPECT_EQ(t.stats(0)->free, 0);
  EXPECT_EQ(pages_of(t, 0, {"n4"}), (V{-1}));
}

TEST(RankTable, AllocationIsDeterministic) {
  rank_table a, b;
  for (rank_table* t : {&a, &b}) {
    t->initialize(0, 64);
    pages_of(*t, 0, {"p", "q", "r", "s"});
    confirm(*t, 0, {"q"}, {1}, {0, 2});
  }
  // p was released with page 0, so it needs a new page like z and y.
  EXPECT_EQ(pages_of(a, 0, {"z", "y", "p"}), (V{0, 2, 4}));
  EXPECT_EQ(pages_of(b, 0, {"z", "y", "p"}), (V{0, 2, 4}));
  EXPECT_EQ(pages_of(a, 0, {"t"}), (V{5}));
}

TEST(RankTable, EmptyAllocateReturnsNothing) {
  rank_table t;
  t.initialize(0, 1);
  auto a = allocate(t, 0, {});
  EXPECT_TRUE(a.pages.empty());
}

TEST(RankTable, ConfirmBindsReservedPagesAndReportsNewKeysOnce) {
  rank_table t;
  t.initialize(0, 4);
  pages_of(t, 0, {"a", "b", "c"});
  auto c = confirm(t, 0, {"a", "b", "a"}, {0, 1, 0});
  ASSERT_EQ(c.outcome, confirm_outcome::ok) << c.detail;
  EXPECT_EQ(c.newly, (U{0, 1}));
  EXPECT_EQ(tie(*t.stats(0)), tie({4, 1, 1, 2}));
  EXPECT_EQ(confirmed(t, 0, {"a", "b", "c", "d"}), (V{0, 1, -1, -1}));
  // Confirming again is a no-op, and these keys are no longer new.
  c = confirm(t, 0, {"b", "a", "c"}, {1, 0, 2});
  ASSERT_EQ(c.outcome, confirm_outcome::ok) << c.detail;
  EXPECT_EQ(c.newly, (U{2}));
  EXPECT_EQ(tie(*t.stats(0)), tie({4, 1, 0, 3}));
  c = confirm(t, 0, {"a"}, {0});
  EXPECT_EQ(c.outcome, confirm_outcome::ok);
  EXPECT_TRUE(c.newly.empty());
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(RankTable, EmptyConfirmIsOk) {
  rank_table t;
  t.initialize(0, 1);
  auto c = confirm(t, 0, {}, {});
  EXPECT_EQ(c.outcome, confirm_outcome::ok);
  EXPECT_TRUE(c.newly.empty());
}

TEST(RankTable, ConfirmedPagesIgnoresReservations) {
  rank_table t;
  t.initialize(0, 4);
  pages_of(t, 0, {"a", "b"});
  confirm(t, 0, {"b"}, {1});
  EXPECT_EQ(confirmed(t, 0, {"a", "b", "b", "zz"}), (V{-1, 1, 1, -1}));
  EXPECT_TRUE(confirmed(t, 0, {}).empty());
}

// A bad request changes nothing: same stats, invariants hold, and the next allocation
// sees exactly the pool it would have seen.
class ConfirmRejects : public ::testing::Test {
 protected:
  void SetUp() override {
    t.initialize(5, 8);
    ASSERT_EQ(pages_of(t, 5, {"a", "b", "c", "d"}), (V{0, 1, 2, 3}));
    ASSERT_EQ(confirm(t, 5, {"c"}, {2}).outcome, confirm_outcome::ok);
    ASSERT_EQ(confirm(t, 5, {}, {}, {3}).outcome, confirm_outcome::ok);  // d released
    before = *t.stats(5);
    refused_before = t.refused_releases();
  }
  void expect_rejected(const keys_t& keys, const V& pages, const V& releases,
                       const std::string& detail) {
    auto c = confirm(t, 5, keys, pages, releases);
    EXPECT_EQ(c.outcome, confirm_outcome::bad_request);
    EXPECT_EQ(c.detail, detail);
    EXPECT_TRUE(c.newly.empty());
    EXPECT_EQ(tie(*t.stats(5)), tie(before));
    EXPECT_EQ(t.refused_releases(), refused_before);
    EXPECT_EQ(t.check_invariants(), "");
    EXPECT_EQ(confirmed(t, 5, {"a", "b", "c", "d"}), (V{-1, -1, 2, -1}));
    // a and b still reserved (same pages), d gets the lowest free page again.
    EXPECT_EQ(pages_of(t, 5, {"a", "b", "c", "d"}), (V{0, 1, 2, 3}));
  }
  rank_table t;
  rank_stats before{};
  std::uint64_t refused_before = 0;
};

TEST_F(ConfirmRejects, PageOutOfRange) {
  expect_rejected({"a", "b"}, {0, 8}, {}, "Page 8 out of range for rank 5 (num_pages 8)");
}

TEST_F(ConfirmRejects, NegativePage) {
  expect_rejected({"a"}, {-1}, {}, "Page -1 out of range for rank 5 (num_pages 8)");
}

TEST_F(ConfirmRejects, ReleaseOutOfRange) {
  expect_rejected({"a"}, {0}, {1, 100},
                  "Page 100 in pages_to_release out of range for rank 5 (num_pages 8)");
}

TEST_F(ConfirmRejects, FreePage) {
  expect_rejected({"a", "x"}, {0, 5}, {}, "Page 5 is not reserved for key x on rank 5");
}

TEST_F(ConfirmRejects, PageReservedForAnotherKey) {
  expect_rejected({"a"}, {1}, {1}, "Page 1 is not reserved for key a on rank 5");
}

TEST_F(ConfirmRejects, PageBoundToAnotherKey) {
  expect_rejected({"a"}, {2}, {}, "Page 2 is not reserved for key a on rank 5");
}

TEST_F(ConfirmRejects, ConfirmedKeyOnADifferentPage) {
  expect_rejected({"c"}, {0}, {}, "Page 0 is not reserved for key c on rank 5");
}

TEST_F(ConfirmRejects, ReleasedReservationCannotBeConfirmed) {
  expect_rejected({"d"}, {3}, {}, "Page 3 is not reserved for key d on rank 5");
}

TEST_F(ConfirmRejects, OnePageForTwoKeys) {
  expect_rejected({"a", "b", "z"}, {0, 1, 0}, {}, "Page 0 confirmed for two different keys");
}

TEST_F(ConfirmRejects, FirstErrorWinsAndReleasesAreCheckedAfterConfirmations) {
  expect_rejected({"a", "q"}, {0, 9}, {100}, "Page 9 out of range for rank 5 (num_pages 8)");
}

TEST(RankTable, ReleaseOfFreePageIsANoOp) {
  rank_table t;
  t.initialize(0, 4);
  auto c = confirm(t, 0, {}, {}, {0, 3, 3});
  EXPECT_EQ(c.outcome, confirm_outcome::ok);
  EXPECT_EQ(tie(*t.stats(0)), tie({4, 4, 0, 0}));
  EXPECT_EQ(t.refused_releases(), 0u);
}

TEST(RankTable, ReleaseOfReservedPageFreesItAndDropsTheReservation) {
  rank_table t;
  t.initialize(0, 4);
  EXPECT_EQ(pages_of(t, 0, {"a", "b", "c"}), (V{0, 1, 2}));
  auto c = confirm(t, 0, {}, {}, {1, 0, 1});
  EXPECT_EQ(c.outcome, confirm_outcome::ok);
  EXPECT_EQ(tie(*t.stats(0)), tie({4, 3, 1, 0}));
  EXPECT_EQ(t.check_invariants(), "");
  // b's reservation is gone: it gets a new page (the lowest free), c keeps page 2.
  EXPECT_EQ(pages_of(t, 0, {"c", "b", "a"}), (V{2, 0, 1}));
  EXPECT_EQ(t.refused_releases(), 0u);
}

TEST(RankTable, ReleaseOfConfirmedPageIsRefused) {
  rank_table t;
  t.initialize(0, 4);
  pages_of(t, 0, {"a", "b"});
  ASSERT_EQ(confirm(t, 0, {"a"}, {0}).outcome, confirm_outcome::ok);
  auto c = confirm(t, 0, {}, {}, {0, 1, 0});
  EXPECT_EQ(c.outcome, confirm_outcome::ok);
  EXPECT_EQ(t.refused_releases(), 2u);
  EXPECT_EQ(tie(*t.stats(0)), tie({4, 3, 0, 1}));
  EXPECT_EQ(confirmed(t, 0, {"a"}), (V{0}));
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(RankTable, ReleaseInTheSameRequestAsItsConfirmationIsRefused) {
  rank_table t;
  t.initialize(0, 4);
  pages_of(t, 0, {"a", "b"});
  auto c = confirm(t, 0, {"a"}, {0}, {0, 1});
  EXPECT_EQ(c.outcome, confirm_outcome::ok);
  EXPECT_EQ(c.newly, (U{0}));
  EXPECT_EQ(t.refused_releases(), 1u);
  EXPECT_EQ(tie(*t.stats(0)), tie({4, 3, 0, 1}));
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(RankTable, WriteFailurePathReleasesEveryPageOfTheTask) {
  // The connector allocates a batch (some hits), fails the write and releases all pages.
  rank_table t;
  t.initialize(1, 8);
  pages_of(t, 1, {"old"});
  confirm(t, 1, {"old"}, {0});
  const auto pages = pages_of(t, 1, {"old", "n1", "n2"});
  EXPECT_EQ(pages, (V{0, 1, 2}));
  EXPECT_EQ(confirm(t, 1, {}, {}, pages).outcome, confirm_outcome::ok);
  EXPECT_EQ(tie(*t.stats(1)), tie({8, 7, 0, 1}));
  EXPECT_EQ(confirmed(t, 1, {"old"}), (V{0}));
  EXPECT_EQ(t.refused_releases(), 1u);
}

TEST(RankTable, NegativeAndExtremeRanksAreIndependent) {
  rank_table t;
  for (std::int64_t r : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{1}, INT64_MIN, INT64_MAX}) {
    EXPECT_EQ(t.initialize(r, 2).outcome, init_outcome::created);
  }
  EXPECT_EQ(t.rank_count(), 5u);
  EXPECT_EQ(pages_of(t, -1, {"a"}), (V{0}));
  EXPECT_EQ(pages_of(t, INT64_MIN, {"b", "a"}), (V{0, 1}));
  EXPECT_EQ(confirm(t, -1, {"a"}, {0}).outcome, confirm_outcome::ok);
  EXPECT_EQ(confirmed(t, INT64_MIN, {"a"}), (V{-1}));
  EXPECT_EQ(confirmed(t, -1, {"a"}), (V{0}));
  auto c = confirm(t, INT64_MIN, {"a"}, {0});
  EXPECT_EQ(c.outcome, confirm_outcome::bad_request);
  EXPECT_EQ(c.detail, "Page 0 is not reserved for key a on rank -9223372036854775808");
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(RankTable, ClearDropsEveryRank) {
  rank_table t;
  t.initialize(0, 2);
  t.initialize(-3, 2);
  pages_of(t, 0, {"a"});
  t.clear();
  EXPECT_EQ(t.rank_count(), 0u);
  EXPECT_FALSE(t.contains(0));
  EXPECT_EQ(t.initialize(0, 2).outcome, init_outcome::created);
  EXPECT_EQ(pages_of(t, 0, {"a"}), (V{0}));
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(RankTable, MovedTableKeepsItsState) {
  rank_table t;
  t.initialize(0, 2);
  pages_of(t, 0, {"a"});
  rank_table moved(std::move(t));
  EXPECT_EQ(pages_of(moved, 0, {"b", "a"}), (V{1, 0}));
  rank_table assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.stats(0)->reserved, 2);
}

TEST(RankTable, LongAndBinaryKeysRoundTrip) {
  rank_table t;
  t.initialize(0, 4);
  const std::string long_key(100000, 'k');
  const std::string binary("a\0b", 3);
  EXPECT_EQ(pages_of(t, 0, {long_key, binary, "", "a"}), (V{0, 1, 2, 3}));
  EXPECT_EQ(confirm(t, 0, {long_key, ""}, {0, 2}).outcome, confirm_outcome::ok);
  EXPECT_EQ(confirmed(t, 0, {long_key, binary, "", "a"}), (V{0, -1, 2, -1}));
  EXPECT_EQ(confirm(t, 0, {}, {}, {1, 3}).outcome, confirm_outcome::ok);
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(RankTable, ManyKeysGrowTheKeyMap) {
  rank_table t;
  t.initialize(0, 50000);
  std::vector<std::string> storage;
  for (int i = 0; i < 50000; ++i) storage.push_back(std::to_string(i * 7919));
  keys_t keys(storage.begin(), storage.end());
  auto a = allocate(t, 0, keys);
  for (int i = 0; i < 50000; ++i) ASSERT_EQ(a.pages[i], i);
  V pages(a.pages.begin(), a.pages.end());
  auto c = confirm(t, 0, keys, pages);
  ASSERT_EQ(c.outcome, confirm_outcome::ok);
  EXPECT_EQ(c.newly.size(), 50000u);
  EXPECT_EQ(tie(*t.stats(0)), tie({50000, 0, 0, 50000}));
  EXPECT_EQ(confirmed(t, 0, keys), pages);
  EXPECT_EQ(t.check_invariants(), "");
}

}  // namespace
}  // namespace shard
