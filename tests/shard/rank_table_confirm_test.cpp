#include <gtest/gtest.h>

#include "rank_table_helpers.hpp"
#include "shard/rank_table.hpp"

// confirm_write on one rank: binding, validation (nothing changes on a bad request),
// releases, and confirmed_pages.
namespace metad::shard {
namespace {

using namespace testing_helpers;

TEST(RankTable, ConfirmBindsReservedPagesAndReportsNewKeysOnce) {
  rank_table t;
  t.initialize(0, 4);
  pages_of(t, 0, {"a", "b", "c"});
  auto c = confirm(t, 0, {"a", "b", "a"}, {0, 1, 0});
  ASSERT_EQ(c.outcome, confirm_outcome::ok) << c.detail;
  EXPECT_EQ(c.newly, (U{0, 1}));
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({4, 1, 1, 2}));
  EXPECT_EQ(confirmed(t, 0, {"a", "b", "c", "d"}), (V{0, 1, -1, -1}));
  // Confirming again is a no-op, and these keys are no longer new.
  c = confirm(t, 0, {"b", "a", "c"}, {1, 0, 2});
  ASSERT_EQ(c.outcome, confirm_outcome::ok) << c.detail;
  EXPECT_EQ(c.newly, (U{2}));
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({4, 1, 0, 3}));
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
    EXPECT_EQ(stats_tuple(*t.stats(5)), stats_tuple(before));
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
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({4, 4, 0, 0}));
  EXPECT_EQ(t.refused_releases(), 0u);
}

TEST(RankTable, ReleaseOfReservedPageFreesItAndDropsTheReservation) {
  rank_table t;
  t.initialize(0, 4);
  EXPECT_EQ(pages_of(t, 0, {"a", "b", "c"}), (V{0, 1, 2}));
  auto c = confirm(t, 0, {}, {}, {1, 0, 1});
  EXPECT_EQ(c.outcome, confirm_outcome::ok);
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({4, 3, 1, 0}));
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
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({4, 3, 0, 1}));
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
  EXPECT_EQ(stats_tuple(*t.stats(0)), stats_tuple({4, 3, 0, 1}));
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
  EXPECT_EQ(stats_tuple(*t.stats(1)), stats_tuple({8, 7, 0, 1}));
  EXPECT_EQ(confirmed(t, 1, {"old"}), (V{0}));
  EXPECT_EQ(t.refused_releases(), 1u);
}

}  // namespace
}  // namespace metad::shard
