// --memory-max through the pipeline: a vLLM rank or an SGLang pool whose page bitmaps
// would take the server past the budget is refused with a 507 when it is created and
// when it grows, keeps what it had, and counts in
// hf3fs_metad_memory_refusals_total{what="rank"}. The budget is the process's resident
// size when the test starts plus room for a few grown pools, so that most of the
// growths asked for cannot fit whatever else the process holds.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "pipeline/memory_budget.hpp"
#include "shard/rank_table.hpp"
#include "sim_node.hpp"

namespace {

using server_test::sim_node;

constexpr int kRanks = 10;
constexpr std::int64_t kBig = std::int64_t{1} << 26;  // pages: a 16 MiB pool

metad::config budget_config() {
  const pipeline::memory_budget probe(0);
  const std::uint64_t pool = shard::rank_table::pool_bytes(kBig);
  metad::config cfg;
  cfg.memory_max = probe.used() + 3 * pool + pool / 2;  // room for 3 grown pools at most
  return cfg;
}

std::uint64_t rank_refusals(sim_node& n) {
  const std::string metrics = n.get("/metrics");
  const std::string name = R"(hf3fs_metad_memory_refusals_total{what="rank"} )";
  const std::size_t at = metrics.find(name);
  EXPECT_NE(at, std::string::npos);
  return at == std::string::npos ? 0 : std::stoull(metrics.substr(at + name.size()));
}

std::string status_of(const std::string& response) {
  return response.substr(9, 3);  // "HTTP/1.1 507 ..."
}

std::string post(sim_node& n, const std::string& path, const std::string& body) {
  return n.send("POST " + path + " HTTP/1.1\r\ncontent-length: " + std::to_string(body.size()) +
                "\r\n\r\n" + body);
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

// Review row #6: ranks created small, then initialised again with many more pages.
TEST_P(MemoryBudget, GrowingVllmRanksPastTheBudgetIsRefused) {
  sim_node n(budget_config(), GetParam());
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(n.post(fmt::format("/rank/{}/initialize", r), R"({"num_pages":8})"),
              fmt::format(R"({{"message":"Rank {} initialized with 8 pages"}})", r));
  int refused = 0;
  for (int r = 0; r < kRanks; ++r) {
    const std::string answer =
        post(n, fmt::format("/rank/{}/initialize", r), fmt::format(R"({{"num_pages":{}}})", kBig));
    if (status_of(answer) == "200") {
      EXPECT_EQ(n.get(fmt::format("/rank/{}", r)),
                fmt::format(R"({{"num_pages":{},"free":{},"reserved":0,"bound":0,"incomplete":0}})",
                            kBig, kBig));
      continue;
    }
    ++refused;
    EXPECT_EQ(status_of(answer), "507") << answer;
    EXPECT_NE(answer.find(fmt::format("Rank {} not initialized: its {} pages need", r, kBig)),
              std::string::npos)
        << answer;
    EXPECT_NE(answer.find("--memory-max"), std::string::npos) << answer;
    EXPECT_EQ(n.get(fmt::format("/rank/{}", r)),
              R"({"num_pages":8,"free":8,"reserved":0,"bound":0,"incomplete":0})");
  }
  EXPECT_GE(refused, kRanks - 4);
  EXPECT_EQ(rank_refusals(n), static_cast<std::uint64_t>(refused));
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

// Review row #7: SGLang pools, created past the budget and grown past it.
TEST_P(MemoryBudget, SglangPoolsPastTheBudgetAreRefusedWhenCreatedAndWhenGrown) {
  sim_node n(budget_config(), GetParam());
  // Created small first, in another namespace (the budget counts resident memory: once
  // the pools below have filled it, even a small pool may not fit), and grown below.
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(n.post(fmt::format("/{}/initialize", r), R"({"num_pages":8,"namespace":"mamba"})"),
              "");
  int refused = 0;
  // Created at once with many pages: no pool is made for a refusal.
  for (int r = 0; r < kRanks; ++r) {
    const std::string answer =
        post(n, fmt::format("/{}/initialize", r), fmt::format(R"({{"num_pages":{}}})", kBig));
    if (status_of(answer) == "204") continue;
    ++refused;
    EXPECT_EQ(status_of(answer), "507") << answer;
    EXPECT_NE(answer.find(fmt::format("Rank {} namespace 'kv' not initialized: its {} pages need",
                                      r, kBig)),
              std::string::npos)
        << answer;
    EXPECT_EQ(n.post(fmt::format("/{}/exists", r), R"({"keys":[]})"),
              fmt::format(R"({{"detail":"Rank {} namespace 'kv' not initialized. Please call )"
                          R"(/{}/initialize first."}})",
                          r, r));
  }
  EXPECT_GE(refused, kRanks - 4);
  const int created = kRanks - refused;
  EXPECT_NE(n.get("/stats").find(fmt::format(R"("pools_total":{},)", created + kRanks)),
            std::string::npos);
  // The small pools grown: refused growths keep 8 pages.
  int refused_growths = 0;
  for (int r = 0; r < kRanks; ++r) {
    const std::string answer = post(n, fmt::format("/{}/initialize", r),
                                    fmt::format(R"({{"num_pages":{},"namespace":"mamba"}})", kBig));
    const std::string reserve = n.post(fmt::format("/{}/reserve_and_allocate_page_indices", r),
                                       R"({"keys":["k"],"namespace":"mamba"})");
    if (status_of(answer) == "204") {
      EXPECT_EQ(reserve, fmt::format(R"({{"indices":[[false,{}]]}})", kBig - 1));
      continue;
    }
    ++refused_growths;
    EXPECT_EQ(status_of(answer), "507") << answer;
    EXPECT_NE(answer.find("--memory-max"), std::string::npos) << answer;
    EXPECT_EQ(reserve, R"({"indices":[[false,7]]})");  // still 8 pages
  }
  EXPECT_GT(refused_growths, kRanks / 2);  // the pools made above left (almost) no room
  EXPECT_EQ(rank_refusals(n), static_cast<std::uint64_t>(refused + refused_growths));
  // (No check_consistency: it walks every page of the big pools, seconds under ASan.)
}

INSTANTIATE_TEST_SUITE_P(Cores, MemoryBudget, ::testing::Values(1, 3));

}  // namespace
