// The route table's start functions: decode on the home core, then start the endpoint
// coroutine (endpoints.cpp, lifecycle.cpp) or answer at once.
#include "server/routes.hpp"

#include <algorithm>

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

namespace {

// An SGLang request's operation, rank and tenant; false (and the 400 answered) when the
// rank segment is not an int64.
bool sg_target(exchange& x, const http::route& route, sg_op op) {
  scratch& s = x.work();
  if (!api::parse_rank(route.rank_text, s.sg_rank)) {
    x.answer(http::canned::invalid_rank_in_path);
    return false;
  }
  s.sg = op;
  s.tenant.assign(route.tenant);
  s.sg_error = {};
  return true;
}

// For the operations whose pool is looked up before their fields are read: a decoding
// error is answered at once only when the namespace itself could not be read; otherwise
// it waits for the pool (a missing pool's 404 comes first).
void sg_start_on_pool(exchange& x, api::error err, bool ns_valid) {
  if (err && !ns_valid) {
    x.decoded(err);
    return;
  }
  x.work().sg_error = std::move(err);
  run_sglang(x);
}

}  // namespace

void start_sg_initialize(exchange& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::initialize)) return;
  const std::int64_t pages_max =
      std::min<std::int64_t>(x.shared().cfg.pages_per_rank_max, shard::sglang_pool::pages_max);
  if (x.decoded(x.home().sg_decoder.decode_initialize(request.body, pages_max, x.work().sg_init)))
    run_sglang(x);
}

void start_sg_exists(exchange& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::exists)) return;
  if (x.decoded(x.home().sg_decoder.decode_exists(request.body, x.work().sg_keys))) run_sglang(x);
}

void start_sg_reserve(exchange& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::reserve)) return;
  api::sg_keys_cmd& cmd = x.work().sg_keys;
  api::error err = x.home().sg_decoder.decode_reserve(request.body, cmd);
  sg_start_on_pool(x, std::move(err), cmd.ns_valid);
}

void start_sg_confirm(exchange& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::confirm)) return;
  api::sg_confirm_cmd& cmd = x.work().sg_confirm;
  api::error err = x.home().sg_decoder.decode_confirm(request.body, cmd);
  sg_start_on_pool(x, std::move(err), cmd.ns_valid);
}

void start_sg_delete_keys(exchange& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::delete_keys)) return;
  api::sg_keys_cmd& cmd = x.work().sg_keys;
  api::error err = x.home().sg_decoder.decode_delete_keys(request.body, cmd);
  sg_start_on_pool(x, std::move(err), cmd.ns_valid);
}

void start_sg_clear(exchange& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::clear)) return;
  api::sg_clear_cmd& cmd = x.work().sg_clear;
  api::error err = x.home().sg_decoder.decode_clear(request.body, cmd);
  sg_start_on_pool(x, std::move(err), cmd.ns_valid);
}

void start_sg_get_page_indices(exchange& x, const http::request& request,
                               const http::route& route) {
  if (!sg_target(x, route, sg_op::get_page_indices)) return;
  api::sg_keys_cmd& cmd = x.work().sg_keys;
  api::error err = x.home().sg_decoder.decode_get_page_indices(request.body, cmd);
  sg_start_on_pool(x, std::move(err), cmd.ns_valid);
}

}  // namespace server
