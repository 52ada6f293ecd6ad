// End-to-end: saves into pools far smaller than the working set with --eviction lru, on
// a 3-core server, while other clients read (taking leases) and delete finished keys.
// Every save must eventually be served, no page may serve two live keys, and no key may
// be left half-present: at the end every rank holds exactly the complete keys (see save()
// for why that holds).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "metad_client.hpp"
#include "server_process.hpp"

namespace e2e {
namespace {

constexpr int kRanks = 4;
constexpr std::int64_t kPages = 96;
constexpr int kSavers = 6;
constexpr int kTasks = 60;    // per saver
constexpr int kTaskKeys = 4;  // keys per save task
constexpr int kKeys = kSavers * kTasks * kTaskKeys;

std::string key_of(int saver, int task, int j) {
  return make_key(static_cast<std::uint64_t>(task * kTaskKeys + j),
                  static_cast<std::uint64_t>(saver + 1));
}

std::vector<std::string> task_keys(int saver, int task) {
  std::vector<std::string> keys;
  for (int j = 0; j < kTaskKeys; ++j) keys.push_back(key_of(saver, task, j));
  return keys;
}

// One save task: its keys allocated on every rank, each rank retried while its pool is
// out of evictable keys (the other savers' keys complete meanwhile), then confirmed on
// every rank. Returns the -1 answers seen.
//
// Every rank allocates before any confirms (a TP group's workers allocate together), so
// from the first confirmation to the last each rank that has not confirmed yet holds a
// reservation for the keys (--reservation-ttl, 600 s, outlasts the test), and that keeps
// them whole. Eviction and delete remove a key on every rank (src/pipeline/removal.cpp):
// a rank keeps it only if it confirms after the removal passed its core. A complete key
// gets no later confirmation (no key is saved twice). An incomplete key is taken only if
// no rank reserved it when reclaim_incomplete's walk looked at that rank's core
// (mark_reserved), before the removal passed it: a rank confirming later had allocated
// already, so it held a reservation then, and the key was not taken.
// A save that went rank after rank (rank r + 1 allocating only once rank r confirmed,
// retrying while its pool is full) would leave keys confirmed on the first ranks that no
// rank reserves: eviction takes those rather than answer -1 (docs/operations.md), and
// the later ranks then bind a key the first ones lost, incomplete until it is reclaimed
// as stale (Stale.AnEvictionBetweenTwoRanksOfASaveLeavesItsKeyOnTheLaterRanksOnly).
int save(metad_client& c, const std::vector<std::string>& keys) {
  int refused = 0;
  std::vector<std::vector<key_page>> pages(kRanks);
  for (int rank = 0; rank < kRanks; ++rank) {
    for (int attempt = 0;; ++attempt) {
      std::vector<key_page> got = c.batch_allocate(rank, keys);
      EXPECT_EQ(got.size(), keys.size());
      bool all = true;
      for (const key_page& kp : got) all = all && kp.page >= 0 && kp.page < kPages;
      if (all) {
        pages[static_cast<std::size_t>(rank)] = std::move(got);
        break;
      }
      ++refused;
      EXPECT_LT(attempt, 2000) << "rank " << rank << " never got room";
      if (attempt >= 2000) return refused;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  for (int rank = 0; rank < kRanks; ++rank)
    c.confirm_write(rank, pages[static_cast<std::size_t>(rank)]);
  return refused;
}

TEST(EvictionUnderLoad, SavesKeepSucceedingAndNoKeyIsLeftHalfPresent) {
  server_process server(3, {"--eviction", "lru", "--read-lease-ms", "20"});
  metad_client admin(server.port());
  for (int rank = 0; rank < kRanks; ++rank) admin.initialize_worker(rank, kPages);

  std::atomic<int> done_tasks[kSavers];
  for (auto& d : done_tasks) d = 0;
  std::atomic<bool> stop{false};
  std::atomic<int> refused{0}, deleted{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kSavers; ++s) {
    threads.emplace_back([&, s] {
      metad_client c(server.port());
      for (int task = 0; task < kTasks; ++task) {
        refused += save(c, task_keys(s, task));
        done_tasks[s] = task + 1;
      }
    });
  }
  // A reader: the scheduler's batch_exists and a loader's get_locations (leases).
  threads.emplace_back([&] {
    metad_client c(server.port());
    std::mt19937 rng(7);
    while (!stop) {
      const int s = static_cast<int>(rng() % kSavers);
      const int task = static_cast<int>(rng() % static_cast<unsigned>(done_tasks[s] + 1));
      const std::vector<std::string> keys = task_keys(s, task);
      c.batch_exists(keys);
      c.get_locations(static_cast<std::int64_t>(rng() % kRanks), keys);
    }
  });
  // A deleter of finished keys (deleting a key while it is being saved would leave the
  // ranks that confirm after it with a fresh, incomplete key: legal, but not this test).
  threads.emplace_back([&] {
    metad_client c(server.port());
    std::mt19937 rng(11);
    while (!stop) {
      const int s = static_cast<int>(rng() % kSavers);
      if (done_tasks[s] == 0) continue;
      const int task = static_cast<int>(rng() % static_cast<unsigned>(done_tasks[s]));
      const http_response r = c.post("/keys/delete", body::batch_exists(task_keys(s, task)));
      ASSERT_EQ(r.status, 200) << r.describe();
      deleted += static_cast<int>(json::parse(r.body).at("deleted").as_int());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  for (int s = 0; s < kSavers; ++s) threads[static_cast<std::size_t>(s)].join();
  stop = true;
  for (std::size_t t = kSavers; t < threads.size(); ++t) threads[t].join();
  ASSERT_FALSE(HasFailure());

  std::vector<std::string> all;
  for (int s = 0; s < kSavers; ++s)
    for (int task = 0; task < kTasks; ++task)
      for (const std::string& k : task_keys(s, task)) all.push_back(k);
  const std::vector<bool> exists = admin.batch_exists(all);
  std::int64_t complete = 0;
  for (bool e : exists) complete += e ? 1 : 0;
  for (int rank = 0; rank < kRanks; ++rank) {
    const rank_counts counts = admin.rank_info(rank);
    EXPECT_EQ(counts.reserved, 0) << "rank " << rank;
    EXPECT_EQ(counts.bound, complete) << "rank " << rank << ": a key is half-present ("
                                      << counts.incomplete << " bound pages hold incomplete keys)";
    EXPECT_EQ(counts.free + counts.bound, kPages) << "rank " << rank;
    const std::vector<location> where = admin.get_locations(rank, all);
    std::set<std::int64_t> pages;
    for (std::size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(where[i].has_value(), exists[i]) << "rank " << rank << " key " << all[i];
      if (where[i]) {
        EXPECT_TRUE(pages.insert(*where[i]).second) << "page " << *where[i] << " twice";
      }
    }
  }
  std::cout << "[ workload ] " << kKeys << " keys saved into " << kPages
            << "-page pools: " << complete << " still complete, " << deleted.load() << " deleted, "
            << refused.load() << " allocations answered -1 and retried\n";
  EXPECT_LT(complete, kKeys) << "nothing was evicted: the eviction path went untested";
}

}  // namespace
}  // namespace e2e
