// The simulated vLLM workers of the concurrency test: each drives its own keep-alive
// connection with a bounded random mix of save tasks and lookups, and keeps an exact
// record of what it stored. One worker per thread; page_holders is shared by all.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "metad_client.hpp"

namespace e2e::workload {

constexpr int kWorkerRanks = 8;
constexpr std::int64_t kPagesPerRank = 300;
constexpr int kWorkers = 16;
constexpr int kKeysPerWorker = 125;  // 2,000 keys in all: far more than the pools hold
constexpr int kKeysTotal = kWorkers * kKeysPerWorker;
constexpr int kHotKeys = 8;  // per worker, stored on every rank first
constexpr int kOpsPerWorker = 1500;
constexpr int kAllocateKeysMax = 40;
constexpr int kProbeKeysMax = 64;
constexpr int kReleaseStoredPagesMax = 10;
constexpr double kWriteSuccessRate = 0.9;
constexpr std::uint64_t kBaseSeed = 0x5eed'0000;

// Every worker rank is initialised before any confirm, so every key's tp_world_size is
// kWorkerRanks: a key is complete once all of them confirmed it.
constexpr std::uint8_t kAllRanksConfirmed = (1u << kWorkerRanks) - 1;
static_assert(kWorkerRanks <= 8, "ranks_confirmed is a uint8_t bit mask");
static_assert(kWorkers * kHotKeys <= kPagesPerRank, "the hot keys of all workers fit");

// Which worker holds each page as the workers see it: 0 = nobody, else worker id + 1.
// A page the server hands out as new must be held by nobody; this catches a page
// reserved twice at the moment it happens.
class page_holders {
 public:
  page_holders() : holders_(kWorkerRanks * kPagesPerRank) {}

  // 0 on success, else the id + 1 of the worker that already holds the page.
  int claim(int rank, std::int64_t page, int worker) {
    int expected = 0;
    if (slot(rank, page).compare_exchange_strong(expected, worker + 1)) return 0;
    return expected;
  }
  // Called before the release is sent, so the page is unheld before the server frees it.
  void give_up(int rank, std::int64_t page) { slot(rank, page).store(0); }

 private:
  std::atomic<int>& slot(int rank, std::int64_t page) {
    return holders_[static_cast<std::size_t>(rank * kPagesPerRank + page)];
  }
  std::vector<std::atomic<int>> holders_;
};

struct key_record {
  std::uint8_t ranks_confirmed = 0;  // bit r: confirmed on rank r
  std::array<std::int64_t, kWorkerRanks> page{};
  bool confirmed_on(int rank) const { return (ranks_confirmed >> rank) & 1u; }
  bool complete() const { return ranks_confirmed == kAllRanksConfirmed; }
};

struct check_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One simulated worker process: its own connection, its own keys for writes, any key
// for reads. Its records are exact for its own keys, because only it writes them.
class simulated_worker {
 public:
  simulated_worker(int id, std::uint16_t port, const std::vector<std::string>& all_keys,
                   page_holders& holders)
      : id_(id),
        seed_(kBaseSeed + static_cast<std::uint64_t>(id)),
        random_(seed_),
        api_(port),
        all_keys_(all_keys),
        holders_(holders),
        own_(kKeysPerWorker) {}

  // Stores the hot keys on every rank, waits for all workers to do so, then runs the
  // bounded random workload. A failure is reported with the seed and stops this worker
  // (it still arrives at the barrier so that the others are not held up).
  void run(std::barrier<>& warmed_up) {
    int op = -1;
    try {
      store_hot_keys();
    } catch (const std::exception& e) {
      report(op, e);
      warmed_up.arrive_and_drop();
      return;
    }
    warmed_up.arrive_and_wait();
    try {
      for (op = 0; op < kOpsPerWorker; ++op) run_one();
    } catch (const std::exception& e) {
      report(op, e);
    }
  }

  static bool owns(int id, int key_index) { return key_index / kKeysPerWorker == id; }

  // The state the server must show for one of this worker's keys.
  location expected_location(int rank, int key_index) const {
    const key_record& rec = record(key_index);
    if (rec.complete() && rec.confirmed_on(rank)) return rec.page[rank];
    return std::nullopt;
  }
  bool expected_exists(int key_index) const { return record(key_index).complete(); }
  std::int64_t confirmed_count(int rank) const {
    return std::count_if(own_.begin(), own_.end(),
                         [&](const key_record& rec) { return rec.confirmed_on(rank); });
  }

  // What this worker saw of other workers' complete keys; such state never goes away.
  const std::map<std::pair<int, int>, std::int64_t>& observed_locations() const {
    return observed_locations_;
  }
  const std::set<int>& observed_existing() const { return observed_existing_; }
  std::int64_t refused_total() const { return refused_total_; }

 private:
  int pick(int low, int high) { return std::uniform_int_distribution<int>(low, high)(random_); }

  void report(int op, const std::exception& e) const {
    ADD_FAILURE() << "worker " << id_ << " (seed " << seed_ << ") failed at "
                  << (op < 0 ? "warm-up" : "op " + std::to_string(op)) << ": " << e.what();
  }

  [[noreturn]] static void fail(const std::string& why) { throw check_failed(why); }

  key_record& record(int key_index) { return own_[key_index - id_ * kKeysPerWorker]; }
  const key_record& record(int key_index) const { return own_[key_index - id_ * kKeysPerWorker]; }

  void run_one() {
    const int dice = pick(0, 99);
    if (dice < 60) {
      random_save_task();
    } else if (dice < 78) {
      probe_exists();
    } else if (dice < 95) {
      probe_locations();
    } else {
      release_stored_pages();
    }
  }

  // Like a shared system prompt: the first kHotKeys own keys stored on every rank, so
  // that complete keys exist before the cold keys exhaust the pools.
  void store_hot_keys() {
    std::vector<int> hot(kHotKeys);
    for (int i = 0; i < kHotKeys; ++i) hot[i] = id_ * kKeysPerWorker + i;
    for (int step = 0; step < kWorkerRanks; ++step) {
      const int rank = (id_ + step) % kWorkerRanks;  // spread the workers over the ranks
      if (save_task(rank, hot, /*write_succeeds=*/true) != 0) {
        fail("hot keys refused a page on rank " + std::to_string(rank));
      }
    }
  }

  // Own keys drawn with repetition, on a random rank; the write usually succeeds.
  void random_save_task() {
    const int rank = pick(0, kWorkerRanks - 1);
    std::vector<int> indices(static_cast<std::size_t>(pick(1, kAllocateKeysMax)));
    for (int& index : indices) index = id_ * kKeysPerWorker + pick(0, kKeysPerWorker - 1);
    save_task(rank, indices, std::bernoulli_distribution(kWriteSuccessRate)(random_));
  }

  // One connector save task: batch_allocate, then confirm_write of every page granted,
  // or, if the write failed, release of them all. Returns how many keys got -1.
  int save_task(int rank, const std::vector<int>& indices, bool write_succeeds) {
    std::vector<int> distinct;
    for (int index : indices) {
      if (std::find(distinct.begin(), distinct.end(), index) == distinct.end()) {
        distinct.push_back(index);
      }
    }
    const std::vector<key_page> results = api_.batch_allocate(rank, keys_of(indices));
    if (results.size() != distinct.size()) fail("expected one result per distinct key");
    std::vector<key_page> granted;  // every page we may write: hits and new reservations
    std::vector<int> fresh;         // indices into `results` of new reservations
    int refused = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
      const key_page& result = results[i];
      if (result.key != all_keys_[distinct[i]]) fail("results not in first-occurrence order");
      const key_record& rec = record(distinct[i]);
      if (rec.confirmed_on(rank)) {
        if (result.page != rec.page[rank]) {
          fail("stored key " + result.key + " on rank " + std::to_string(rank) + " got page " +
               std::to_string(result.page) + ", its page is " + std::to_string(rec.page[rank]));
        }
      } else if (result.page == kNoPage) {
        ++refused;
        continue;
      } else {
        claim_new_page(rank, result);
        fresh.push_back(static_cast<int>(i));
      }
      granted.push_back(result);
    }
    if (refused > 0 && !fresh.empty()) {
      fail("allocation not all-or-nothing: " + std::to_string(refused) + " keys got -1 while " +
           std::to_string(fresh.size()) + " got new pages");
    }
    refused_total_ += refused;

    if (write_succeeds) {
      api_.confirm_write(rank, granted);
      for (int i : fresh) {
        key_record& rec = record(distinct[i]);
        rec.ranks_confirmed |= static_cast<std::uint8_t>(1u << rank);
        rec.page[rank] = results[i].page;
      }
    } else {
      std::vector<std::int64_t> released;
      for (const key_page& kp : granted) released.push_back(kp.page);
      for (int i : fresh) holders_.give_up(rank, results[i].page);
      api_.confirm_write(rank, {}, released);
    }
    return refused;
  }

  void claim_new_page(int rank, const key_page& result) {
    if (result.page < 0 || result.page >= kPagesPerRank) {
      fail("page " + std::to_string(result.page) + " outside the pool");
    }
    if (const int holder = holders_.claim(rank, result.page, id_); holder != 0) {
      fail("page " + std::to_string(result.page) + " of rank " + std::to_string(rank) +
           " handed out for " + result.key + " while worker " + std::to_string(holder - 1) +
           " holds it");
    }
  }

  std::vector<int> random_key_indices() {
    std::vector<int> indices(static_cast<std::size_t>(pick(1, kProbeKeysMax)));
    for (int& index : indices) index = pick(0, kKeysTotal - 1);
    return indices;
  }

  std::vector<std::string> keys_of(const std::vector<int>& indices) const {
    std::vector<std::string> keys;
    for (int index : indices) keys.push_back(all_keys_[index]);
    return keys;
  }

  void probe_exists() {
    const std::vector<int> indices = random_key_indices();
    const std::vector<bool> exists = api_.batch_exists(keys_of(indices));
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const int index = indices[i];
      if (owns(id_, index)) {
        if (exists[i] != expected_exists(index)) fail("batch_exists wrong for own key");
      } else if (exists[i]) {
        observed_existing_.insert(index);
      } else if (observed_existing_.count(index) != 0) {
        fail("key " + all_keys_[index] + " stopped existing");
      }
    }
  }

  void probe_locations() {
    const int rank = pick(0, kWorkerRanks - 1);
    const std::vector<int> indices = random_key_indices();
    const std::vector<location> locations = api_.get_locations(rank, keys_of(indices));
    std::map<std::int64_t, int> key_of_page;
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const int index = indices[i];
      const location& loc = locations[i];
      if (loc) {
        const auto [it, inserted] = key_of_page.emplace(*loc, index);
        if (!inserted && it->second != index) fail("one page located for two keys");
      }
      if (owns(id_, index)) {
        if (loc != expected_location(rank, index)) fail("get_locations wrong for own key");
        continue;
      }
      const auto seen = observed_locations_.find({rank, index});
      if (seen != observed_locations_.end() && loc != seen->second) {
        fail("location of " + all_keys_[index] + " on rank " + std::to_string(rank) +
             " changed from " + std::to_string(seen->second));
      }
      if (loc) observed_locations_[{rank, index}] = *loc;
    }
  }

  // The connector's failure path releases cache hits too; bound pages must stay bound.
  void release_stored_pages() {
    const int rank = pick(0, kWorkerRanks - 1);
    std::vector<std::int64_t> stored;
    for (const key_record& rec : own_) {
      if (rec.confirmed_on(rank)) stored.push_back(rec.page[rank]);
    }
    for (const auto& [where, page] : observed_locations_) {
      if (where.first == rank) stored.push_back(page);
    }
    std::shuffle(stored.begin(), stored.end(), random_);
    stored.resize(std::min<std::size_t>(stored.size(), kReleaseStoredPagesMax));
    api_.confirm_write(rank, {}, stored);
  }

  const int id_;
  const std::uint64_t seed_;
  std::mt19937_64 random_;
  metad_client api_;
  const std::vector<std::string>& all_keys_;
  page_holders& holders_;
  std::vector<key_record> own_;
  std::map<std::pair<int, int>, std::int64_t> observed_locations_;  // (rank, key) → page
  std::set<int> observed_existing_;
  std::int64_t refused_total_ = 0;  // keys answered -1: the pools did run out
};

// All simulated workers of one run, and the union of their records: the state the
// server must end up in.
class worker_fleet {
 public:
  explicit worker_fleet(std::uint16_t port) : all_keys_(make_keys(kKeysTotal)) {
    for (int id = 0; id < kWorkers; ++id) {
      workers_.push_back(std::make_unique<simulated_worker>(id, port, all_keys_, holders_));
    }
  }

  // Runs every worker on its own thread until all are done.
  void run() {
    std::barrier<> warmed_up(kWorkers);
    std::vector<std::thread> threads;
    for (auto& worker : workers_) {
      threads.emplace_back([&warmed_up, w = worker.get()] { w->run(warmed_up); });
    }
    for (auto& thread : threads) thread.join();
  }

  const std::vector<std::string>& all_keys() const { return all_keys_; }
  const std::vector<std::unique_ptr<simulated_worker>>& workers() const { return workers_; }

  location expected_location(int rank, int key_index) const {
    return owner(key_index).expected_location(rank, key_index);
  }
  bool expected_exists(int key_index) const { return owner(key_index).expected_exists(key_index); }
  std::int64_t expected_bound(int rank) const {
    std::int64_t bound = 0;
    for (const auto& worker : workers_) bound += worker->confirmed_count(rank);
    return bound;
  }
  std::int64_t refused_total() const {
    std::int64_t refused = 0;
    for (const auto& worker : workers_) refused += worker->refused_total();
    return refused;
  }

 private:
  const simulated_worker& owner(int key_index) const {
    return *workers_[static_cast<std::size_t>(key_index / kKeysPerWorker)];
  }

  std::vector<std::string> all_keys_;
  page_holders holders_;
  std::vector<std::unique_ptr<simulated_worker>> workers_;
};

}  // namespace e2e::workload
