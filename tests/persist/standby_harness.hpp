// The standby side of replication tests: a leader's history touching every record kind,
// the probe that compares two nodes' answers, and a standby sim_node fed through the
// replication protocol (decoder → follower → persist::standby_core, acks back).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "persist/replayer.hpp"
#include "repl/protocol.hpp"
#include "repl/session.hpp"
#include "sim_node.hpp"

using namespace metad;

namespace standby_test {

using server_test::sim_node;

inline constexpr std::uint64_t kEpoch = 42;
inline constexpr int kCores = 2;

// 32 lowercase hex, 64 lowercase or 64 uppercase hex (each stored in its own form).
inline std::string key(int i) {
  const auto n = 0xabc0000u + static_cast<unsigned>(i);
  switch (i % 3) {
    case 1:
      return fmt::format("{:032x}{:032x}", n * 2654435761u, n);
    case 2:
      return fmt::format("{:032X}{:032X}", n * 2654435761u, n);
    default:
      return fmt::format("{:032x}", n);
  }
}

inline std::string list(int from, int to) {
  std::string out;
  for (int i = from; i < to; ++i) out += (out.empty() ? "\"" : ",\"") + key(i) + "\"";
  return out;
}

inline std::string confirmations(int from, int to) {
  std::string out;
  for (int i = from; i < to; ++i)
    out += (out.empty() ? "[\"" : ",[\"") + key(i) + "\"," + std::to_string(i - from) + "]";
  return out;
}

// Every kind of log record: ranks, saves (packed and other keys), failed writes
// released, expiry on the tick, a delete, SGLang pools (a release quarantine ended on
// the tick, another still running at the end), a /clear with writes after it, keys
// deleted and saved again, a rank shrunk.
inline void history(sim_node& n) {
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
  n.post("/t/1/confirm_write", R"({"written_keys_to_confirm":[],"pages_to_release":[1]})");
  // Keys deleted, then saved again with another tp_world_size (a third rank); a rank
  // shrunk under its confirmed keys (they lose that binding).
  n.post("/rank/3/initialize", R"({"num_pages":16})");
  n.post("/keys/delete", "{\"keys\":[" + list(50, 52) + "]}");
  n.post("/keys/batch_allocate", "{\"rank\":3,\"keys\":[" + list(50, 52) + "]}");
  n.post("/keys/confirm_write", "{\"rank\":3,\"confirmations\":[" + confirmations(50, 52) + "]}");
  n.post("/rank/2/initialize", R"({"num_pages":4})");
}

// What the state answers: every rank's counts, the directory, locations, SGLang pools,
// then allocations (which depend on the free pages' order and the reservations).
inline std::string probe(sim_node& n) {
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
  // The free page, then an eviction, then (nothing else left) the quarantined page 1.
  s += n.post("/t/1/reserve_and_allocate_page_indices", R"({"keys":["q1","q2","q3"]})") + "\n";
  return s;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Where each frame of a log starts, and its end.
inline std::vector<std::size_t> frame_starts(std::string_view log) {
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
inline void flush(pipeline::node& nd, pipeline::core_state& core) {
  const smp::core_scope as_core(core.index);
  persist::snapshot_tick(nd, core);  // as the loop's tick: a cut may come due
  store::log_writer::flush_job job;
  if (!persist::take_flush(nd, core, true, job)) return;
  const long written = ::pwrite(job.fd, job.data, job.bytes, static_cast<off_t>(job.offset));
  persist::flush_done(nd, core, written, ::fdatasync(job.fd));
}

// The standby's end of the streams: a sim_node (serving nothing until promoted), and per
// core the decoder, the follower and the applier.
class standby {
 public:
  standby(const std::string& dir, std::uint64_t generation, int cores = kCores,
          std::uint64_t snapshot_bytes = 1u << 30)
      : node_(dir, cores, snapshot_bytes), feed_(cores) {
    for (int c = 0; c < cores; ++c) {
      streams_.push_back(std::make_unique<stream>(kEpoch, generation, c));
      appliers_.push_back(std::make_unique<persist::standby_core>(node_.state(), c, 0, feed_));
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
    flush(node_.state(), *node_.state().core[c]);
    return streams_[static_cast<std::size_t>(c)]->follower.durable(
        appliers_[static_cast<std::size_t>(c)]->durable_lsn());
  }

  // The leader's answer to our hello for core c: true if it streams.
  bool answered(int c, const repl::answer& a) {
    return streams_[static_cast<std::size_t>(c)]->follower.on_answer(a);
  }
  // Waits for background snapshot writers (before the data directory is copied).
  void settle() {
    for (auto& core : node_.state().core) {
      persist::finish_snapshot(*core);
      persist::snapshot_tick(node_.state(), *core);
    }
  }
  void promote() { persist::promote_standby(node_.state(), appliers_, feed_); }
  sim_node& n() { return node_; }
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
  sim_node node_;
  persist::binding_feed feed_;
  std::vector<std::unique_ptr<stream>> streams_;
  std::vector<std::unique_ptr<persist::standby_core>> appliers_;
};

}  // namespace standby_test
