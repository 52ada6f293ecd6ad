// Reservation expiry, removal of confirmed keys, and the directory's side of delete and
// eviction (recency, leases, removals racing confirmations), on a fake clock: the time
// is an argument, so nothing here sleeps.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "keys.hpp"
#include "rank_table_helpers.hpp"
#include "shard/directory.hpp"
#include "shard/key_life.hpp"
#include "shard/rank_table.hpp"
#include "shard/reservation_queue.hpp"

namespace metad::shard {
namespace {

using namespace testing_helpers;

constexpr std::uint64_t kTtl = 600'000;

allocation allocate_at(rank_table& t, std::int64_t rank, const keys_t& keys, std::uint64_t now) {
  allocation a;
  EXPECT_TRUE(t.allocate(rank, keys, now, a.distinct, a.pages));
  return a;
}

// Every page released by expire() at now, by rank.
std::vector<std::pair<std::int64_t, V>> expire(rank_table& t, std::uint64_t now) {
  std::vector<std::pair<std::int64_t, V>> out;
  t.expire(now, [&](std::int64_t rank, std::span<const std::int64_t> pages) {
    out.emplace_back(rank, V(pages.begin(), pages.end()));
  });
  return out;
}

TEST(ReservationExpiry, ReservationPastItsTtlReturnsToThePool) {
  rank_table t;
  t.set_reservation_ttl(kTtl);
  t.initialize(0, 4);
  EXPECT_EQ(allocate_at(t, 0, {"a", "b"}, 1000).pages, (V{0, 1}));
  EXPECT_TRUE(expire(t, 1000 + kTtl - 1).empty());
  EXPECT_EQ(stats_tuple(*t.stats(0)), std::make_tuple(4, 2, 2, 0));
  const auto gone = expire(t, 1000 + kTtl);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0], std::make_pair(std::int64_t{0}, V{0, 1}));
  EXPECT_EQ(stats_tuple(*t.stats(0)), std::make_tuple(4, 4, 0, 0));
  EXPECT_EQ(t.expired_reservations(), 2u);
  // The key is forgotten: a confirm of the expired reservation is refused, and the key
  // gets a page anew.
  EXPECT_EQ(confirm(t, 0, {"a"}, {0}).outcome, confirm_outcome::bad_request);
  EXPECT_EQ(allocate_at(t, 0, {"b"}, 1000 + kTtl).pages, (V{0}));
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(ReservationExpiry, ConfirmedAndReleasedReservationsDoNotExpire) {
  rank_table t;
  t.set_reservation_ttl(kTtl);
  t.initialize(0, 4);
  allocate_at(t, 0, {"a", "b", "c"}, 0);
  ASSERT_EQ(confirm(t, 0, {"a"}, {0}, {1}).outcome, confirm_outcome::ok);  // a bound, b freed
  EXPECT_EQ(expire(t, kTtl), (std::vector<std::pair<std::int64_t, V>>{{0, V{2}}}));
  EXPECT_EQ(stats_tuple(*t.stats(0)), std::make_tuple(4, 3, 0, 1));
  EXPECT_EQ(confirmed(t, 0, {"a"}), (V{0}));
}

TEST(ReservationExpiry, AReReservedPageKeepsItsNewDeadline) {
  rank_table t;
  t.set_reservation_ttl(kTtl);
  t.initialize(0, 1);
  allocate_at(t, 0, {"a"}, 0);
  ASSERT_EQ(confirm(t, 0, {}, {}, {0}).outcome, confirm_outcome::ok);
  EXPECT_EQ(allocate_at(t, 0, {"a"}, 500).pages, (V{0}));  // same key, same page, later
  EXPECT_TRUE(expire(t, kTtl).empty());                    // the first entry is stale
  EXPECT_EQ(expire(t, kTtl + 500).size(), 1u);
}

TEST(ReservationExpiry, ZeroTtlKeepsReservations) {
  rank_table t;
  t.initialize(0, 2);
  allocate_at(t, 0, {"a"}, 0);
  EXPECT_TRUE(expire(t, ~std::uint64_t{0}).empty());
  EXPECT_EQ(stats_tuple(*t.stats(0)), std::make_tuple(2, 1, 1, 0));
}

TEST(ReservationExpiry, RestoredReservationGetsAFreshTtl) {
  rank_table t;
  t.set_reservation_ttl(kTtl);
  t.initialize(3, 4);
  ASSERT_TRUE(t.restore(3, "a", 2, false, 5000));
  ASSERT_TRUE(t.restore(3, "b", 1, true, 5000));
  EXPECT_TRUE(expire(t, 5000 + kTtl - 1).empty());
  EXPECT_EQ(expire(t, 5000 + kTtl), (std::vector<std::pair<std::int64_t, V>>{{3, V{2}}}));
  EXPECT_EQ(stats_tuple(*t.stats(3)), std::make_tuple(4, 3, 0, 1));
}

TEST(ReservationExpiry, ReplayedReleaseFreesOnlyReservedPages) {
  rank_table t;
  t.initialize(0, 4);
  allocate_at(t, 0, {"a", "b"}, 0);
  ASSERT_EQ(confirm(t, 0, {"a"}, {0}).outcome, confirm_outcome::ok);
  EXPECT_TRUE(t.release_reserved(0, V{0, 1, 3}));  // bound, reserved, free
  EXPECT_EQ(stats_tuple(*t.stats(0)), std::make_tuple(4, 3, 0, 1));
  EXPECT_FALSE(t.release_reserved(0, V{4}));
  EXPECT_FALSE(t.release_reserved(9, V{0}));
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(ReservationQueue, StaysWithinAConstantFactorOfLiveReservations) {
  // One live reservation at a time, a million made: the stale entries are compacted.
  reservation_queue q;
  std::uint64_t live_deadline = 0;
  auto live = [&](const reservation_queue::entry& e) { return e.deadline == live_deadline; };
  for (std::uint64_t i = 1; i <= 1'000'000; ++i) {
    live_deadline = i;
    q.push(0, i, 1, live);
    ASSERT_LE(q.size(), 2u * 1 + 64 + 1);
  }
  std::vector<std::uint32_t> expired;
  EXPECT_EQ(q.pop_due(~std::uint64_t{0}, live, [&](std::uint32_t p) { expired.push_back(p); }), 1u);
  EXPECT_EQ(q.size(), 0u);
}

TEST(RemoveConfirmed, DropsBoundKeysAndKeepsReservations) {
  rank_table t;
  t.initialize(0, 4);
  allocate_at(t, 0, {"a", "b", "c"}, 0);
  ASSERT_EQ(confirm(t, 0, {"a", "c"}, {0, 2}).outcome, confirm_outcome::ok);
  U removed;
  ASSERT_TRUE(t.remove_confirmed(0, keys_t{"c", "b", "x", "a", "c"}, removed));
  EXPECT_EQ(removed, (U{0, 3}));
  EXPECT_EQ(stats_tuple(*t.stats(0)), std::make_tuple(4, 3, 1, 0));
  EXPECT_EQ(confirmed(t, 0, {"a", "c"}), (V{-1, -1}));
  EXPECT_EQ(allocate_at(t, 0, {"b", "a"}, 0).pages, (V{1, 0}));  // b kept its page
  EXPECT_FALSE(t.remove_confirmed(5, keys_t{"a"}, removed));
  EXPECT_EQ(t.check_invariants(), "");
}

// A key confirmed by `ranks` ranks under tp_world_size `tp`.
void confirm_key(directory& d, std::string_view key, int ranks, int tp, std::uint64_t now) {
  for (int r = 0; r < ranks; ++r) d.add_confirmation(key, tp, now);
}

std::vector<std::string> take(directory& d, std::uint64_t now, std::size_t n) {
  std::vector<std::string> out;
  d.take_least_recent(now, n, [&](std::string_view k, std::uint64_t) { out.emplace_back(k); });
  return out;
}

const std::string kA(32, 'a'), kB(32, 'b'), kC(32, 'c');

TEST(DirectoryRemoval, BeginHidesTheKeyAndFinishDropsIt) {
  directory d;
  confirm_key(d, kA, 2, 2, 0);
  EXPECT_EQ(d.begin_removal(kA, 0), directory::removal::started);
  EXPECT_FALSE(d.complete(kA));
  EXPECT_EQ(d.begin_removal(kA, 0), directory::removal::busy);
  EXPECT_TRUE(d.finish_removal(kA, 2, 0));
  EXPECT_EQ(d.size(), 0u);
  EXPECT_EQ(d.begin_removal(kA, 0), directory::removal::absent);
  // A fresh confirmation starts the key anew, with the tp of now.
  EXPECT_TRUE(d.add_confirmation(kA, 1, 0));
  EXPECT_TRUE(d.complete(kA));
}

TEST(DirectoryRemoval, ConfirmationsDuringARemovalKeepTheKey) {
  directory d;
  confirm_key(d, "k", 1, 2, 0);
  ASSERT_EQ(d.begin_removal("k", 0), directory::removal::started);
  d.add_confirmation("k", 2, 0);              // a rank the removal had passed already
  EXPECT_FALSE(d.complete("k"));              // still hidden until the removal settles
  EXPECT_FALSE(d.finish_removal("k", 1, 0));  // one binding dropped, one new one stays
  EXPECT_EQ(d.size(), 1u);
  EXPECT_FALSE(d.complete("k"));  // 1 of 2
  d.add_confirmation("k", 2, 0);
  EXPECT_TRUE(d.complete("k"));
}

TEST(DirectoryRemoval, AConfirmationArrivingAfterItsBindingWasDroppedIsAbsorbed) {
  directory d;
  confirm_key(d, "k", 1, 1, 0);
  ASSERT_EQ(d.begin_removal("k", 0), directory::removal::started);
  // Two ranks dropped the key, but only one confirmation had reached the directory.
  EXPECT_TRUE(d.finish_removal("k", 2, 0));
  EXPECT_FALSE(d.add_confirmation("k", 1, 0));  // the late one: owed, absorbed
  EXPECT_EQ(d.size(), 0u);
  EXPECT_FALSE(d.complete("k"));
  EXPECT_TRUE(d.add_confirmation("k", 1, 0));  // a real new binding counts again
  EXPECT_TRUE(d.complete("k"));
}

TEST(DirectoryRemoval, AClearInBetweenLeavesNothingBehind) {
  directory d;
  confirm_key(d, "k", 1, 1, 0);
  ASSERT_EQ(d.begin_removal("k", 0), directory::removal::started);
  d.clear();
  EXPECT_FALSE(d.finish_removal("k", 3, 0));
  EXPECT_TRUE(d.add_confirmation("k", 1, 0));  // nothing owed
  EXPECT_TRUE(d.complete("k"));
}

TEST(DirectoryRemoval, AKeyCompletedDuringItsRemovalIsNotOfferedForEviction) {
  directory d;
  d.set_lru(true);
  confirm_key(d, kA, 1, 2, 0);  // 1 of 2: a delete begins
  ASSERT_EQ(d.begin_removal(kA, 0), directory::removal::started);
  d.add_confirmation(kA, 2, 1);  // the second rank completes it meanwhile
  EXPECT_TRUE(take(d, 2, 5).empty());
  // The delete dropped one binding; the other stays: 1 of 2, incomplete.
  EXPECT_FALSE(d.finish_removal(kA, 1, 3));
  EXPECT_TRUE(take(d, 4, 5).empty());  // incomplete: not evictable
  // A survivor that is complete is evictable again.
  confirm_key(d, kB, 1, 1, 5);
  ASSERT_EQ(d.begin_removal(kB, 5), directory::removal::started);
  d.add_confirmation(kB, 1, 6);
  EXPECT_FALSE(d.finish_removal(kB, 1, 7));
  EXPECT_EQ(take(d, 8, 5), (std::vector<std::string>{kB}));
}

TEST(DirectoryRemoval, CalledOffKeysGoBackInFrontOrBehind) {
  directory d;
  d.set_lru(true);
  confirm_key(d, kA, 1, 1, 1);
  confirm_key(d, kB, 1, 1, 2);
  confirm_key(d, kC, 1, 1, 3);
  std::vector<std::pair<std::string, std::uint64_t>> got;
  d.take_least_recent(4, 2, [&](std::string_view k, std::uint64_t used) {
    got.emplace_back(std::string(k), used);
  });
  ASSERT_EQ(got.size(), 2u);
  EXPECT_FALSE(d.complete(kA));  // hidden while an eviction holds it
  d.abort_removal(kB, got[1].second, true);
  d.abort_removal(kA, got[0].second, false);  // passed over: behind the others
  EXPECT_TRUE(d.complete(kA));
  EXPECT_EQ(take(d, 5, 5), (std::vector<std::string>{kB, kC, kA}));
}

TEST(DirectoryLease, ALeasedKeyIsNeitherDeletedNorEvictedUntilTheLeaseEnds) {
  for (bool lru : {false, true}) {
    SCOPED_TRACE(lru ? "lru" : "no lru");
    directory d;
    d.set_lru(lru);
    confirm_key(d, kA, 1, 1, 0);
    EXPECT_TRUE(d.use(kA, 100, 10'100));  // get_locations at 100, lease 10 s
    EXPECT_EQ(d.leased_count(10'099), 1u);
    EXPECT_EQ(d.begin_removal(kA, 10'099), directory::removal::leased);
    EXPECT_TRUE(take(d, 10'099, 5).empty());
    EXPECT_EQ(d.begin_removal(kA, 10'100), directory::removal::started);
    EXPECT_TRUE(d.finish_removal(kA, 1, 0));
  }
}

TEST(DirectoryLease, WithoutLruEndedLeasesAreSwept) {
  directory d;
  confirm_key(d, kA, 1, 1, 0);
  confirm_key(d, kB, 1, 1, 0);
  d.use(kA, 0, 50);
  d.use(kB, 10, 60);
  d.use(kA, 20, 70);  // renewed: now after kB in lease order
  d.sweep(60);
  EXPECT_EQ(d.leased_count(0), 1u);
  EXPECT_EQ(d.begin_removal(kB, 60), directory::removal::started);
  EXPECT_EQ(d.begin_removal(kA, 60), directory::removal::leased);
  d.sweep(70);
  EXPECT_EQ(d.leased_count(0), 0u);
}

// Ending leases is bounded work: a sweep ends at most sweep_batch of them, and each new
// lease ends two that are due, so no call stops the core however many come due at once.
TEST(KeyLife, SweepsEndBoundedNumbersOfLeases) {
  key_life life;
  const std::size_t many = 3 * key_life::sweep_batch;
  std::string key(32, '0');
  auto key_of = [&](std::size_t i) {
    for (int c = 0; c < 8; ++c)
      key[static_cast<std::size_t>(c)] = "0123456789abcdef"[(i >> (4 * c)) & 15];
    return as_parsed(key);
  };
  for (std::size_t i = 0; i < many; ++i) life.lease(key, key_of(i), 0, 100);
  EXPECT_EQ(life.size(), many);
  EXPECT_EQ(life.leased_count(100), 0u);  // counted exactly, swept or not
  life.sweep(100);
  EXPECT_EQ(life.size(), many - key_life::sweep_batch);
  life.lease(key, key_of(many), 100, 200);  // ends two more, then adds its own
  EXPECT_EQ(life.size(), many - key_life::sweep_batch - 2 + 1);
  life.sweep(100);
  life.sweep(100);
  EXPECT_EQ(life.size(), 1u);
  EXPECT_EQ(life.leased_count(100), 1u);
}

// After a peak, the few keys left move into storage of their size, in order and with
// their last use; while leases are queued, or too many keys are left, nothing moves.
TEST(KeyLife, ShrinksWhatAPeakLeftKeepingOrderAndTimes) {
  key_life life;
  life.set_lru(true);
  const std::size_t peak = 4 * key_life::shrink_nodes_min;
  auto name = [](std::size_t i) { return fmt::format("peak-key-{}", i); };
  for (std::size_t i = 0; i < peak; ++i) life.touch(name(i), as_parsed(name(i)), 1000 + i);
  EXPECT_FALSE(life.shrink_if_sparse());  // all in use
  for (std::size_t i = 0; i < peak; ++i)
    if (i % 64 != 0) life.forget(name(i));
  life.lease(name(0), as_parsed(name(0)), 5000, 6000);
  EXPECT_FALSE(life.shrink_if_sparse());  // a lease entry is queued
  life.sweep(6000);
  ASSERT_EQ(life.size(), peak / 64);
  EXPECT_GT(life.nodes_held(), peak);
  ASSERT_TRUE(life.shrink_if_sparse());
  EXPECT_LE(life.nodes_held(), peak / 64 + 1);
  EXPECT_EQ(life.verify(), "");
  std::vector<std::string> order;
  life.for_each_key([&](std::string_view k) {
    order.emplace_back(k);
    return true;
  });
  std::vector<std::string> expected;
  for (std::size_t i = 64; i < peak; i += 64) expected.push_back(name(i));
  expected.push_back(name(0));  // used last (its lease)
  EXPECT_EQ(order, expected);
  std::uint64_t used = 0, until = 0;
  ASSERT_TRUE(life.times(name(128), as_parsed(name(128)), used, until));
  EXPECT_EQ(used, 1128u);
  EXPECT_FALSE(life.shrink_if_sparse());  // nothing left to give back
}

TEST(KeyLife, AnExtendedLeaseRequeuedBehindLaterOnesIsCountedWhenItEnds) {
  key_life life;
  life.lease(kA, as_parsed(kA), 0, 100);
  life.lease(kA, as_parsed(kA), 50, 150);  // extended
  life.lease(kB, as_parsed(kB), 60, 160);
  life.sweep(100);  // a's entry came due: a is queued again by its new end, 150
  EXPECT_EQ(life.leased_count(149), 2u);
  EXPECT_EQ(life.leased_count(155), 1u);  // a ended, though b's later entry is queued first
  life.sweep(155);
  EXPECT_FALSE(life.leased(kA, 155));
  EXPECT_EQ(life.size(), 1u);  // without LRU tracking, a's node left on time
  EXPECT_EQ(life.leased_count(155), 1u);
}

TEST(KeyLife, AKeyThatLeavesBeforeItsLeaseIsSweptLeavesNothingCounted) {
  key_life life;
  life.set_lru(true);
  const std::string others[] = {std::string(32, '1'), std::string(32, '2'), std::string(32, '3'),
                                std::string(32, '4')};
  for (const std::string& k : others) life.lease(k, as_parsed(k), 0, 100);
  life.lease(kA, as_parsed(kA), 0, 100);
  life.forget(kA);  // its lease ended at 100, not swept yet (behind four others)
  EXPECT_EQ(life.leased_count(105), 0u);
  life.lease(kB, as_parsed(kB), 105, 205);  // ends two; must not take a's node yet
  EXPECT_EQ(life.leased_count(105), 1u);
  life.sweep(106);
  EXPECT_EQ(life.leased_count(106), 1u);
  EXPECT_EQ(life.leased_count(210), 0u);  // b ended, counted once
  life.sweep(210);
  EXPECT_EQ(life.leased_count(210), 0u);
  EXPECT_EQ(life.size(), 5u);  // LRU tracking keeps the keys still there
}

TEST(KeyLife, LeasesCountedExactlyAgainstAModel) {
  // Random leases (mostly one length, some shorter: out of order), extensions, keys
  // leaving, sweeps of any size: leased() and leased_count() agree with a plain map.
  for (bool lru : {false, true}) {
    SCOPED_TRACE(lru ? "lru" : "no lru");
    std::mt19937_64 rng(lru ? 7 : 11);
    key_life life;
    life.set_lru(lru);
    std::vector<std::string> keys;
    for (int i = 0; i < 64; ++i) {  // hex keys, and some others (a separate map)
      std::string k = i % 16 == 15 ? "key-" + std::to_string(i) : std::string(32, '0');
      if (i % 16 != 15) k[0] = "0123456789abcdef"[i % 16], k[1] = "0123456789abcdef"[i / 16];
      keys.push_back(std::move(k));
    }
    std::map<std::string, std::uint64_t> until;  // the model: key → end of its lease
    std::uint64_t now = 0;
    constexpr std::uint64_t kLength = 1000;
    for (int step = 0; step < 20000; ++step) {
      now += rng() % 40;
      const std::string& k = keys[rng() % keys.size()];
      switch (rng() % 8) {
        case 0:
          if (!life.leased(k, now)) {
            life.forget(k);
            until.erase(k);
          }
          break;
        case 1:
          life.sweep(now, rng() % 4);
          break;
        default: {
          const std::uint64_t end = now + (rng() % 10 == 0 ? rng() % kLength : kLength);
          life.lease(k, as_parsed(k), now, end);
          until[k] = std::max(until[k], end);
        }
      }
      const std::uint64_t at = now + rng() % (2 * kLength);
      std::size_t expected = 0;
      for (const auto& [key, end] : until) expected += end > at ? 1 : 0;
      ASSERT_EQ(life.leased_count(at), expected) << "step " << step;
      ASSERT_EQ(life.leased(k, now), until.count(k) != 0 && until[k] > now);
      ASSERT_EQ(life.verify(), "") << "step " << step;
    }
  }
}

TEST(DirectoryLease, LeasesAreCountedExactlyAsTheyAreExtendedAndEnd) {
  for (bool lru : {false, true}) {
    SCOPED_TRACE(lru ? "lru" : "no lru");
    directory d;
    d.set_lru(lru);
    confirm_key(d, kA, 1, 1, 0);
    confirm_key(d, kB, 1, 1, 0);
    d.use(kA, 10, 100);
    d.use(kB, 20, 110);
    d.use(kA, 90, 190);  // extended
    EXPECT_EQ(d.leased_count(99), 2u);
    EXPECT_EQ(d.leased_count(105), 2u);  // a's first entry is due, but a was extended
    EXPECT_EQ(d.leased_count(110), 1u);  // b ended, not swept yet
    d.sweep(110);
    EXPECT_EQ(d.leased_count(110), 1u);
    d.use(kB, 120, 200);  // b leased anew
    EXPECT_EQ(d.leased_count(150), 2u);
    d.sweep(200);
    EXPECT_EQ(d.leased_count(200), 0u);
    EXPECT_EQ(d.begin_removal(kA, 200), directory::removal::started);
  }
}

TEST(DirectoryLease, UseEachAnswersAndLeasesAsUseDoesKeyByKey) {
  // More keys than a prefetch group, hex and not, complete, incomplete and absent; only
  // the indices asked are looked up and written.
  directory grouped, single;
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i) {
    std::string k = i % 7 == 3 ? "other-" + std::to_string(i) : std::string(32, 'a');
    if (i % 7 != 3) k[0] = "0123456789abcdef"[i % 16], k[1] = "0123456789abcdef"[i / 16];
    keys.push_back(k);
    if (i % 5 == 4) continue;              // absent
    const int ranks = i % 3 == 2 ? 1 : 2;  // else incomplete: confirmed by 1 of 2
    for (directory* d : {&grouped, &single}) confirm_key(*d, k, ranks, 2, 0);
  }
  const std::vector<std::string_view> views(keys.begin(), keys.end());
  std::vector<std::uint32_t> at;
  for (std::uint32_t i = 1; i < keys.size(); i += 2) at.push_back(i);
  std::vector<std::uint8_t> used(keys.size(), 9);
  grouped.use_each(views, at, 10, 100, used);
  std::size_t complete = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE(keys[i]);
    if (i % 2 == 0) {
      EXPECT_EQ(used[i], 9) << "not asked, not written";
      continue;
    }
    const bool expected = single.use(keys[i], 10, 100);
    EXPECT_EQ(used[i], expected ? 1 : 0);
    complete += expected ? 1 : 0;
  }
  EXPECT_GT(complete, 0u);
  EXPECT_EQ(grouped.leased_count(50), complete);
  EXPECT_EQ(grouped.leased_count(50), single.leased_count(50));
}

TEST(DirectoryLease, AddConfirmationsCountsAsAddConfirmationDoesKeyByKey) {
  // Repeated keys (the second counts again), non-hex keys, keys already there, and
  // keys outside `at`; with LRU tracking, recency follows the same order.
  for (bool lru : {false, true}) {
    SCOPED_TRACE(lru ? "lru" : "no lru");
    directory grouped, single;
    grouped.set_lru(lru);
    single.set_lru(lru);
    std::vector<std::string> keys;
    for (int i = 0; i < 40; ++i) {
      std::string k = i % 9 == 4 ? "other-" + std::to_string(i % 20) : std::string(32, 'c');
      if (i % 9 != 4)
        k[0] = "0123456789abcdef"[i % 20 % 16], k[1] = "0123456789abcdef"[i % 20 / 16];
      keys.push_back(k);
    }
    for (directory* d : {&grouped, &single}) confirm_key(*d, keys[3], 1, 2, 0);
    const std::vector<std::string_view> views(keys.begin(), keys.end());
    std::vector<std::uint32_t> at;
    for (std::uint32_t i = 0; i < keys.size(); ++i)
      if (i % 7 != 6) at.push_back(i);
    std::vector<std::uint8_t> entered(keys.size(), 9);
    grouped.add_confirmations(views, at, 2, 5, entered);
    std::vector<std::uint8_t> expected(keys.size(), 9);
    for (const std::uint32_t i : at) expected[i] = single.add_confirmation(keys[i], 2, 5) ? 1 : 0;
    EXPECT_EQ(entered, expected);
    for (const std::string& k : keys) EXPECT_EQ(grouped.complete(k), single.complete(k)) << k;
    std::vector<std::uint64_t> a, b;
    grouped.oldest_used(6, 100, a);
    single.oldest_used(6, 100, b);
    EXPECT_EQ(a, b);
  }
}

TEST(DirectoryLru, TakesTheLeastRecentlyUsedCompleteKeysFirst) {
  directory d;
  d.set_lru(true);
  confirm_key(d, kA, 2, 2, 1);  // complete at 1
  confirm_key(d, kB, 2, 2, 2);
  confirm_key(d, kC, 1, 2, 3);  // incomplete: being written, never taken
  confirm_key(d, "other", 1, 1, 4);
  EXPECT_TRUE(d.use(kA, 5, 0));  // batch_exists hit: a is now the most recent
  std::vector<std::uint64_t> used;
  d.oldest_used(6, 10, used);
  EXPECT_EQ(used, (std::vector<std::uint64_t>{2, 4, 5}));
  EXPECT_EQ(take(d, 6, 2), (std::vector<std::string>{kB, "other"}));
  EXPECT_FALSE(d.complete(kB));  // being removed
  d.add_confirmation(kC, 2, 7);  // c completes at 7
  EXPECT_EQ(take(d, 8, 5), (std::vector<std::string>{kA, kC}));
  EXPECT_TRUE(take(d, 8, 5).empty());
}

TEST(DirectoryLru, LeasedKeysAreSkippedAndMovedBehind) {
  directory d;
  d.set_lru(true);
  confirm_key(d, kA, 1, 1, 1);
  confirm_key(d, kB, 1, 1, 2);
  d.use(kA, 3, 100);  // leased until 100
  EXPECT_EQ(take(d, 50, 2), (std::vector<std::string>{kB}));
  EXPECT_EQ(take(d, 100, 2), (std::vector<std::string>{kA}));
}

// On several cores an eviction first asks each core for the last uses of its oldest keys
// (oldest_used), then, after hopping, takes its quota (take_least_recent). A reader may
// lease a key in between: the take must still pass it over.
TEST(DirectoryLru, AKeyLeasedBetweenTheCountAndTheTakeIsPassedOver) {
  directory d;
  d.set_lru(true);
  confirm_key(d, kA, 1, 1, 1);
  confirm_key(d, kB, 1, 1, 2);
  confirm_key(d, kC, 1, 1, 3);
  std::vector<std::uint64_t> times;
  d.oldest_used(4, 3, times);
  ASSERT_EQ(times, (std::vector<std::uint64_t>{1, 2, 3}));  // the quota: all three
  ASSERT_TRUE(d.use(kA, 5, 100));                           // leased meanwhile
  ASSERT_TRUE(d.use(kB, 5, 100));
  EXPECT_EQ(take(d, 6, 3), (std::vector<std::string>{kC}));
  EXPECT_TRUE(d.complete(kA));
  EXPECT_TRUE(d.complete(kB));
}

TEST(DirectoryLru, RecoveredKeysAreTracked) {
  directory d;
  d.set_lru(true);
  d.restore(kA, 2, 2, 10);
  d.restore(kB, 2, 1, 10);  // incomplete
  EXPECT_EQ(take(d, 20, 5), (std::vector<std::string>{kA}));
}

TEST(KeyLife, NonHexKeysLiveBesideHexOnes) {
  key_life life;
  life.set_lru(true);
  const std::string sha(64, 'f');
  life.touch("plain key", as_parsed("plain key"), 1);
  life.touch(sha, as_parsed(sha), 2);
  life.touch(kA, as_parsed(kA), 3);
  life.lease("plain key", as_parsed("plain key"), 4, 9);
  EXPECT_TRUE(life.leased("plain key", 8));
  EXPECT_FALSE(life.leased(sha, 0));
  std::vector<std::string> got;
  life.take_oldest(10, 10, [&](std::string_view k, std::uint64_t) {
    got.emplace_back(k);
    return key_life::offer::take;
  });
  EXPECT_EQ(got, (std::vector<std::string>{sha, kA, "plain key"}));
  EXPECT_EQ(life.size(), 0u);
  life.touch("again", as_parsed("again"), 11);  // nodes are reused
  EXPECT_EQ(life.size(), 1u);
}

}  // namespace
}  // namespace metad::shard
