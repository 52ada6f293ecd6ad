// A whole node without sockets or threads: one connection fed requests, every core's
// mailbox drained and log group-committed by hand (sim.hpp), on a fake clock. The node's
// durability (recovery, the group commit, snapshot cuts) is a parameter: memory_node runs
// without it, state in memory (the pipeline tests, tests/pipeline: they link no persist);
// sim_node.hpp plugs in persist's (tests/persist, tests/server).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/connection.hpp"
#include "pipeline/consistency.hpp"
#include "pipeline/node.hpp"
#include "pipeline/removal.hpp"
#include "sim.hpp"
#include "smp/core.hpp"

using namespace metad;

namespace server_test {

// A node's durability as the server's loops drive it (persist/durability.hpp's calls):
// none, state in memory only.
struct in_memory {
  static void recover(pipeline::node&) {}
  static void finish_snapshot(pipeline::core_state&) {}
  static void snapshot_tick(pipeline::node&, pipeline::core_state&) {}
  static bool take_flush(pipeline::node&, pipeline::core_state&, bool,
                         store::log_writer::flush_job&) {
    return false;
  }
  static void flush_done(pipeline::node&, pipeline::core_state&, long, int) {}
};

// One simulated node (a pipeline::node) over a data directory, driven by hand: mailbox
// drains and log flushes, through `Durability` (in_memory, or sim_node.hpp's persist).
template <class Durability>
class basic_sim_node {
 public:
  basic_sim_node(const std::string& dir, int cores, std::uint64_t snapshot_bytes = 1u << 30)
      : basic_sim_node(with_dir(dir, snapshot_bytes), cores) {}
  // Any configuration; state in memory unless cfg.data_dir is set.
  basic_sim_node(metad::config cfg, int cores) : cfg_(std::move(cfg)) {
    cfg_.log = metad::log_level::error;
    node_ = std::make_unique<pipeline::node>(cfg_, cores);
    node_->clock = [this] { return now * smp::kNsPerMs; };
    Durability::recover(*node_);
    x_ = std::make_unique<pipeline::connection>(*node_, *node_->core[0], waker_);
  }
  ~basic_sim_node() {
    for (auto& core : node_->core) Durability::finish_snapshot(*core);
  }

  // Bytes larger than the connection's read space go in as several reads.
  std::string send(const std::string& bytes) {
    std::string drained;  // answers a drain handed over (flow::drain: sent, then go on)
    std::size_t at = 0;
    do {
      std::span<char> space = x_->read_space();
      const std::size_t n = std::min(space.size(), bytes.size() - at);
      std::copy_n(bytes.begin() + static_cast<std::ptrdiff_t>(at), n, space.begin());
      at += n;
      bool woken = true;
      sim::settle(
          *node_, *x_, 0, waker_, sim::as_core(0, [&] { return x_->on_bytes(n); }),
          [&](std::string& output) { drained += std::exchange(output, {}); }, woken, 1000,
          flush_step());
      if (at == bytes.size()) {
        EXPECT_TRUE(woken);
      }
    } while (at < bytes.size());
    for (auto& core : node_->core) Durability::snapshot_tick(*node_, *core);
    return drained + std::exchange(x_->output(), {});
  }

  std::string post(const std::string& path, const std::string& body) {
    const std::string response =
        send("POST " + path + " HTTP/1.1\r\ncontent-length: " + std::to_string(body.size()) +
             "\r\n\r\n" + body);
    return response.substr(response.find("\r\n\r\n") + 4);
  }
  std::string get(const std::string& path) {
    const std::string response = send("GET " + path + " HTTP/1.1\r\n\r\n");
    return response.substr(response.find("\r\n\r\n") + 4);
  }
  // What each core's loop does every tick, at the fake clock's time; the background
  // walks a tick starts are run to their end.
  void tick() {
    sweepers_.resize(node_->core.size());
    EXPECT_TRUE(sim::tick(*node_, sweepers_.data(), 1000, flush_step()));
  }
  pipeline::node& state() { return *node_; }
  // While set, every group commit's fdatasync fails with EIO (its write succeeds).
  bool fail_sync = false;
  // Replication tests: on_flush is called with each group commit before it is written
  // (the same bytes are shipped to a standby there), after_sync once it is written and
  // synced, before its waiters are resumed (a standby's ack may be awaited there).
  using flush_hook =
      std::function<void(pipeline::core_state&, const store::log_writer::flush_job&)>;
  flush_hook on_flush, after_sync;

  std::uint64_t now = 1'000'000;  // the node's clock, in ms

 private:
  static metad::config with_dir(const std::string& dir, std::uint64_t snapshot_bytes) {
    metad::config cfg;
    cfg.data_dir = dir;
    cfg.snapshot_log_bytes = snapshot_bytes;
    return cfg;
  }

  // What a loop does once per iteration: the group commit, through the server's hooks.
  void flush(pipeline::core_state& core) {
    const smp::core_scope as_core(core.index);  // resumes the requests that waited for it
    store::log_writer::flush_job job;
    if (!Durability::take_flush(*node_, core, true, job)) return;
    if (on_flush) on_flush(core, job);
    const long written = ::pwrite(job.fd, job.data, job.bytes, static_cast<off_t>(job.offset));
    const int synced = fail_sync ? -EIO : ::fdatasync(job.fd);
    if (after_sync) after_sync(core, job);
    Durability::flush_done(*node_, core, written, synced);
  }

  sim::core_step flush_step() {
    return [this](pipeline::core_state& core) { flush(core); };
  }

  metad::config cfg_;
  std::unique_ptr<pipeline::node> node_;
  std::vector<pipeline::stale_sweeper> sweepers_;
  sim::counting_waker waker_;
  std::unique_ptr<pipeline::connection> x_;
};

// The in-memory node (no --data-dir, no durability): the pipeline tests.
using memory_node = basic_sim_node<in_memory>;

// A node's settings with the release quarantine at `quarantine_ms` (the replay tests).
inline metad::config quarantine_config(std::uint32_t quarantine_ms) {
  metad::config cfg;
  cfg.release_quarantine_ms = quarantine_ms;
  return cfg;
}

// "a","b",... for a JSON array's body.
inline std::string json_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "\"" : ",\"") + k + "\"";
  return out;
}

}  // namespace server_test
