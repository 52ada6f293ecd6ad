// The sync set, sans-IO: whether a leader's writes wait for its standby, and when etcd's
// /sync may name that standby (docs/replication.md, "The sync set"). It is the
// replication counterpart of ha::leadership: the server's link thread feeds it what each
// core reports and applies what it decides; the tests drive it on a fake clock against a
// model of cores, a standby and etcd (tests/repl/sync_set_simulation_test.cpp).
//
// The rule it keeps: while /sync names the standby, every write the leader answered is
// held by that standby. Hence the order, both ways: writes wait for the standby
// (require) before /sync names it, and wait until /sync no longer names it.
//
//   alone ──every core caught up──► requiring ──every core applied it──► publishing
//     ▲                                 │ lagging                            │ /sync written
//     │◄────────────────────────────────┘                                    ▼
//     │                                                                   in_sync
//     │                                                                      │ lagging or slow
//     └───── /sync written (no standby) ◄──── dropping ◄─────────────────────┘ (also from
//     publishing)
//
// Three small pieces, each owned by one thread:
// - core_requirement (a core thread): applies the requirement to that core's log and
//   reports it applied only once the standby holds everything the log answered before;
// - ack_latency (a core thread): the EWMA of its standby's ack delays (late acks);
// - sync_set (the link thread): the state machine above.
#pragma once

#include <cstdint>
#include <span>

namespace metad::repl {

// How far one core's standby has come on its current stream.
enum class progress : std::uint8_t { none, catching_up, caught_up };

// One core's view of the requirement. The core calls poll() on each of its turns.
class core_requirement {
 public:
  // `required`: what the link thread asks; `log_end`: the core's log end; `acked`: what
  // the standby acknowledged durable (store::log_writer::replicated). Returns whether
  // the core's log must wait for the standby from now on (log_writer::require_standby).
  bool poll(bool required, std::uint64_t log_end, std::uint64_t acked) {
    if (required && !required_) mark_ = log_end;  // answered so far without the standby
    required_ = required;
    applied_ = required && acked >= mark_;
    return required_;
  }
  // The log waits for the standby, and the standby holds every write answered before it
  // did: /sync may name it as far as this core is concerned.
  bool applied() const { return applied_; }

 private:
  bool required_ = false;
  bool applied_ = false;
  std::uint64_t mark_ = 0;
};

// When a standby's acks come late on average: an EWMA (weight 1/4) of each ack's delay
// after the newest write it covers, and since when it has stayed above half of
// --sync-timeout-ms.
class ack_latency {
 public:
  explicit ack_latency(std::uint64_t bound_ns) : bound_ns_(bound_ns) {}
  // An ack `latency_ns` after the write it covers, arriving at `now_ns`.
  void on_ack(std::uint64_t latency_ns, std::uint64_t now_ns);
  void reset() { *this = ack_latency(bound_ns_); }
  std::uint64_t slow_since_ns() const { return slow_since_ns_; }  // 0: not late
  std::uint64_t slow_acks() const { return slow_acks_; }

 private:
  std::uint64_t bound_ns_;
  double ewma_ns_ = 0;  // 0: no ack yet
  std::uint64_t slow_since_ns_ = 0, slow_acks_ = 0;
};

// What the link thread reads of one core (its shared atomics) on each turn.
struct core_report {
  progress state = progress::none;
  bool require_applied = false;         // core_requirement::applied
  std::uint64_t oldest_unacked_ns = 0;  // when the oldest unacknowledged write was sent; 0: none
  std::uint64_t slow_since_ns = 0;      // ack_latency
  std::uint64_t slow_acks = 0;
};

struct sync_config {
  std::uint64_t sync_timeout_ms =
      500;  // --sync-timeout-ms: a standby in the set silent longer is dropped
  // A standby still catching up (its snapshot in transfer) may be silent this long.
  std::uint64_t catch_up_silence_ms = 60'000;
  // Late acks drop the standby after 4 × sync_timeout_ms above half of it and at least
  // slow_acks_min acks; it may join again slow_rejoin_ms later at the soonest.
  std::uint64_t slow_acks_min = 3;
  std::uint64_t slow_rejoin_ms = 30'000;
};

struct sync_inputs {
  std::int64_t epoch = 0;  // the leadership's; 0: none (nothing is decided)
  std::uint64_t now_ns = 0;
  std::span<const core_report> cores;
  bool written = false;  // the last /sync write this set asked for is done
};

// What the link thread does, in this order: the requirement, the streams, /sync.
struct sync_actions {
  enum class require_change : std::uint8_t { none, on, off };
  enum class sync_write : std::uint8_t { none, standby, nobody };
  // Why the state changed, for the log.
  enum class reason : std::uint8_t {
    none,
    catch_up_silent,   // a catching-up standby went silent: streams closed
    caught_up,         // every core caught up: requiring
    lost_before_sync,  // lagging while requiring: alone, /sync never named it
    published,         // /sync names the standby: in sync
    stopped_acking,    // lagging in the set: dropping
    late_acks,         // slow in the set: dropping, rejoin later
    dropped,           // /sync no longer names it: alone
    new_epoch,         // another leadership: alone
  };
  require_change require = require_change::none;
  bool close_streams = false;
  sync_write write = sync_write::none;
  reason why = reason::none;
};

class sync_set {
 public:
  enum class state : std::uint8_t { alone, requiring, publishing, in_sync, dropping };

  explicit sync_set(sync_config config) : config_(config) {}
  sync_actions step(const sync_inputs& in);
  state current() const { return state_; }
  bool in_sync() const { return state_ == state::in_sync; }
  const sync_config& config() const { return config_; }

 private:
  bool lagging(const sync_inputs& in, bool in_set) const;
  bool slow(const sync_inputs& in) const;

  sync_config config_;
  state state_ = state::alone;
  std::int64_t epoch_ = 0;
  std::uint64_t rejoin_after_ns_ = 0;
};

const char* to_string(sync_set::state s);

}  // namespace metad::repl
