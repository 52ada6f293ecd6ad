// Replayed SGLang requests (docs/sglang-api.md, confirm_write: the release quarantine):
// a client's retry, a proxy or a failover may send a confirm_write again after it was
// applied. A replayed pages_to_release must not free a page that, meanwhile, went to
// another writer. Two writers save through the whole pipeline; every confirm_write and
// delete_keys is sent again, at once or after the other writer's next request; the test
// tracks which writer holds which in-flight page and fails on any page reserved for two
// writers at once, or a confirmation that did not bind.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "sim_node.hpp"

using namespace metad;

namespace {

using server_test::json_list;
using server_test::sim_node;

// The pages of a reserve answer {"indices":[[false,3],[true,2],...]} (-1 for a hit: the
// writer writes only the pages it was given).
std::vector<std::int64_t> reserved_pages(const std::string& answer) {
  std::vector<std::int64_t> pages;
  for (std::size_t at = answer.find("[f"), t = answer.find("[t");
       at != std::string::npos || t != std::string::npos;) {
    const std::size_t next = std::min(at, t);
    if (next == at) {
      pages.push_back(std::stoll(answer.substr(at + 7)));
      at = answer.find("[f", at + 1);
    } else {
      pages.push_back(-1);
      t = answer.find("[t", t + 1);
    }
  }
  return pages;
}

struct sglang_writer {
  int id = 0;
  int next_key = 0;
  std::vector<std::pair<std::string, std::int64_t>> in_flight;  // reserved, not yet settled
  std::vector<std::string> saved;                               // confirmed, oldest first
};

// One run on a 64-page pool: returns how many times two writers held one page, or a
// confirmation did not bind its page.
int sglang_run(int cores, std::uint32_t seed, std::uint32_t quarantine_ms, int steps) {
  sim_node n(server_test::quarantine_config(quarantine_ms), cores);
  std::mt19937 rng(seed);
  auto pick = [&](int k) { return static_cast<int>(rng() % static_cast<unsigned>(k)); };
  n.post("/5/initialize", R"({"num_pages":64})");
  std::map<std::int64_t, std::pair<int, std::string>> holder;  // in-flight page → writer, key
  int violations = 0;
  sglang_writer writers[2];
  writers[1].id = 1;
  std::optional<std::pair<std::string, std::string>> deferred;  // a replay for later

  // Sends a request; a confirm_write or delete_keys is sent again, right away or after
  // the next request (the other writer's, most often).
  auto send = [&](const std::string& path, const std::string& body, bool replayed) {
    const std::string answer = n.post(path, body);
    if (deferred) {
      n.post(deferred->first, deferred->second);
      deferred.reset();
    }
    if (!replayed) return answer;
    if (pick(2) == 0) {
      n.post(path, body);
    } else {
      deferred.emplace(path, body);
    }
    return answer;
  };

  for (int step = 0; step < steps; ++step) {
    sglang_writer& w = writers[pick(2)];
    if (step % 25 == 24) {
      if (deferred) n.post(deferred->first, deferred->second);  // retries come within seconds
      deferred.reset();
      n.now += quarantine_ms + 1000;  // well past any client's retry window
      n.tick();
    }
    if (w.in_flight.empty()) {
      std::vector<std::string> keys;
      for (int k = 1 + pick(4); k > 0; --k)
        keys.push_back(fmt::format("w{}-{}", w.id, w.next_key++));
      const std::string answer = send("/5/reserve_and_allocate_page_indices",
                                      R"({"keys":[)" + json_list(keys) + "]}", false);
      const std::vector<std::int64_t> pages = reserved_pages(answer);
      EXPECT_EQ(pages.size(), keys.size()) << answer;
      for (std::size_t i = 0; i < keys.size() && i < pages.size(); ++i) {
        if (pages[i] < 0) continue;
        const auto it = holder.find(pages[i]);
        if (it != holder.end()) {
          std::printf("seed %u step %d: page %lld reserved for %s while %s holds it\n", seed, step,
                      static_cast<long long>(pages[i]), keys[i].c_str(), it->second.second.c_str());
          ++violations;
        }
        holder[pages[i]] = {w.id, keys[i]};
        w.in_flight.emplace_back(keys[i], pages[i]);
      }
    } else if (pick(3) == 0) {  // the write failed: release every page
      std::string pages;
      for (const auto& [key, page] : w.in_flight) {
        pages += (pages.empty() ? "" : ",") + std::to_string(page);
        holder.erase(page);
      }
      w.in_flight.clear();
      send("/5/confirm_write",
           R"({"written_keys_to_confirm":[],"pages_to_release":[)" + pages + "]}", true);
    } else {
      std::string confirmations;
      std::vector<std::string> keys;
      std::string expected;
      for (const auto& [key, page] : w.in_flight) {
        confirmations += fmt::format("{}[\"{}\",{}]", confirmations.empty() ? "" : ",", key, page);
        expected += fmt::format("{}{}", expected.empty() ? "" : ",", page);
        keys.push_back(key);
        holder.erase(page);  // bound now: eviction may hand it on
        w.saved.push_back(key);
      }
      w.in_flight.clear();
      send("/5/confirm_write", R"({"written_keys_to_confirm":[)" + confirmations + "]}", true);
      const std::string found =
          n.post("/5/get_page_indices", R"({"keys":[)" + json_list(keys) + "]}");
      if (found != R"({"indices":[)" + expected + "]}") {
        std::printf("seed %u step %d: confirmed [%s], found %s\n", seed, step, expected.c_str(),
                    found.c_str());
        ++violations;
      }
    }
    if (w.saved.size() > 6) {  // the oldest saves are deleted
      std::vector<std::string> gone(w.saved.begin(), w.saved.begin() + 3);
      w.saved.erase(w.saved.begin(), w.saved.begin() + 3);
      send("/5/delete_keys", R"({"keys":[)" + json_list(gone) + "]}", true);
    }
    const std::string consistency = pipeline::check_consistency(n.state());
    if (!consistency.empty()) {
      ADD_FAILURE() << "seed " << seed << " step " << step << ": " << consistency;
      return violations + 1;
    }
  }
  return violations;
}

class SglangReplay : public ::testing::TestWithParam<int> {};

TEST_P(SglangReplay, ReplayedRequestsNeverGiveOneWritersPageToAnother) {
  for (std::uint32_t seed = 1; seed <= 6; ++seed)
    EXPECT_EQ(sglang_run(GetParam(), seed, 5'000, 400), 0) << "seed " << seed;
}

// The same runs without the quarantine: a replayed release frees the page another writer
// was given meanwhile (the pool hands the page released last out first). Shows that the
// test above can fail.
TEST_P(SglangReplay, WithoutTheQuarantineAReplayedReleaseFreesAnotherWritersPage) {
  int violations = 0;
  for (std::uint32_t seed = 1; seed <= 6; ++seed)
    violations += sglang_run(GetParam(), seed, 0, 400);
  EXPECT_GT(violations, 0);
}

std::string reserve(sim_node& n, const std::string& key) {
  return n.post("/0/reserve_and_allocate_page_indices", R"({"keys":[")" + key + R"("]})");
}

// Issue 31's case, by default (--release-quarantine-ms 5000): A reserves ka (page 63) and
// releases it; B reserves kb; A's release is replayed; C reserves kc. B and C must not
// share a page; and ticks while the quarantine runs end nothing.
TEST_P(SglangReplay, AReplayedReleaseInsideTheQuarantineChangesNothing) {
  sim_node n(metad::config{}, GetParam());
  n.post("/0/initialize", R"({"num_pages":64})");
  EXPECT_EQ(reserve(n, "ka"), R"({"indices":[[false,63]]})");
  const std::string release = R"({"written_keys_to_confirm":[],"pages_to_release":[63]})";
  EXPECT_EQ(n.post("/0/confirm_write", release), "");
  EXPECT_EQ(reserve(n, "kb"), R"({"indices":[[false,62]]})");
  n.now += 1;
  n.tick();                                            // the quarantine still runs
  EXPECT_EQ(n.post("/0/confirm_write", release), "");  // the replay
  EXPECT_EQ(reserve(n, "kc"), R"({"indices":[[false,61]]})");
  EXPECT_EQ(n.post("/0/confirm_write", R"({"written_keys_to_confirm":[["kb",62],["kc",61]]})"), "");
  EXPECT_EQ(n.post("/0/get_page_indices", R"({"keys":["kb","kc"]})"), R"({"indices":[62,61]})");
  // The quarantined page counts as free.
  EXPECT_NE(n.get("/stats").find(R"("num_pages":64,"free":62,"in_flight":0,"bound":2)"),
            std::string::npos);
  n.now += 4'998;  // 1 ms before its end
  n.tick();
  EXPECT_EQ(reserve(n, "kd"), R"({"indices":[[false,60]]})");
  n.now += 1;  // its end: the next tick frees it, on top of the free stack
  n.tick();
  EXPECT_EQ(reserve(n, "ke"), R"({"indices":[[false,63]]})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

// --release-quarantine-ms 0: the reference's order exactly (SGLang's own tests assert
// it): the page released last is handed out next.
TEST_P(SglangReplay, WithoutTheQuarantineTheReferenceOrderHolds) {
  sim_node n(server_test::quarantine_config(0), GetParam());
  n.post("/0/initialize", R"({"num_pages":64})");
  EXPECT_EQ(reserve(n, "ka"), R"({"indices":[[false,63]]})");
  EXPECT_EQ(n.post("/0/confirm_write", R"({"written_keys_to_confirm":[],"pages_to_release":[63]})"),
            "");
  EXPECT_EQ(reserve(n, "kb"), R"({"indices":[[false,63]]})");
}

// A full pool (an SGLang cache's steady state): the released page stays out while a
// bound key can be evicted instead, and serves only when nothing else can.
TEST_P(SglangReplay, AFullPoolEvictsBeforeItHandsOutAQuarantinedPage) {
  sim_node n(metad::config{}, GetParam());
  n.post("/0/initialize", R"({"num_pages":3})");
  EXPECT_EQ(n.post("/0/reserve_and_allocate_page_indices", R"({"keys":["a","b","c"]})"),
            R"({"indices":[[false,2],[false,1],[false,0]]})");
  EXPECT_EQ(n.post("/0/confirm_write",
                   R"({"written_keys_to_confirm":[["a",2],["b",1]],"pages_to_release":[0]})"),
            "");
  EXPECT_EQ(reserve(n, "d"), R"({"indices":[[false,2]]})");  // a evicted
  EXPECT_EQ(n.post("/0/reserve_and_allocate_page_indices", R"({"keys":["b","e","f"]})"),
            R"({"indices":[[true,1],[false,0],[false,-1]]})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

INSTANTIATE_TEST_SUITE_P(Cores, SglangReplay, ::testing::Values(1, 3));

}  // namespace
