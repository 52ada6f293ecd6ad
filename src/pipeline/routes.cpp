// The route table's start functions: decode on the home core, then answer at once or
// start the endpoint coroutine (endpoints.cpp, removal.cpp), which answers later.
#include "pipeline/routes.hpp"

#include <algorithm>

#include "pipeline/connection.hpp"
#include "pipeline/endpoints.hpp"
#include "pipeline/ha_gate.hpp"
#include "pipeline/removal.hpp"

namespace metad::pipeline {

answer start_initialize(connection& x, const http::request& request, const http::route& route) {
  api::initialize_cmd& cmd = x.work().init;
  if (api::error err = x.home().decoder.decode_initialize(route.rank_text, request.body,
                                                          x.shared().cfg.pages_per_rank_max, cmd))
    return x.refused(std::move(err));
  if (cmd.kind == api::init_kind::scheduler)
    return answer::canned(http::canned::scheduler_initialized);
  if (cmd.kind == api::init_kind::invalid_parameters)
    return answer::canned(http::canned::invalid_initialization);
  return run_initialize(x);
}

answer start_allocate(connection& x, const http::request& request, const http::route&) {
  if (api::error err = x.home().decoder.decode_allocate(request.body, x.work().allocate))
    return x.refused(std::move(err));
  return run_allocate(x);
}

answer start_confirm(connection& x, const http::request& request, const http::route&) {
  if (api::error err = x.home().decoder.decode_confirm(request.body, x.work().confirm))
    return x.refused(std::move(err));
  return run_confirm(x);
}

answer start_exists(connection& x, const http::request& request, const http::route&) {
  if (api::error err = x.home().decoder.decode_exists(request.body, x.work().exists))
    return x.refused(std::move(err));
  return run_lookup(x, false);
}

answer start_locations(connection& x, const http::request& request, const http::route&) {
  if (api::error err = x.home().decoder.decode_locations(request.body, x.work().locations))
    return x.refused(std::move(err));
  return run_lookup(x, true);
}

answer start_clear(connection& x, const http::request&, const http::route&) { return run_clear(x); }

answer start_rank_info(connection& x, const http::request&, const http::route& route) {
  if (!api::parse_rank(route.rank_text, x.work().init.rank))
    return answer::canned(http::canned::invalid_rank_in_path);
  return run_rank_info(x);
}

answer start_health(connection& x, const http::request&, const http::route&) {
  return health_answer(x.shared());
}

answer start_ready(connection& x, const http::request&, const http::route&) {
  return ready_answer(x.shared());
}

answer start_metrics(connection& x, const http::request&, const http::route&) {
  return run_metrics(x);
}

answer start_delete(connection& x, const http::request& request, const http::route&) {
  if (api::error err = x.home().decoder.decode_delete(request.body, x.work().remove))
    return x.refused(std::move(err));
  return run_delete(x);
}

answer start_stats(connection& x, const http::request&, const http::route&) { return run_stats(x); }

answer start_inspect(connection& x, const http::request& request, const http::route&) {
  if (api::error err = x.home().decoder.decode_inspect(request.body, x.work().inspect))
    return x.refused(std::move(err));
  return run_inspect(x);
}

answer start_status_page(connection&, const http::request&, const http::route&) {
  return answer::html(kStatusPage);
}

answer start_status(connection& x, const http::request&, const http::route&) {
  return run_status(x);
}

namespace {

// An SGLang request's operation, rank and tenant; false when the rank segment is not an
// int64.
bool sg_target(connection& x, const http::route& route, sg_op op) {
  scratch& s = x.work();
  if (!api::parse_rank(route.rank_text, s.sg_rank)) return false;
  s.sg = op;
  s.tenant.assign(route.tenant);
  s.sg_error = {};
  return true;
}

answer invalid_rank() { return answer::canned(http::canned::invalid_rank_in_path); }

// For the operations whose pool is looked up before their fields are read: a decoding
// error is answered at once only when the namespace itself could not be read; otherwise
// it waits for the pool (a missing pool's 404 comes first).
answer sg_start_on_pool(connection& x, api::error err, bool ns_valid) {
  if (err && !ns_valid) return x.refused(std::move(err));
  x.work().sg_error = std::move(err);
  return run_sglang(x);
}

}  // namespace

answer start_sg_initialize(connection& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::initialize)) return invalid_rank();
  const std::int64_t pages_max =
      std::min<std::int64_t>(x.shared().cfg.pages_per_rank_max, shard::sglang_pool::pages_max);
  if (api::error err =
          x.home().sg_decoder.decode_initialize(request.body, pages_max, x.work().sg_init))
    return x.refused(std::move(err));
  return run_sglang(x);
}

answer start_sg_exists(connection& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::exists)) return invalid_rank();
  if (api::error err = x.home().sg_decoder.decode_exists(request.body, x.work().sg_keys))
    return x.refused(std::move(err));
  return run_sglang(x);
}

answer start_sg_reserve(connection& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::reserve)) return invalid_rank();
  api::sg_keys_cmd& cmd = x.work().sg_keys;
  api::error err = x.home().sg_decoder.decode_reserve(request.body, cmd);
  return sg_start_on_pool(x, std::move(err), cmd.ns_valid);
}

answer start_sg_confirm(connection& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::confirm)) return invalid_rank();
  api::sg_confirm_cmd& cmd = x.work().sg_confirm;
  api::error err = x.home().sg_decoder.decode_confirm(request.body, cmd);
  return sg_start_on_pool(x, std::move(err), cmd.ns_valid);
}

answer start_sg_delete_keys(connection& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::delete_keys)) return invalid_rank();
  api::sg_keys_cmd& cmd = x.work().sg_keys;
  api::error err = x.home().sg_decoder.decode_delete_keys(request.body, cmd);
  return sg_start_on_pool(x, std::move(err), cmd.ns_valid);
}

answer start_sg_clear(connection& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::clear)) return invalid_rank();
  api::sg_clear_cmd& cmd = x.work().sg_clear;
  api::error err = x.home().sg_decoder.decode_clear(request.body, cmd);
  return sg_start_on_pool(x, std::move(err), cmd.ns_valid);
}

answer start_sg_get_page_indices(connection& x, const http::request& request,
                                 const http::route& route) {
  if (!sg_target(x, route, sg_op::get_page_indices)) return invalid_rank();
  api::sg_keys_cmd& cmd = x.work().sg_keys;
  api::error err = x.home().sg_decoder.decode_get_page_indices(request.body, cmd);
  return sg_start_on_pool(x, std::move(err), cmd.ns_valid);
}

answer start_sg_inspect(connection& x, const http::request& request, const http::route& route) {
  if (!sg_target(x, route, sg_op::inspect)) return invalid_rank();
  api::sg_keys_cmd& cmd = x.work().sg_keys;
  api::error err = x.home().sg_decoder.decode_inspect(request.body, cmd);
  return sg_start_on_pool(x, std::move(err), cmd.ns_valid);
}

}  // namespace metad::pipeline
