// The leadership state machine on a fake clock: campaign, renewal, the fencing deadline
// (counted from the keepalive's send time), resumption, demotion, the /sync predicate,
// the watch. The randomised simulation is in leadership_simulation_test.cpp.
#include "ha/leadership.hpp"

#include <gtest/gtest.h>

#include "fake_time.hpp"

#include <vector>

using namespace metad;

namespace {

using ha::action_kind;
using ha::role;
using std::chrono::milliseconds;
using ms = milliseconds;

using ha::fake_time::at;
using ha::fake_time::t0;

ha::timing default_timing() { return ha::timing{}; }  // TTL 1 s, renew 200, margin 150

struct fixture {
  std::vector<std::optional<std::string>> asked;  // what the predicate saw
  bool allow = true;
  ha::leadership m{default_timing(),
                   [this](const std::optional<std::string>& sync) {
                     asked.push_back(sync);
                     return allow;
                   },
                   t0};

  // Drives a fresh node to leadership: observe (no key), grant at `grant_sent`, win.
  void win(std::int64_t lease = 7, std::int64_t epoch = 100, ha::time_point grant_sent = t0) {
    ASSERT_EQ(m.next(t0).kind, action_kind::observe);
    m.on_observed(t0, std::nullopt, std::nullopt, 99);
    ASSERT_EQ(m.next(t0).kind, action_kind::grant);
    m.on_granted(grant_sent + ms(1), grant_sent, lease, ms(1000));
    ASSERT_EQ(m.next(grant_sent + ms(1)).kind, action_kind::campaign);
    m.on_campaign(grant_sent + ms(2), ha::holder{epoch, lease, "me"}, epoch);
    ASSERT_EQ(m.current(), role::leader);
  }
};

TEST(Leadership, StartsAsCandidateReadingTheKeys) {
  fixture f;
  EXPECT_EQ(f.m.current(), role::candidate);
  const auto a = f.m.next(t0);
  EXPECT_EQ(a.kind, action_kind::observe);
  EXPECT_EQ(a.at, t0);
  EXPECT_FALSE(f.m.serving(t0));
}

TEST(Leadership, WinsAnEmptyKeyAndServesUntilGrantSendPlusTtlMinusMargin) {
  fixture f;
  f.win(7, 100, t0);
  EXPECT_EQ(f.m.epoch(), 100);
  EXPECT_EQ(f.m.lease(), 7);
  EXPECT_EQ(f.m.serving_until(), at(850));
  EXPECT_TRUE(f.m.serving(at(849)));
  EXPECT_FALSE(f.m.serving(at(850)));
  const auto a = f.m.next(at(2));
  EXPECT_EQ(a.kind, action_kind::keepalive);
  EXPECT_EQ(a.at, at(200));
}

TEST(Leadership, RenewalCountsFromTheSendTimeNotTheAnswer) {
  fixture f;
  f.win();
  // Sent at 200, answered 400 ms later: the lease ran from no later than 200.
  f.m.on_keepalive(at(600), at(200), ms(1000));
  EXPECT_EQ(f.m.serving_until(), at(1050));
  EXPECT_EQ(f.m.last_renewal_sent(), at(200));
  EXPECT_EQ(f.m.next(at(600)).at, at(400));  // the next renewal is already due
  // A TTL etcd raised (its minimum) lengthens the deadline accordingly.
  f.m.on_keepalive(at(700), at(650), ms(2000));
  EXPECT_EQ(f.m.serving_until(), at(2500));
}

TEST(Leadership, AnOlderAnswerNeverShortensTheDeadline) {
  fixture f;
  f.win();
  f.m.on_keepalive(at(410), at(400), ms(1000));
  f.m.on_keepalive(at(420), at(200), ms(1000));
  EXPECT_EQ(f.m.serving_until(), at(1250));
  EXPECT_EQ(f.m.last_renewal_sent(), at(400));
}

TEST(Leadership, UnreachableEtcdFencesAtTheDeadlineAndKeepsRetrying) {
  fixture f;
  f.win();
  ha::time_point now = at(200);
  while (now < at(850)) {
    const auto a = f.m.next(now);
    if (a.kind == action_kind::wait) {
      EXPECT_EQ(a.at, at(850));
      now = a.at;
      continue;
    }
    ASSERT_EQ(a.kind, action_kind::keepalive);
    now = std::max(now, a.at);
    EXPECT_EQ(f.m.current(), role::leader);
    EXPECT_TRUE(f.m.serving(now));
    f.m.on_etcd_failed(now + ms(60));  // a timeout later
    now += ms(60);
  }
  EXPECT_FALSE(f.m.serving(at(850)));
  const auto a = f.m.next(at(850));
  EXPECT_EQ(f.m.current(), role::fenced);
  EXPECT_EQ(a.kind, action_kind::keepalive);
  EXPECT_EQ(f.m.epoch(), 0);
  EXPECT_EQ(f.m.serving_until(), ha::time_point::min());
}

TEST(Leadership, WaitsUntilTheDeadlineWhenTheNextRenewalIsLater) {
  ha::timing t;
  t.retry_interval = ms(500);
  ha::leadership m(
      t, [](const auto&) { return true; }, t0);
  m.next(t0);
  m.on_observed(t0, std::nullopt, std::nullopt, 1);
  m.on_granted(t0, t0, 7, ms(1000));
  m.on_campaign(t0, ha::holder{2, 7, "me"}, 2);
  m.on_etcd_failed(at(700));  // retry at 1200, past the deadline at 850
  const auto a = m.next(at(700));
  EXPECT_EQ(a.kind, action_kind::wait);
  EXPECT_EQ(a.at, at(850));
  EXPECT_EQ(m.current(), role::leader);
  EXPECT_EQ(m.next(at(850)).kind, action_kind::keepalive);
  EXPECT_EQ(m.current(), role::fenced);
}

TEST(Leadership, FencedResumesAfterARenewalIfTheKeyIsStillItsOwn) {
  fixture f;
  f.win(7, 100);
  f.m.next(at(900));
  ASSERT_EQ(f.m.current(), role::fenced);
  f.m.on_keepalive(at(960), at(950), ms(1000));
  // Renewed, but not serving until the key is checked.
  EXPECT_EQ(f.m.current(), role::fenced);
  EXPECT_FALSE(f.m.serving(at(960)));
  EXPECT_EQ(f.m.next(at(960)).kind, action_kind::observe);
  f.m.on_observed(at(962), ha::holder{100, 7, "me"}, std::nullopt, 120);
  EXPECT_EQ(f.m.current(), role::leader);
  EXPECT_EQ(f.m.epoch(), 100);
  EXPECT_TRUE(f.m.serving(at(962)));
  EXPECT_EQ(f.m.serving_until(), at(1800));
  const auto a = f.m.next(at(962));
  EXPECT_EQ(a.kind, action_kind::keepalive);
  EXPECT_EQ(a.at, at(1150));
}

TEST(Leadership, FencedBecomesStandbyWhenTheKeyIsSomeoneElses) {
  fixture f;
  f.win(7, 100);
  f.m.next(at(900));
  f.m.on_keepalive(at(2010), at(2000), ms(1000));
  f.m.next(at(2010));
  f.m.on_observed(at(2012), ha::holder{150, 9, "other"}, std::nullopt, 160);
  EXPECT_EQ(f.m.current(), role::standby);
  EXPECT_FALSE(f.m.serving(at(2012)));
  EXPECT_EQ(f.m.lease(), 0);
  EXPECT_EQ(f.m.watch_revision(), 161);
  EXPECT_EQ(f.m.known_leader()->value, "other");
  EXPECT_EQ(f.m.next(at(2012)).kind, action_kind::watch);
}

TEST(Leadership, FencedWithTheKeyGoneBecomesStandbyThenMayCampaignAgain) {
  fixture f;
  f.win(7, 100);
  f.m.next(at(900));
  f.m.on_keepalive(at(960), at(950), ms(1000));
  f.m.next(at(960));
  f.m.on_observed(at(962), std::nullopt, std::nullopt, 130);
  EXPECT_EQ(f.m.current(), role::standby);
  EXPECT_EQ(f.m.next(at(962)).kind, action_kind::observe);
  f.m.on_observed(at(963), std::nullopt, std::nullopt, 130);
  EXPECT_EQ(f.m.current(), role::candidate);
  EXPECT_EQ(f.m.next(at(963)).kind, action_kind::grant);
}

TEST(Leadership, SameLeaseButAnotherEpochIsNotOurs) {
  fixture f;
  f.win(7, 100);
  f.m.next(at(900));
  f.m.on_keepalive(at(960), at(950), ms(1000));
  f.m.on_observed(at(962), ha::holder{140, 7, "me"}, std::nullopt, 150);
  EXPECT_EQ(f.m.current(), role::standby);
}

TEST(Leadership, AnExpiredLeaseDemotesALeaderOrFencedNode) {
  for (const bool fenced_first : {false, true}) {
    fixture f;
    f.win();
    if (fenced_first) f.m.next(at(900));
    f.m.on_keepalive(at(1000), at(990), ms(0));
    EXPECT_EQ(f.m.current(), role::standby) << fenced_first;
    EXPECT_EQ(f.m.lease(), 0);
    EXPECT_FALSE(f.m.serving(at(1000)));
    EXPECT_EQ(f.m.next(at(1000)).kind, action_kind::observe);
  }
}

TEST(Leadership, AnotherHolderMakesAStandbyThatWatchesFromTheNextRevision) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(at(1), ha::holder{50, 9, "b"}, std::nullopt, 60);
  EXPECT_EQ(f.m.current(), role::standby);
  EXPECT_TRUE(f.asked.empty());  // someone leads: no reason to ask
  EXPECT_EQ(f.m.watch_revision(), 61);
  const auto a = f.m.next(at(1));
  EXPECT_EQ(a.kind, action_kind::watch);
  EXPECT_EQ(a.at, at(1001));  // the recheck interval
  EXPECT_FALSE(f.m.serving(at(1)));
  EXPECT_EQ(f.m.epoch(), 0);
}

TEST(Leadership, OnlyNodesTheSyncPredicateAllowsCampaign) {
  fixture f;
  f.allow = false;
  f.m.next(t0);
  f.m.on_observed(at(1), std::nullopt, std::string("{\"sync\":[\"x\"]}"), 60);
  ASSERT_EQ(f.asked.size(), 1u);
  EXPECT_EQ(f.asked[0], std::string("{\"sync\":[\"x\"]}"));
  EXPECT_EQ(f.m.current(), role::standby);
  EXPECT_EQ(f.m.next(at(1)).kind, action_kind::watch);
  // Re-read after the recheck interval; now listed.
  EXPECT_EQ(f.m.next(at(1001)).kind, action_kind::observe);
  f.allow = true;
  f.m.on_observed(at(1002), std::nullopt, std::string("{\"sync\":[\"me\"]}"), 61);
  EXPECT_EQ(f.m.current(), role::candidate);
  EXPECT_EQ(f.m.next(at(1002)).kind, action_kind::grant);
}

TEST(Leadership, ALostCampaignMakesAStandbyAndDropsTheLease) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(t0, std::nullopt, std::nullopt, 10);
  f.m.on_granted(at(1), t0, 7, ms(1000));
  f.m.on_campaign(at(2), ha::holder{11, 8, "b"}, 11);
  EXPECT_EQ(f.m.current(), role::standby);
  EXPECT_EQ(f.m.lease(), 0);
  EXPECT_EQ(f.m.watch_revision(), 12);
  EXPECT_EQ(f.m.known_leader()->lease, 8);
  EXPECT_FALSE(f.m.serving(at(2)));
}

TEST(Leadership, ACampaignWhoseAnswerWasLostIsFoundByItsLease) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(t0, std::nullopt, std::nullopt, 10);
  f.m.next(t0);
  f.m.on_granted(at(1), t0, 7, ms(1000));
  ASSERT_EQ(f.m.next(at(1)).kind, action_kind::campaign);
  f.m.on_etcd_failed(at(300));
  EXPECT_EQ(f.m.current(), role::candidate);
  const auto a = f.m.next(at(300));
  EXPECT_EQ(a.kind, action_kind::observe);
  EXPECT_EQ(a.at, at(350));
  f.m.on_observed(at(351), ha::holder{11, 7, "me"}, std::nullopt, 11);
  EXPECT_EQ(f.m.current(), role::leader);
  EXPECT_EQ(f.m.epoch(), 11);
  EXPECT_EQ(f.m.serving_until(), at(850));  // still counted from the grant's send time
}

TEST(Leadership, ACampaignAnsweredAfterTheGrantsDeadlineDoesNotServe) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(t0, std::nullopt, std::nullopt, 10);
  f.m.on_granted(at(1), t0, 7, ms(1000));
  f.m.on_campaign(at(900), ha::holder{11, 7, "me"}, 11);
  EXPECT_FALSE(f.m.serving(at(900)));
  f.m.next(at(900));
  EXPECT_EQ(f.m.current(), role::fenced);
}

TEST(Leadership, FailedReadsAndGrantsRetryTheRead) {
  fixture f;
  f.m.next(t0);
  f.m.on_etcd_failed(at(5));
  auto a = f.m.next(at(5));
  EXPECT_EQ(a.kind, action_kind::observe);
  EXPECT_EQ(a.at, at(55));
  f.m.on_observed(at(55), std::nullopt, std::nullopt, 3);
  ASSERT_EQ(f.m.next(at(55)).kind, action_kind::grant);
  f.m.on_etcd_failed(at(60));
  a = f.m.next(at(60));
  EXPECT_EQ(a.kind, action_kind::observe);  // never a campaign without a lease
  EXPECT_EQ(f.m.current(), role::candidate);
}

TEST(Leadership, ADeleteSeenByTheWatchRereadsBeforeCampaigning) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(at(1), ha::holder{50, 9, "b"}, std::nullopt, 60);
  f.m.on_leader_deleted(at(500), 70);
  EXPECT_EQ(f.m.watch_revision(), 71);
  EXPECT_FALSE(f.m.known_leader().has_value());
  const auto a = f.m.next(at(500));
  EXPECT_EQ(a.kind, action_kind::observe);
  EXPECT_EQ(a.at, at(500));
  f.m.on_observed(at(501), std::nullopt, std::nullopt, 70);
  EXPECT_EQ(f.m.next(at(501)).kind, action_kind::grant);
}

TEST(Leadership, APutSeenByTheWatchUpdatesTheKnownLeader) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(at(1), ha::holder{50, 9, "b"}, std::nullopt, 60);
  f.m.on_leader_put(at(10), ha::holder{65, 12, "c"}, 65);
  EXPECT_EQ(f.m.current(), role::standby);
  EXPECT_EQ(f.m.known_leader()->value, "c");
  EXPECT_EQ(f.m.watch_revision(), 66);
  const auto a = f.m.next(at(10));
  EXPECT_EQ(a.kind, action_kind::watch);
  EXPECT_EQ(a.at, at(1001));  // the watch goes on
}

TEST(Leadership, ABrokenWatchRereadsAfterTheRetryInterval) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(at(1), ha::holder{50, 9, "b"}, std::nullopt, 60);
  f.m.on_watch_broken(at(20));
  const auto a = f.m.next(at(20));
  EXPECT_EQ(a.kind, action_kind::observe);
  EXPECT_EQ(a.at, at(70));
}

TEST(Leadership, ALeaderSeeingItsKeyReplacedChecksIt) {
  fixture f;
  f.win(7, 100);
  f.m.on_leader_put(at(10), ha::holder{100, 7, "me"}, 101);  // its own key: nothing to do
  EXPECT_EQ(f.m.next(at(10)).kind, action_kind::keepalive);
  f.m.on_leader_put(at(20), ha::holder{120, 9, "x"}, 120);
  EXPECT_EQ(f.m.next(at(20)).kind, action_kind::observe);
  f.m.on_observed(at(21), ha::holder{120, 9, "x"}, std::nullopt, 120);
  EXPECT_EQ(f.m.current(), role::standby);
}

TEST(Leadership, ALeaderWhoseKeyIsDeletedStopsServingAtOnce) {
  for (const bool fenced_first : {false, true}) {
    fixture f;
    f.win(7, 100);
    if (fenced_first) f.m.next(at(900));
    f.m.on_leader_deleted(at(300), 130);
    EXPECT_EQ(f.m.current(), role::standby);
    EXPECT_FALSE(f.m.serving(at(300)));
    EXPECT_EQ(f.m.lease(), 0);
    EXPECT_EQ(f.m.next(at(300)).kind, action_kind::observe);
    // The key is gone: it may campaign again (for a new epoch).
    f.m.on_observed(at(301), std::nullopt, std::nullopt, 130);
    EXPECT_EQ(f.m.next(at(301)).kind, action_kind::grant);
  }
}

TEST(Leadership, WatchEventsOlderThanWhatWasReadAreIgnored) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(at(1), std::nullopt, std::nullopt, 60);  // nobody leads at 60
  ASSERT_EQ(f.m.next(at(1)).kind, action_kind::grant);
  f.m.on_leader_deleted(at(2), 55);  // the stream catching up: already known
  EXPECT_EQ(f.m.next(at(2)).kind, action_kind::grant);
  f.m.on_granted(at(3), at(2), 7, ms(1000));
  f.m.on_campaign(at(4), ha::holder{61, 7, "me"}, 61);
  ASSERT_EQ(f.m.current(), role::leader);
  EXPECT_EQ(f.m.watch_revision(), 62);
  f.m.on_leader_deleted(at(5), 58);  // an older incarnation of the key
  f.m.on_leader_put(at(5), ha::holder{59, 3, "old"}, 59);
  EXPECT_EQ(f.m.current(), role::leader);
  EXPECT_TRUE(f.m.serving(at(5)));
  EXPECT_EQ(f.m.known_leader()->lease, 7);
}

TEST(Leadership, LateAnswersForAnotherRoleAreIgnored) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(at(1), ha::holder{50, 9, "b"}, std::nullopt, 60);
  f.m.on_keepalive(at(2), at(1), ms(1000));
  f.m.on_granted(at(3), at(2), 5, ms(1000));
  f.m.on_campaign(at(4), ha::holder{50, 5, "me"}, 60);
  EXPECT_EQ(f.m.current(), role::standby);
  EXPECT_FALSE(f.m.serving(at(4)));
}

// --- Foreign leader keys: written without a lease (by hand, or by an attacker with write
// access to etcd). They name no leader, never expire, and are removed after a grace.

TEST(Leadership, AKeyWithoutALeaseNamesNoLeaderAndIsRemovedAfterTheGrace) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(at(1), ha::holder{50, 0, "forged", 55}, std::string("{}"), 60);
  EXPECT_FALSE(f.m.known_leader().has_value());
  ASSERT_TRUE(f.m.foreign_key().has_value());
  EXPECT_EQ(f.m.foreign_key()->mod_revision, 55);
  EXPECT_EQ(f.m.foreign_keys_seen(), 1u);
  ASSERT_EQ(f.asked.size(), 1u);  // only a node that may lead removes it
  EXPECT_EQ(f.m.current(), role::candidate);
  // No TTL known yet: a grant first says what etcd grants.
  ASSERT_EQ(f.m.next(at(1)).kind, action_kind::grant);
  f.m.on_granted(at(3), at(2), 7, ms(1000));
  auto a = f.m.next(at(3));
  EXPECT_EQ(a.kind, action_kind::remove_foreign);
  EXPECT_EQ(a.at, at(2001));  // first seen at 1, + twice the TTL
  EXPECT_FALSE(f.m.serving(at(3)));
  // A re-read of the same key meanwhile keeps the time it was first seen.
  f.m.on_observed(at(1500), ha::holder{50, 0, "forged", 55}, std::nullopt, 61);
  EXPECT_EQ(f.m.next(at(1500)).at, at(2001));
  EXPECT_EQ(f.m.foreign_keys_seen(), 1u);
  f.m.on_foreign_removed(at(2002), true);
  EXPECT_FALSE(f.m.foreign_key().has_value());
  ASSERT_EQ(f.m.next(at(2002)).kind, action_kind::observe);
  f.m.on_observed(at(2003), std::nullopt, std::nullopt, 62);
  ASSERT_EQ(f.m.next(at(2003)).kind, action_kind::grant);  // a fresh lease: the first expired
  f.m.on_granted(at(2005), at(2004), 8, ms(1000));
  ASSERT_EQ(f.m.next(at(2005)).kind, action_kind::campaign);
  f.m.on_campaign(at(2006), ha::holder{63, 8, "me", 63}, 63);
  EXPECT_EQ(f.m.current(), role::leader);
  EXPECT_TRUE(f.m.serving(at(2006)));
}

TEST(Leadership, ALeaderWhoseKeyIsOverwrittenWithoutALeaseStandsByThenRemovesIt) {
  fixture f;
  f.win(7, 100);
  // The watch shows the overwrite (same create_revision, no lease).
  f.m.on_leader_put(at(10), ha::holder{100, 0, "forged", 130}, 130);
  EXPECT_FALSE(f.m.known_leader().has_value());
  ASSERT_EQ(f.m.next(at(10)).kind, action_kind::observe);
  f.m.on_observed(at(11), ha::holder{100, 0, "forged", 130}, std::nullopt, 131);
  // Deposed: it stops serving and says it is a standby (for one step) before it deals
  // with the key.
  EXPECT_EQ(f.m.current(), role::standby);
  EXPECT_FALSE(f.m.serving(at(11)));
  EXPECT_EQ(f.m.lease(), 0);
  ASSERT_EQ(f.m.next(at(11)).kind, action_kind::observe);
  f.m.on_observed(at(12), ha::holder{100, 0, "forged", 130}, std::nullopt, 131);
  EXPECT_EQ(f.m.current(), role::candidate);
  const auto a = f.m.next(at(12));
  EXPECT_EQ(a.kind, action_kind::remove_foreign);  // the TTL is known from its own grant
  EXPECT_EQ(a.at, at(2012));
}

TEST(Leadership, ARenewalCountsOnlyWhileTheKeyIsStillItsOwn) {
  {
    fixture f;
    f.win(7, 100);
    f.m.on_renewed(at(210), at(200), ms(1000), ha::holder{100, 7, "me", 101}, std::nullopt, 140);
    EXPECT_EQ(f.m.serving_until(), at(1050));
    EXPECT_EQ(f.m.current(), role::leader);
  }
  // Overwritten without a lease (the watch has not said so yet): the lease lives, but
  // the deadline does not move and the node stops at once.
  for (const bool fenced_first : {false, true}) {
    fixture f;
    f.win(7, 100);
    if (fenced_first) f.m.next(at(900));
    f.m.on_renewed(at(910), at(900), ms(1000), ha::holder{100, 0, "forged", 130}, std::nullopt,
                   140);
    EXPECT_EQ(f.m.current(), role::standby) << fenced_first;
    EXPECT_FALSE(f.m.serving(at(910)));
    EXPECT_EQ(f.m.serving_until(), ha::time_point::min());
    EXPECT_EQ(f.m.next(at(910)).kind, action_kind::observe);
  }
  // Deleted, or someone else's.
  for (const auto& key :
       {std::optional<ha::holder>{}, std::optional<ha::holder>{ha::holder{150, 9, "other", 150}}}) {
    fixture f;
    f.win(7, 100);
    f.m.on_renewed(at(210), at(200), ms(1000), key, std::nullopt, 160);
    EXPECT_EQ(f.m.current(), role::standby);
    EXPECT_FALSE(f.m.serving(at(210)));
  }
  // An expired lease needs no key.
  fixture f;
  f.win(7, 100);
  f.m.on_renewed(at(210), at(200), ms(0), std::nullopt, std::nullopt, 0);
  EXPECT_EQ(f.m.current(), role::standby);
}

TEST(Leadership, ANodeThatMayNotLeadLeavesAForeignKeyAndWatches) {
  fixture f;
  f.allow = false;
  f.m.next(t0);
  f.m.on_observed(at(1), ha::holder{50, 0, "forged", 55}, std::string("{}"), 60);
  EXPECT_EQ(f.m.current(), role::candidate);  // no leader to follow
  EXPECT_FALSE(f.m.serving(at(1)));
  EXPECT_TRUE(f.m.foreign_key().has_value());  // still reported
  EXPECT_EQ(f.m.next(at(1)).kind, action_kind::watch);
  EXPECT_EQ(f.m.next(at(5000)).kind, action_kind::observe);  // the recheck
  f.m.on_observed(at(5000), ha::holder{50, 0, "forged", 55}, std::string("{}"), 60);
  EXPECT_EQ(f.m.next(at(5000)).kind, action_kind::watch);
  EXPECT_EQ(f.m.foreign_keys_seen(), 1u);
  // Removed by the node that may lead: still no leader to follow, still a candidate.
  f.m.on_leader_deleted(at(5100), 61);
  ASSERT_EQ(f.m.next(at(5100)).kind, action_kind::observe);
  f.m.on_observed(at(5101), std::nullopt, std::string("{}"), 61);
  EXPECT_EQ(f.m.current(), role::candidate);
  EXPECT_FALSE(f.m.foreign_key().has_value());
  // That node won: this one reads it at once and stands by for it (a role change, which
  // a standby's replication follows).
  f.m.on_leader_put(at(5200), ha::holder{62, 9, "b", 62}, 62);
  ASSERT_EQ(f.m.next(at(5200)).kind, action_kind::observe);
  f.m.on_observed(at(5201), ha::holder{62, 9, "b", 62}, std::string("{}"), 62);
  EXPECT_EQ(f.m.current(), role::standby);
}

TEST(Leadership, AForeignKeyWrittenAgainRestartsTheGrace) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(at(1), ha::holder{50, 0, "forged", 55}, std::nullopt, 60);
  f.m.on_granted(at(3), at(2), 7, ms(1000));
  f.m.on_leader_put(at(1000), ha::holder{50, 0, "again", 70}, 70);
  ASSERT_EQ(f.m.next(at(1000)).kind, action_kind::observe);
  f.m.on_observed(at(1001), ha::holder{50, 0, "again", 70}, std::nullopt, 70);
  EXPECT_EQ(f.m.foreign_keys_seen(), 2u);
  const auto a = f.m.next(at(1001));
  EXPECT_EQ(a.kind, action_kind::remove_foreign);
  EXPECT_EQ(a.at, at(3001));
  // The compare-and-delete finds it changed once more: read again, decide again.
  f.m.on_foreign_removed(at(3002), false);
  EXPECT_EQ(f.m.next(at(3002)).kind, action_kind::observe);
  f.m.on_observed(at(3003), ha::holder{80, 9, "b", 80}, std::nullopt, 80);  // a real leader
  EXPECT_EQ(f.m.current(), role::standby);
  EXPECT_FALSE(f.m.foreign_key().has_value());
  EXPECT_EQ(f.m.known_leader()->lease, 9);
}

TEST(Leadership, AForeignKeyDeletedMeanwhileLetsTheNodeCampaignAtOnce) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(at(1), ha::holder{50, 0, "forged", 55}, std::nullopt, 60);
  ASSERT_EQ(f.m.next(at(1)).kind, action_kind::grant);
  f.m.on_leader_deleted(at(5), 61);  // an operator ran the etcdctl del the log printed
  EXPECT_FALSE(f.m.foreign_key().has_value());
  ASSERT_EQ(f.m.next(at(5)).kind, action_kind::observe);
  f.m.on_observed(at(6), std::nullopt, std::nullopt, 61);
  ASSERT_EQ(f.m.next(at(6)).kind, action_kind::grant);
  f.m.on_granted(at(8), at(7), 7, ms(1000));
  EXPECT_EQ(f.m.next(at(8)).kind, action_kind::campaign);
}

TEST(Leadership, TheGraceIsTwiceTheLongestTtlEtcdGranted) {
  fixture f;
  EXPECT_EQ(f.m.foreign_grace(), ms(2000));
  f.m.next(t0);
  f.m.on_observed(at(1), ha::holder{50, 0, "forged", 55}, std::nullopt, 60);
  f.m.on_granted(at(3), at(2), 7, ms(2000));  // a stock etcd's minimum
  EXPECT_EQ(f.m.foreign_grace(), ms(4000));
  EXPECT_EQ(f.m.next(at(3)).at, at(4001));
}

TEST(Leadership, AKeyUnderALiveLeaseIsAHolderWhateverItsValue) {
  fixture f;
  f.m.next(t0);
  f.m.on_observed(at(1), ha::holder{50, 9, "not json", 50}, std::nullopt, 60);
  EXPECT_EQ(f.m.current(), role::standby);
  EXPECT_FALSE(f.m.foreign_key().has_value());
  EXPECT_EQ(f.m.known_leader()->value, "not json");
  EXPECT_EQ(f.m.next(at(1)).kind, action_kind::watch);
}

}  // namespace
