// A seeded simulation of the sync set (src/repl/sync_set.hpp) with the core-side pieces
// the server runs beside it, against a model of a leader's cores, one standby and etcd's
// /sync key, on a fake clock in 1 ms steps: writes on random cores, batches and acks
// delayed (sometimes by tens of milliseconds), a standby that stalls (SIGSTOP) or acks
// late for a while, streams that end and resume, cores that poll late, /sync writes
// that take their time, epochs that change.
//
// The property, checked after every step: while etcd's /sync names the standby, every
// write the leader answered is held by it (the standby could take over now and lose
// nothing). And the simulation must not pass by never joining: the standby is in the
// set for much of the run.
#include "repl/sync_set.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace metad;

namespace {

constexpr std::uint64_t kSimMs = 1'000'000;

struct sim_message {
  std::uint64_t at_ms;    // when it arrives
  std::uint64_t lsn;      // a batch's end, or an ack's position
  std::uint64_t sent_ns;  // a batch's: when the leader shipped it
};

struct sim_core {
  // The leader's core.
  std::uint64_t end = 0;         // log end: each write is one position
  std::uint64_t answered = 0;    // every write up to here was answered
  std::uint64_t replicated = 0;  // acked by the standby (log_writer::replicated)
  bool log_requires = false;
  repl::core_requirement requirement;
  repl::ack_latency latency{500 * kSimMs};
  std::uint64_t poll_at_ms = 0;  // the core's next turn
  // The stream.
  bool connected = false;
  std::uint64_t reconnect_at_ms = 0;
  repl::progress state = repl::progress::none;
  std::uint64_t caught_up_at = 0, caught_up_ns = 0;
  std::deque<std::pair<std::uint64_t, std::uint64_t>> unacked;  // (lsn, sent ns)
  std::deque<sim_message> to_standby, to_leader;
  // The standby's core: what it holds durably.
  std::uint64_t held = 0;
};

struct sim_etcd {
  bool names_standby = false;
  std::uint64_t landed = 0, asked = 0;  // tickets
  struct write {
    std::uint64_t at_ms, ticket;
    bool standby;
  };
  std::deque<write> pending;
};

struct sim_result {
  std::uint64_t steps_in_sync = 0, steps = 0;
  std::string violation;
};

class sync_simulation {
 public:
  explicit sync_simulation(std::uint32_t seed) : rng_(seed) {
    cores_.resize(1 + pick(4));
    for (sim_core& c : cores_) connect(c);
  }

  sim_result run(std::uint64_t ms) {
    sim_result r;
    for (now_ms_ = 1; now_ms_ <= ms && r.violation.empty(); ++now_ms_) {
      faults();
      for (std::size_t i = 0; i < cores_.size(); ++i) core_turn(i);
      standby_turn();
      etcd_turn();
      if (now_ms_ >= link_at_ms_) link_turn();
      r.violation = check();
      ++r.steps;
      if (etcd_.names_standby) ++r.steps_in_sync;
    }
    return r;
  }

 private:
  std::uint64_t pick(std::uint64_t n) {
    return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  std::uint64_t now_ns() const { return now_ms_ * kSimMs; }
  // A network delay: mostly a millisecond or two, sometimes tens (a busy link).
  std::uint64_t delay_ms() { return chance(0.05) ? 10 + pick(80) : pick(3); }

  void connect(sim_core& c) {
    c.connected = true;
    c.to_standby.clear();
    c.to_leader.clear();
    // The hello says where the standby stands; the leader resumes there (the retained
    // bytes always cover it in this model) and it is caught up once it acks the end.
    c.state = repl::progress::catching_up;
    c.caught_up_at = c.end;
    c.caught_up_ns = 0;
    c.unacked.assign(1, {c.end, now_ns()});
    c.latency.reset();
    if (c.end > c.held)
      c.to_standby.push_back({now_ms_ + delay_ms(), c.end, now_ns()});
    else
      c.to_leader.push_back({now_ms_ + delay_ms(), c.held, 0});
  }

  void disconnect(sim_core& c) {
    if (!c.connected) return;
    c.connected = false;
    c.state = repl::progress::none;
    c.unacked.clear();
    c.to_standby.clear();
    c.to_leader.clear();
    c.latency.reset();
    c.reconnect_at_ms = now_ms_ + 50 + pick(250);
  }

  void faults() {
    if (chance(0.0005)) stall_until_ms_ = now_ms_ + 100 + pick(1500);  // SIGSTOP
    if (chance(0.0003)) late_until_ms_ = now_ms_ + 1000 + pick(3000);  // acks late
    if (chance(0.0003)) disconnect(cores_[pick(cores_.size())]);
    if (chance(0.0001)) {  // the lease lost and won again: a new /sync
      ++epoch_;
      etcd_.names_standby = false;
      etcd_.pending.clear();
    }
    for (sim_core& c : cores_)
      if (!c.connected && now_ms_ >= c.reconnect_at_ms) connect(c);
  }

  void core_turn(std::size_t i) {
    sim_core& c = cores_[i];
    if (chance(0.3)) {  // a write: durable on the leader's disk at once, shipped if streaming
      ++c.end;
      if (c.connected) {
        c.to_standby.push_back({now_ms_ + delay_ms(), c.end, now_ns()});
        c.unacked.emplace_back(c.end, now_ns());
      }
    }
    while (!c.to_leader.empty() && c.to_leader.front().at_ms <= now_ms_) {  // acks
      const std::uint64_t lsn = c.to_leader.front().lsn;
      c.to_leader.pop_front();
      c.replicated = std::max(c.replicated, std::min(lsn, c.end));
      std::uint64_t newest_sent = 0;
      while (!c.unacked.empty() && c.unacked.front().first <= lsn) {
        newest_sent = c.unacked.front().second;
        c.unacked.pop_front();
      }
      if (c.caught_up_ns != 0 && newest_sent >= c.caught_up_ns)
        c.latency.on_ack(now_ns() - newest_sent, now_ns());
      if (lsn >= c.caught_up_at && c.caught_up_ns == 0) {
        c.caught_up_ns = now_ns();
        c.state = repl::progress::caught_up;
      }
    }
    if (now_ms_ < c.poll_at_ms) return;  // busy
    c.poll_at_ms = now_ms_ + (chance(0.02) ? 5 + pick(40) : 0);
    c.log_requires = c.requirement.poll(require_, c.end, c.replicated);
    // log_writer: waiters resume at the local disk's position, or at the standby's while
    // it is required.
    c.answered = std::max(c.answered, c.log_requires ? std::min(c.end, c.replicated) : c.end);
  }

  void standby_turn() {
    if (now_ms_ < stall_until_ms_) return;
    const bool late = now_ms_ < late_until_ms_;
    for (sim_core& c : cores_)
      while (!c.to_standby.empty() && c.to_standby.front().at_ms <= now_ms_) {
        c.held = std::max(c.held, c.to_standby.front().lsn);
        c.to_standby.pop_front();
        c.to_leader.push_back({now_ms_ + (late ? 300 + pick(150) : delay_ms()), c.held, 0});
      }
  }

  void etcd_turn() {
    while (!etcd_.pending.empty() && etcd_.pending.front().at_ms <= now_ms_) {
      etcd_.names_standby = etcd_.pending.front().standby;
      etcd_.landed = etcd_.pending.front().ticket;
      etcd_.pending.pop_front();
    }
  }

  void link_turn() {
    link_at_ms_ = now_ms_ + 1 + pick(20);
    std::vector<repl::core_report> reports;
    for (const sim_core& c : cores_)
      reports.push_back({c.state, c.requirement.applied(),
                         c.unacked.empty() ? 0 : c.unacked.front().second,
                         c.latency.slow_since_ns(), c.latency.slow_acks()});
    const repl::sync_actions a =
        set_.step({epoch_, now_ns(), reports, etcd_.landed >= etcd_.asked && etcd_.asked != 0});
    using A = repl::sync_actions;
    if (a.require != A::require_change::none) require_ = a.require == A::require_change::on;
    if (a.close_streams)
      for (sim_core& c : cores_) disconnect(c);
    if (a.write != A::sync_write::none) {
      etcd_.asked = ++tickets_;
      etcd_.pending.push_back(
          {now_ms_ + 1 + pick(30), tickets_, a.write == A::sync_write::standby});
    }
  }

  std::string check() const {
    if (!etcd_.names_standby) return "";
    for (std::size_t i = 0; i < cores_.size(); ++i)
      if (cores_[i].answered > cores_[i].held)
        return "at " + std::to_string(now_ms_) + " ms /sync names the standby, core " +
               std::to_string(i) + " answered up to " + std::to_string(cores_[i].answered) +
               " and the standby holds " + std::to_string(cores_[i].held);
    return "";
  }

  std::mt19937 rng_;
  std::vector<sim_core> cores_;
  repl::sync_set set_{repl::sync_config{}};
  sim_etcd etcd_;
  bool require_ = false;
  std::int64_t epoch_ = 1;
  std::uint64_t tickets_ = 0;
  std::uint64_t now_ms_ = 0, link_at_ms_ = 0, stall_until_ms_ = 0, late_until_ms_ = 0;
};

TEST(SyncSetSimulation, WhileSyncNamesTheStandbyItHoldsEveryAnsweredWrite) {
  std::uint64_t in_sync = 0, steps = 0;
  for (std::uint32_t seed = 1; seed <= 60; ++seed) {
    sync_simulation sim(seed);
    const sim_result r = sim.run(20'000);
    ASSERT_EQ(r.violation, "") << "seed " << seed;
    in_sync += r.steps_in_sync;
    steps += r.steps;
  }
  // Not vacuous: the standby spends most of the time in the set.
  EXPECT_GT(in_sync, steps / 3) << in_sync << " of " << steps << " steps in sync";
}

}  // namespace
