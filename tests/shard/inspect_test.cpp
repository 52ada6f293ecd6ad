// The read-only accessors POST /keys/inspect and /{rank}/inspect use: they report every
// state and change nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "rank_table_helpers.hpp"
#include "sglang_helpers.hpp"
#include "shard/directory.hpp"
#include "shard/rank_table.hpp"
#include "shard/sglang_pool.hpp"

namespace metad::shard {
namespace {

using hold = std::tuple<std::int64_t, std::int64_t, bool, std::uint64_t>;

std::vector<hold> holds_of(const rank_table& t, std::string_view key) {
  std::vector<hold> out;
  t.inspect_key(key,
                [&](std::int64_t rank, std::int64_t page, bool confirmed, std::uint64_t deadline) {
                  out.emplace_back(rank, page, confirmed, deadline);
                });
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Inspect, RankTableReportsBoundAndReservedHoldsWithDeadlines) {
  using namespace testing_helpers;
  rank_table t;
  t.set_reservation_ttl(100);
  t.initialize(0, 4);
  t.initialize(5, 4);
  const keys_t keys = {"a", "b"};
  std::vector<std::uint32_t> distinct;
  std::vector<std::int64_t> pages;
  ASSERT_TRUE(t.allocate(0, keys, 10, distinct, pages));
  distinct.clear();
  pages.clear();
  ASSERT_TRUE(t.allocate(5, keys, 20, distinct, pages));
  EXPECT_EQ(confirm(t, 0, {"a"}, {0}).outcome, confirm_outcome::ok);
  EXPECT_EQ(holds_of(t, "a"), (std::vector<hold>{{0, 0, true, 0}, {5, 0, false, 120}}));
  EXPECT_EQ(holds_of(t, "b"), (std::vector<hold>{{0, 1, false, 110}, {5, 1, false, 120}}));
  EXPECT_TRUE(holds_of(t, "c").empty());
  EXPECT_EQ(stats_tuple(*t.stats(0)), std::make_tuple(4, 2, 1, 1));  // unchanged
}

TEST(Inspect, DirectoryReportsCompletenessTimesAndLeasesWithoutUsingTheKey) {
  directory d;
  d.add_confirmation("done", 1, 100);
  d.add_confirmation("half", 2, 200);
  EXPECT_TRUE(d.use("done", 300, 5'000));  // a read lease until 5000
  const key_report done = d.inspect("done");
  EXPECT_TRUE(done.present && done.complete && !done.removing);
  EXPECT_EQ(std::make_tuple(done.tp_world_size, done.confirmations), std::make_tuple(1, 1));
  EXPECT_EQ(std::make_tuple(done.last_used, done.lease_until, done.last_confirmed),
            std::make_tuple(300u, 5'000u, 0u));
  const key_report half = d.inspect("half");
  EXPECT_TRUE(half.present && !half.complete);
  EXPECT_EQ(std::make_tuple(half.tp_world_size, half.confirmations, half.last_confirmed),
            std::make_tuple(2, 1, 200u));
  EXPECT_FALSE(d.inspect("none").present);
  EXPECT_EQ(d.leased_count(400), 1u);
  EXPECT_EQ(d.incomplete_count(), 1u);
}

TEST(Inspect, SglangPoolReportsBoundInFlightAndStaleReservations) {
  using namespace sg_testing;
  sglang_pool pool(4, sglang_config{100, 0});
  EXPECT_EQ(reserve(pool, {"b", "f"}, 10), S({{false, 3}, {false, 2}}));
  EXPECT_EQ(confirm(pool, {"b"}, {3}, {}, 20), "");
  std::vector<std::string_view> keys = {"b", "f", "z"};
  std::vector<sglang_key_report> out(keys.size());
  pool.inspect(keys, out);
  EXPECT_EQ(std::make_tuple(out[0].page, out[0].reserved_page), std::make_tuple(3, -1));
  EXPECT_EQ(std::make_tuple(out[1].page, out[1].reserved_page, out[1].reserved_until,
                            out[1].reserved_stale),
            std::make_tuple(-1, 2, 110u, false));
  EXPECT_EQ(std::make_tuple(out[2].page, out[2].reserved_page), std::make_tuple(-1, -1));
  pool.clear();
  pool.inspect(keys, out);
  EXPECT_EQ(std::make_tuple(out[0].page, out[1].reserved_page, out[1].reserved_stale),
            std::make_tuple(-1, 2, true));
  EXPECT_EQ(pool.check(), "");
}

}  // namespace
}  // namespace metad::shard
