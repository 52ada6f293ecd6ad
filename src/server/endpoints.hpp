// One coroutine per endpoint that touches state. Each starts on the connection's home
// core with its command decoded into exchange::work(), hops to the owning cores, comes
// back home, writes the answer and calls exchange::complete().
#pragma once

#include <functional>

#include "server/exchange.hpp"
#include "server/request_task.hpp"

namespace server {

request_task run_initialize(exchange& x);
request_task run_allocate(exchange& x);
request_task run_confirm(exchange& x);
// batch_exists (with_rank == false) and get_locations (true) share the directory walk.
request_task run_lookup(exchange& x, bool with_rank);
request_task run_clear(exchange& x);
request_task run_rank_info(exchange& x);
// GET /metrics: gathers every core's counters and ranks, renders Prometheus text.
request_task run_metrics(exchange& x);

// Calls visit(core) on each core's own thread in turn, starting at `home`, then done()
// back on home (read-only walks: metrics, the periodic summary).
request_task visit_cores(cluster& cl, int home, std::function<void(const core_state&)> visit,
                         std::function<void()> done);

}  // namespace server
