// Stale incomplete keys through the whole server on a fake clock, on 1 and 3 simulated
// cores, with and without eviction: a save whose write failed on one rank leaves keys
// confirmed on the others that no one will complete; once --incomplete-grace-ms has
// passed since their last confirmation they are removed on every rank (by the tick, or
// at once by an allocation that comes up short), unless a writer still holds a
// reservation for them. Counted in /stats and /metrics, and durable.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "sim_node.hpp"

namespace {

namespace fs = std::filesystem;
using server_test::sim_node;

constexpr std::uint32_t kGraceMs = 30'000;

std::string stale_key(int i) {
  return fmt::format("{:032x}", 0x57a1e000u + static_cast<unsigned>(i));
}
std::vector<std::string> keys(int first, int n) {
  std::vector<std::string> out;
  for (int i = first; i < first + n; ++i) out.push_back(stale_key(i));
  return out;
}
std::string stale_list(const std::vector<std::string>& ks) {
  std::string out;
  for (const auto& k : ks) out += (out.empty() ? "\"" : ",\"") + k + "\"";
  return out;
}

// The pages of a batch_allocate answer, in order.
std::vector<long> stale_pages_of(const std::string& answer) {
  std::vector<long> out;
  for (std::size_t at = answer.find("\","); at != std::string::npos;
       at = answer.find("\",", at + 2))
    out.push_back(std::stol(answer.substr(at + 2)));
  return out;
}

class Stale : public ::testing::TestWithParam<std::tuple<int, metad::eviction>> {
 protected:
  int cores() const { return std::get<0>(GetParam()); }
  bool lru() const { return std::get<1>(GetParam()) == metad::eviction::lru; }
  metad::config config() const {
    metad::config cfg;
    cfg.evict = std::get<1>(GetParam());
    cfg.incomplete_grace_ms = kGraceMs;
    return cfg;
  }

  static void init(sim_node& n, int ranks, int pages) {
    for (int r = 0; r < ranks; ++r)
      n.post("/rank/" + std::to_string(r) + "/initialize",
             "{\"num_pages\":" + std::to_string(pages) + "}");
  }
  static std::vector<long> allocate(sim_node& n, int rank, const std::vector<std::string>& ks) {
    return stale_pages_of(
        n.post("/keys/batch_allocate",
               fmt::format("{{\"rank\":{},\"keys\":[{}]}}", rank, stale_list(ks))));
  }
  static std::string confirm(sim_node& n, int rank, const std::vector<std::string>& ks,
                             const std::vector<long>& pages) {
    std::string confirmations;
    for (std::size_t i = 0; i < ks.size(); ++i)
      confirmations += fmt::format("{}[\"{}\",{}]", i == 0 ? "" : ",", ks[i], pages[i]);
    return n.post("/keys/confirm_write",
                  fmt::format("{{\"rank\":{},\"confirmations\":[{}]}}", rank, confirmations));
  }
  static std::string release(sim_node& n, int rank, const std::vector<long>& pages) {
    return n.post("/keys/confirm_write",
                  fmt::format("{{\"rank\":{},\"confirmations\":[],\"pages_to_release\":[{}]}}",
                              rank, fmt::join(pages, ",")));
  }
  // One rank's side of a save: allocate, then confirm. Returns the pages (-1s: failed).
  static std::vector<long> save_on(sim_node& n, int rank, const std::vector<std::string>& ks) {
    const std::vector<long> pages = allocate(n, rank, ks);
    if (pages.empty() || pages[0] < 0) return pages;
    EXPECT_EQ(confirm(n, rank, ks, pages), "");
    return pages;
  }
  // vLLM's write-failure path on a TP-2 save: rank 0 writes and confirms, rank 1's
  // write fails and it releases its pages.
  static void half_save(sim_node& n, const std::vector<std::string>& ks) {
    ASSERT_EQ(save_on(n, 0, ks).size(), ks.size());
    const std::vector<long> pages = allocate(n, 1, ks);
    ASSERT_TRUE(!pages.empty() && pages[0] >= 0);
    EXPECT_EQ(release(n, 1, pages), "");
  }
  static std::string exists(sim_node& n, const std::vector<std::string>& ks) {
    return n.post("/keys/batch_exists", "{\"keys\":[" + stale_list(ks) + "]}");
  }
  static std::string stats_tail(sim_node& n) {
    const std::string s = n.get("/stats");
    return s.substr(s.find("\"incomplete_keys\""));
  }
};

TEST_P(Stale, AHalfFailedSaveNoLongerBlocksTheRankOnceItsGraceHasPassed) {
  sim_node n(config(), cores());
  init(n, 2, 4);
  half_save(n, keys(0, 4));  // rank 0 is full of keys that can never complete
  EXPECT_EQ(stats_tail(n), R"("incomplete_keys":4,"incomplete_pages":4,"stale_keys":0})");
  EXPECT_EQ(n.get("/rank/0"), R"({"num_pages":4,"free":0,"reserved":0,"bound":4,"incomplete":4})");
  EXPECT_EQ(n.get("/rank/1"), R"({"num_pages":4,"free":4,"reserved":0,"bound":0,"incomplete":0})");
  if (lru()) {
    // With eviction, incomplete keys no rank reserves are evicted, even within their
    // grace, rather than refuse the allocation (two of the four, confirmed together).
    const std::vector<long> pages = allocate(n, 0, keys(10, 2));
    ASSERT_EQ(pages.size(), 2u);
    EXPECT_TRUE(pages[0] >= 0 && pages[0] < pages[1] && pages[1] < 4) << pages[0] << pages[1];
    EXPECT_EQ(stats_tail(n), R"("incomplete_keys":2,"incomplete_pages":2,"stale_keys":0})");
    EXPECT_NE(n.get("/stats").find(R"("evicted_keys":2,)"), std::string::npos);
    EXPECT_EQ(pipeline::check_consistency(n.state()), "");
    return;
  }
  EXPECT_EQ(allocate(n, 0, keys(10, 2)), (std::vector<long>{-1, -1}));
  n.now += kGraceMs - 1;
  n.tick();
  EXPECT_EQ(allocate(n, 0, keys(10, 2)), (std::vector<long>{-1, -1}));  // not yet
  n.now += 2;
  // Past the grace: the allocation that comes up short reclaims them at once.
  EXPECT_EQ(save_on(n, 0, keys(10, 2)), (std::vector<long>{0, 1}));
  EXPECT_EQ(save_on(n, 1, keys(10, 2)), (std::vector<long>{0, 1}));
  EXPECT_EQ(exists(n, keys(10, 2)), R"({"exists":[true,true]})");
  EXPECT_EQ(stats_tail(n), R"("incomplete_keys":0,"incomplete_pages":0,"stale_keys":4})");
  EXPECT_EQ(n.get("/rank/0"), R"({"num_pages":4,"free":2,"reserved":0,"bound":2,"incomplete":0})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

TEST_P(Stale, TheTickReclaimsStaleKeysOnEveryRank) {
  sim_node n(config(), cores());
  init(n, 3, 4);
  // Keys confirmed on ranks 0 and 1 of a TP-3 group; rank 2 never wrote them.
  ASSERT_EQ(save_on(n, 0, keys(0, 3)).size(), 3u);
  ASSERT_EQ(save_on(n, 1, keys(0, 3)).size(), 3u);
  EXPECT_EQ(stats_tail(n), R"("incomplete_keys":3,"incomplete_pages":6,"stale_keys":0})");
  n.now += kGraceMs;
  n.tick();
  EXPECT_EQ(stats_tail(n), R"("incomplete_keys":0,"incomplete_pages":0,"stale_keys":3})");
  for (const char* rank : {"/rank/0", "/rank/1", "/rank/2"})
    EXPECT_EQ(n.get(rank), R"({"num_pages":4,"free":4,"reserved":0,"bound":0,"incomplete":0})")
        << rank;
  const std::string metrics = n.get("/metrics");
  EXPECT_NE(metrics.find("\nhf3fs_metad_stale_keys_total 3\n"), std::string::npos);
  EXPECT_NE(metrics.find("\nhf3fs_metad_incomplete_keys 0\n"), std::string::npos);
  EXPECT_NE(metrics.find("\nhf3fs_metad_incomplete_pages 0\n"), std::string::npos);
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

TEST_P(Stale, ALaggingWriterThatCompletesJustBeforeTheGraceKeepsTheKey) {
  sim_node n(config(), cores());
  init(n, 2, 4);
  ASSERT_EQ(save_on(n, 0, keys(0, 2)).size(), 2u);
  n.now += kGraceMs - 1;
  ASSERT_EQ(save_on(n, 1, keys(0, 2)).size(), 2u);  // the lagging rank completes them
  n.now += kGraceMs;
  n.tick();
  EXPECT_EQ(exists(n, keys(0, 2)), R"({"exists":[true,true]})");
  EXPECT_EQ(stats_tail(n), R"("incomplete_keys":0,"incomplete_pages":0,"stale_keys":0})");
}

TEST_P(Stale, AKeyARankStillReservesIsKeptUntilAGraceAfterTheWriterGaveUp) {
  sim_node n(config(), cores());
  init(n, 2, 4);
  ASSERT_EQ(save_on(n, 0, keys(0, 1)).size(), 1u);
  const std::vector<long> slow = allocate(n, 1, keys(0, 1));  // rank 1 is still writing
  n.now += kGraceMs + 1;
  n.tick();
  EXPECT_EQ(stats_tail(n), R"("incomplete_keys":1,"incomplete_pages":1,"stale_keys":0})");
  // Its write fails after all: the key is stale a grace after it was looked at.
  EXPECT_EQ(release(n, 1, slow), "");
  n.now += kGraceMs - 1;
  n.tick();
  EXPECT_EQ(stats_tail(n), R"("incomplete_keys":1,"incomplete_pages":1,"stale_keys":0})");
  n.now += 1;
  n.tick();
  EXPECT_EQ(stats_tail(n), R"("incomplete_keys":0,"incomplete_pages":0,"stale_keys":1})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

TEST_P(Stale, AWriterThatFinishesAfterBeingLookedAtCompletesTheKey) {
  sim_node n(config(), cores());
  init(n, 2, 4);
  ASSERT_EQ(save_on(n, 0, keys(0, 1)).size(), 1u);
  const std::vector<long> slow = allocate(n, 1, keys(0, 1));
  n.now += kGraceMs + 1;
  n.tick();  // kept: rank 1 reserves it
  EXPECT_EQ(confirm(n, 1, keys(0, 1), slow), "");
  EXPECT_EQ(exists(n, keys(0, 1)), R"({"exists":[true]})");
  n.now += 10 * kGraceMs;
  n.tick();
  EXPECT_EQ(exists(n, keys(0, 1)), R"({"exists":[true]})");
}

// Under pressure (eviction on), incomplete keys within their grace go before an
// allocation is refused, but only those that hold a page on the short rank and that no
// rank reserves; the others keep their place (and their grace).
TEST_P(Stale, EvictionTakesIncompleteKeysOnTheShortRankOnly) {
  if (!lru()) GTEST_SKIP() << "eviction only";
  sim_node n(config(), cores());
  init(n, 3, 2);
  // Rank 2 holds two incomplete keys; rank 0 two more, the older one being written on
  // rank 1 (reserved there).
  ASSERT_EQ(save_on(n, 2, keys(0, 2)).size(), 2u);
  n.now += 1;
  ASSERT_EQ(save_on(n, 0, keys(2, 2)).size(), 2u);
  allocate(n, 1, keys(2, 1));
  n.now += 1;
  EXPECT_EQ(allocate(n, 0, keys(10, 1)), (std::vector<long>{1}));  // key 3's page
  EXPECT_EQ(n.get("/rank/0"), R"({"num_pages":2,"free":0,"reserved":1,"bound":1,"incomplete":1})");
  EXPECT_EQ(n.get("/rank/2"), R"({"num_pages":2,"free":0,"reserved":0,"bound":2,"incomplete":2})");
  EXPECT_EQ(allocate(n, 0, keys(11, 1)), (std::vector<long>{-1}));  // key 2 is being written
  EXPECT_EQ(stats_tail(n), R"("incomplete_keys":3,"incomplete_pages":3,"stale_keys":0})");
  // The passed-over keys kept their grace: rank 2's are stale first.
  n.now += kGraceMs - 1;
  n.tick();
  EXPECT_EQ(n.get("/rank/2"), R"({"num_pages":2,"free":2,"reserved":0,"bound":0,"incomplete":0})");
  EXPECT_EQ(stats_tail(n), R"("incomplete_keys":1,"incomplete_pages":1,"stale_keys":2})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

// A save whose ranks go one after another (rank 1 allocates only once rank 0 has
// confirmed) is, between the two, exactly what eviction takes rather than answer -1: a
// key confirmed on rank 0 that no rank reserves. Its writer does not know: rank 1's
// allocation and confirm then succeed, and the key is bound on rank 1 but not on rank
// 0, incomplete (batch_exists: false) until a grace later it is reclaimed as stale. The
// node stays consistent; a save whose ranks all allocate before any confirms keeps its
// key (the lagging rank's reservation protects it) and the allocation is refused.
TEST_P(Stale, AnEvictionBetweenTwoRanksOfASaveLeavesItsKeyOnTheLaterRanksOnly) {
  if (!lru()) GTEST_SKIP() << "eviction only";
  for (const bool reserve_first : {false, true}) {
    SCOPED_TRACE(reserve_first);
    sim_node n(config(), cores());
    init(n, 2, 2);
    const std::vector<std::string> c = keys(0, 1), x = keys(1, 1), y = keys(2, 1);
    ASSERT_EQ(save_on(n, 0, c), (std::vector<long>{0}));  // complete, page 0 on both ranks
    ASSERT_EQ(save_on(n, 1, c), (std::vector<long>{0}));
    // A reader's lease: c cannot be evicted.
    EXPECT_EQ(n.post("/keys/get_locations", "{\"rank\":0,\"keys\":[" + stale_list(c) + "]}"),
              R"({"locations":[0]})");
    // Saver X: rank 0 written and confirmed; rank 1 not allocated yet (unless reserve_first).
    const std::vector<long> x_on_0 = allocate(n, 0, x);
    const std::vector<long> x_on_1 = reserve_first ? allocate(n, 1, x) : std::vector<long>{};
    EXPECT_EQ(confirm(n, 0, x, x_on_0), "");
    // Saver Y: rank 0 is full (c leased, x incomplete).
    const std::vector<long> y_on_0 = allocate(n, 0, y);
    if (reserve_first) {
      EXPECT_EQ(y_on_0, (std::vector<long>{-1}));  // x is being written on rank 1
      EXPECT_EQ(confirm(n, 1, x, x_on_1), "");
      EXPECT_EQ(exists(n, x), R"({"exists":[true]})");
      EXPECT_EQ(pipeline::check_consistency(n.state()), "");
      continue;
    }
    EXPECT_EQ(y_on_0, (std::vector<long>{1}));  // x's page: x was evicted on rank 0
    // X goes on to rank 1, and every step of its save succeeds.
    EXPECT_EQ(save_on(n, 1, x), (std::vector<long>{1}));
    EXPECT_EQ(exists(n, x), R"({"exists":[false]})");
    EXPECT_EQ(n.get("/rank/0"),
              R"({"num_pages":2,"free":0,"reserved":1,"bound":1,"incomplete":0})");
    // Rank 1 binds a key more than there are complete keys: x is half-present.
    EXPECT_EQ(n.get("/rank/1"),
              R"({"num_pages":2,"free":0,"reserved":0,"bound":2,"incomplete":1})");
    EXPECT_EQ(pipeline::check_consistency(n.state()), "");
    n.now += kGraceMs;
    n.tick();
    EXPECT_EQ(n.get("/rank/1"),
              R"({"num_pages":2,"free":1,"reserved":0,"bound":1,"incomplete":0})");
    EXPECT_EQ(stats_tail(n), R"("incomplete_keys":0,"incomplete_pages":0,"stale_keys":1})");
    EXPECT_EQ(pipeline::check_consistency(n.state()), "");
  }
}

// Eviction takes the dead before the living: incomplete keys nobody reserves go before
// complete ones once a second has passed since their last confirmation (the ranks of one
// save confirm together), and before that only when no complete key can go.
TEST_P(Stale, SettledIncompleteKeysAreEvictedBeforeCompleteOnes) {
  if (!lru()) GTEST_SKIP() << "eviction only";
  for (const std::uint64_t wait_ms : {10u, 1'000u}) {
    SCOPED_TRACE(wait_ms);
    sim_node n(config(), cores());
    init(n, 2, 4);
    ASSERT_EQ(save_on(n, 0, keys(0, 1)).size(), 1u);  // complete
    ASSERT_EQ(save_on(n, 1, keys(0, 1)).size(), 1u);
    n.now += 1;
    half_save(n, keys(1, 2));  // incomplete on rank 0, nobody reserves them
    n.now += wait_ms;
    ASSERT_EQ(allocate(n, 0, keys(10, 2)).size(), 2u);  // one page short
    const bool settled = wait_ms >= 1'000;
    EXPECT_EQ(exists(n, keys(0, 1)), settled ? R"({"exists":[true]})" : R"({"exists":[false]})");
    EXPECT_EQ(stats_tail(n), settled
                                 ? R"("incomplete_keys":1,"incomplete_pages":1,"stale_keys":0})"
                                 : R"("incomplete_keys":2,"incomplete_pages":2,"stale_keys":0})");
    EXPECT_EQ(pipeline::check_consistency(n.state()), "");
  }
}

// The connector's save path at small scale, as the replay runs it: TP 4, pools far
// smaller than the working set, and save tasks whose write fails on one rank (that rank
// releases, the others confirm). After the first fill no allocation answers -1 with
// eviction on, and the pages held by incomplete keys stay bounded; without eviction the
// reclamation alone keeps the incomplete keys from filling the pool for good.
TEST_P(Stale, AReplayWithFailingRanksNeverSpiralsIntoRefusals) {
  sim_node n(config(), cores());
  constexpr int kRanks = 4, kPages = 64, kTaskKeys = 8;
  init(n, kRanks, kPages);
  std::uint64_t seed = 12345;
  auto next = [&seed] {
    return (seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33;
  };
  int refused_late = 0, max_incomplete_pages = 0;
  for (int task = 0; task < 400; ++task) {
    const std::vector<std::string> ks = keys(1000 + task * kTaskKeys, kTaskKeys);
    const int failing = next() % 5 == 0 ? static_cast<int>(next() % kRanks) : -1;  // 20%
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<long> pages = allocate(n, r, ks);
      const bool refused = pages.empty() || pages[0] < 0;
      if (refused) {
        refused_late += task >= 40;
        continue;
      }
      if (r == failing) {
        EXPECT_EQ(release(n, r, pages), "");
      } else {
        EXPECT_EQ(confirm(n, r, ks, pages), "");
      }
    }
    n.now += 250;  // four tasks a second: the grace (30 s) spans 120 of them
    if (task % 4 == 3) n.tick();
    const std::string st = n.get("/stats");
    const std::size_t at = st.find("\"incomplete_pages\":") + 19;
    max_incomplete_pages = std::max(max_incomplete_pages, std::stoi(st.substr(at)));
  }
  if (lru()) {
    EXPECT_EQ(refused_late, 0);
    EXPECT_LT(max_incomplete_pages, kRanks * kPages / 2);  // 72 of 256 when written
  }
  // A grace later, nothing incomplete is left: every failed save's keys were reclaimed.
  n.now += kGraceMs;
  n.tick();
  EXPECT_NE(n.get("/stats").find(R"("incomplete_keys":0,"incomplete_pages":0,)"),
            std::string::npos);
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

TEST_P(Stale, ZeroGraceNeverReclaims) {
  metad::config cfg = config();
  cfg.incomplete_grace_ms = 0;
  sim_node n(cfg, cores());
  init(n, 2, 2);
  half_save(n, keys(0, 2));
  n.now += 100 * kGraceMs;
  n.tick();
  EXPECT_EQ(stats_tail(n), R"("incomplete_keys":2,"incomplete_pages":2,"stale_keys":0})");
  // Only eviction, under pressure, takes them: one of the two (confirmed at the same
  // time, so which one is the directory's tie-break).
  const std::vector<long> got = allocate(n, 0, keys(10, 1));
  ASSERT_EQ(got.size(), 1u);
  if (lru())
    EXPECT_TRUE(got[0] == 0 || got[0] == 1) << got[0];
  else
    EXPECT_EQ(got[0], -1);
  EXPECT_EQ(stats_tail(n), lru() ? R"("incomplete_keys":1,"incomplete_pages":1,"stale_keys":0})"
                                 : R"("incomplete_keys":2,"incomplete_pages":2,"stale_keys":0})");
}

TEST_P(Stale, ReclaimedKeysStayGoneAfterARestartAndRecoveredOnesGetAFreshGrace) {
  const std::string dir =
      (fs::temp_directory_path() / fmt::format("metad-stale-{}-{}-{}", ::getpid(), cores(),
                                               static_cast<int>(std::get<1>(GetParam()))))
          .string();
  fs::remove_all(dir);
  metad::config cfg = config();
  cfg.data_dir = dir;
  {
    sim_node n(cfg, cores());
    init(n, 2, 4);
    half_save(n, keys(0, 2));
    n.now += kGraceMs;
    half_save(n, keys(2, 2));  // confirmed a grace later: not yet stale at the tick
    n.tick();
    EXPECT_EQ(stats_tail(n), R"("incomplete_keys":2,"incomplete_pages":2,"stale_keys":2})");
  }
  {
    sim_node n(cfg, 4 - cores());
    EXPECT_EQ(n.get("/rank/0"),
              R"({"num_pages":4,"free":2,"reserved":0,"bound":2,"incomplete":2})");
    EXPECT_EQ(stats_tail(n), R"("incomplete_keys":2,"incomplete_pages":2,"stale_keys":0})");
    n.now += kGraceMs - 1;  // the recovered keys' grace starts at recovery
    n.tick();
    EXPECT_EQ(stats_tail(n), R"("incomplete_keys":2,"incomplete_pages":2,"stale_keys":0})");
    n.now += 1;
    n.tick();
    EXPECT_EQ(n.get("/rank/0"),
              R"({"num_pages":4,"free":4,"reserved":0,"bound":0,"incomplete":0})");
    EXPECT_EQ(pipeline::check_consistency(n.state()), "");
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, Stale,
                         ::testing::Combine(::testing::Values(1, 3),
                                            ::testing::Values(metad::eviction::none,
                                                              metad::eviction::lru)),
                         [](const auto& info) {
                           return fmt::format(
                               "{}cores_{}", std::get<0>(info.param),
                               std::get<1>(info.param) == metad::eviction::lru ? "lru" : "none");
                         });

}  // namespace
