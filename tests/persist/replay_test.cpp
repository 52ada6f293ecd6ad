// Replayed requests (docs/api.md, "A replayed request must not free another writer's
// page"): vLLM's client retries a POST after a 5xx or a lost connection, so a request
// that was applied may arrive again, possibly after another writer's. Two writers save
// through the whole pipeline; every mutating request is sent again, at once or after the
// other writer's next one; the test tracks which writer holds which page and fails on
// any page two writers hold at once, or on a confirm of a held page that is refused.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/removal.hpp"
#include "sim_node.hpp"

using namespace metad;

namespace {

using server_test::json_list;
using server_test::sim_node;

// The page of each key in a batch_allocate answer {"rank":r,"results":[["k",p],...]}.
std::map<std::string, std::int64_t> replay_pages_of(const std::string& answer) {
  std::map<std::string, std::int64_t> pages;
  for (std::size_t at = answer.find("[\""); at != std::string::npos;
       at = answer.find("[\"", at + 1)) {
    const std::size_t key_end = answer.find('"', at + 2);
    const std::string key = answer.substr(at + 2, key_end - at - 2);
    pages[key] = std::stoll(answer.substr(key_end + 2));
  }
  return pages;
}

struct writer {
  int id = 0;
  int next_key = 0;
  std::map<std::string, std::int64_t> in_flight;  // allocated, neither confirmed nor released
  std::vector<std::string> saved;                 // confirmed, oldest first
};

// One run: returns how many times two writers held one page, or a held page's confirm
// was refused.
int run(int cores, std::uint32_t seed, std::uint32_t quarantine_ms, int steps) {
  sim_node n(server_test::quarantine_config(quarantine_ms), cores);
  std::mt19937 rng(seed);
  auto pick = [&](int k) { return static_cast<int>(rng() % static_cast<unsigned>(k)); };
  const std::string init = R"({"num_pages":128})";
  n.post("/rank/0/initialize", init);
  std::map<std::int64_t, std::pair<int, std::string>> holder;  // page → writer, key
  int violations = 0;
  writer writers[2];
  writers[1].id = 1;
  std::optional<std::pair<std::string, std::string>> deferred;  // a replay for later

  auto send = [&](const std::string& path, const std::string& body) {
    const std::string answer = n.post(path, body);
    if (deferred) {  // the other writer's earlier request, arriving again now
      n.post(deferred->first, deferred->second);
      deferred.reset();
    }
    if (pick(2) == 0) {
      n.post(path, body);  // a retry right away
    } else {
      deferred.emplace(path, body);
    }
    return answer;
  };

  for (int step = 0; step < steps; ++step) {
    writer& w = writers[pick(2)];
    if (step % 25 == 24) {
      if (deferred) n.post(deferred->first, deferred->second);  // retries come within seconds
      deferred.reset();
      n.now += quarantine_ms + 1000;  // well past any client's retry window
      n.tick();
    }
    if (pick(10) == 0) send("/rank/0/initialize", init);
    if (w.in_flight.empty()) {
      std::vector<std::string> keys;
      for (int k = 1 + pick(4); k > 0; --k)
        keys.push_back(fmt::format("w{}-{}", w.id, w.next_key++));
      const std::string answer =
          send("/keys/batch_allocate", R"({"rank":0,"keys":[)" + json_list(keys) + "]}");
      for (const auto& [key, page] : replay_pages_of(answer)) {
        if (page < 0) continue;
        const auto it = holder.find(page);
        if (it != holder.end() && it->second != std::make_pair(w.id, key)) {
          std::printf("seed %u step %d: page %lld handed to %s while %s holds it\n", seed, step,
                      static_cast<long long>(page), key.c_str(), it->second.second.c_str());
          ++violations;
        }
        holder[page] = {w.id, key};
        w.in_flight[key] = page;
      }
    } else if (pick(3) == 0) {  // the write failed: release every page
      std::string pages;
      for (const auto& [key, page] : w.in_flight) {
        pages += (pages.empty() ? "" : ",") + std::to_string(page);
        holder.erase(page);
      }
      w.in_flight.clear();
      send("/keys/confirm_write",
           R"({"rank":0,"confirmations":[],"pages_to_release":[)" + pages + "]}");
    } else {
      std::string confirmations;
      for (const auto& [key, page] : w.in_flight) {
        confirmations += fmt::format("{}[\"{}\",{}]", confirmations.empty() ? "" : ",", key, page);
        w.saved.push_back(key);
      }
      w.in_flight.clear();
      const std::string answer =
          send("/keys/confirm_write", R"({"rank":0,"confirmations":[)" + confirmations + "]}");
      if (!answer.empty()) {
        std::printf("seed %u step %d: confirm refused: %s\n", seed, step, answer.c_str());
        ++violations;
      }
    }
    if (w.saved.size() > 6) {  // the oldest saves are deleted
      std::vector<std::string> gone(w.saved.begin(), w.saved.begin() + 3);
      w.saved.erase(w.saved.begin(), w.saved.begin() + 3);
      for (auto it = holder.begin(); it != holder.end();) {
        const bool dropped = it->second.first == w.id &&
                             std::find(gone.begin(), gone.end(), it->second.second) != gone.end();
        it = dropped ? holder.erase(it) : std::next(it);
      }
      send("/keys/delete", R"({"keys":[)" + json_list(gone) + "]}");
    }
    const std::string consistency = pipeline::check_consistency(n.state());
    if (!consistency.empty()) {
      ADD_FAILURE() << "seed " << seed << " step " << step << ": " << consistency;
      return violations + 1;
    }
  }
  return violations;
}

class Replay : public ::testing::TestWithParam<int> {};

TEST_P(Replay, ReplayedRequestsNeverGiveOneWritersPageToAnother) {
  for (std::uint32_t seed = 1; seed <= 6; ++seed)
    EXPECT_EQ(run(GetParam(), seed, 5'000, 400), 0) << "seed " << seed;
}

// The same runs without the quarantine: a replayed release frees the page another writer
// was given meanwhile. Shows that the test above can fail.
TEST_P(Replay, WithoutTheQuarantineAReplayedReleaseFreesAnotherWritersPage) {
  int violations = 0;
  for (std::uint32_t seed = 1; seed <= 6; ++seed) violations += run(GetParam(), seed, 0, 400);
  EXPECT_GT(violations, 0);
}

// docs/api.md's case: allocate A (page p), release p, allocate B, the release replayed:
// B keeps its page, and p goes to nobody else while its quarantine lasts.
TEST_P(Replay, TheDocumentedCase) {
  sim_node n(server_test::quarantine_config(5'000), GetParam());
  n.post("/rank/0/initialize", R"({"num_pages":4})");
  EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":0,"keys":["A"]})"),
            R"({"rank":0,"results":[["A",0]]})");
  const std::string release = R"({"rank":0,"confirmations":[],"pages_to_release":[0]})";
  EXPECT_EQ(n.post("/keys/confirm_write", release), "");
  EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":0,"keys":["B"]})"),
            R"({"rank":0,"results":[["B",1]]})");
  EXPECT_EQ(n.post("/keys/confirm_write", release), "");  // the replay
  n.now += 1;  // a tick while the quarantine runs keeps page 0 out of the lowest-first order
  n.tick();
  EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":0,"keys":["C"]})"),
            R"({"rank":0,"results":[["C",2]]})");
  EXPECT_EQ(n.post("/keys/confirm_write", R"({"rank":0,"confirmations":[["B",1]]})"), "");
  EXPECT_EQ(n.get("/rank/0"), R"({"num_pages":4,"free":2,"reserved":1,"bound":1,"incomplete":0})")
      << "the quarantined page counts as free";
  // A full pool still serves: the quarantined page goes last.
  EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":0,"keys":["D","E"]})"),
            R"({"rank":0,"results":[["D",3],["E",0]]})");
  // Once the quarantine is over, a released page is free at once for the lowest-first order.
  EXPECT_EQ(
      n.post("/keys/confirm_write", R"({"rank":0,"confirmations":[],"pages_to_release":[3]})"), "");
  n.now += 5'000;
  n.tick();
  EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":0,"keys":["F"]})"),
            R"({"rank":0,"results":[["F",3]]})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

INSTANTIATE_TEST_SUITE_P(Cores, Replay, ::testing::Values(1, 3));

}  // namespace
