// One coroutine per endpoint that touches state. Each starts on the connection's home
// core with its command decoded into connection::work(), hops to the owning cores, comes
// back home and co_returns its answer (answer.hpp), which the connection writes.
#pragma once

#include <time.h>

#include <cstdint>
#include <string_view>

#include "pipeline/connection.hpp"
#include "smp/request_task.hpp"

namespace metad::pipeline {

// vLLM's key endpoints (endpoints.cpp).
endpoint_task run_initialize(connection& x);
endpoint_task run_allocate(connection& x);
endpoint_task run_confirm(connection& x);
// batch_exists (with_rank == false) and get_locations (true) share the directory walk.
endpoint_task run_lookup(connection& x, bool with_rank);

// Every core at once (admin_endpoints.cpp): /clear, GET /rank/{rank}, GET /metrics
// (every core's counters and ranks, as Prometheus text), /keys/delete, GET /stats.
endpoint_task run_clear(connection& x);
endpoint_task run_rank_info(connection& x);
endpoint_task run_metrics(connection& x);
endpoint_task run_delete(connection& x);
endpoint_task run_stats(connection& x);
// /metrics' walk, shared with /status.json: begin (home), collect (on each core), end
// (home), into *s.snapshot, s.rank_rows, s.sg_rows and s.sg_sum.
void begin_metrics(node& nd, scratch& s);
void collect_metrics(node& nd, const core_state& core, scratch& s);
void end_metrics(node& nd, scratch& s);

// What the operator looks at (inspect.cpp, status.cpp): POST /keys/inspect (every core's
// ranks, the keys' directory slices), GET /status.json (the status page's summary), and
// the page itself (GET /, status_page.cpp: constant bytes).
endpoint_task run_inspect(connection& x);
endpoint_task run_status(connection& x);
extern const std::string_view kStatusPage;
// The wall clock, in Unix epoch milliseconds (inspect's and the status page's times).
inline std::int64_t unix_ms_now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

// SGLang's seven operations (sglang_endpoints.cpp): scratch::sg says which, with the
// command, tenant and rank decoded; any decoding error in scratch::sg_error is answered
// only if the pool exists (else its 404).
endpoint_task run_sglang(connection& x);
// /stats and /metrics: adds a core's SGLang pools and counters to s.sg_rows and s.sg_sum
// (on that core); then, home, the /stats section ("sglang":{...}) or the metric families.
void collect_sg_pools(const core_state& core, scratch& s);
void append_sg_stats(std::string& out, scratch& s);
void render_sg_metrics(std::string& out, scratch& s);
// On core `core`'s thread, every loop tick: ends the SGLang release quarantines that are
// due (--release-quarantine-ms) and reservations past their deadline (--reservation-ttl),
// each logged. Returns how many pages that freed.
std::size_t expire_sg_due(node& nd, core_state& core);

}  // namespace metad::pipeline
