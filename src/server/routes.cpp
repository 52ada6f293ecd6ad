// The route table's start functions: decode on the home core, then start the endpoint
// coroutine (endpoints.cpp, lifecycle.cpp) or answer at once.
#include "server/routes.hpp"

#include "server/endpoints.hpp"
#include "server/exchange.hpp"
#include "server/lifecycle.hpp"

namespace server {

void start_initialize(exchange& x, const http::request& request, const http::route& route) {
  api::initialize_cmd& cmd = x.work().init;
  if (!x.decoded(x.home().decoder.decode_initialize(route.rank_text, request.body,
                                                    x.shared().cfg.pages_per_rank_max, cmd)))
    return;
  if (cmd.kind == api::init_kind::scheduler) return x.answer(http::canned::scheduler_initialized);
  if (cmd.kind == api::init_kind::invalid_parameters)
    return x.answer(http::canned::invalid_initialization);
  run_initialize(x);
}

void start_allocate(exchange& x, const http::request& request, const http::route&) {
  if (x.decoded(x.home().decoder.decode_allocate(request.body, x.work().allocate))) run_allocate(x);
}

void start_confirm(exchange& x, const http::request& request, const http::route&) {
  if (x.decoded(x.home().decoder.decode_confirm(request.body, x.work().confirm))) run_confirm(x);
}

void start_exists(exchange& x, const http::request& request, const http::route&) {
  if (x.decoded(x.home().decoder.decode_exists(request.body, x.work().exists)))
    run_lookup(x, false);
}

void start_locations(exchange& x, const http::request& request, const http::route&) {
  if (x.decoded(x.home().decoder.decode_locations(request.body, x.work().locations)))
    run_lookup(x, true);
}

void start_clear(exchange& x, const http::request&, const http::route&) { run_clear(x); }

void start_rank_info(exchange& x, const http::request&, const http::route& route) {
  if (!api::parse_rank(route.rank_text, x.work().init.rank))
    return x.answer(http::canned::invalid_rank_in_path);
  run_rank_info(x);
}

void start_health(exchange& x, const http::request&, const http::route&) {
  x.answer(http::canned::health_ok);
}

void start_ready(exchange& x, const http::request&, const http::route&) {
  const bool stopping = x.shared().stopping.load(std::memory_order_relaxed);
  x.answer(stopping ? http::canned::not_ready : http::canned::ready_ok);
}

void start_metrics(exchange& x, const http::request&, const http::route&) { run_metrics(x); }

void start_delete(exchange& x, const http::request& request, const http::route&) {
  if (x.decoded(x.home().decoder.decode_delete(request.body, x.work().remove))) run_delete(x);
}

void start_stats(exchange& x, const http::request&, const http::route&) { run_stats(x); }

}  // namespace server
