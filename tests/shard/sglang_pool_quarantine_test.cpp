// sglang_pool's release quarantine (docs/sglang-api.md, confirm_write): a page released
// by pages_to_release is held for no key until its quarantine ends, so that a replay of
// the release cannot free a page that meanwhile went to another writer; reserve takes
// such a page only when nothing is free and nothing can be evicted. Without a quarantine
// (until 0) the reference's order is kept exactly (sglang_pool_test.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sglang_helpers.hpp"
#include "shard/sglang_pool.hpp"

namespace metad::shard {
namespace {

using namespace shard::sg_testing;

// confirm_write with its releases quarantined until `until`.
std::string release(sglang_pool& pool, const ints& pages, std::uint64_t until,
                    std::uint64_t now = 0, sglang_confirm_stats* stats = nullptr) {
  std::string detail;
  sglang_confirm_stats s;
  const auto outcome = pool.confirm({}, {}, pages, now, detail, s, until);
  if (stats != nullptr) *stats = s;
  EXPECT_EQ(pool.check(), "");
  return outcome == sglang_confirm_outcome::ok ? "" : detail;
}

// The case: A's release of page 63, B reserves, A's release replayed, C reserves.
TEST(SglangPoolQuarantine, AReplayedReleaseChangesNothingAndNoPageGoesToTwoWriters) {
  sglang_pool pool(64);
  EXPECT_EQ(reserve(pool, {"ka"}), S({{false, 63}}));
  sglang_confirm_stats st;
  EXPECT_EQ(release(pool, {63}, 5000, 0, &st), "");
  EXPECT_EQ(st.released, 1u);
  EXPECT_EQ(st.quarantined, 1u);
  EXPECT_EQ(pool.quarantined(), 1u);
  // Not handed out again: B gets the next free page.
  EXPECT_EQ(reserve(pool, {"kb"}), S({{false, 62}}));
  // The replay: page 63 is quarantined, owned by no key; nothing changes.
  const sglang_image before = pool.image();
  EXPECT_EQ(release(pool, {63}, 6000, 10, &st), "");
  EXPECT_EQ(st.released, 0u);
  EXPECT_EQ(st.release_noop, 1u);
  EXPECT_EQ(pool.image().free, before.free);
  EXPECT_EQ(pool.image().quarantined, before.quarantined);
  EXPECT_EQ(pool.image().reserved.size(), before.reserved.size());
  // A replay of B's own release frees B's page, once; C never gets page 63 nor 62 twice.
  EXPECT_EQ(reserve(pool, {"kc"}), S({{false, 61}}));
  EXPECT_EQ(confirm(pool, {"kb", "kc"}, {62, 61}), "");
  EXPECT_EQ(get(pool, {"kb", "kc"}), (ints{62, 61}));
}

TEST(SglangPoolQuarantine, AQuarantinedPageCountsAsFreeButIsNotInTheStack) {
  sglang_pool pool(4);
  reserve(pool, {"a", "b"});  // 3, 2
  EXPECT_EQ(release(pool, {3}, 100), "");
  const sglang_pool_stats st = pool.stats();
  EXPECT_EQ(st.free, 3u);  // 0, 1 and the quarantined 3
  EXPECT_EQ(st.quarantined, 1u);
  EXPECT_EQ(st.in_flight, 1u);
  EXPECT_EQ(st.unowned, 0u);
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(pool.image().quarantined, (std::vector<std::uint64_t>{3}));
}

TEST(SglangPoolQuarantine, AQuarantinedPageCannotBeConfirmed) {
  sglang_pool pool(4);
  reserve(pool, {"a"});  // 3
  EXPECT_EQ(release(pool, {3}, 100), "");
  // A's replayed confirmation (or anyone's) of the released page: skipped, not bound
  // (an unowned page would be).
  sglang_confirm_stats st;
  EXPECT_EQ(confirm(pool, {"a"}, {3}, {}, 0, &st), "");
  EXPECT_EQ(st.skipped, 1u);
  EXPECT_EQ(st.bound, 0u);
  EXPECT_EQ(exists(pool, {"a"}), std::vector<bool>{false});
  EXPECT_EQ(pool.quarantined(), 1u);
}

TEST(SglangPoolQuarantine, EndingReturnsPagesOnTopOldestReleaseFirst) {
  sglang_pool pool(6);
  reserve(pool, {"a", "b", "c"});  // 5, 4, 3
  EXPECT_EQ(release(pool, {4}, 100), "");
  EXPECT_EQ(release(pool, {5, 3}, 200), "");
  // Not yet: nothing ends before its time.
  std::vector<std::int64_t> ended;
  EXPECT_EQ(pool.end_quarantines(99, &ended), 0u);
  EXPECT_EQ(pool.end_quarantines(100, &ended), 1u);
  EXPECT_EQ(ended, (std::vector<std::int64_t>{4}));
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1, 2, 4}));
  EXPECT_EQ(pool.end_quarantines(500, &ended), 2u);
  EXPECT_EQ(ended, (std::vector<std::int64_t>{4, 5, 3}));
  EXPECT_EQ(pool.check(), "");
  // Pushed as if released at the end: the most recently released on top.
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1, 2, 4, 5, 3}));
  EXPECT_EQ(reserve(pool, {"d", "e"}), S({{false, 3}, {false, 5}}));
  EXPECT_EQ(pool.quarantined(), 0u);
}

TEST(SglangPoolQuarantine, WithoutAQuarantineTheReferenceOrderHolds) {
  sglang_pool pool(4);
  reserve(pool, {"a", "b"});  // 3, 2
  EXPECT_EQ(release(pool, {3, 2}, 0), "");
  EXPECT_EQ(pool.quarantined(), 0u);
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1, 3, 2}));
  EXPECT_EQ(reserve(pool, {"c"}), S({{false, 2}}));
}

TEST(SglangPoolQuarantine, AFullPoolEvictsBeforeItTakesAQuarantinedPage) {
  sglang_pool pool(3);
  store(pool, {"a", "b"});  // 2, 1
  reserve(pool, {"c"});     // 0
  EXPECT_EQ(release(pool, {0}, 100), "");
  // Nothing free: the LRU key is evicted, the released page stays out.
  sglang_reserve_stats st;
  EXPECT_EQ(reserve(pool, {"d"}, 0, &st), S({{false, 2}}));
  EXPECT_EQ(st.evicted, 1u);
  EXPECT_EQ(st.unquarantined, 0u);
  EXPECT_EQ(exists(pool, {"a", "b"}), (std::vector<bool>{false, true}));
  // b is a hit of the batch and d is in flight: nothing evictable is left, so the
  // quarantined page serves rather than a -1.
  EXPECT_EQ(reserve(pool, {"b", "e", "f"}, 0, &st), S({{true, 1}, {false, 0}, {false, -1}}));
  EXPECT_EQ(st.unquarantined, 1u);
  EXPECT_EQ(pool.quarantined(), 0u);
  EXPECT_EQ(confirm(pool, {"e", "d"}, {0, 2}), "");
  EXPECT_EQ(get(pool, {"b", "d", "e"}), (ints{1, 2, 0}));
}

TEST(SglangPoolQuarantine, TheOldestQuarantinedPageGoesFirst) {
  sglang_pool pool(3);
  reserve(pool, {"a", "b", "c"});  // 2, 1, 0
  EXPECT_EQ(release(pool, {1}, 100), "");
  EXPECT_EQ(release(pool, {2, 0}, 200), "");
  EXPECT_EQ(reserve(pool, {"d", "e"}), S({{false, 1}, {false, 2}}));
  EXPECT_EQ(pool.image().quarantined, (std::vector<std::uint64_t>{0}));
  // The pages it took are no longer quarantined: their end is not due any more.
  std::vector<std::int64_t> ended;
  EXPECT_EQ(pool.end_quarantines(1000, &ended), 1u);
  EXPECT_EQ(ended, (std::vector<std::int64_t>{0}));
  EXPECT_EQ(confirm(pool, {"d", "e"}, {1, 2}), "");
  EXPECT_EQ(get(pool, {"d", "e"}), (ints{1, 2}));
}

TEST(SglangPoolQuarantine, ClearKeepsQuarantinedPagesOutOfTheStack) {
  sglang_pool pool(4);
  reserve(pool, {"a", "b"});  // 3, 2
  store(pool, {"c"});         // 1
  EXPECT_EQ(release(pool, {3}, 100), "");
  pool.clear();
  EXPECT_EQ(pool.check(), "");
  // 2 is in flight (across the clear), 3 quarantined: neither is handed out.
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(pool.quarantined(), 1u);
  // A replay of the release after the clear still changes nothing.
  EXPECT_EQ(release(pool, {3}, 100), "");
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(pool.end_quarantines(100), 1u);
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1, 3}));
}

TEST(SglangPoolQuarantine, ExpiryAndDeleteFreeAtOnce) {
  sglang_pool pool(4, sglang_config{10, 0});
  reserve(pool, {"a"}, 0);  // 3, deadline 10
  store(pool, {"b"}, 0);    // 2
  EXPECT_EQ(pool.expire(10), 1u);
  EXPECT_EQ(del(pool, {"b"}), 1u);
  EXPECT_EQ(pool.quarantined(), 0u);
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1, 3, 2}));
}

TEST(SglangPoolQuarantine, ReplayedEndsAndRestartsFollowTheQueue) {
  sglang_pool pool(5);
  reserve(pool, {"a", "b", "c"});  // 4, 3, 2
  EXPECT_EQ(release(pool, {3, 4, 2}, sglang_pool::no_deadline), "");
  // The log's end records: only the oldest pages, in order; nothing changes otherwise.
  const std::vector<std::int64_t> wrong{4}, too_many{3, 4, 2, 1}, right{3, 4};
  EXPECT_FALSE(pool.end_quarantine(wrong));
  EXPECT_FALSE(pool.end_quarantine(too_many));
  EXPECT_EQ(pool.quarantined(), 3u);
  EXPECT_TRUE(pool.end_quarantine(right));
  EXPECT_EQ(pool.check(), "");
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1, 3, 4}));
  // Replayed quarantines have no time: they end only when restarted.
  EXPECT_EQ(pool.end_quarantines(UINT64_MAX - 1), 0u);
  pool.restart_quarantines(50);
  EXPECT_EQ(pool.end_quarantines(49), 0u);
  EXPECT_EQ(pool.end_quarantines(50), 1u);
  EXPECT_EQ(free_stack(pool), (std::vector<std::uint32_t>{0, 1, 3, 4, 2}));
}

TEST(SglangPoolQuarantine, AnImageKeepsTheQuarantineAndRestoresIt) {
  sglang_pool pool(6);
  reserve(pool, {"a", "b", "c", "d"});  // 5, 4, 3, 2
  EXPECT_EQ(confirm(pool, {"a"}, {5}, {3, 4}, 0), "");
  std::string detail;
  sglang_confirm_stats st;
  const std::vector<std::int64_t> rel{2};
  ASSERT_EQ(pool.confirm({}, {}, rel, 0, detail, st, 100), sglang_confirm_outcome::ok);
  // Now 3 and 4 are free, 2 quarantined.
  const sglang_image img = pool.image();
  EXPECT_EQ(img.quarantined, (std::vector<std::uint64_t>{2}));
  sglang_pool copy(0);
  std::string error;
  ASSERT_TRUE(sglang_pool::restore(img, {}, copy, error)) << error;
  EXPECT_EQ(copy.check(), "");
  EXPECT_EQ(copy.image().quarantined, img.quarantined);
  EXPECT_EQ(copy.stats().quarantined, 1u);
  copy.restart_quarantines(100);
  EXPECT_EQ(copy.end_quarantines(100), 1u);
  // A snapshot's separate quarantine record: the pages its image lists nowhere.
  sglang_image bare = img;
  bare.quarantined.clear();
  sglang_pool again(0);
  ASSERT_TRUE(sglang_pool::restore(bare, {}, again, error)) << error;
  EXPECT_EQ(again.stats().unowned, 1u);
  const std::vector<std::int64_t> bad_range{6}, bound{5}, twice{2, 2}, ok{2};
  EXPECT_FALSE(again.restore_quarantine(bad_range, 0));
  EXPECT_FALSE(again.restore_quarantine(bound, 0));
  EXPECT_FALSE(again.restore_quarantine(twice, 0));
  EXPECT_EQ(again.quarantined(), 0u);
  EXPECT_TRUE(again.restore_quarantine(ok, 0));
  EXPECT_FALSE(again.restore_quarantine(ok, 0));  // no longer unowned
  EXPECT_EQ(again.check(), "");
  EXPECT_EQ(again.image().quarantined, img.quarantined);
  // A restored image refuses a page listed both free and quarantined.
  sglang_image both = img;
  both.quarantined.push_back(img.free.front().first);
  EXPECT_FALSE(sglang_pool::restore(both, {}, again, error));
}

}  // namespace
}  // namespace metad::shard
