// High availability's gate on the request path (--ha-etcd): a node answers the API
// (the route table's leader-only rows) only while its ha control says it may serve;
// otherwise 503 naming the leader, with nothing changed. /health, /ready and /metrics
// answer on every node and say its role. Any core: the check is one atomic load (the
// control's serving deadline); the leader's name is read once per change per core.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ha/control.hpp"
#include "pipeline/answer.hpp"
#include "pipeline/node.hpp"

namespace metad::pipeline {

// Whether this node may answer the API at `now_ns` (smp::monotonic_ns, the clock of
// std::chrono::steady_clock): always without HA; with it, while the lease allows and no
// promotion is under way.
inline bool ha_serving(const node& nd, std::uint64_t now_ns) {
  return nd.ha == nullptr || (nd.ha->serving(ha::time_point(std::chrono::nanoseconds(now_ns))) &&
                              !nd.repl.promoting.load(std::memory_order_acquire));
}

// The 503's detail while not serving: "not the leader; the leader is node b at
// http://...", or "... no leader ..." while none is known. Valid until this core's next
// call.
std::string_view not_leader_detail(const node& nd);

// GET /health: 200 while the process serves requests; with HA, its role in the body.
answer health_answer(const node& nd);
// GET /ready: 200 once listening and, with HA, while this node serves; else 503.
answer ready_answer(const node& nd);
// hf3fs_metad_ha_* (with HA only): role, serving, epoch.
void render_ha_metrics(std::string& out, const node& nd);

}  // namespace metad::pipeline
