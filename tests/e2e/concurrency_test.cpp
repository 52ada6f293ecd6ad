// End-to-end: many clients at once against a multi-core server. Pages must stay
// exclusive per rank, page accounting must balance, and the final state must be exactly
// what the clients' own records of their confirmed writes say.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "metad_client.hpp"
#include "server_process.hpp"

namespace e2e {
namespace {

constexpr int kWorkerRanks = 8;
constexpr std::int64_t kPagesPerRank = 300;
constexpr int kClients = 16;
constexpr int kKeysPerClient = 125;  // 2,000 keys in all: far more than the pools hold
constexpr int kKeysTotal = kClients * kKeysPerClient;
constexpr int kOpsPerClient = 1500;
constexpr int kAllocateKeysMax = 40;
constexpr int kProbeKeysMax = 64;
constexpr int kReleaseStoredPagesMax = 10;
constexpr double kWriteSuccessRate = 0.9;
constexpr std::uint64_t kBaseSeed = 0x5eed'0000;

// Every worker rank is initialised before any confirm, so every key's tp_world_size is
// kWorkerRanks: a key is complete once all of them confirmed it.
constexpr std::uint8_t kAllRanksConfirmed = (1u << kWorkerRanks) - 1;
static_assert(kWorkerRanks <= 8, "ranks_confirmed is a uint8_t bit mask");

// Which client holds each page as the clients see it: 0 = nobody, else client id + 1.
// A page the server hands out as new must be held by nobody; this catches a page
// reserved twice at the moment it happens.
class page_holders {
 public:
  page_holders() : holders_(kWorkerRanks * kPagesPerRank) {}

  // 0 on success, else the id + 1 of the client that already holds the page.
  int claim(int rank, std::int64_t page, int client) {
    int expected = 0;
    if (slot(rank, page).compare_exchange_strong(expected, client + 1)) return 0;
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
class client {
 public:
  client(int id, std::uint16_t port, const std::vector<std::string>& all_keys,
         page_holders& holders)
      : id_(id), seed_(kBaseSeed + static_cast<std::uint64_t>(id)), random_(seed_),
        api_(port), all_keys_(all_keys), holders_(holders), own_(kKeysPerClient) {}

  // Runs the bounded random workload; a failure is reported with the seed, then stops it.
  void run() {
    int op = 0;
    try {
      for (; op < kOpsPerClient; ++op) run_one();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "client " << id_ << " (seed " << seed_ << ") failed at op " << op
                    << ": " << e.what();
    }
  }

  static bool owns(int id, int key_index) { return key_index / kKeysPerClient == id; }

  // The state the server must show for one of this client's keys.
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

  // What this client saw of other clients' complete keys; such state never goes away.
  const std::map<std::pair<int, int>, std::int64_t>& observed_locations() const {
    return observed_locations_;
  }
  const std::set<int>& observed_existing() const { return observed_existing_; }

 private:
  int pick(int low, int high) { return std::uniform_int_distribution<int>(low, high)(random_); }

  [[noreturn]] static void fail(const std::string& why) { throw check_failed(why); }

  key_record& record(int key_index) { return own_[key_index - id_ * kKeysPerClient]; }
  const key_record& record(int key_index) const { return own_[key_index - id_ * kKeysPerClient]; }

  void run_one() {
    const int dice = pick(0, 99);
    if (dice < 60) {
      save_task();
    } else if (dice < 78) {
      probe_exists();
    } else if (dice < 95) {
      probe_locations();
    } else {
      release_stored_pages();
    }
  }

  // batch_allocate some own keys (duplicates possible), then confirm or fail the write.
  void save_task() {
    const int rank = pick(0, kWorkerRanks - 1);
    std::vector<int> indices;
    std::vector<std::string> keys;
    for (int n = pick(1, kAllocateKeysMax); n > 0; --n) {
      indices.push_back(id_ * kKeysPerClient + pick(0, kKeysPerClient - 1));
      keys.push_back(all_keys_[indices.back()]);
    }
    std::vector<int> distinct;
    for (int index : indices) {
      if (std::find(distinct.begin(), distinct.end(), index) == distinct.end()) {
        distinct.push_back(index);
      }
    }

    const std::vector<key_page> results = api_.batch_allocate(rank, keys);
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

    if (std::bernoulli_distribution(kWriteSuccessRate)(random_)) {
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
  }

  void claim_new_page(int rank, const key_page& result) {
    if (result.page < 0 || result.page >= kPagesPerRank) {
      fail("page " + std::to_string(result.page) + " outside the pool");
    }
    if (const int holder = holders_.claim(rank, result.page, id_); holder != 0) {
      fail("page " + std::to_string(result.page) + " of rank " + std::to_string(rank) +
           " handed out for " + result.key + " while client " + std::to_string(holder - 1) +
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
};

class Concurrency : public ::testing::TestWithParam<int> {
 protected:
  void initialize_ranks(int ranks, std::int64_t pages) {
    for (int rank = 0; rank < ranks; ++rank) admin_.initialize_worker(rank, pages);
  }

  // free + reserved + bound == num_pages, and nothing left reserved.
  void expect_balanced_and_settled(int rank, std::int64_t pages, std::int64_t bound) {
    const rank_counts c = admin_.rank_info(rank);
    EXPECT_EQ(c.num_pages, pages) << "rank " << rank;
    EXPECT_EQ(c.free + c.reserved + c.bound, c.num_pages) << "rank " << rank;
    EXPECT_EQ(c.reserved, 0) << "rank " << rank;
    EXPECT_EQ(c.bound, bound) << "rank " << rank;
  }

  server_process server_{/*threads=*/GetParam()};
  metad_client admin_{server_.port()};
};

TEST_P(Concurrency, PagesStayExclusiveUnderManyClients) {
  initialize_ranks(kWorkerRanks, kPagesPerRank);
  const std::vector<std::string> all_keys = make_keys(kKeysTotal);
  page_holders holders;
  std::vector<std::unique_ptr<client>> clients;
  for (int id = 0; id < kClients; ++id) {
    clients.push_back(std::make_unique<client>(id, server_.port(), all_keys, holders));
  }
  std::vector<std::thread> threads;
  for (auto& c : clients) threads.emplace_back([&c] { c->run(); });
  for (auto& t : threads) t.join();
  ASSERT_FALSE(HasFailure()) << "a client failed; the final state is not comparable";

  auto owner = [&](int key_index) -> const client& {
    return *clients[static_cast<std::size_t>(key_index / kKeysPerClient)];
  };
  for (int rank = 0; rank < kWorkerRanks; ++rank) {
    std::int64_t bound = 0;
    for (const auto& c : clients) bound += c->confirmed_count(rank);
    expect_balanced_and_settled(rank, kPagesPerRank, bound);

    const std::vector<location> locations = admin_.get_locations(rank, all_keys);
    std::map<std::int64_t, int> key_of_page;
    for (int index = 0; index < kKeysTotal; ++index) {
      const location& loc = locations[index];
      ASSERT_EQ(loc, owner(index).expected_location(rank, index))
          << "rank " << rank << " key " << all_keys[index];
      if (loc) {
        const auto [it, inserted] = key_of_page.emplace(*loc, index);
        ASSERT_TRUE(inserted) << "rank " << rank << " page " << *loc << " located for "
                              << all_keys[it->second] << " and " << all_keys[index];
      }
    }
    for (const auto& c : clients) {
      for (const auto& [where, page] : c->observed_locations()) {
        if (where.first == rank) {
          EXPECT_EQ(locations[where.second], location{page}) << "rank " << rank;
        }
      }
    }
  }

  const std::vector<bool> exists = admin_.batch_exists(all_keys);
  for (int index = 0; index < kKeysTotal; ++index) {
    ASSERT_EQ(exists[index], owner(index).expected_exists(index)) << all_keys[index];
  }
  for (const auto& c : clients) {
    for (int index : c->observed_existing()) EXPECT_TRUE(exists[index]) << all_keys[index];
  }
}

// Sends one request on every connection before reading any answer, so that all
// connections are in flight at once.
std::vector<http_response> exchange_on_all(
    std::vector<std::unique_ptr<http_connection>>& connections,
    const std::function<std::string(std::size_t)>& request_for) {
  for (std::size_t i = 0; i < connections.size(); ++i) connections[i]->send_all(request_for(i));
  std::vector<http_response> responses;
  for (auto& connection : connections) responses.push_back(connection->read_response());
  return responses;
}

TEST_P(Concurrency, ServesTwoHundredConnectionsAtOnce) {
  constexpr int kConnections = 200;
  constexpr int kRanks = 4;
  constexpr std::int64_t kPages = 512;
  constexpr std::int64_t kKeysPerConnection = 2;
  initialize_ranks(kRanks, kPages);
  std::vector<std::unique_ptr<http_connection>> connections;
  for (int i = 0; i < kConnections; ++i) {
    connections.push_back(std::make_unique<http_connection>(server_.port()));
  }
  auto keys_of = [](std::size_t connection) {
    return std::vector<std::string>{make_key(connection, 21), make_key(connection, 22)};
  };

  // Each connection saves its two keys on every rank, then reads them back.
  for (int rank = 0; rank < kRanks; ++rank) {
    const auto allocated = exchange_on_all(connections, [&](std::size_t i) {
      return format_post("/keys/batch_allocate", body::batch_allocate(rank, keys_of(i)));
    });
    std::vector<std::vector<key_page>> granted(kConnections);
    std::set<std::int64_t> pages;
    for (std::size_t i = 0; i < allocated.size(); ++i) {
      ASSERT_EQ(allocated[i].status, 200) << allocated[i].describe();
      granted[i] = allocation_results(json::parse(allocated[i].body));
      ASSERT_EQ(granted[i].size(), keys_of(i).size()) << allocated[i].body;
      for (const key_page& kp : granted[i]) {
        ASSERT_TRUE(kp.page >= 0 && kp.page < kPages) << allocated[i].body;
        ASSERT_TRUE(pages.insert(kp.page).second) << "page " << kp.page << " handed out twice";
      }
    }
    const auto confirmed = exchange_on_all(connections, [&](std::size_t i) {
      return format_post("/keys/confirm_write", body::confirm_write(rank, granted[i], {}));
    });
    for (const auto& response : confirmed) ASSERT_EQ(response.status, 204) << response.describe();
  }
  const auto exists = exchange_on_all(connections, [&](std::size_t i) {
    return format_post("/keys/batch_exists", body::batch_exists(keys_of(i)));
  });
  for (const auto& response : exists) EXPECT_EQ(response.body, R"({"exists":[true,true]})");
  for (int rank = 0; rank < kRanks; ++rank) {
    expect_balanced_and_settled(rank, kPages, kConnections * kKeysPerConnection);
  }
}

INSTANTIATE_TEST_SUITE_P(ServerThreads, Concurrency, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Threads" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace e2e
