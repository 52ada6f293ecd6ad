// The /sync claim of a new leader (leadership's claim_sync, control's /sync rule): a
// leader serves only once /sync names it; a failed claim keeps the lease alive; a
// claim whose fence fails sends the node back to reading the keys; and the /sync value
// a leader writes lets only that node campaign again.
#include <gtest/gtest.h>

#include "fake_time.hpp"

#include "ha/control.hpp"
#include "ha/leadership.hpp"

using namespace metad;

namespace {

using ha::action_kind;
using ha::role;
using ms = std::chrono::milliseconds;

using ha::fake_time::at;
using ha::fake_time::t0;

struct claiming {
  ha::leadership m{ha::timing{}, [](const auto&) { return true; }, t0, true};

  // Observe (no key), grant sent at t0, win epoch 100 with lease 7 at 2 ms.
  void win() {
    ASSERT_EQ(m.next(t0).kind, action_kind::observe);
    m.on_observed(t0, std::nullopt, std::nullopt, 99);
    ASSERT_EQ(m.next(t0).kind, action_kind::grant);
    m.on_granted(at(1), t0, 7, ms(1000));
    ASSERT_EQ(m.next(at(1)).kind, action_kind::campaign);
    m.on_campaign(at(2), ha::holder{100, 7, "me"}, 100);
    ASSERT_EQ(m.current(), role::leader);
  }
};

TEST(SyncClaim, ANewLeaderServesOnlyOnceSyncNamesIt) {
  claiming c;
  c.win();
  EXPECT_FALSE(c.m.serving(at(2)));
  EXPECT_EQ(c.m.serving_until(), ha::time_point::min());
  const auto a = c.m.next(at(2));
  EXPECT_EQ(a.kind, action_kind::claim_sync);
  EXPECT_EQ(a.at, at(2));
  EXPECT_EQ(c.m.key_epoch(), 100);
  c.m.on_sync_claimed(at(5), true);
  EXPECT_TRUE(c.m.sync_claimed());
  EXPECT_TRUE(c.m.serving(at(5)));
  EXPECT_EQ(c.m.serving_until(), at(850));
  const auto next = c.m.next(at(5));
  EXPECT_EQ(next.kind, action_kind::keepalive);
  EXPECT_EQ(next.at, at(200));
}

TEST(SyncClaim, WithoutClaimSyncALeaderServesAtOnce) {
  ha::leadership m{ha::timing{}, [](const auto&) { return true; }, t0};
  m.next(t0);
  m.on_observed(t0, std::nullopt, std::nullopt, 99);
  m.on_granted(at(1), t0, 7, ms(1000));
  m.on_campaign(at(2), ha::holder{100, 7, "me"}, 100);
  EXPECT_TRUE(m.serving(at(2)));
  EXPECT_EQ(m.next(at(2)).kind, action_kind::keepalive);
}

TEST(SyncClaim, AFailingClaimIsRetriedAndTheLeaseKeptAlive) {
  claiming c;
  c.win();
  ha::time_point now = at(2);
  int claims = 0, renewals = 0;
  while (now < at(700)) {
    const auto a = c.m.next(now);
    now = std::max(now, a.at);
    if (a.kind == action_kind::claim_sync) {
      ++claims;
      c.m.on_etcd_failed(now + ms(10));
      now += ms(10);
    } else {
      ASSERT_EQ(a.kind, action_kind::keepalive) << ha::to_string(a.kind);
      ++renewals;
      c.m.on_keepalive(now + ms(1), now, ms(1000));
      now += ms(1);
    }
    EXPECT_FALSE(c.m.serving(now)) << "served before /sync named it";
  }
  EXPECT_GT(claims, 5);
  EXPECT_GE(renewals, 3);  // every 200 ms, claims or not
  EXPECT_EQ(c.m.current(), role::leader) << "fenced: the renewals stopped";
  EXPECT_GT(c.m.last_renewal_sent(), at(400));
  ASSERT_EQ(c.m.next(now).kind, action_kind::claim_sync);
  c.m.on_sync_claimed(now, true);
  EXPECT_TRUE(c.m.serving(now));
}

TEST(SyncClaim, AClaimWhoseFenceFailsReadsTheKeysAndStandsBy) {
  claiming c;
  c.win();
  ASSERT_EQ(c.m.next(at(2)).kind, action_kind::claim_sync);
  c.m.on_sync_claimed(at(3), false);
  EXPECT_FALSE(c.m.serving(at(3)));
  ASSERT_EQ(c.m.next(at(3)).kind, action_kind::observe);
  c.m.on_observed(at(4), ha::holder{120, 9, "other"}, std::nullopt, 130);
  EXPECT_EQ(c.m.current(), role::standby);
  EXPECT_FALSE(c.m.serving(at(4)));
}

TEST(SyncClaim, AResumedLeaderDoesNotClaimAgainForTheSameEpoch) {
  claiming c;
  c.win();
  c.m.next(at(2));
  c.m.on_sync_claimed(at(3), true);
  // Renewals fail until the deadline: fenced; a late renewal and a read bring it back.
  EXPECT_EQ(c.m.next(at(850)).kind, action_kind::keepalive);
  EXPECT_EQ(c.m.current(), role::fenced);
  c.m.on_keepalive(at(900), at(860), ms(1000));
  ASSERT_EQ(c.m.next(at(900)).kind, action_kind::observe);
  c.m.on_observed(at(901), ha::holder{100, 7, "me"}, std::nullopt, 140);
  EXPECT_EQ(c.m.current(), role::leader);
  EXPECT_TRUE(c.m.serving(at(901)));
  EXPECT_EQ(c.m.next(at(901)).kind, action_kind::keepalive);
}

TEST(SyncClaim, TheValueALeaderWritesLetsOnlyItCampaign) {
  const std::string sync = ha::sync_value(100, "a");
  EXPECT_EQ(sync, R"({"epoch":100,"leader":"a","sync":[]})");
  EXPECT_TRUE(ha::listed_in_sync(sync, "a"));
  EXPECT_FALSE(ha::listed_in_sync(sync, "b"));
  EXPECT_TRUE(ha::listed_in_sync(std::nullopt, "b"));  // a fresh cluster: anyone
}

TEST(SyncClaim, AStandbyInSyncMayCampaignToo) {
  const std::string sync = ha::sync_value(100, "a", {"b"});
  EXPECT_EQ(sync, R"({"epoch":100,"leader":"a","sync":["b"]})");
  EXPECT_TRUE(ha::listed_in_sync(sync, "a"));
  EXPECT_TRUE(ha::listed_in_sync(sync, "b"));
  EXPECT_FALSE(ha::listed_in_sync(sync, "c"));
  EXPECT_EQ(ha::sync_value(7, "a", {"b", "c"}), R"({"epoch":7,"leader":"a","sync":["b","c"]})");
}

TEST(SyncClaim, LeaderValuesAreReadForTheirNodeAndAddress) {
  const auto info = ha::parse_leader_value(R"({"node":"b","http":"http://10.0.0.2:18000"})");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->node, "b");
  EXPECT_EQ(info->http, "http://10.0.0.2:18000");
  EXPECT_EQ(info->repl, "");
  const auto with_repl = ha::parse_leader_value(
      R"({"node":"b","http":"http://10.0.0.2:18000","repl":"10.0.0.2:18200"})");
  ASSERT_TRUE(with_repl);
  EXPECT_EQ(with_repl->repl, "10.0.0.2:18200");
  const auto bare = ha::parse_leader_value(R"({"node":"c"})");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->node, "c");
  EXPECT_EQ(bare->http, "");
  EXPECT_FALSE(ha::parse_leader_value("not json"));
  EXPECT_FALSE(ha::parse_leader_value(R"(["node"])"));
}

}  // namespace
