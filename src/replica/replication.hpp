// Synchronous replication to a hot standby (--repl-listen; docs/replication.md), wired into
// the cores' loops. One object per node:
// - on a leader, each core ships what its group commit writes to the standby's core
//   and moves its log's replicated watermark as acks come back; a standby that is new
//   first gets a snapshot of each core's state. Once every core's standby caught up,
//   the standby joins the ack set, then /sync names it (Patroni's order); one silent for
//   --sync-timeout-ms is taken off /sync first, then the leader acknowledges alone.
// - on a standby, each core appends the leader's frames to its own log, applies them
//   as recovery does, and acks what its own group commit made durable. Its cores do
//   not expire or reclaim anything (the leader's log says when). When it wins the
//   lease it cuts the streams, parks the cores, finishes the replay (promotion) and
//   serves.
// A node whose state can no longer follow the leader (it led and was deposed, or its
// stream cannot resume) exits with status 75 (kExitResync) so that its supervisor
// starts it again: empty, as a standby.
//
// The files, by role (their state is replication_impl.hpp's replication::impl):
// - replication.cpp: construction (the link and its callbacks), each core's turn (the
//   stream's messages to its end, the ack set's requirement, parking), the sync set;
// - leader_end.cpp: a leader core's end (hello, snapshot, shipping, acks), over
//   repl/leader_end.hpp (retained bytes, the ack clock, the forked snapshot cut);
// - standby_end.cpp: a standby core's end (hello, answer, snapshot, batches, acks);
// - promotion.cpp: on_role, may_campaign, and promotion.
// The role etcd gives at start-up is ha::probe_start_role (ha/probe.hpp).
//
// Five actors meet here (docs/replication.md lists every thread of the process): the core
// threads (the hooks below, on their own core), the repl link thread (its each_turn
// runs the sync set), the ha thread (on_role, may_campaign), the promotion thread (a
// standby that won the lease) and a forked child per snapshot cut. Who owns what
// (written by → read by: guarded by):
// - ends[c] (core_end: a leading_end or a following_end, std::variant; a standby's
//   become a leader's at promotion, never back): core c, and promotion while c is
//   parked → core c: the parking handshake (park_mutex, park_cv);
// - shared[c] (progress, oldest unacked write, lag, require_applied, late acks, cutting):
//   core c (progress also promotion) → the link thread (sync set), the ha thread
//   (may_campaign): atomics;
// - mode: the promotion thread → cores, link and ha threads: atomic;
// - require: the link thread → cores: atomic;
// - sync, sync_ticket: the link thread alone;
// - standby_node: a core (on_hello) → the link thread: standby_mutex;
// - promotion (the std::thread): the ha thread (on_role) → the main thread (stop):
//   server::run's shutdown order;
// - a snapshot cut's image (repl::snapshot_cut): the forked child → core c, through a
//   pipe: the process boundary;
// - feed (persist::binding_feed: a standby's binding changes for each key's directory
//   slice): any standby core posts → the owning core drains, promotion while every core
//   is parked: one mutex per owning core.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ha/control.hpp"
#include "pipeline/node.hpp"
#include "store/log.hpp"

namespace metad::replica {

inline constexpr int kExitResync = 75;  // EX_TEMPFAIL: restart me

class replication {
 public:
  enum class start_as : std::uint8_t { primary, standby };

  // Binds --repl-listen (throws std::system_error).
  replication(pipeline::node& nd, start_as as);
  ~replication();
  replication(const replication&) = delete;
  replication& operator=(const replication&) = delete;

  // Before the control starts (its callbacks call this object); nd.ha set too.
  void start(ha::control& control);
  void stop();
  bool standby() const;  // the cores must leave expiry and reclamation to the leader

  // Core c's loop.
  void poll(int c);
  void shipped(int c, const store::log_writer::flush_job& job);
  void flushed(int c);

  // The ha thread.
  void on_role(ha::role from, ha::role to, std::int64_t epoch);
  bool may_campaign(const std::optional<std::string>& sync) const;

  // Its state (replication_impl.hpp), which tests drive in-process.
  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace metad::replica
