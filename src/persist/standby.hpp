// A hot standby's side of replication (docs/replication.md, "What is shipped"): the leader's
// log frames for core c are appended to this node's own log of core c, made durable by
// the core's usual group commit, and applied to core c's state with recovery's replayer
// as they arrive. promote_standby ends the replay as recovery does. A standby_core is
// used on its core's thread only; the node it fills serves no request meanwhile.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "persist/replayer.hpp"
#include "pipeline/node.hpp"

namespace metad::persist {

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
// ranks are counted, and recovered keys are leased for --read-lease-ms (as after a
// restart). The node can serve afterwards; the standby_cores are spent (their
// replay output moved out). Called on one thread while the cores are idle; the
// directory phase runs on one thread per core. A reservation keeps the
// TTL it got when its batch arrived (close to the leader's deadline).
void promote_standby(pipeline::node& nd, std::vector<std::unique_ptr<standby_core>>& cores);

}  // namespace metad::persist
