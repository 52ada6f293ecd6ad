// Applying records to the cores' state, in one place for both of its users: recovery's
// replayer (decoded log and snapshot records applied to one core's state at start-up),
// and a hot standby's standby_core (docs/replication.md, "What is shipped"), which
// appends the leader's frames to its own log and applies them with the same replayer as
// they arrive. Then the directory phase that recovery (and a promotion) runs once every
// record is in. A replayer is used by one thread at a time, on its core's state only.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pipeline/node.hpp"
#include "shard/packed_key.hpp"
#include "store/record.hpp"
#include "store/recovery.hpp"

namespace metad::persist {

// What one core learns while replaying, for the directory phase: the confirmed
// bindings of its ranks, by the core that owns each key's directory slice now (one entry
// per (rank, key)); 32-hex keys packed. (The tp_world_size of the keys a core owns goes
// straight into its directory: directory::restore_key.)
struct replay_output {
  std::vector<std::vector<shard::packed_key>> packed_by_owner;
  std::vector<std::vector<std::string>> others_by_owner;
  std::uint64_t records = 0;
};

// Quarantines replayed from the log end where the log says (quarantine_end); after
// recovery they all restart (rank_table::restart_quarantines).
inline constexpr std::uint64_t kQuarantinedUntilLogged = UINT64_MAX;

class replayer {
 public:
  // sizes: what the files hold, to size the tables before filling them (empty: unknown).
  replayer(pipeline::node& nd, int core, replay_output& out, const store::file_sizes& sizes);

  // One record, if it belongs to this core (its rank, or its key's directory slice).
  // clear records are not applied: recovery starts after the last one. Throws
  // std::runtime_error for a record that no longer applies.
  void apply(const store::record& r);

  // After the last record: the keys this core's ranks hold confirmed, by the core
  // that owns each key's directory slice (which counts them).
  void collect_confirmed();

  // The time reservations made from here on count their TTL from (recovery: when it
  // started; a hot standby: when each batch arrives, close to the leader's own time).
  void set_now(std::uint64_t now) { now_ = now; }

 private:
  void restore_rank_keys(const store::record& r, shard::rank_table& ranks);
  void restore_directory_keys(const store::record& r, shard::directory& directory);

  pipeline::node& node_;
  int core_;
  replay_output& out_;
  std::unordered_map<std::int64_t, std::size_t> expected_;
  std::uint64_t now_ = node_.clock();
  std::vector<std::uint32_t> indices_;
  std::vector<shard::rank_table::packed_binding> bindings_;
  std::vector<std::int64_t> pages_;
  std::string detail_;
};

// Counts every confirmed binding into the directory slice of the key's owner (each core
// reads the lists the others made for it, and frees them).
void rebuild_directory(pipeline::node& nd, int core, std::vector<replay_output>& outputs,
                       std::int32_t fallback_tp);

// A hot standby's side of replication: the leader's log frames for core c are appended
// to this node's own log of core c, made durable by the core's usual group commit, and
// applied to core c's state with the replayer as they arrive. promote_standby ends the
// replay as recovery does. A standby_core is used on its core's thread only; the node it
// fills serves no request meanwhile.
class standby_core {
 public:
  // Core c of `nd`, a node recovered from the standby's own data directory (its log
  // open and idle), whose state is the leader's core c at leader_lsn.
  standby_core(pipeline::node& nd, int core, std::uint64_t leader_lsn);

  // Whole, checked frames (repl::follower's verdict apply) starting at the leader's
  // position received_lsn(): appended to the core's log, then applied. Throws
  // std::runtime_error if a record no longer applies (the states diverged: resync).
  void receive(std::string_view frames);

  // Leader positions: what was received, and what this node's log holds durably (what
  // to ack once the core's group commit returns).
  std::uint64_t received_lsn() const { return leader_base_ + (log_.end() - local_base_); }
  // 0 until this node's log holds the bytes before leader_lsn (a snapshot received).
  std::uint64_t durable_lsn() const {
    return snapshot_durable() ? leader_base_ + (log_.durable() - local_base_) : 0;
  }
  bool snapshot_durable() const { return log_.durable() >= local_base_; }
  // The state received so far (a snapshot's records) is the leader's at leader_lsn:
  // what follows is the leader's log from there.
  void rebase(std::uint64_t leader_lsn) {
    leader_base_ = leader_lsn;
    local_base_ = log_.end();
  }

  int core() const { return core_; }
  replay_output& output() { return out_; }
  replayer& replay() { return replayer_; }

 private:
  pipeline::node& node_;
  int core_;
  store::log_writer& log_;
  std::uint64_t leader_base_, local_base_;
  replay_output out_;
  replayer replayer_;
};

// Promotion's replay half, once the streams are closed and every received frame is
// applied: the directory is rebuilt from the bindings, quarantines restart, worker
// ranks are counted (and with --tenants-file each tenant's SGLang ranks, its ranks=N
// count), and recovered keys are leased for --read-lease-ms (as after a
// restart). The node can serve afterwards; the standby_cores are spent (their
// replay output moved out). Called on one thread while the cores are idle; collecting
// each core's bindings and the directory phase run on one thread per core. A reservation keeps the
// TTL it got when its batch arrived (close to the leader's deadline).
void promote_standby(pipeline::node& nd, std::vector<std::unique_ptr<standby_core>>& cores);

// Runs work(c) for every core c on a thread of its own, and rethrows the first error.
template <typename Work>
void on_every_core(pipeline::node& nd, Work&& work) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(nd.cores));
  for (int c = 0; c < nd.cores; ++c) {
    threads.emplace_back([&, c] {
      try {
        work(c);
      } catch (...) {
        errors[static_cast<std::size_t>(c)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace metad::persist
