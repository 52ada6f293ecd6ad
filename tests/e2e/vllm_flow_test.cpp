// End-to-end: the call sequence of one vLLM engine (scheduler + TP=2 workers) against
// the real server, and the HTTP/1.1 features its clients and proxies rely on
// (keep-alive, pipelining, chunked bodies, Expect: 100-continue).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "metad_client.hpp"
#include "server_process.hpp"

namespace e2e {
namespace {

constexpr std::int64_t kTensorParallel = 2;
constexpr std::int64_t kPagesPerRank = 1024;
constexpr std::size_t kBlocksPerTask = 128;  // the connector's largest save/load task

// What a fresh pool hands out: lowest free page first, keys in request order.
std::vector<key_page> fresh_allocation(const std::vector<std::string>& keys,
                                       std::int64_t first_page = 0) {
  std::vector<key_page> out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out.push_back({keys[i], first_page + static_cast<std::int64_t>(i)});
  }
  return out;
}

std::vector<std::int64_t> pages_of(const std::vector<key_page>& allocation) {
  std::vector<std::int64_t> pages;
  for (const auto& kp : allocation) pages.push_back(kp.page);
  return pages;
}

std::vector<location> locations_of(const std::vector<key_page>& allocation) {
  std::vector<location> out;
  for (const auto& kp : allocation) out.emplace_back(kp.page);
  return out;
}

// The exact batch_exists answer for `count` keys that all have the same state.
std::string uniform_exists_body(std::size_t count, bool exists) {
  std::string out = "{\"exists\":[";
  for (std::size_t i = 0; i < count; ++i) {
    if (i != 0) out.push_back(',');
    out += exists ? "true" : "false";
  }
  return out + "]}";
}

// One request and the exact answer it must get.
struct scripted_exchange {
  std::string request;
  int status;
  std::string body;
};

// Writes all requests of `script` at once, then reads the answers in order.
void expect_pipelined_script(http_connection& connection,
                             const std::vector<scripted_exchange>& script) {
  std::string burst;
  for (const auto& step : script) burst += step.request;
  connection.send_all(burst);
  for (std::size_t i = 0; i < script.size(); ++i) {
    const http_response response = connection.read_response();
    ASSERT_EQ(response.status, script[i].status) << "answer " << i << ": " << response.describe();
    ASSERT_EQ(response.body, script[i].body) << "answer " << i;
  }
}

class VllmFlow : public ::testing::Test {
 protected:
  // One connection per process role, as in a vLLM deployment.
  metad_client& worker(std::int64_t rank) { return rank == 0 ? worker0_ : worker1_; }

  void start_engine(std::int64_t pages_per_rank) {
    scheduler_.initialize_scheduler();
    for (std::int64_t rank = 0; rank < kTensorParallel; ++rank) {
      worker(rank).initialize_worker(rank, pages_per_rank);
    }
  }

  // A successful save task on every TP rank; returns each rank's allocation.
  std::vector<std::vector<key_page>> save_on_all_ranks(const std::vector<std::string>& keys) {
    std::vector<std::vector<key_page>> allocations;
    for (std::int64_t rank = 0; rank < kTensorParallel; ++rank) {
      allocations.push_back(worker(rank).batch_allocate(rank, keys));
      worker(rank).confirm_write(rank, allocations.back());
    }
    return allocations;
  }

  server_process server_{/*threads=*/2};
  metad_client scheduler_{server_.port()};
  metad_client worker0_{server_.port()};
  metad_client worker1_{server_.port()};
};

TEST_F(VllmFlow, KeysExistOnlyOnceEveryTensorParallelRankConfirmed) {
  start_engine(kPagesPerRank);
  const std::vector<std::string> keys = make_keys(kBlocksPerTask);
  EXPECT_EQ(scheduler_.batch_exists(keys), std::vector<bool>(keys.size(), false));

  std::vector<std::vector<key_page>> allocations;
  for (std::int64_t rank = 0; rank < kTensorParallel; ++rank) {
    allocations.push_back(worker(rank).batch_allocate(rank, keys));
    EXPECT_EQ(allocations[rank], fresh_allocation(keys)) << "rank " << rank;
  }

  worker(0).confirm_write(0, allocations[0]);
  EXPECT_EQ(scheduler_.batch_exists(keys), std::vector<bool>(keys.size(), false))
      << "a key is complete only when all TP ranks confirmed it";
  EXPECT_EQ(worker(0).get_locations(0, keys), std::vector<location>(keys.size()));

  worker(1).confirm_write(1, allocations[1]);
  EXPECT_EQ(scheduler_.batch_exists(keys), std::vector<bool>(keys.size(), true));
  for (std::int64_t rank = 0; rank < kTensorParallel; ++rank) {
    EXPECT_EQ(worker(rank).get_locations(rank, keys), locations_of(allocations[rank]))
        << "rank " << rank;
    const rank_counts counts = scheduler_.rank_info(rank);
    EXPECT_EQ(counts.num_pages, kPagesPerRank);
    EXPECT_EQ(counts.bound, static_cast<std::int64_t>(keys.size()));
    EXPECT_EQ(counts.reserved, 0);
    EXPECT_EQ(counts.free, kPagesPerRank - static_cast<std::int64_t>(keys.size()));
  }
}

TEST_F(VllmFlow, SavingStoredKeysAgainReturnsTheirPagesWithoutTakingNewOnes) {
  start_engine(kPagesPerRank);
  const std::vector<std::string> keys = make_keys(kBlocksPerTask);
  const auto first = save_on_all_ranks(keys);
  const auto second = save_on_all_ranks(keys);
  EXPECT_EQ(second, first);
  for (std::int64_t rank = 0; rank < kTensorParallel; ++rank) {
    EXPECT_EQ(scheduler_.rank_info(rank).free,
              kPagesPerRank - static_cast<std::int64_t>(keys.size()));
  }
}

TEST_F(VllmFlow, FailedWriteFreesNewPagesButKeepsCacheHits) {
  constexpr std::int64_t kSmallPool = 16;
  start_engine(kSmallPool);
  const std::vector<std::string> stored = make_keys(4, /*salt=*/1);
  const auto stored_allocations = save_on_all_ranks(stored);

  // A save task mixing stored blocks (hits) and new ones, whose write then fails: the
  // connector releases every page of the task, hits included.
  std::vector<std::string> task = stored;
  const std::vector<std::string> fresh = make_keys(6, /*salt=*/2);
  task.insert(task.end(), fresh.begin(), fresh.end());
  const std::vector<key_page> allocation = worker(0).batch_allocate(0, task);
  std::vector<key_page> expected = stored_allocations[0];
  for (const key_page& kp : fresh_allocation(fresh, /*first_page=*/4)) expected.push_back(kp);
  ASSERT_EQ(allocation, expected);
  worker(0).confirm_write(0, {}, pages_of(allocation));

  const rank_counts counts = scheduler_.rank_info(0);
  EXPECT_EQ(counts.bound, 4) << "pages of stored keys must survive a release";
  EXPECT_EQ(counts.reserved, 0);
  EXPECT_EQ(counts.free, kSmallPool - 4);
  EXPECT_EQ(scheduler_.batch_exists(stored), std::vector<bool>(stored.size(), true));
  EXPECT_EQ(scheduler_.batch_exists(fresh), std::vector<bool>(fresh.size(), false));
  EXPECT_EQ(worker(0).get_locations(0, stored), locations_of(stored_allocations[0]));
  // Released pages count as free but sit out a quarantine (--release-quarantine-ms,
  // 5 s): a retried release cannot free them under another writer. The next pages go first.
  EXPECT_EQ(worker(0).batch_allocate(0, fresh), fresh_allocation(fresh, 10))
      << "pages free since start-up go before released ones";
}

TEST_F(VllmFlow, OneKeepAliveConnectionServesHundredsOfRequests) {
  constexpr int kRounds = 150;  // 4 requests each
  start_engine(kPagesPerRank);
  metad_client& client = worker(0);
  for (int round = 0; round < kRounds; ++round) {
    const std::vector<std::string> key{make_key(static_cast<std::uint64_t>(round), 7)};
    for (std::int64_t rank = 0; rank < kTensorParallel; ++rank) {
      const std::vector<key_page> allocation = client.batch_allocate(rank, key);
      ASSERT_EQ(allocation, fresh_allocation(key, round)) << "round " << round;
      client.confirm_write(rank, allocation);
    }
    const http_response exists = client.post("/keys/batch_exists", body::batch_exists(key));
    ASSERT_EQ(exists.status, 200) << exists.describe();
    ASSERT_EQ(exists.body, uniform_exists_body(1, true));
    ASSERT_EQ(exists.header("content-type"), "application/json");
    ASSERT_FALSE(exists.closes_connection()) << "round " << round;
  }
}

TEST_F(VllmFlow, PipelinedRequestsAreAnsweredInOrder) {
  constexpr int kRanks = 6;
  std::vector<scripted_exchange> script;
  for (int rank = 0; rank < kRanks; ++rank) {
    const std::int64_t pages = 10 + rank;
    script.push_back({format_post(initialize_path(rank), body::initialize_worker(pages)), 200,
                      "{\"message\":\"Rank " + std::to_string(rank) + " initialized with " +
                          std::to_string(pages) + " pages\"}"});
    script.push_back({format_post("/keys/batch_exists", body::batch_exists(make_keys(rank + 1, 3))),
                      200, uniform_exists_body(rank + 1, false)});
    script.push_back({format_request("GET", "/rank/" + std::to_string(rank), ""), 200,
                      "{\"num_pages\":" + std::to_string(pages) + ",\"free\":" +
                          std::to_string(pages) + ",\"reserved\":0,\"bound\":0,\"incomplete\":0}"});
  }
  script.push_back({format_post("/keys/no_such_endpoint", "{}"), 404, R"({"detail":"Not Found"})"});
  script.push_back(
      {format_post("/keys/confirm_write", R"({"rank":0,"confirmations":[]})"), 204, ""});
  expect_pipelined_script(scheduler_.connection(), script);
  EXPECT_EQ(scheduler_.rank_info(kRanks - 1).num_pages, 10 + kRanks - 1)
      << "the connection still works after the burst";
}

// Ranks 0 and 1 live on different cores; answers must still come back in request order,
// and each write must be visible to the requests pipelined after it.
TEST_F(VllmFlow, PipelinedSaveTasksOnRanksOfDifferentCoresKeepTheirOrder) {
  constexpr int kKeys = 50;  // 6 requests each, all in one write
  start_engine(kPagesPerRank);
  std::vector<scripted_exchange> script;
  for (int i = 0; i < kKeys; ++i) {
    const std::string key = make_key(static_cast<std::uint64_t>(i), 9);
    const std::string page = std::to_string(i);
    for (std::int64_t rank = 0; rank < kTensorParallel; ++rank) {
      script.push_back({format_post("/keys/batch_allocate", body::batch_allocate(rank, {key})), 200,
                        "{\"rank\":" + std::to_string(rank) + ",\"results\":[[" + json::quote(key) +
                            "," + page + "]]}"});
      script.push_back(
          {format_post("/keys/confirm_write", body::confirm_write(rank, {{key, i}}, {})), 204, ""});
    }
    script.push_back({format_post("/keys/batch_exists", body::batch_exists({key})), 200,
                      uniform_exists_body(1, true)});
    script.push_back({format_post("/keys/get_locations", body::get_locations(1, {key})), 200,
                      "{\"locations\":[" + page + "]}"});
  }
  expect_pipelined_script(scheduler_.connection(), script);
}

TEST_F(VllmFlow, ChunkedRequestBodyIsReassembled) {
  start_engine(kPagesPerRank);
  const std::vector<std::string> keys = make_keys(10);
  const std::string payload = body::batch_allocate(0, keys);
  http_connection& connection = worker(0).connection();
  connection.send_all(
      "POST /keys/batch_allocate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
  // Uneven chunks, each in its own write, so the body arrives in pieces.
  const std::size_t cuts[] = {0, 1, 8, 58, payload.size()};
  for (std::size_t i = 0; i + 1 < std::size(cuts); ++i) {
    const std::string piece = payload.substr(cuts[i], cuts[i + 1] - cuts[i]);
    char size_line[32];
    std::snprintf(size_line, sizeof size_line, "%zx\r\n", piece.size());
    connection.send_all(size_line + piece + "\r\n");
  }
  connection.send_all("0\r\n\r\n");

  const http_response response = connection.read_response();
  ASSERT_EQ(response.status, 200) << response.describe();
  std::string expected = "{\"rank\":0,\"results\":[";
  for (std::size_t i = 0; i < keys.size(); ++i) {
    expected += (i ? ",[" : "[") + json::quote(keys[i]) + "," + std::to_string(i) + "]";
  }
  EXPECT_EQ(response.body, expected + "]}");
  worker(0).confirm_write(0, fresh_allocation(keys));  // framing intact: same connection works
}

TEST_F(VllmFlow, ExpectContinueGetsInterimResponseBeforeTheBody) {
  constexpr std::size_t kPromptBlocks = 1250;  // a 20k-token prompt, block size 16
  const std::vector<std::string> keys = make_keys(kPromptBlocks);
  const std::string payload = body::batch_exists(keys);
  http_connection& connection = scheduler_.connection();
  const std::string head =
      format_request("POST", "/keys/batch_exists", payload, {{"Expect", "100-continue"}});
  connection.send_all(std::string_view(head).substr(0, head.size() - payload.size()));

  const std::string interim = "HTTP/1.1 100 Continue\r\n\r\n";
  ASSERT_EQ(connection.read_exact(interim.size()), interim);
  connection.send_all(payload);
  const http_response response = connection.read_response();
  ASSERT_EQ(response.status, 200) << response.describe();
  EXPECT_EQ(response.body, uniform_exists_body(kPromptBlocks, false));
}

}  // namespace
}  // namespace e2e
