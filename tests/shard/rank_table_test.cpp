#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <tuple>
#include <vector>

#include "rank_table_helpers.hpp"
#include "shard/rank_table.hpp"

namespace metad::shard {
namespace {

using namespace testing_helpers;

TEST(RankTable, InitializeCreatesGrowsAndShrinks) {
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
  EXPECT_EQ(r.outcome, init_outcome::shrunk);
  EXPECT_EQ(r.old_pages, 100);
  EXPECT_EQ(t.stats(3)->num_pages, 50);
  r = t.initialize(3, 200);
  EXPECT_EQ(r.outcome, init_outcome::grown);
  EXPECT_EQ(r.old_pages, 50);
  EXPECT_EQ(stats_tuple(*t.stats(3)), stats_tuple({200, 200, 0, 0}));
  EXPECT_EQ(t.rank_count(), 1u);
  EXPECT_EQ(t.check_invariants(), "");
}

// The pages past the new end no longer exist: their keys lose their bindings and
// reservations, their quarantines end; the pages below keep their state.
TEST(RankTable, ShrinkDropsWhatLayPastTheNewEnd) {
  rank_table t;
  t.initialize(0, 8);
  EXPECT_EQ(pages_of(t, 0, {"a", "b", "c", "d", "e", "f"}), (V{0, 1, 2, 3, 4, 5}));
  std::string detail;
  std::vector<std::uint32_t> newly;
  const std::vector<std::string_view> bound = {"a", "e"};
  const std::vector<std::int64_t> bound_pages = {0, 4}, releases = {1, 5};
  ASSERT_EQ(t.confirm(0, bound, bound_pages, releases, 100, detail, newly), confirm_outcome::ok);
  // a: bound 0, b: quarantined 1, c, d: reserved 2, 3, e: bound 4, f: quarantined 5.
  std::vector<std::string> unbound;
  const init_result r = t.initialize(0, 3, &unbound);
  EXPECT_EQ(r.outcome, init_outcome::shrunk);
  EXPECT_EQ(unbound, (std::vector<std::string>{"e"}));
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({3, 1, 1, 1}));  // free: the quarantined 1
  EXPECT_EQ(t.check_invariants(), "");
  std::vector<std::int64_t> pages(2);
  const std::vector<std::string_view> both = {"a", "e"};
  ASSERT_TRUE(t.confirmed_pages(0, both, pages));
  EXPECT_EQ(pages, (std::vector<std::int64_t>{0, -1}));
  // d's reservation is gone, c's is kept; the quarantined page 1 goes last.
  EXPECT_EQ(pages_of(t, 0, {"c", "d"}), (V{2, 1}));
  t.initialize(0, 5);  // grown back: pages 3 and 4 are new and free
  EXPECT_EQ(pages_of(t, 0, {"g", "h"}), (V{3, 4}));
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
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({4, 0, 3, 1}));
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(RankTable, UninitialisedRankIsReported) {
  rank_table t;
  allocation a;
  EXPECT_FALSE(t.allocate(1, keys_t{"a"}, 0, a.distinct, a.pages));
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
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({8, 4, 4, 0}));
}

// A page_quota (a tenant's pages=N, shared by cores): a batch's new pages are added to
// its count before they are taken; a batch they would take past the bound is answered as
// by a full rank (all or nothing), the count untouched; hits take nothing.
TEST(RankTable, AllocateChargesAPageQuotaBeforeTakingPages) {
  rank_table t;
  t.initialize(0, 8);
  std::atomic<std::int64_t> held{2};  // pages held elsewhere (other ranks, SGLang pools)
  const page_quota quota{&held, 5};
  allocation a;
  allocate_result r = t.allocate(0, keys_t{"x", "y"}, 0, a.distinct, a.pages, UINT64_MAX, quota);
  EXPECT_EQ(a.pages, (V{0, 1}));
  EXPECT_EQ((std::tuple{r.taken, r.short_by, r.over_quota}), (std::tuple{2u, 0u, false}));
  EXPECT_EQ(held.load(), 4);
  EXPECT_EQ(t.held_pages(), 2);
  allocation b;
  r = t.allocate(0, keys_t{"x", "z", "w"}, 0, b.distinct, b.pages, UINT64_MAX, quota);
  EXPECT_EQ(b.pages, (V{0, -1, -1}));  // the hit keeps its page
  EXPECT_EQ((std::tuple{r.taken, r.short_by, r.over_quota, r.evictable}),
            (std::tuple{0u, 1u, true, false}));  // nothing bound to evict
  EXPECT_EQ(held.load(), 4);
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({8, 6, 2, 0}));
  allocation c;
  r = t.allocate(0, keys_t{"z"}, 0, c.distinct, c.pages, UINT64_MAX, quota);
  EXPECT_EQ(c.pages, (V{2}));
  EXPECT_EQ(held.load(), 5);
  // Far over a lowered bound: short by what the batch takes, no more.
  allocation d;
  r = t.allocate(0, keys_t{"v"}, 0, d.distinct, d.pages, UINT64_MAX, page_quota{&held, 1});
  EXPECT_EQ((std::tuple{r.short_by, r.over_quota}), (std::tuple{1u, true}));
  // No bound (max < 0): it only counts.
  allocation e;
  r = t.allocate(0, keys_t{"v"}, 0, e.distinct, e.pages, UINT64_MAX, page_quota{&held, -1});
  EXPECT_EQ(e.pages, (V{3}));
  EXPECT_EQ(held.load(), 6);
  EXPECT_EQ(t.held_pages(), 4);
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

// Two keys are the smallest batch with a duplicate: a dedupe skipped for small batches
// would give the key two pages.
TEST(RankTable, ADuplicateInABatchOfTwoTakesOnePage) {
  rank_table t;
  t.initialize(0, 1);
  auto a = allocate(t, 0, {"k", "k"});
  EXPECT_EQ(a.distinct, (U{0}));
  EXPECT_EQ(a.pages, (V{0}));
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({1, 0, 1, 0}));
  EXPECT_EQ(t.check_invariants(), "");
}

// evictable: freeing every bound page would serve the batch. Exactly at the boundary
// (pages still missing == bound pages) it would; one more and it would not.
TEST(RankTable, AShortBatchIsEvictableExactlyUpToTheBoundPages) {
  rank_table t;
  t.initialize(0, 4);
  const keys_t held = {"a", "b"};
  const allocation h = allocate(t, 0, held);
  ASSERT_EQ(confirm(t, 0, held, h.pages, {}).outcome, confirm_outcome::ok);
  allocate(t, 0, {"r"});  // 2 bound, 1 reserved, 1 free
  allocation a;
  shard::allocate_result r = t.allocate(0, keys_t{"x", "y", "z"}, 0, a.distinct, a.pages);
  EXPECT_EQ(r.short_by, 2u);  // 3 new keys, 1 free page
  EXPECT_TRUE(r.evictable);   // missing 2 == bound 2
  a = {};
  r = t.allocate(0, keys_t{"v", "w", "x", "y"}, 0, a.distinct, a.pages);
  EXPECT_EQ(r.short_by, 3u);
  EXPECT_FALSE(r.evictable);  // missing 3 > bound 2: eviction cannot serve it
  EXPECT_EQ(a.pages, (V{-1, -1, -1, -1}));
}

TEST(RankTable, AllocateAppendsToTheOutputVectors) {
  rank_table t;
  t.initialize(0, 4);
  std::vector<std::uint32_t> distinct{99};
  std::vector<std::int64_t> pages{-5};
  ASSERT_TRUE(t.allocate(0, keys_t{"a", "a", "b"}, 0, distinct, pages));
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
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({2, 0, 1, 1}));
}

TEST(RankTable, ExhaustionIsAllOrNothingAndHitsStillServed) {
  rank_table t;
  t.initialize(0, 4);
  EXPECT_EQ(pages_of(t, 0, {"h"}), (V{0}));
  ASSERT_EQ(confirm(t, 0, {"h"}, {0}).outcome, confirm_outcome::ok);
  const auto before = *t.stats(0);
  // Four keys need a page, three are free: all four get -1, the hit keeps its page.
  EXPECT_EQ(pages_of(t, 0, {"n1", "h", "n2", "n3", "n4", "n1"}), (V{-1, 0, -1, -1, -1}));
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple(before));
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

TEST(RankTable, NegativeAndExtremeRanksAreIndependent) {
  rank_table t;
  for (std::int64_t r :
       {std::int64_t{-1}, std::int64_t{0}, std::int64_t{1}, INT64_MIN, INT64_MAX}) {
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
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({50000, 0, 0, 50000}));
  EXPECT_EQ(confirmed(t, 0, keys), pages);
  EXPECT_EQ(t.check_invariants(), "");
}

}  // namespace
}  // namespace metad::shard
