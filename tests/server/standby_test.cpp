// A hot standby fed the leader's per-core log frames over the replication protocol
// (repl::), applying them with recovery's replayer (server::standby_core): its state
// after promotion answers as the leader's does, and its own data directory recovers to
// that state after a restart. Both from the leader's log files cut at arbitrary frame
// boundaries (with duplicates, overlaps and a wire split at any byte), and live, each
// group commit shipped as it happens with the leader waiting for the standby's ack.
#include "server/standby.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "node.hpp"
#include "repl/protocol.hpp"
#include "repl/session.hpp"

namespace {

namespace fs = std::filesystem;
using server_test::node;

constexpr std::uint64_t kEpoch = 42;
constexpr int kCores = 2;

std::string key(int i) { return fmt::format("{:032x}", 0xabc0000u + static_cast<unsigned>(i)); }

std::string list(int from, int to) {
  std::string out;
  for (int i = from; i < to; ++i) out += (out.empty() ? "\"" : ",\"") + key(i) + "\"";
  return out;
}

std::string confirmations(int from, int to) {
  std::string out;
  for (int i = from; i < to; ++i)
    out += (out.empty() ? "[\"" : ",[\"") + key(i) + "\"," + std::to_string(i - from) + "]";
  return out;
}

// Every kind of log record: ranks, saves (packed and other keys), failed writes
// released, expiry on the tick, a delete, SGLang pools, a /clear with writes after it.
void history(node& n) {
  for (int r = 0; r < 4; ++r)
    n.post("/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":64})");
  for (int r = 0; r < 2; ++r) {
    n.post("/keys/batch_allocate",
           "{\"rank\":" + std::to_string(r) + ",\"keys\":[" + list(0, 20) + ",\"plain\"]}");
    n.post("/keys/confirm_write", "{\"rank\":" + std::to_string(r) + ",\"confirmations\":[" +
                                      confirmations(0, 20) + ",[\"plain\",20]]}");
  }
  n.post("/keys/batch_allocate", R"({"rank":2,"keys":["open1","open2"]})");
  n.post("/keys/batch_allocate", R"({"rank":3,"keys":["failed1","failed2","kept"]})");
  n.post("/keys/confirm_write", R"({"rank":3,"confirmations":[],"pages_to_release":[0,1]})");
  n.post("/keys/delete", "{\"keys\":[" + list(3, 6) + "]}");
  n.post("/0/initialize", R"({"num_pages":8})");
  n.post("/t/1/initialize", R"({"num_pages":3})");
  n.post("/0/reserve_and_allocate_page_indices", R"({"keys":["a","b","c","d"]})");
  n.post("/0/confirm_write",
         R"({"written_keys_to_confirm":[["a",7],["b",6]],"pages_to_release":[5]})");
  n.post("/0/get_page_indices", R"({"keys":["a"]})");
  n.post("/keys/batch_allocate", "{\"rank\":2,\"keys\":[" + list(30, 34) + "]}");
  n.now += 700'000;  // past --reservation-ttl: the tick expires what is still reserved
  n.tick();
  n.post("/keys/batch_allocate", "{\"rank\":2,\"keys\":[" + list(40, 44) + "]}");
  n.post("/clear", "");
  n.post("/rank/1/initialize", R"({"num_pages":16})");
  n.post("/rank/2/initialize", R"({"num_pages":16})");
  for (int r = 1; r < 3; ++r) {
    n.post("/keys/batch_allocate",
           "{\"rank\":" + std::to_string(r) + ",\"keys\":[" + list(50, 58) + "]}");
    n.post("/keys/confirm_write", "{\"rank\":" + std::to_string(r) + ",\"confirmations\":[" +
                                      confirmations(50, 56) + "]}");
  }
  n.post("/t/1/reserve_and_allocate_page_indices", R"({"keys":["x","y"]})");
  n.post("/t/1/confirm_write", R"({"written_keys_to_confirm":[["x",2]]})");
}

// What the state answers: every rank's counts, the directory, locations, SGLang pools,
// then allocations (which depend on the free pages' order and the reservations).
std::string probe(node& n) {
  std::string s;
  for (int r = 0; r < 4; ++r) s += n.get("/rank/" + std::to_string(r)) + "\n";
  for (int r = 0; r < 4; ++r)
    s += n.post("/keys/batch_exists", "{\"keys\":[" + list(0, 60) + ",\"plain\"]}") + "\n";
  for (int r = 0; r < 3; ++r)
    s += n.post("/keys/get_locations",
                "{\"rank\":" + std::to_string(r) + ",\"keys\":[" + list(0, 60) + "]}") +
         "\n";
  s += n.post("/0/exists", R"({"keys":["a","b","c","d"]})") + "\n";
  s += n.post("/t/1/exists", R"({"keys":["x","y"]})") + "\n";
  s += n.post("/0/get_page_indices", R"({"keys":["a","b","c"]})") + "\n";
  s += n.post("/keys/batch_allocate", "{\"rank\":2,\"keys\":[" + list(50, 60) + "]}") + "\n";
  s += n.post("/keys/batch_allocate", R"({"rank":1,"keys":["new1","new2"]})") + "\n";
  s += n.post("/0/reserve_and_allocate_page_indices", R"({"keys":["c","e","f"]})") + "\n";
  return s;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Where each frame of a log starts, and its end.
std::vector<std::size_t> frame_starts(std::string_view log) {
  std::vector<std::size_t> at;
  std::size_t offset = 0;
  while (offset + 8 <= log.size()) {
    at.push_back(offset);
    std::uint32_t length = 0;
    std::memcpy(&length, log.data() + offset, 4);
    offset += 8 + length;
  }
  EXPECT_EQ(offset, log.size());
  at.push_back(offset);
  return at;
}

// A core's group commit, as its loop does it (the standby's own log).
void flush(pipeline::cluster& cl, pipeline::core_state& core) {
  const smp::core_scope as_core(core.index);
  store::log_writer::flush_job job;
  if (!server::take_flush(cl, core, true, job)) return;
  const long written = ::pwrite(job.fd, job.data, job.bytes, static_cast<off_t>(job.offset));
  server::flush_done(cl, core, written, ::fdatasync(job.fd));
}

// The standby's end of the streams: a node (serving nothing until promoted), and per
// core the decoder, the follower and the applier.
class standby {
 public:
  standby(const std::string& dir, std::uint64_t generation) : node_(dir, kCores) {
    for (int c = 0; c < kCores; ++c) {
      streams_.push_back(std::make_unique<stream>(kEpoch, generation, c));
      appliers_.push_back(std::make_unique<server::standby_core>(node_.cluster(), c, 0));
    }
  }

  // Bytes of the leader's stream for core c, as they arrive; returns the acks to send.
  std::string receive(int c, std::string_view wire, bool sync_now) {
    stream& s = *streams_[static_cast<std::size_t>(c)];
    s.from_leader.feed(wire);
    std::string acks;
    repl::decoder::status st;
    while ((st = s.from_leader.next()) == repl::decoder::status::message) {
      EXPECT_EQ(s.from_leader.type, repl::message_type::batch);
      const repl::follower::result r = s.follower.on_batch(s.from_leader.batch);
      if (r.v == repl::follower::verdict::apply) {
        EXPECT_EQ(r.start_lsn, appliers_[static_cast<std::size_t>(c)]->received_lsn());
        appliers_[static_cast<std::size_t>(c)]->receive(r.bytes);
        ++applied;
      } else {
        EXPECT_EQ(r.v, repl::follower::verdict::duplicate);
        ++duplicates;
      }
      if (sync_now) repl::encode(acks, sync(c));
    }
    EXPECT_EQ(st, repl::decoder::status::need_more);
    return acks;
  }

  // The core's group commit, and the ack it allows.
  repl::ack sync(int c) {
    flush(node_.cluster(), *node_.cluster().core[c]);
    return streams_[static_cast<std::size_t>(c)]->follower.durable(
        appliers_[static_cast<std::size_t>(c)]->durable_lsn());
  }

  void promote() { server::promote_standby(node_.cluster(), appliers_); }
  node& n() { return node_; }
  std::uint64_t durable_lsn(int c) const {
    return appliers_[static_cast<std::size_t>(c)]->durable_lsn();
  }
  int applied = 0, duplicates = 0;

 private:
  struct stream {
    stream(std::uint64_t epoch, std::uint64_t generation, int c)
        : follower(epoch, generation, static_cast<std::uint32_t>(c), 0) {}
    repl::decoder from_leader;
    repl::follower follower;
  };
  node node_;
  std::vector<std::unique_ptr<stream>> streams_;
  std::vector<std::unique_ptr<server::standby_core>> appliers_;
};

class Standby : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = (fs::temp_directory_path() /
             ("metad-standby-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove_all(base_);
    fs::create_directories(base_);
  }
  void TearDown() override { fs::remove_all(base_); }
  std::string base_;
};

// The leader's log of each core, from its files, shipped in batches cut at random frame
// boundaries, some sent twice or resent overlapping, over a wire delivered in random
// pieces; the standby syncs and acks at random points.
TEST_F(Standby, AppliesTheLeadersLogCutAnywhereAndAnswersAsTheLeaderDoes) {
  std::string expected;
  std::vector<std::string> logs;
  {
    node leader(base_ + "/leader", kCores);
    history(leader);
    for (int c = 0; c < kCores; ++c)
      logs.push_back(read_file(base_ + "/leader/g1/core-" + std::to_string(c) + ".log-1"));
    expected = probe(leader);  // after the logs were read: probe() changes the state
    EXPECT_EQ(pipeline::check_consistency(leader.cluster()), "");
  }
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const std::string dir = base_ + "/standby-" + std::to_string(seed);
    standby s(dir, 1);
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
    // The standby's own data directory, as it is now (before promotion writes to it).
    fs::copy(dir, dir + "-copy", fs::copy_options::recursive);
    fs::remove(dir + "-copy/LOCK");
    s.promote();
    EXPECT_EQ(pipeline::check_consistency(s.n().cluster()), "");
    EXPECT_EQ(probe(s.n()), expected);
    node restarted(dir + "-copy", kCores);
    EXPECT_EQ(probe(restarted), expected);
  }
}

// Live: every group commit of the leader is shipped as it happens and the leader's
// requests wait for the standby's ack (sync replication); after each request the
// standby holds durably everything the leader acknowledged.
TEST_F(Standby, ALiveLeaderAcknowledgesOnlyWhatTheStandbyHolds) {
  standby s(base_ + "/standby", 1);
  node leader(base_ + "/leader", kCores);
  std::vector<repl::leader_stream> out;
  std::vector<repl::decoder> acks(kCores);
  for (int c = 0; c < kCores; ++c) {
    out.emplace_back(kEpoch, 1, static_cast<std::uint32_t>(c), 0);
    leader.cluster().core[c]->log.require_standby(true);
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
    EXPECT_EQ(leader.cluster().core[c]->log.committed(), leader.cluster().core[c]->log.durable());
    EXPECT_EQ(s.durable_lsn(c), leader.cluster().core[c]->log.durable());
    leader.cluster().core[c]->log.require_standby(false);
  }
  EXPECT_GT(shipped, 20);
  s.promote();
  EXPECT_EQ(pipeline::check_consistency(s.n().cluster()), "");
  EXPECT_EQ(probe(s.n()), probe(leader));
}

}  // namespace
