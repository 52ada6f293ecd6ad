// Page lifecycle through the whole server on a fake clock, on 1 and 3 simulated cores:
// reservation expiry on the tick, /keys/delete, read leases, LRU eviction on every rank,
// /stats, and all of it across a restart.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "pipeline/rank_sample.hpp"
#include "sim_node.hpp"

using namespace metad;

namespace {

namespace fs = std::filesystem;
using server_test::sim_node;

std::string lifecycle_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "\"" : ",\"") + k + "\"";
  return out;
}

// 32-hex keys as vLLM sends them; lifecycle_key(i) for i < 1000.
std::string lifecycle_key(int i) {
  return fmt::format("{:032x}", 0x5eed0000u + static_cast<unsigned>(i));
}

class Lifecycle : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("metad-lifecycle-" + std::to_string(::getpid()) + "-" + std::to_string(GetParam())))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static metad::config config(metad::eviction evict, std::uint32_t lease_ms = 10'000) {
    metad::config cfg;
    cfg.evict = evict;
    cfg.read_lease_ms = lease_ms;
    return cfg;
  }

  // A TP-wide save task: allocate then confirm `keys` on every rank; returns the pages
  // rank 0 got (-1s if it could not).
  static std::string save(sim_node& n, int ranks, const std::vector<std::string>& keys) {
    std::string first;
    for (int r = 0; r < ranks; ++r) {
      const std::string rank = std::to_string(r);
      const std::string got = n.post("/keys/batch_allocate", "{\"rank\":" + rank + ",\"keys\":[" +
                                                                 lifecycle_list(keys) + "]}");
      if (r == 0) first = got;
      std::string confirmations;
      std::size_t at = 0;
      for (const auto& k : keys) {
        at = got.find(k, at) + k.size() + 2;
        const std::string page = got.substr(at, got.find(']', at) - at);
        if (page == "-1") return got;
        confirmations += (confirmations.empty() ? "[\"" : ",[\"") + k + "\"," + page + "]";
      }
      EXPECT_EQ(n.post("/keys/confirm_write",
                       "{\"rank\":" + rank + ",\"confirmations\":[" + confirmations + "]}"),
                "");
    }
    return first;
  }
  static void init(sim_node& n, int ranks, int pages) {
    for (int r = 0; r < ranks; ++r)
      n.post("/rank/" + std::to_string(r) + "/initialize",
             "{\"num_pages\":" + std::to_string(pages) + "}");
  }
  static std::string exists(sim_node& n, const std::vector<std::string>& keys) {
    return n.post("/keys/batch_exists", "{\"keys\":[" + lifecycle_list(keys) + "]}");
  }

  std::string dir_;
};

TEST_P(Lifecycle, AReservationPastItsTtlIsFreedOnTheTick) {
  metad::config cfg;
  cfg.reservation_ttl_ms = 600'000;
  sim_node n(cfg, GetParam());
  init(n, 2, 4);
  n.post("/keys/batch_allocate", R"({"rank":1,"keys":["a","b"]})");
  n.now += 599'999;
  n.tick();
  EXPECT_EQ(n.get("/rank/1"), R"({"num_pages":4,"free":2,"reserved":2,"bound":0,"incomplete":0})");
  n.now += 1;
  n.tick();
  EXPECT_EQ(n.get("/rank/1"), R"({"num_pages":4,"free":4,"reserved":0,"bound":0,"incomplete":0})");
  EXPECT_EQ(n.post("/keys/confirm_write", R"({"rank":1,"confirmations":[["a",0]]})"),
            R"({"detail":"Page 0 is not reserved for key a on rank 1"})");
  EXPECT_NE(n.get("/stats").find(R"("expired_reservations":2)"), std::string::npos);
}

TEST_P(Lifecycle, AShortAllocationFirstTakesBackExpiredReservations) {
  metad::config cfg;
  cfg.reservation_ttl_ms = 1000;
  sim_node n(cfg, GetParam());
  init(n, 1, 2);
  n.post("/keys/batch_allocate", R"({"rank":0,"keys":["a","b"]})");
  n.now += 1000;  // due, but no tick has run yet
  EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":0,"keys":["c"]})"),
            R"({"rank":0,"results":[["c",0]]})");
}

TEST_P(Lifecycle, DeleteRemovesTheKeyOnEveryRank) {
  sim_node n(config(metad::eviction::none), GetParam());
  init(n, 3, 8);
  save(n, 3, {lifecycle_key(1), lifecycle_key(2), lifecycle_key(3)});
  // Rank 2 is still writing lifecycle_key(4); ranks 0 and 1 confirmed it.
  save(n, 2, {lifecycle_key(4)});
  n.post("/keys/batch_allocate", "{\"rank\":2,\"keys\":[\"" + lifecycle_key(4) + "\"]}");
  EXPECT_EQ(n.post("/keys/delete", "{\"keys\":[" +
                                       lifecycle_list({lifecycle_key(1), lifecycle_key(4),
                                                       lifecycle_key(1), "nope"}) +
                                       "]}"),
            R"({"deleted":2})");
  EXPECT_EQ(exists(n, {lifecycle_key(1), lifecycle_key(2), lifecycle_key(4)}),
            R"({"exists":[false,true,false]})");
  EXPECT_EQ(n.get("/rank/0"), R"({"num_pages":8,"free":6,"reserved":0,"bound":2,"incomplete":0})");
  EXPECT_EQ(n.get("/rank/2"), R"({"num_pages":8,"free":5,"reserved":1,"bound":2,"incomplete":0})");
  // The writer of rank 2 can still confirm: its key starts over in the directory.
  EXPECT_EQ(n.post("/keys/confirm_write",
                   "{\"rank\":2,\"confirmations\":[[\"" + lifecycle_key(4) + "\",3]]}"),
            "");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
  EXPECT_EQ(n.post("/keys/delete", R"({"keys":"x"})"), R"({"detail":"Invalid keys format"})");
  EXPECT_NE(n.get("/stats").find(R"("deleted_keys":2)"), std::string::npos);
}

TEST_P(Lifecycle, AReadLeaseBlocksDeleteUntilItEnds) {
  sim_node n(config(metad::eviction::none, 10'000), GetParam());
  init(n, 1, 4);
  save(n, 1, {lifecycle_key(1), lifecycle_key(2)});
  EXPECT_EQ(n.post("/keys/get_locations", "{\"rank\":0,\"keys\":[\"" + lifecycle_key(1) + "\"]}"),
            R"({"locations":[0]})");
  EXPECT_EQ(exists(n, {lifecycle_key(2)}), R"({"exists":[true]})");  // no lease from batch_exists
  EXPECT_EQ(n.post("/keys/delete",
                   "{\"keys\":[" + lifecycle_list({lifecycle_key(1), lifecycle_key(2)}) + "]}"),
            R"({"deleted":1})");
  n.now += 9'999;
  EXPECT_EQ(n.post("/keys/delete", "{\"keys\":[" + lifecycle_list({lifecycle_key(1)}) + "]}"),
            R"({"deleted":0})");
  n.now += 1;
  EXPECT_EQ(n.post("/keys/delete", "{\"keys\":[" + lifecycle_list({lifecycle_key(1)}) + "]}"),
            R"({"deleted":1})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

TEST_P(Lifecycle, EvictionTakesTheLeastRecentlyUsedKeysOnEveryRank) {
  sim_node n(config(metad::eviction::lru), GetParam());
  init(n, 2, 4);
  for (int i = 0; i < 4; ++i) {
    save(n, 2, {lifecycle_key(i)});
    n.now += 1;
  }
  exists(n, {lifecycle_key(0)});  // key 0 is now the most recently used
  n.now += 1;
  EXPECT_EQ(save(n, 2, {lifecycle_key(10), lifecycle_key(11)}),
            "{\"rank\":0,\"results\":[[\"" + lifecycle_key(10) + "\",1],[\"" + lifecycle_key(11) +
                "\",2]]}");
  EXPECT_EQ(exists(n, {lifecycle_key(0), lifecycle_key(1), lifecycle_key(2), lifecycle_key(3),
                       lifecycle_key(10), lifecycle_key(11)}),
            R"({"exists":[true,false,false,true,true,true]})");
  EXPECT_EQ(n.get("/rank/1"), R"({"num_pages":4,"free":0,"reserved":0,"bound":4,"incomplete":0})");
  EXPECT_NE(n.get("/stats").find(R"("evicted_keys":2)"), std::string::npos);
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

TEST_P(Lifecycle, EvictionSparesLeasedKeysAndKeysBeingWritten) {
  sim_node n(config(metad::eviction::lru, 10'000), GetParam());
  init(n, 2, 3);
  save(n, 2, {lifecycle_key(1)});
  save(n, 2, {lifecycle_key(2)});
  save(n, 1, {lifecycle_key(3)});  // rank 1 has not written key 3: incomplete
  n.post("/keys/get_locations",
         "{\"rank\":1,\"keys\":[" + lifecycle_list({lifecycle_key(1), lifecycle_key(2)}) + "]}");
  // Rank 1's pool: two bound (leased), one free; two new keys cannot fit.
  EXPECT_EQ(n.post("/keys/batch_allocate",
                   "{\"rank\":1,\"keys\":[" + lifecycle_list({lifecycle_key(7), lifecycle_key(8)}) +
                       "]}"),
            "{\"rank\":1,\"results\":[[\"" + lifecycle_key(7) + "\",-1],[\"" + lifecycle_key(8) +
                "\",-1]]}");
  n.now += 10'000;  // the leases end
  EXPECT_EQ(n.post("/keys/batch_allocate",
                   "{\"rank\":1,\"keys\":[" + lifecycle_list({lifecycle_key(7), lifecycle_key(8)}) +
                       "]}"),
            "{\"rank\":1,\"results\":[[\"" + lifecycle_key(7) + "\",0],[\"" + lifecycle_key(8) +
                "\",2]]}");
  EXPECT_EQ(exists(n, {lifecycle_key(1), lifecycle_key(2), lifecycle_key(3)}),
            R"({"exists":[false,true,false]})");
  EXPECT_EQ(n.get("/rank/0"), R"({"num_pages":3,"free":1,"reserved":0,"bound":2,"incomplete":1})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

TEST_P(Lifecycle, AnAllocationHitLeasesItsKeyAgainstEviction) {
  sim_node n(config(metad::eviction::lru, 10'000), GetParam());
  init(n, 1, 2);
  save(n, 1, {lifecycle_key(1)});
  n.now += 1;
  save(n, 1, {lifecycle_key(2)});
  n.now += 1;
  // A writer re-saves key 1 (a hit: it may rewrite page 0), then the pool needs a page.
  EXPECT_EQ(n.post("/keys/batch_allocate", "{\"rank\":0,\"keys\":[\"" + lifecycle_key(1) + "\"]}"),
            "{\"rank\":0,\"results\":[[\"" + lifecycle_key(1) + "\",0]]}");
  n.now += 1;
  exists(n, {lifecycle_key(2)});   // key 2 is now the most recently used ...
  save(n, 1, {lifecycle_key(3)});  // ... but key 1 is leased: key 2 goes
  EXPECT_EQ(exists(n, {lifecycle_key(1), lifecycle_key(2), lifecycle_key(3)}),
            R"({"exists":[true,false,true]})");
}

TEST_P(Lifecycle, ABatchThatCanNeverFitEvictsNothing) {
  sim_node n(config(metad::eviction::lru), GetParam());
  init(n, 1, 2);
  save(n, 1, {lifecycle_key(1), lifecycle_key(2)});
  EXPECT_EQ(
      n.post("/keys/batch_allocate",
             "{\"rank\":0,\"keys\":[" +
                 lifecycle_list({lifecycle_key(3), lifecycle_key(4), lifecycle_key(5)}) + "]}"),
      "{\"rank\":0,\"results\":[[\"" + lifecycle_key(3) + "\",-1],[\"" + lifecycle_key(4) +
          "\",-1],[\"" + lifecycle_key(5) + "\",-1]]}");
  EXPECT_EQ(exists(n, {lifecycle_key(1), lifecycle_key(2)}), R"({"exists":[true,true]})");
}

TEST_P(Lifecycle, KeysWithoutAPageOnTheRankArePassedOverAndKeepTheirPlace) {
  sim_node n(config(metad::eviction::lru), GetParam());
  init(n, 1, 100);  // rank 0 alone: its keys are complete with one confirmation
  for (int i = 0; i < 20; ++i) {
    save(n, 1, {lifecycle_key(i)});
    n.now += 1;
  }
  n.post("/rank/1/initialize", R"({"num_pages":2})");
  for (int i = 20; i < 22; ++i) {
    n.now += 1;
    for (int r = 1; r >= 0; --r) {
      const std::string rank = std::to_string(r);
      const std::string got = n.post("/keys/batch_allocate", "{\"rank\":" + rank + ",\"keys\":[\"" +
                                                                 lifecycle_key(i) + "\"]}");
      const std::string page = got.substr(got.rfind(',') + 1, got.find(']') - got.rfind(',') - 1);
      n.post("/keys/confirm_write", "{\"rank\":" + rank + ",\"confirmations\":[[\"" +
                                        lifecycle_key(i) + "\"," + page + "]]}");
    }
  }
  // Rank 1 is full; the 20 older keys have no page there and are not evicted for it.
  EXPECT_EQ(n.post("/keys/batch_allocate", "{\"rank\":1,\"keys\":[\"" + lifecycle_key(50) + "\"]}"),
            "{\"rank\":1,\"results\":[[\"" + lifecycle_key(50) + "\",0]]}");
  EXPECT_EQ(exists(n, {lifecycle_key(0), lifecycle_key(19), lifecycle_key(20), lifecycle_key(21)}),
            R"({"exists":[true,true,false,true]})");
  // ... and, but for key 0 and 19 just used, they are still the least recently used: a
  // full rank 0 evicts key 1 first.
  for (int i = 100; i < 179; ++i) save(n, 1, {lifecycle_key(i)});  // incomplete: rank 1 lacks them
  EXPECT_EQ(n.post("/keys/batch_allocate", "{\"rank\":0,\"keys\":[\"" + lifecycle_key(60) + "\"]}")
                .find("-1"),
            std::string::npos);
  EXPECT_EQ(exists(n, {lifecycle_key(1), lifecycle_key(2)}), R"({"exists":[false,true]})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

TEST_P(Lifecycle, AnAllocationThatEvictionCannotServeEvictsNothing) {
  sim_node n(config(metad::eviction::lru), GetParam());
  init(n, 2, 8);
  save(n, 1,
       {lifecycle_key(1), lifecycle_key(2)});  // confirmed on rank 0, being written on rank 1:
  n.post("/keys/batch_allocate",               // incomplete, reserved, not evictable
         "{\"rank\":1,\"keys\":[" + lifecycle_list({lifecycle_key(1), lifecycle_key(2)}) + "]}");
  for (int i = 3; i < 9; ++i) save(n, 2, {lifecycle_key(i)});
  std::vector<std::string> fresh;
  for (int i = 20; i < 27; ++i) fresh.push_back(lifecycle_key(i));
  EXPECT_EQ(n.post("/keys/batch_allocate", "{\"rank\":0,\"keys\":[" + lifecycle_list(fresh) + "]}")
                .find(",0]"),
            std::string::npos);
  EXPECT_EQ(exists(n, {lifecycle_key(3), lifecycle_key(8)}), R"({"exists":[true,true]})");
  EXPECT_NE(n.get("/stats").find(R"("evicted_keys":0)"), std::string::npos);
  // Six new keys fit once the six complete ones go.
  fresh.pop_back();
  EXPECT_EQ(n.post("/keys/batch_allocate", "{\"rank\":0,\"keys\":[" + lifecycle_list(fresh) + "]}")
                .find("-1"),
            std::string::npos);
  EXPECT_EQ(exists(n, {lifecycle_key(3), lifecycle_key(8)}), R"({"exists":[false,false]})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

TEST_P(Lifecycle, AVllmFlowWithAPoolFarSmallerThanTheWorkingSetKeepsSaving) {
  for (const auto evict : {metad::eviction::lru, metad::eviction::none}) {
    SCOPED_TRACE(evict == metad::eviction::lru ? "lru" : "none");
    sim_node n(config(evict, 100), GetParam());
    init(n, 2, 16);
    int failed = 0;
    for (int task = 0; task < 60; ++task) {
      std::vector<std::string> keys;
      for (int j = 0; j < 4; ++j) keys.push_back(lifecycle_key(task * 4 + j));
      const std::string got = save(n, 2, keys);
      failed += got.find(",-1]") != std::string::npos;
      // The scheduler and a loader look at recent keys, as vLLM does before a load.
      exists(n, keys);
      n.post("/keys/get_locations", "{\"rank\":1,\"keys\":[" + lifecycle_list(keys) + "]}");
      n.now += 50;
      ASSERT_EQ(pipeline::check_consistency(n.state()), "");
    }
    if (evict == metad::eviction::lru) {
      EXPECT_EQ(failed, 0);
      EXPECT_EQ(exists(n, {lifecycle_key(236), lifecycle_key(237), lifecycle_key(238),
                           lifecycle_key(239)}),
                R"({"exists":[true,true,true,true]})");
    } else {
      EXPECT_EQ(failed, 56);  // 16 pages hold 4 tasks; every later task gets -1
    }
  }
}

TEST_P(Lifecycle, DeletesEvictionsAndExpiriesSurviveARestart) {
  {
    metad::config cfg = config(metad::eviction::lru, 0);
    cfg.data_dir = dir_;
    cfg.reservation_ttl_ms = 5000;
    sim_node n(cfg, GetParam());
    init(n, 2, 4);
    for (int i = 0; i < 4; ++i) {
      save(n, 2, {lifecycle_key(i)});
      n.now += 1;  // recency across cores is by the millisecond
    }
    n.post("/keys/delete", "{\"keys\":[\"" + lifecycle_key(0) + "\"]}");  // frees page 0
    save(n, 2, {lifecycle_key(4), lifecycle_key(5)});                     // evicts key 1
    n.post("/keys/batch_allocate", R"({"rank":0,"keys":["open"]})");      // evicts key 2
    n.now += 5000;
    n.tick();  // "open" expires
    EXPECT_EQ(exists(n, {lifecycle_key(0), lifecycle_key(1), lifecycle_key(2), lifecycle_key(3),
                         lifecycle_key(4), lifecycle_key(5)}),
              R"({"exists":[false,false,false,true,true,true]})");
  }
  metad::config cfg = config(metad::eviction::lru, 10'000);
  cfg.data_dir = dir_;
  sim_node n(cfg, 4 - GetParam());  // another core count
  EXPECT_EQ(exists(n, {lifecycle_key(0), lifecycle_key(1), lifecycle_key(2), lifecycle_key(3),
                       lifecycle_key(4), lifecycle_key(5)}),
            R"({"exists":[false,false,false,true,true,true]})");
  EXPECT_EQ(n.get("/rank/0"), R"({"num_pages":4,"free":1,"reserved":0,"bound":3,"incomplete":0})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
  // The readers' leases were not kept: nothing is removed for one lease after start-up.
  EXPECT_EQ(
      n.post("/keys/delete", "{\"keys\":[\"" + lifecycle_key(3) + "\"]}"),
      R"({"detail":"Deletes are refused for --read-lease-ms after a restart: readers' leases were not kept"})");
  n.now += 10'000;
  EXPECT_EQ(n.post("/keys/delete", "{\"keys\":[\"" + lifecycle_key(3) + "\"]}"),
            R"({"deleted":1})");
}

TEST_P(Lifecycle, StatsListEveryRankInOrderWithTheCounters) {
  sim_node n(config(metad::eviction::none), GetParam());
  init(n, 3, 2);
  save(n, 3, {lifecycle_key(1)});  // complete: three worker ranks when it was first confirmed
  n.post("/rank/-4/initialize", R"({"num_pages":5})");
  n.post("/keys/get_locations", "{\"rank\":0,\"keys\":[\"" + lifecycle_key(1) + "\"]}");
  EXPECT_EQ(n.get("/stats"),
            R"({"ranks":[{"rank":-4,"num_pages":5,"free":5,"reserved":0,"bound":0},)"
            R"({"rank":0,"num_pages":2,"free":1,"reserved":0,"bound":1},)"
            R"({"rank":1,"num_pages":2,"free":1,"reserved":0,"bound":1},)"
            R"({"rank":2,"num_pages":2,"free":1,"reserved":0,"bound":1}],)"
            R"("ranks_total":4,"ranks_truncated":false,"pages_total":11,"pages_free":8,)"
            R"("pages_reserved":0,"pages_bound":3,)"
            R"("keys":1,"leased_keys":1,"evicted_keys":0,"expired_reservations":0,)"
            R"("deleted_keys":0,"refused_releases":0,"incomplete_keys":0,"incomplete_pages":0,)"
            R"("stale_keys":0})");
}

// Past kRankRowsMax ranks, /stats lists the lowest ones and /metrics gives only them
// series; the totals still count every rank.
TEST_P(Lifecycle, StatsAndMetricsListTheLowestRanksAndSumThemAll) {
  sim_node n(config(metad::eviction::none), GetParam());
  const int ranks = static_cast<int>(pipeline::kRankRowsMax) + 7;
  for (int i = 0; i < ranks; ++i) {  // highest first: the first seen are not the lowest
    const int rank = ranks - 1 - i - 3;
    ASSERT_EQ(n.post(fmt::format("/rank/{}/initialize", rank), R"({"num_pages":2})"),
              fmt::format(R"({{"message":"Rank {} initialized with 2 pages"}})", rank));
  }
  const std::string stats = n.get("/stats");
  std::string rows;
  for (int rank = -3; rank < -3 + static_cast<int>(pipeline::kRankRowsMax); ++rank)
    rows += fmt::format(R"({}{{"rank":{},"num_pages":2,"free":2,"reserved":0,"bound":0}})",
                        rows.empty() ? "" : ",", rank);
  EXPECT_TRUE(stats.starts_with(R"({"ranks":[)" + rows + "],")) << stats.substr(0, 300);
  EXPECT_NE(stats.find(fmt::format(R"(],"ranks_total":{},"ranks_truncated":true,)"
                                   R"("pages_total":{},"pages_free":{},"pages_reserved":0,)"
                                   R"("pages_bound":0,"keys":0,)",
                                   ranks, 2 * ranks, 2 * ranks)),
            std::string::npos);
  const std::string metrics = n.get("/metrics");
  EXPECT_NE(metrics.find("\nhf3fs_metad_rank_series_omitted 7\n"), std::string::npos);
  EXPECT_NE(
      metrics.find(fmt::format("\nhf3fs_metad_pool_pages{{state=\"total\"}} {}\n", 2 * ranks)),
      std::string::npos);
  const int last = -3 + static_cast<int>(pipeline::kRankRowsMax) - 1;
  EXPECT_NE(
      metrics.find(fmt::format("\nhf3fs_metad_pages{{rank=\"{}\",state=\"free\"}} 2\n", last)),
      std::string::npos);
  EXPECT_EQ(metrics.find(fmt::format("hf3fs_metad_pages{{rank=\"{}\",", last + 1)),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Cores, Lifecycle, ::testing::Values(1, 3),
                         [](const auto& info) { return std::to_string(info.param) + "cores"; });

}  // namespace
