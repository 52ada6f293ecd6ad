// --memory-max through the pipeline. A vLLM rank or an SGLang pool costs what it holds,
// not its num_pages: created or grown to 2^40 pages it takes nothing more, and as it grows
// by handing pages out (with their bindings and keys) the budget is charged. Past the
// budget an allocation is answered as by a full pool: vLLM's new keys get -1 (hits keep
// their pages), an SGLang pool only evicts (or answers -1), and a refusal counts in
// hf3fs_metad_memory_refusals_total{what="allocation"}. The budget is the process's
// resident size when the test starts plus a little room, so that storing keys of 4,000
// bytes fills it within a few hundred requests.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
extern "C" void __sanitizer_purge_allocator();  // sanitizer/allocator_interface.h
#endif

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "pipeline/memory_budget.hpp"
#include "shard/rank_table.hpp"
#include "sim_node.hpp"

namespace {

using server_test::sim_node;
namespace fs = std::filesystem;

constexpr std::int64_t kHuge = std::int64_t{1} << 40;
constexpr std::uint64_t kRoom = 16 << 20;  // the budget's room above the resident size
constexpr int kBudgetBatch = 12;           // keys per request (a body under 64 KiB)
constexpr int kBudgetBatchesMax = 600;     // 12 x 4,000 x 600 = 27 MiB of keys: past the room

metad::config budget_config(std::uint64_t room = kRoom) {
  // What earlier tests freed goes back to the system first: memory the allocator still
  // holds would be reused without the resident size growing, and the budget (which
  // counts resident memory) would never fill.
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_purge_allocator();
#else
  ::malloc_trim(0);
#endif
  const pipeline::memory_budget probe(0);
  metad::config cfg;
  cfg.memory_max = probe.used() + room;
  return cfg;
}

std::uint64_t refusals(sim_node& n, const char* what) {
  const std::string metrics = n.get("/metrics");
  const std::string name = fmt::format(R"(hf3fs_metad_memory_refusals_total{{what="{}"}} )", what);
  const std::size_t at = metrics.find(name);
  EXPECT_NE(at, std::string::npos);
  return at == std::string::npos ? 0 : std::stoull(metrics.substr(at + name.size()));
}

// Batch b's keys: 4,000 bytes each, distinct.
std::vector<std::string> long_keys(int b) {
  std::vector<std::string> keys;
  for (int i = 0; i < kBudgetBatch; ++i)
    keys.push_back(fmt::format("{:0>4000}", b * kBudgetBatch + i));
  return keys;
}
std::string json_keys(const std::vector<std::string>& keys, bool with_prefix) {
  std::string out;
  for (const auto& k : keys) {
    if (!out.empty()) out += ',';
    out += with_prefix ? fmt::format(R"(["{}",""])", k) : fmt::format(R"("{}")", k);
  }
  return out;
}

// The first SGLang pool's counts in /stats: "num_pages":...,"bound":N.
std::string pool_row(const std::string& stats) {
  const std::size_t at = stats.find(R"("num_pages")", stats.find(R"("sglang")"));
  return at == std::string::npos ? stats : stats.substr(at, stats.find('}', at) - at);
}

class MemoryBudget : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
#if defined(__SANITIZE_THREAD__)
    // The budget counts resident memory, and ThreadSanitizer's shadow memory grows it by
    // hundreds of MiB as the test runs: past any budget fixed at its start.
    GTEST_SKIP() << "resident memory is ThreadSanitizer's here";
#endif
  }
};

// Pools cost what they hold: 24 ranks and 24 pools of 2^40 pages, created or grown to it,
// fit a budget with 16 MiB of room, and serve.
TEST_P(MemoryBudget, HugeRanksAndPoolsCostNothingUntilTheyHandOutPages) {
  sim_node n(budget_config(), GetParam());
  for (int r = 0; r < 24; ++r) {
    const std::int64_t first = r % 2 == 0 ? kHuge : 8;  // half grown from 8 pages
    EXPECT_EQ(
        n.post(fmt::format("/rank/{}/initialize", r), fmt::format(R"({{"num_pages":{}}})", first)),
        fmt::format(R"({{"message":"Rank {} initialized with {} pages"}})", r, first));
    EXPECT_EQ(n.post(fmt::format("/{}/initialize", r), fmt::format(R"({{"num_pages":{}}})", first)),
              "");
    EXPECT_EQ(
        n.post(fmt::format("/rank/{}/initialize", r), fmt::format(R"({{"num_pages":{}}})", kHuge)),
        fmt::format(R"({{"message":"Rank {} initialized with {} pages"}})", r, kHuge));
    EXPECT_EQ(n.post(fmt::format("/{}/initialize", r), fmt::format(R"({{"num_pages":{}}})", kHuge)),
              "");
  }
  for (int r = 0; r < 24; ++r) {
    EXPECT_EQ(n.post("/keys/batch_allocate",
                     fmt::format(R"({{"rank":{},"keys":[["a",""],["b",""]]}})", r)),
              fmt::format(R"({{"rank":{},"results":[["a",0],["b",1]]}})", r));
    EXPECT_EQ(
        n.post(fmt::format("/{}/reserve_and_allocate_page_indices", r), R"({"keys":["a","b"]})"),
        fmt::format(R"({{"indices":[[false,{}],[false,{}]]}})", kHuge - 1, kHuge - 2));
  }
  EXPECT_EQ(refusals(n, "rank"), 0u);
  EXPECT_EQ(refusals(n, "allocation"), 0u);
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

// A vLLM rank growing by the keys it is given: past the budget, a batch of new keys gets
// -1s and changes nothing, hits keep their pages, and the keys stored stay within the room.
TEST_P(MemoryBudget, VllmAllocationsPastTheBudgetAreAnsweredAsByAFullPool) {
  sim_node n(budget_config(), GetParam());
  EXPECT_EQ(n.post("/rank/0/initialize", fmt::format(R"({{"num_pages":{}}})", kHuge)),
            fmt::format(R"({{"message":"Rank 0 initialized with {} pages"}})", kHuge));
  int stored = 0, refused_at = -1;
  for (int b = 0; b < kBudgetBatchesMax && refused_at < 0; ++b) {
    const std::string answer =
        n.post("/keys/batch_allocate",
               fmt::format(R"({{"rank":0,"keys":[{}]}})", json_keys(long_keys(b), true)));
    if (answer.find(",-1]") != std::string::npos) {
      EXPECT_EQ(answer.find(fmt::format(",{}]", stored)), std::string::npos) << "all or nothing";
      refused_at = b;
    } else {
      stored += kBudgetBatch;
    }
  }
  ASSERT_GE(refused_at, 0) << "never refused: the keys are not charged";
  // Not more than the room (and the resident size grew by them: it is what refused).
  EXPECT_LE(static_cast<std::uint64_t>(stored) * 4000, kRoom);
  EXPECT_EQ(n.get("/rank/0"),
            fmt::format(R"({{"num_pages":{},"free":{},"reserved":{},"bound":0,"incomplete":0}})",
                        kHuge, kHuge - stored, stored));
  // Hits cost nothing new: they keep their pages.
  const std::vector<std::string> first = long_keys(0);
  EXPECT_EQ(
      n.post("/keys/batch_allocate", fmt::format(R"({{"rank":0,"keys":[["{}",""]]}})", first[0])),
      fmt::format(R"({{"rank":0,"results":[["{}",0]]}})", first[0]));
  EXPECT_GE(refusals(n, "allocation"), 1u);
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

// An SGLang pool growing by the keys it binds: past the budget a reserve takes no fresh
// page (the pool's free pages stay as they are) and evicts the least recently used keys
// instead, as a full pool does. The log says so: the pool is the same after a restart.
TEST_P(MemoryBudget, SglangReservesPastTheBudgetOnlyEvict) {
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("metad-budget-{}-{}", ::getpid(), GetParam());
  fs::remove_all(dir);
  metad::config cfg = budget_config();
  cfg.data_dir = dir.string();
  std::string stats;
  {
    sim_node n(cfg, GetParam());
    EXPECT_EQ(n.post("/0/initialize", fmt::format(R"({{"num_pages":{}}})", kHuge)), "");
    std::int64_t lowest = kHuge;  // the lowest page handed out
    int refused_at = -1, evicting = 0;
    for (int b = 0; b < kBudgetBatchesMax && evicting < 3; ++b) {
      const std::vector<std::string> keys = long_keys(b);
      const std::string answer = n.post("/0/reserve_and_allocate_page_indices",
                                        fmt::format(R"({{"keys":[{}]}})", json_keys(keys, false)));
      // [[false,page],...]: confirm every page given.
      std::vector<std::int64_t> pages;
      for (std::size_t at = answer.find("[false,"); at != std::string::npos;
           at = answer.find("[false,", at + 1))
        pages.push_back(std::stoll(answer.substr(at + 7)));
      ASSERT_EQ(pages.size(), keys.size()) << answer;
      std::string confirms;
      bool fresh = false;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        ASSERT_GE(pages[i], 0) << answer;  // bound keys are left to evict: never -1
        fresh = fresh || pages[i] < lowest;
        lowest = std::min(lowest, pages[i]);
        confirms += fmt::format(R"({}["{}",{}])", confirms.empty() ? "" : ",", keys[i], pages[i]);
      }
      if (!fresh) {
        if (refused_at < 0) refused_at = b;
        ++evicting;
      } else {
        ASSERT_LT(refused_at, 0) << "a fresh page after the budget was spent";
      }
      ASSERT_EQ(n.post("/0/confirm_write",
                       fmt::format(R"({{"written_keys_to_confirm":[{}]}})", confirms)),
                "");
    }
    ASSERT_GE(refused_at, 0) << "never refused: the keys are not charged";
    EXPECT_LE(static_cast<std::uint64_t>(kHuge - lowest) * 4000, kRoom);
    EXPECT_GE(refusals(n, "allocation"), 3u);
    stats = pool_row(n.get("/stats"));
    EXPECT_EQ(stats.find(fmt::format(R"("num_pages":{},"free":{},)", kHuge, lowest)), 0u) << stats;
  }
  // Recovered from the log (the refused reserves replayed as such): the same pool.
  metad::config roomy = cfg;
  roomy.memory_max = 0;
  sim_node n(roomy, GetParam());
  EXPECT_EQ(pool_row(n.get("/stats")), stats);
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
  fs::remove_all(dir);
}

// Already past the budget: a rank or pool cannot even be created (507), nor allocate.
TEST_P(MemoryBudget, NothingIsCreatedPastTheBudget) {
  metad::config cfg;
  cfg.memory_max = 1 << 20;  // far below what the process holds
  sim_node n(cfg, GetParam());
  const std::string answer =
      n.send("POST /rank/0/initialize HTTP/1.1\r\ncontent-length: 16\r\n\r\n{\"num_pages\":64}");
  EXPECT_EQ(answer.substr(9, 3), "507") << answer;
  EXPECT_NE(answer.find("--memory-max 1048576"), std::string::npos) << answer;
  const std::string sg =
      n.send("POST /0/initialize HTTP/1.1\r\ncontent-length: 16\r\n\r\n{\"num_pages\":64}");
  EXPECT_EQ(sg.substr(9, 3), "507") << sg;
  EXPECT_EQ(refusals(n, "rank"), 2u);
}

// A forked snapshot cut is charged the resident size at its fork (the pages its child
// may copy) while it runs: refused when that does not fit, shared by cuts forked
// together, given back when the last ends, and counted against every other charge.
TEST(MemoryBudgetCuts, AForkedCutHoldsTheResidentSizeUntilTheLastEnds) {
  const pipeline::memory_budget probe(0);
  const std::uint64_t resident = probe.used();
  ASSERT_GT(resident, 0u);

  pipeline::memory_budget tight(resident + resident / 2);  // no room for a second copy
  EXPECT_FALSE(tight.begin_cut());
  EXPECT_EQ(tight.refused_cuts.load(), 1u);
  EXPECT_EQ(tight.cut_charge(), 0u);
  EXPECT_TRUE(tight.charge_kept(resident / 4));  // a refused cut took nothing

  pipeline::memory_budget roomy(3 * resident + (64u << 20));
  ASSERT_TRUE(roomy.begin_cut());
  const std::uint64_t first = roomy.cut_charge();
  EXPECT_GE(first, resident - resident / 8);
  EXPECT_GE(roomy.used(), roomy.resident() + first);
  ASSERT_TRUE(roomy.begin_cut());  // forked together: the charge is shared
  EXPECT_LE(roomy.cut_charge(), first + (8u << 20));
  // What the cuts hold is not there for anything else.
  EXPECT_FALSE(roomy.charge_kept(roomy.max() - roomy.used() + 1));
  roomy.end_cut();
  EXPECT_GT(roomy.cut_charge(), 0u);  // one still runs
  roomy.end_cut();
  EXPECT_EQ(roomy.cut_charge(), 0u);
  EXPECT_TRUE(roomy.charge_kept(resident));
  EXPECT_EQ(roomy.refused_cuts.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Cores, MemoryBudget, ::testing::Values(1, 3));

}  // namespace
