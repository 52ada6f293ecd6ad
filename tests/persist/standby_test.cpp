// A hot standby fed the leader's per-core log frames over the replication protocol
// (repl::), applying them with recovery's replayer (persist::standby_core): its state
// after promotion answers as the leader's does, and its own data directory recovers to
// that state after a restart. Both from the leader's log files cut at arbitrary frame
// boundaries (with duplicates, overlaps and a wire split at any byte), and live, each
// group commit shipped as it happens with the leader waiting for the standby's ack.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "pipeline/routes.hpp"
#include "pipeline/tenants.hpp"
#include "standby_harness.hpp"
#include "temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using namespace standby_test;

class Standby : public ::testing::Test {
 protected:
  sim::temp_dir dir_{"metad-standby"};
  const std::string base_ = dir_.path();

  // --tenants-file's table, with each token's hash in place of {token-NAME}.
  static void publish_tenants(pipeline::node& nd, const std::string& lines) {
    std::string text = lines;
    for (std::size_t at; (at = text.find("{token-")) != std::string::npos;) {
      const std::size_t end = text.find('}', at);
      std::string hex;
      for (const unsigned char b : pipeline::token_sha256(text.substr(at + 1, end - at - 1)))
        hex += fmt::format("{:02x}", b);
      text.replace(at, end - at + 1, hex);
    }
    auto table = std::make_shared<pipeline::tenant_table>();
    ASSERT_EQ(pipeline::parse_tenants(text, pipeline::kPatterns, *table), "");
    nd.tenants.publish(std::move(table));
  }
  // The leader's log of each core (base_/leader, generation 1, its first segment).
  std::vector<std::string> leader_logs() const {
    std::vector<std::string> logs;
    for (int c = 0; c < kCores; ++c)
      logs.push_back(read_file(base_ + "/leader/g1/core-" + std::to_string(c) + ".log-1"));
    return logs;
  }
  // Each core's whole log to the standby in one batch; then its data directory copied
  // to dir + "-copy" (what a restart of it would recover).
  static void ship_and_copy(standby& s, const std::vector<std::string>& logs,
                            const std::string& dir) {
    for (int c = 0; c < kCores; ++c) {
      repl::leader_stream out(kEpoch, 1, static_cast<std::uint32_t>(c), 0);
      std::string wire;
      out.send(wire, logs[static_cast<std::size_t>(c)]);
      s.receive(c, wire, true);
    }
    copy_data_dir(s, dir);
  }
  // The standby's own data directory, as it is now (before promotion writes to it), to
  // dir + "-copy": what a restart of it would recover.
  static void copy_data_dir(standby& s, const std::string& dir) {
    s.settle();
    fs::copy(dir, dir + "-copy", fs::copy_options::recursive);
    fs::remove(dir + "-copy/LOCK");
  }
  // Promoted, the standby answers as `expected` (the leader's answers), and so does a
  // restart from its own data directory as it was before promotion.
  static void promote_and_compare(standby& s, const std::string& dir, const std::string& expected) {
    copy_data_dir(s, dir);
    s.promote();
    EXPECT_EQ(pipeline::check_consistency(s.n().state()), "");
    EXPECT_EQ(probe(s.n()), expected);
    sim_node restarted(dir + "-copy", kCores);
    EXPECT_EQ(probe(restarted), expected);
  }
  // Each core's log in batches of 1 to max_batch frames, the cores' turns at random
  // (first >= 0: that core's whole stream first), acks at random; then every core synced.
  static void ship_interleaved(standby& s, const std::vector<std::string>& logs, std::mt19937& rng,
                               int first, std::size_t max_batch) {
    std::vector<std::vector<std::size_t>> at;
    std::vector<std::size_t> next(kCores, 0);
    std::vector<std::unique_ptr<repl::leader_stream>> out;
    for (int c = 0; c < kCores; ++c) {
      at.push_back(frame_starts(logs[static_cast<std::size_t>(c)]));
      out.push_back(
          std::make_unique<repl::leader_stream>(kEpoch, 1, static_cast<std::uint32_t>(c), 0));
    }
    const auto left = [&](int c) { return next[c] + 1 < at[c].size(); };
    while (left(0) || left(1)) {
      int c = first >= 0 && left(first) ? first : static_cast<int>(rng() % kCores);
      if (!left(c)) c = 1 - c;
      const std::size_t i = next[c];
      const std::size_t j = std::min(at[c].size() - 1, i + 1 + rng() % max_batch);
      std::string wire;
      out[c]->send(wire, std::string_view(logs[c]).substr(at[c][i], at[c][j] - at[c][i]));
      s.receive(c, wire, rng() % 2 == 0);
      next[c] = j;
    }
    for (int c = 0; c < kCores; ++c) s.sync(c);
  }
  // A request with a bearer token; the whole answer.
  static std::string post_as(sim_node& n, std::string_view token, std::string_view path,
                             std::string_view body) {
    return n.send(
        fmt::format("POST {} HTTP/1.1\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\n\r\n{}",
                    path, token, body.size(), body));
  }
  static std::string get_as(sim_node& n, std::string_view token, std::string_view path) {
    return n.send(fmt::format("GET {} HTTP/1.1\r\nauthorization: Bearer {}\r\n\r\n", path, token));
  }
};

// The leader's log of each core, from its files, shipped in batches cut at random frame
// boundaries, some sent twice or resent overlapping, over a wire delivered in random
// pieces; the standby syncs and acks at random points.
TEST_F(Standby, AppliesTheLeadersLogCutAnywhereAndAnswersAsTheLeaderDoes) {
  std::string expected;
  std::vector<std::string> logs;
  {
    sim_node leader(base_ + "/leader", kCores);
    history(leader);
    logs = leader_logs();
    expected = probe(leader);  // after the logs were read: probe() changes the state
    EXPECT_EQ(pipeline::check_consistency(leader.state()), "");
  }
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const std::string dir = base_ + "/standby-" + std::to_string(seed);
    // Seeds 3 and 4: the standby cuts its own log into snapshots as it goes.
    standby s(dir, 1, kCores, seed > 2 ? 2048 : 1u << 30);
    for (int c = 0; c < kCores; ++c) {
      const std::vector<std::size_t> at = frame_starts(logs[static_cast<std::size_t>(c)]);
      repl::leader_stream out(kEpoch, 1, static_cast<std::uint32_t>(c), 0);
      repl::decoder acks;
      std::string wire;
      std::size_t prev = 0;
      for (std::size_t i = 0; i + 1 < at.size();) {
        const std::size_t j = std::min(at.size() - 1, i + 1 + rng() % 6);
        const std::string_view bytes =
            std::string_view(logs[static_cast<std::size_t>(c)]).substr(at[i], at[j] - at[i]);
        out.send(wire, bytes);
        if (rng() % 4 == 0)  // the same batch again (a resend after a reconnect)
          repl::encode(wire, repl::batch{kEpoch, 1, static_cast<std::uint32_t>(c), at[i], bytes});
        if (rng() % 4 == 0)  // from an earlier frame boundary, overlapping what was sent
          repl::encode(wire, repl::batch{kEpoch, 1, static_cast<std::uint32_t>(c), at[prev],
                                         std::string_view(logs[static_cast<std::size_t>(c)])
                                             .substr(at[prev], at[j] - at[prev])});
        prev = i;
        i = j;
        // Deliver what is on the wire in pieces split anywhere.
        std::size_t sent = 0;
        while (sent < wire.size()) {
          const std::size_t piece = std::min<std::size_t>(wire.size() - sent, 1 + rng() % 97);
          acks.feed(s.receive(c, std::string_view(wire).substr(sent, piece), rng() % 3 == 0));
          sent += piece;
        }
        wire.clear();
        while (acks.next() == repl::decoder::status::message) EXPECT_TRUE(out.on_ack(acks.ack));
      }
      EXPECT_TRUE(out.on_ack(s.sync(c)));
      EXPECT_EQ(out.acked(), logs[static_cast<std::size_t>(c)].size());
    }
    EXPECT_GT(s.duplicates, 0);
    if (seed > 2) {
      std::size_t cut = 0;  // snapshots after recovery's own (segment 1)
      for (const auto& e : fs::recursive_directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name.find(".snap-") != std::string::npos && !name.ends_with(".snap-1")) ++cut;
      }
      EXPECT_GT(cut, 0u);
    }
    promote_and_compare(s, dir, expected);
  }
}

// The cores' streams interleaved in any order (a batch of one core, then of another, in
// random turns, or one core's whole stream before the other's in either order): the
// directory counts arrive through the binding feed in any order relative to the names,
// and promotion finishes what recovery computes from the same records.
TEST_F(Standby, AppliesTheCoresStreamsInAnyInterleaving) {
  std::string expected;
  std::vector<std::string> logs;
  {
    sim_node leader(base_ + "/leader", kCores);
    history(leader);
    logs = leader_logs();
    expected = probe(leader);
  }
  for (std::uint32_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const std::string dir = base_ + "/standby-" + std::to_string(seed);
    standby s(dir, 1, kCores, seed % 3 == 0 ? 2048 : 1u << 30);
    // Seed 1: core 0's whole stream, then core 1's; seed 2: the other way round.
    ship_interleaved(s, logs, rng, seed == 1 ? 0 : seed == 2 ? 1 : -1, 3);
    promote_and_compare(s, dir, expected);
  }
}

// Random leader histories (saves of keys on several ranks of both cores, deletes, shrinks
// and regrowths, clears, expiries), their streams interleaved at random: the promoted
// standby answers as a restart from the same records does, and as the leader.
TEST_F(Standby, RandomHistoriesInterleavedPromoteAsARestartRecovers) {
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const std::string root = base_ + "/random-" + std::to_string(seed);
    std::string expected;
    std::vector<std::string> logs;
    {
      sim_node leader(root + "/leader", kCores);
      for (int r = 0; r < 4; ++r)
        leader.post("/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":64})");
      for (int step = 0; step < 150; ++step) {
        const int r = static_cast<int>(rng() % 4);
        const int from = static_cast<int>(rng() % 20), to = from + 1 + static_cast<int>(rng() % 8);
        const unsigned op = rng() % 100;
        if (op < 50) {
          leader.post("/keys/batch_allocate",
                      "{\"rank\":" + std::to_string(r) + ",\"keys\":[" + list(from, to) + "]}");
          // Confirm what the allocation gave: ask for the pages.
          std::string conf;
          const std::string got =
              leader.post("/keys/batch_allocate",
                          "{\"rank\":" + std::to_string(r) + ",\"keys\":[" + list(from, to) + "]}");
          // results: [["key",page],...]
          std::size_t at = 0;
          while ((at = got.find("[\"", at)) != std::string::npos) {
            const std::size_t close = got.find(']', at);
            const std::string item = got.substr(at, close - at + 1);
            if (item.find(",-1]") == std::string::npos) conf += (conf.empty() ? "" : ",") + item;
            at = close;
          }
          if (!conf.empty() && rng() % 4 != 0)
            leader.post("/keys/confirm_write",
                        "{\"rank\":" + std::to_string(r) + ",\"confirmations\":[" + conf + "]}");
        } else if (op < 65) {
          leader.post("/keys/delete", "{\"keys\":[" + list(from, to) + "]}");
        } else if (op < 78) {
          const int pages = 2 + static_cast<int>(rng() % 70);  // shrinks and regrowths
          leader.post("/rank/" + std::to_string(r) + "/initialize",
                      "{\"num_pages\":" + std::to_string(pages) + "}");
        } else if (op < 82) {
          leader.post("/clear", "");
          for (int q = 0; q < 4; ++q)
            if (rng() % 2 == 0)
              leader.post("/rank/" + std::to_string(q) + "/initialize", R"({"num_pages":32})");
        } else if (op < 86) {
          leader.now += 700'000;
          leader.tick();
        }
      }
      for (int c = 0; c < kCores; ++c)
        logs.push_back(read_file(root + "/leader/g1/core-" + std::to_string(c) + ".log-1"));
    }
    {
      sim_node restarted_leader(root + "/leader", kCores);
      expected = probe(restarted_leader);
    }
    const std::string dir = root + "/standby";
    standby s(dir, 1, kCores, seed % 2 == 0 ? 2048 : 1u << 30);
    ship_interleaved(s, logs, rng, -1, 4);
    copy_data_dir(s, dir);
    s.promote();
    EXPECT_EQ(pipeline::check_consistency(s.n().state()), "");
    std::string restarted;
    {
      sim_node r(dir + "-copy", kCores);
      restarted = probe(r);
    }
    const std::string promoted = probe(s.n());

    EXPECT_EQ(promoted, restarted);
    EXPECT_EQ(promoted, expected);
  }
}

// Live: every group commit of the leader is shipped as it happens (before its own
// write: the standby acks first) and the leader's requests wait for the standby's ack
// (sync replication); after each request the standby holds durably everything the
// leader acknowledged.
TEST_F(Standby, ALiveLeaderAcknowledgesOnlyWhatTheStandbyHolds) {
  standby s(base_ + "/standby", 1);
  sim_node leader(base_ + "/leader", kCores);
  std::vector<repl::leader_stream> out;
  std::vector<repl::decoder> acks(kCores);
  for (int c = 0; c < kCores; ++c) {
    out.emplace_back(kEpoch, 1, static_cast<std::uint32_t>(c), 0);
    leader.state().core[c]->log.require_standby(true);
  }
  std::mt19937 rng(7);
  int shipped = 0;
  leader.on_flush = [&](pipeline::core_state& core, const store::log_writer::flush_job& job) {
    const auto c = static_cast<std::size_t>(core.index);
    ASSERT_EQ(job.lsn, out[c].sent());
    std::string wire;
    out[c].send(wire, std::string_view(job.data, job.bytes));
    const std::size_t cut = rng() % (wire.size() + 1);
    std::string back = s.receive(core.index, std::string_view(wire).substr(0, cut), false);
    back += s.receive(core.index, std::string_view(wire).substr(cut), true);
    acks[c].feed(back);
    while (acks[c].next() == repl::decoder::status::message) {
      ASSERT_TRUE(out[c].on_ack(acks[c].ack));
      core.log.replicated_until(acks[c].ack.lsn);
    }
    ++shipped;
  };
  history(leader);
  leader.on_flush = nullptr;
  for (int c = 0; c < kCores; ++c) {
    EXPECT_EQ(leader.state().core[c]->log.committed(), leader.state().core[c]->log.durable());
    EXPECT_EQ(s.durable_lsn(c), leader.state().core[c]->log.durable());
    leader.state().core[c]->log.require_standby(false);
  }
  EXPECT_GT(shipped, 20);
  s.promote();
  EXPECT_EQ(pipeline::check_consistency(s.n().state()), "");
  EXPECT_EQ(probe(s.n()), probe(leader));
}

// --tenants-file's ranks=N count (tenant_usage::sg_ranks) after a failover: promotion
// counts each tenant's SGLang ranks from the pools it replayed, as a restart does (the
// server's start-up: recovery, then pipeline::count_tenant_usage), not from what the
// standby counted when it started empty.
TEST_F(Standby, PromotionCountsEachTenantsRanksAsARestartDoes) {
  const auto publish = [](pipeline::node& nd) {
    publish_tenants(nd, "t {token-t} ranks=3\nu {token-u} ranks=1\n");
  };
  const auto counts = [](pipeline::node& nd) {
    std::string out;
    for (const char* name : {"", "t", "u", "gone"})
      out += fmt::format("{}={} ", name, nd.tenants.usage(name).sg_ranks.load());
    return out;
  };
  std::vector<std::string> logs;
  {
    sim_node leader(base_ + "/leader", kCores);
    for (const char* path : {"/t/1/initialize", "/t/2/initialize", "/t/3/initialize",
                             "/u/0/initialize", "/0/initialize", "/3/initialize"})
      EXPECT_EQ(leader.post(path, R"({"num_pages":4})"), "");  // 204: no body
    // A second pool on a rank the tenant holds counts no second rank.
    leader.post("/t/2/initialize", R"({"num_pages":4,"namespace":"swa"})");
    logs = leader_logs();
  }
  const std::string dir = base_ + "/standby";
  standby s(dir, 1);
  publish(s.n().state());                            // the server loads the file before recovery
  s.n().state().tenants.usage("gone").sg_ranks = 5;  // a count with no pools behind it
  ship_and_copy(s, logs, dir);
  EXPECT_EQ(counts(s.n().state()), "=0 t=0 u=0 gone=5 ");  // replayed, not counted yet
  s.promote();
  const std::string promoted = counts(s.n().state());
  EXPECT_EQ(promoted, "=2 t=3 u=1 gone=0 ");
  sim_node restarted(dir + "-copy", kCores);
  publish(restarted.state());
  pipeline::count_tenant_usage(restarted.state());
  EXPECT_EQ(counts(restarted.state()), promoted);
  // The quota holds on the promoted node: t is at ranks=3, and may add a pool on a rank
  // it holds.
  const auto initialize = [&](std::string_view path) {
    const std::string answer = post_as(s.n(), "token-t", path, R"({"num_pages":4})");
    return answer.substr(0, answer.find("\r\n"));
  };
  EXPECT_EQ(initialize("/4/initialize"), "HTTP/1.1 403 Forbidden");
  EXPECT_EQ(initialize("/1/initialize"), "HTTP/1.1 204 No Content");
}

// pages=N's count (tenant_usage::pages) after a failover, as after a restart: each
// tenant's SGLang pages (in flight and bound) on every core, and vLLM's ranks' for the
// tenant that holds vLLM's API; then the quota holds on the promoted node.
TEST_F(Standby, PromotionCountsEachTenantsPagesAsARestartDoes) {
  const auto publish = [](pipeline::node& nd) {
    publish_tenants(nd, "t {token-t} pages=7 vllm\nu {token-u} pages=2\n");
  };
  const auto counts = [](pipeline::node& nd) {
    std::string out;
    for (const char* name : {"t", "u", "gone"})
      out += fmt::format("{}={} ", name, nd.tenants.usage(name).pages.load());
    return out;
  };
  std::vector<std::string> logs;
  {
    sim_node leader(base_ + "/leader", kCores);
    for (const char* path :
         {"/t/1/initialize", "/t/2/initialize", "/u/0/initialize", "/0/initialize"})
      EXPECT_EQ(leader.post(path, R"({"num_pages":8})"), "");
    EXPECT_EQ(leader.post("/t/1/reserve_and_allocate_page_indices", R"({"keys":["a","b","c"]})"),
              R"({"indices":[[false,7],[false,6],[false,5]]})");
    EXPECT_EQ(leader.post("/t/1/confirm_write", R"({"written_keys_to_confirm":[["a",7]]})"), "");
    EXPECT_EQ(leader.post("/t/2/reserve_and_allocate_page_indices", R"({"keys":["d"]})"),
              R"({"indices":[[false,7]]})");
    EXPECT_EQ(leader.post("/u/0/reserve_and_allocate_page_indices", R"({"keys":["e","f"]})"),
              R"({"indices":[[false,7],[false,6]]})");
    EXPECT_EQ(leader.post("/0/reserve_and_allocate_page_indices", R"({"keys":["g"]})"),
              R"({"indices":[[false,7]]})");  // the default tenant: no one's quota
    EXPECT_EQ(leader.post("/rank/1/initialize", R"({"num_pages":8})").substr(0, 12),
              R"({"message":")");
    EXPECT_EQ(leader.post("/keys/batch_allocate", R"({"rank":1,"keys":["v","w"]})"),
              R"({"rank":1,"results":[["v",0],["w",1]]})");
    logs = leader_logs();
  }
  const std::string dir = base_ + "/standby";
  standby s(dir, 1);
  publish(s.n().state());
  s.n().state().tenants.usage("gone").pages = 5;  // a count with no pages behind it
  ship_and_copy(s, logs, dir);
  s.promote();
  const std::string promoted = counts(s.n().state());
  EXPECT_EQ(promoted, "t=6 u=2 gone=0 ");
  sim_node restarted(dir + "-copy", kCores);
  publish(restarted.state());
  pipeline::count_tenant_usage(restarted.state());
  EXPECT_EQ(counts(restarted.state()), promoted);
  const auto as = [&](std::string_view token, std::string_view path, std::string_view body) {
    const std::string answer = post_as(s.n(), token, path, body);
    return answer.substr(answer.find("\r\n\r\n") + 4);
  };
  // t holds 6 of its 7: one page more, on either API, then -1; u is at its 2.
  EXPECT_EQ(as("token-t", "/keys/batch_allocate", R"({"rank":1,"keys":["x","y"]})"),
            R"({"rank":1,"results":[["x",-1],["y",-1]]})");
  EXPECT_EQ(as("token-t", "/2/reserve_and_allocate_page_indices", R"({"keys":["h"]})"),
            R"({"indices":[[false,6]]})");
  EXPECT_EQ(as("token-t", "/keys/batch_allocate", R"({"rank":1,"keys":["x"]})"),
            R"({"rank":1,"results":[["x",-1]]})");
  EXPECT_EQ(as("token-u", "/0/reserve_and_allocate_page_indices", R"({"keys":["i"]})"),
            R"({"indices":[[false,-1]]})");
}

// Each tenant's own vLLM state (issue 34) through the log, a failover and restarts into
// other core counts: the same rank and key of three tenants stay three ranks and keys,
// a tenant's clear voids its own records only, and pages=N holds on its own ranks.
TEST_F(Standby, EachTenantsVllmStateStaysItsOwnThroughAFailoverAndRestarts) {
  const auto publish = [](pipeline::node& nd) {
    publish_tenants(nd, "t {token-t} vllm\nu {token-u} pages=3\nv {token-v}\n");
  };
  // What each tenant sees of vLLM's state (the answers, status line included).
  const auto state = [](sim_node& n) {
    std::string out;
    for (const char* token : {"token-t", "token-u", "token-v"}) {
      for (const char* path : {"/rank/0", "/rank/1"}) out += get_as(n, token, path) + "\n";
      out += post_as(n, token, "/keys/batch_exists", R"({"keys":["k","j","x"]})") + "\n";
      out += post_as(n, token, "/keys/get_locations", R"({"rank":0,"keys":["k","j"]})") + "\n";
    }
    return out;
  };
  const auto save = [](sim_node& n, const char* token, int pages, const char* keys,
                       const char* confirmations) {
    post_as(n, token, "/rank/0/initialize", fmt::format(R"({{"num_pages":{}}})", pages));
    post_as(n, token, "/keys/batch_allocate", fmt::format(R"({{"rank":0,"keys":{}}})", keys));
    return post_as(n, token, "/keys/confirm_write",
                   fmt::format(R"({{"rank":0,"confirmations":{}}})", confirmations));
  };
  std::vector<std::string> logs;
  std::string expected;
  {
    sim_node leader(base_ + "/leader", kCores);
    publish(leader.state());
    EXPECT_EQ(save(leader, "token-t", 4, R"(["k"])", R"([["k",0]])").substr(0, 12), "HTTP/1.1 204");
    EXPECT_EQ(save(leader, "token-u", 8, R"(["j","k"])", R"([["j",0],["k",1]])").substr(0, 12),
              "HTTP/1.1 204");
    EXPECT_EQ(save(leader, "token-v", 2, R"(["k","x"])", R"([["k",0],["x",1]])").substr(0, 12),
              "HTTP/1.1 204");
    // v clears its own state (its token: no --admin-token-file here), then starts anew.
    EXPECT_EQ(post_as(leader, "token-v", "/clear", ""), "HTTP/1.1 204 No Content\r\n\r\n");
    post_as(leader, "token-v", "/rank/1/initialize", R"({"num_pages":3})");
    // u holds 2 of its pages=3: a batch of 2 new keys is all -1, one fits.
    const std::string refused =
        post_as(leader, "token-u", "/keys/batch_allocate", R"({"rank":0,"keys":["a","b"]})");
    EXPECT_NE(refused.find(R"({"rank":0,"results":[["a",-1],["b",-1]]})"), std::string::npos)
        << refused;
    expected = state(leader);
    EXPECT_EQ(pipeline::check_consistency(leader.state()), "");
    logs = leader_logs();
  }
  // The tenants' own records name them: v's clear among them.
  EXPECT_NE(logs[0].find("\x3f\x01\x00\x00\x00v"), std::string::npos);
  EXPECT_NE(expected.find(R"({"num_pages":8,"free":6,"reserved":0,"bound":2,"incomplete":0})"),
            std::string::npos)
      << expected;
  for (const char* seen : {R"({"exists":[true,false,false]})", R"({"exists":[true,true,false]})",
                           R"({"exists":[false,false,false]})"})
    EXPECT_NE(expected.find(seen), std::string::npos) << seen << expected;
  const std::string dir = base_ + "/standby";
  standby s(dir, 1);
  publish(s.n().state());
  ship_and_copy(s, logs, dir);
  s.promote();
  EXPECT_EQ(pipeline::check_consistency(s.n().state()), "");
  EXPECT_EQ(state(s.n()), expected);
  for (const int cores : {3, 1}) {
    sim_node restarted(dir + "-copy", cores);
    publish(restarted.state());
    pipeline::count_tenant_usage(restarted.state());
    EXPECT_EQ(pipeline::check_consistency(restarted.state()), "") << cores << " cores";
    EXPECT_EQ(state(restarted), expected) << cores << " cores";
    EXPECT_EQ(restarted.state().tenants.usage("u").pages.load(), 2) << cores << " cores";
  }
}

// A tenant's /clear voids its own state only, in the log too: on a core that holds no
// state of that tenant nothing is logged (a bare clear there would void the unnamed
// state's records before it: gone after a restart or a failover, though still in memory).
TEST_F(Standby, ATenantsClearLeavesTheOtherStatesThroughARestartAndAFailover) {
  const auto publish = [](pipeline::node& nd) {
    publish_tenants(nd, "t {token-t} vllm\nv {token-v}\n");
  };
  const auto state = [](sim_node& n) {
    std::string out;
    for (int r = 0; r < 4; ++r) out += get_as(n, "token-t", "/rank/" + std::to_string(r)) + "\n";
    return out + post_as(n, "token-t", "/keys/batch_exists", R"({"keys":["k","j"]})");
  };
  std::vector<std::string> logs;
  std::string expected;
  {
    sim_node leader(base_ + "/leader", kCores);
    publish(leader.state());
    for (int r = 0; r < 4; ++r) {
      post_as(leader, "token-t", "/rank/" + std::to_string(r) + "/initialize",
              R"({"num_pages":4})");
      post_as(leader, "token-t", "/keys/batch_allocate",
              fmt::format(R"({{"rank":{},"keys":["k","j"]}})", r));
      post_as(leader, "token-t", "/keys/confirm_write",
              fmt::format(R"({{"rank":{},"confirmations":[["k",0],["j",1]]}})", r));
    }
    // v holds nothing anywhere; its clear changes nothing, and logs nothing.
    EXPECT_EQ(post_as(leader, "token-v", "/clear", ""), "HTTP/1.1 204 No Content\r\n\r\n");
    expected = state(leader);
    logs = leader_logs();
  }
  EXPECT_NE(expected.find(R"({"exists":[true,true]})"), std::string::npos) << expected;
  for (const std::string& log : logs) {
    bool cleared = false;
    store::scan(log, [&](const store::record& r, std::size_t) {
      cleared = cleared || r.kind == store::record_kind::clear;
    });
    EXPECT_FALSE(cleared);
  }
  const std::string dir = base_ + "/standby";
  standby s(dir, 1);
  publish(s.n().state());
  ship_and_copy(s, logs, dir);
  s.promote();
  EXPECT_EQ(state(s.n()), expected);
  sim_node restarted(dir + "-copy", 3);
  publish(restarted.state());
  EXPECT_EQ(state(restarted), expected);
  EXPECT_EQ(pipeline::check_consistency(restarted.state()), "");
}

}  // namespace
