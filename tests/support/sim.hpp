// The in-memory harness: drives pipeline::connections and a node's cores by hand, on one
// thread, as the transports and the core loops would, without sockets or threads. Used by
// the pipeline tests (tests/pipeline), the whole-node tests (basic_sim_node.hpp)
// and the pipeline fuzzer (tests/fuzz/pipeline_fuzz.cpp).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>

#include "net/transport.hpp"
#include "pipeline/connection.hpp"
#include "pipeline/node.hpp"
#include "pipeline/removal.hpp"
#include "smp/core.hpp"

namespace metad::sim {

// Counts the connection's wake-ups; input_pending() says `pending`.
struct counting_waker final : net::waker {
  int wakes = 0;
  bool pending = false;
  void wake() override { ++wakes; }
  bool input_pending() override { return pending; }
};

// Calls into a connection (or anything else) as core `core`'s thread would.
template <typename Call>
auto as_core(int core, Call call) {
  const smp::core_scope scope(core);
  return call();
}

// What a core's loop does besides draining its mailbox (sim_node: the log flush).
using core_step = std::function<void(pipeline::core_state&)>;

// One round of every core's loop: its mailbox drained, then `step`.
inline void run_cores_once(pipeline::node& nd, const core_step& step = {}) {
  for (auto& core : nd.core) {
    nd.mailbox.drain(core->index);
    if (step) step(*core);
  }
}

// Settles the connection after one of its calls answered `flow`, as a transport does:
// on wait, runs the cores (at most `spins` rounds) until the connection is woken, then
// resumes it; on drain, hands the output to `take` and goes on. Returns the first other
// flow (read or close). `woken_once` turns false if a wait was not woken exactly once.
template <typename Take>
net::flow settle(pipeline::node& nd, pipeline::connection& x, int home, counting_waker& waker,
                 net::flow flow, Take&& take, bool& woken_once, int spins = 1000,
                 const core_step& step = {}) {
  for (;;) {
    if (flow == net::flow::wait) {
      const int before = waker.wakes;
      for (int spin = 0; spin < spins && waker.wakes == before; ++spin) run_cores_once(nd, step);
      woken_once = woken_once && waker.wakes == before + 1;
      flow = as_core(home, [&] { return x.on_resume(); });
    } else if (flow == net::flow::drain) {
      take(x.output());
      flow = as_core(home, [&] { return x.on_drained(); });
    } else {
      return flow;
    }
  }
}

// What each core's loop does every tick (expiry, the stale-key walks), then the walks a
// tick started run to their end (at most `spins` rounds). `sweepers` holds one per core.
// Returns whether every walk ended.
inline bool tick(pipeline::node& nd, pipeline::stale_sweeper* sweepers, int spins = 1000,
                 const core_step& step = {}) {
  for (auto& core : nd.core) {
    as_core(core->index, [&] {
      pipeline::expire_due(nd, *core);
      pipeline::reclaim_stale_due(nd, *core, sweepers[core->index]);
      if (step) step(*core);
    });
  }
  auto walking = [&] {
    for (int c = 0; c < nd.cores; ++c)
      if (sweepers[c].running) return true;
    return false;
  };
  for (int spin = 0; spin < spins && walking(); ++spin) run_cores_once(nd, step);
  return !walking();
}

}  // namespace metad::sim
