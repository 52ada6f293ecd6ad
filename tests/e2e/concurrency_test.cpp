// End-to-end: many workers at once against a multi-core server. Pages must stay
// exclusive per rank, page accounting must balance, and the final state must be exactly
// what the workers' own records of their confirmed writes say.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "metad_client.hpp"
#include "server_process.hpp"
#include "simulated_worker.hpp"

namespace e2e {
namespace {

using namespace workload;

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

  // get_locations of every key on `rank`: exactly the workers' records, no page for two
  // keys, and every location a worker saw during the run still in place.
  void expect_locations_as_recorded(const worker_fleet& fleet, int rank) {
    const std::vector<std::string>& keys = fleet.all_keys();
    const std::vector<location> locations = admin_.get_locations(rank, keys);
    std::map<std::int64_t, int> key_of_page;
    for (int index = 0; index < kKeysTotal; ++index) {
      const location& loc = locations[index];
      ASSERT_EQ(loc, fleet.expected_location(rank, index))
          << "rank " << rank << " key " << keys[index];
      if (!loc) continue;
      const auto [it, inserted] = key_of_page.emplace(*loc, index);
      ASSERT_TRUE(inserted) << "rank " << rank << " page " << *loc << " located for "
                            << keys[it->second] << " and " << keys[index];
    }
    for (const auto& worker : fleet.workers()) {
      for (const auto& [where, page] : worker->observed_locations()) {
        if (where.first != rank) continue;
        EXPECT_EQ(locations[where.second], location{page})
            << "rank " << rank << " key " << keys[where.second];
      }
    }
  }

  // batch_exists of every key: exactly the workers' records, and every key a worker saw
  // existing still exists. Returns the answer.
  std::vector<bool> expect_existence_as_recorded(const worker_fleet& fleet) {
    const std::vector<std::string>& keys = fleet.all_keys();
    const std::vector<bool> exists = admin_.batch_exists(keys);
    for (int index = 0; index < kKeysTotal; ++index) {
      EXPECT_EQ(exists[index], fleet.expected_exists(index)) << keys[index];
    }
    for (const auto& worker : fleet.workers()) {
      for (int index : worker->observed_existing()) EXPECT_TRUE(exists[index]) << keys[index];
    }
    return exists;
  }

  // No stale-key reclamation: its counts are checked against what the workers recorded,
  // and a key the pool left incomplete would be removed 30 s (the default grace) after its
  // last confirmation, mid-run when the run is slow (it was, once, under ASan: 32 s).
  server_process server_{/*threads=*/GetParam(), {"--incomplete-grace-ms", "0"}};
  metad_client admin_{server_.port()};
};

TEST_P(Concurrency, PagesStayExclusiveUnderManyClients) {
  initialize_ranks(kWorkerRanks, kPagesPerRank);
  worker_fleet fleet(server_.port());
  fleet.run();
  ASSERT_FALSE(HasFailure()) << "a worker failed; the final state is not comparable";

  for (int rank = 0; rank < kWorkerRanks; ++rank) {
    expect_balanced_and_settled(rank, kPagesPerRank, fleet.expected_bound(rank));
    expect_locations_as_recorded(fleet, rank);
  }
  const std::vector<bool> exists = expect_existence_as_recorded(fleet);

  // Guards against a vacuous workload, not against the server.
  const auto complete = std::count(exists.begin(), exists.end(), true);
  std::cout << "[ workload ] complete keys: " << complete << " of " << kKeysTotal
            << ", keys refused a page: " << fleet.refused_total() << "\n";
  EXPECT_GE(complete, kWorkers * kHotKeys);
  EXPECT_GT(fleet.refused_total(), 0) << "no pool ran out: the exhaustion path went untested";
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
  std::vector<std::vector<std::vector<key_page>>> stored(kRanks);  // rank, connection
  for (int rank = 0; rank < kRanks; ++rank) {
    const auto allocated = exchange_on_all(connections, [&](std::size_t i) {
      return format_post("/keys/batch_allocate", body::batch_allocate(rank, keys_of(i)));
    });
    std::vector<std::vector<key_page>>& granted = stored[rank];
    granted.resize(kConnections);
    std::set<std::int64_t> pages;
    for (std::size_t i = 0; i < allocated.size(); ++i) {
      ASSERT_EQ(allocated[i].status, 200) << allocated[i].describe();
      granted[i] = allocation_results(json::parse(allocated[i].body));
      ASSERT_EQ(granted[i].size(), keys_of(i).size()) << allocated[i].body;
      for (std::size_t k = 0; k < granted[i].size(); ++k) {
        const key_page& kp = granted[i][k];
        ASSERT_EQ(kp.key, keys_of(i)[k]) << allocated[i].body;
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
  const auto located = exchange_on_all(connections, [&](std::size_t i) {
    return format_post("/keys/get_locations", body::get_locations(i % kRanks, keys_of(i)));
  });
  for (std::size_t i = 0; i < located.size(); ++i) {
    const std::vector<key_page>& pages = stored[i % kRanks][i];
    EXPECT_EQ(located[i].body, "{\"locations\":[" + std::to_string(pages[0].page) + "," +
                                   std::to_string(pages[1].page) + "]}");
  }
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
