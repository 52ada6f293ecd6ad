// The route table: one row per endpoint, the only place that says which endpoints exist.
// A row gives the methods and path pattern (matched by http::match), the label of its
// metrics and access-log lines, who may call it, and the function that decodes the
// request and starts its work. Adding an endpoint is a row here, its start function in
// routes.cpp, and what that calls (an api decoder, an endpoint coroutine).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "http/parser.hpp"
#include "http/router.hpp"
#include "pipeline/answer.hpp"

namespace metad::pipeline {

class connection;

// Who may call an endpoint. Without --tenants-file, `monitor`, `token` and `sg_token` are
// one class (--auth-token-file's token, when set) and `sg_admin` is `admin`. With it
// (docs/operations.md, "Tenants"), each request's token names its tenant:
// - `token`, `admin` (vLLM's API): any tenant's token, on that tenant's own vLLM state
//   (the `vllm` tenant's is the unnamed one);
// - `sg_token`, `sg_admin` (SGLang's): any tenant's token, on that tenant's pools;
// - `admin`, `sg_admin` with --admin-token-file: that token instead, as without tenants;
// - `monitor` (what shows every tenant): --auth-token-file's or --admin-token-file's token;
// - `stats` (GET /stats): as `monitor`, on the unnamed vLLM state or X-Metad-Tenant's, or
//   a tenant's token, on its own vLLM state.
enum class access : std::uint8_t {
  open,      // anyone: probes carry no secrets
  monitor,   // the operator's reads: --auth-token-file's token, when set
  token,     // vLLM's API: --auth-token-file's token, when set
  admin,     // vLLM's destructive calls: --admin-token-file's token when set, else as `token`
  sg_token,  // SGLang's API: as `token`
  sg_admin,  // SGLang's clear: as `admin`
  stats,     // GET /stats: as `monitor` (with --tenants-file, a tenant's token too)
};

// Which nodes answer an endpoint under high availability (--ha-etcd; without it, all do).
enum class serves : std::uint8_t {
  leader,    // the API: other nodes answer 503 naming the leader, and change nothing
  any_node,  // probes and metrics: every node answers, saying its role
};

// Decodes the request into connection::work() and answers it, or starts the endpoint
// coroutine that will (and returns it: answer::later()).
using start_fn = answer (*)(connection& x, const http::request& request, const http::route& route);

struct endpoint_row {
  http::path_pattern pattern;
  std::string_view label;  // hf3fs_metad_requests_total{endpoint="..."} and the access log
  access auth;
  start_fn start;
  serves on = serves::leader;
};

// The start functions (routes.cpp).
answer start_initialize(connection& x, const http::request& request, const http::route& route);
answer start_allocate(connection& x, const http::request& request, const http::route& route);
answer start_confirm(connection& x, const http::request& request, const http::route& route);
answer start_exists(connection& x, const http::request& request, const http::route& route);
answer start_locations(connection& x, const http::request& request, const http::route& route);
answer start_clear(connection& x, const http::request& request, const http::route& route);
answer start_rank_info(connection& x, const http::request& request, const http::route& route);
answer start_health(connection& x, const http::request& request, const http::route& route);
answer start_ready(connection& x, const http::request& request, const http::route& route);
answer start_metrics(connection& x, const http::request& request, const http::route& route);
answer start_delete(connection& x, const http::request& request, const http::route& route);
answer start_stats(connection& x, const http::request& request, const http::route& route);
answer start_inspect(connection& x, const http::request& request, const http::route& route);
answer start_status_page(connection& x, const http::request& request, const http::route& route);
answer start_status(connection& x, const http::request& request, const http::route& route);
// SGLang's HiCache API (docs/sglang-api.md): the rank is the path's, the tenant the
// segment before it (none: the default tenant).
answer start_sg_initialize(connection& x, const http::request& request, const http::route& route);
answer start_sg_exists(connection& x, const http::request& request, const http::route& route);
answer start_sg_reserve(connection& x, const http::request& request, const http::route& route);
answer start_sg_confirm(connection& x, const http::request& request, const http::route& route);
answer start_sg_delete_keys(connection& x, const http::request& request, const http::route& route);
answer start_sg_clear(connection& x, const http::request& request, const http::route& route);
answer start_sg_get_page_indices(connection& x, const http::request& request,
                                 const http::route& route);
answer start_sg_inspect(connection& x, const http::request& request, const http::route& route);

// "GET" rows answer HEAD too. The order is that of the metrics' lines. Paths of
// different rows do not overlap (a request matches the first row whose path and method
// fit).
// clang-format off
inline constexpr endpoint_row kEndpoints[] = {
    {"POST /rank/{rank}/initialize", "initialize",     access::token, start_initialize},
    {"POST /keys/batch_allocate",    "batch_allocate", access::token, start_allocate},
    {"POST /keys/confirm_write",     "confirm_write",  access::token, start_confirm},
    {"POST /keys/batch_exists",      "batch_exists",   access::token, start_exists},
    {"POST /keys/get_locations",     "get_locations",  access::token, start_locations},
    {"POST /clear",                  "clear",          access::admin, start_clear},
    {"GET /rank/{rank}",             "rank_info",      access::token, start_rank_info},
    {"GET /health",                  "health",         access::open,  start_health,  serves::any_node},
    {"GET /ready",                   "ready",          access::monitor, start_ready,   serves::any_node},
    {"GET /metrics",                 "metrics",        access::monitor, start_metrics, serves::any_node},
    {"POST /keys/delete",            "delete",         access::admin, start_delete},
    {"GET /stats",                   "stats",          access::stats,   start_stats},
    {"POST /keys/inspect",           "inspect",        access::token, start_inspect},
    // The status page carries no data (open); it polls /status.json with the token.
    {"GET /",                        "status_page",    access::open,  start_status_page, serves::any_node},
    {"GET /status.json",             "status",         access::monitor, start_status,      serves::any_node},
    // SGLang, default tenant: the first segment is an integer (vLLM's paths start with
    // a word), so the two APIs never claim one path.
    {"POST /{int}/initialize",                        "sglang_initialize",       access::sg_token, start_sg_initialize},
    {"POST /{int}/exists",                            "sglang_exists",           access::sg_token, start_sg_exists},
    {"POST /{int}/reserve_and_allocate_page_indices", "sglang_reserve",          access::sg_token, start_sg_reserve},
    {"POST /{int}/confirm_write",                     "sglang_confirm_write",    access::sg_token, start_sg_confirm},
    {"POST /{int}/delete_keys",                       "sglang_delete_keys",      access::sg_token, start_sg_delete_keys},
    {"POST /{int}/clear",                             "sglang_clear",            access::sg_admin, start_sg_clear},
    {"POST /{int}/get_page_indices",                  "sglang_get_page_indices", access::sg_token, start_sg_get_page_indices},
    {"POST /{int}/inspect",                           "sglang_inspect",          access::sg_token, start_sg_inspect},
    // SGLang, a named tenant: its own pools. Any rank segment matches, so that a
    // non-integer one is a 400 rather than a 404.
    {"POST /{tenant}/{rank}/initialize",                        "sglang_tenant_initialize",       access::sg_token, start_sg_initialize},
    {"POST /{tenant}/{rank}/exists",                            "sglang_tenant_exists",           access::sg_token, start_sg_exists},
    {"POST /{tenant}/{rank}/reserve_and_allocate_page_indices", "sglang_tenant_reserve",          access::sg_token, start_sg_reserve},
    {"POST /{tenant}/{rank}/confirm_write",                     "sglang_tenant_confirm_write",    access::sg_token, start_sg_confirm},
    {"POST /{tenant}/{rank}/delete_keys",                       "sglang_tenant_delete_keys",      access::sg_token, start_sg_delete_keys},
    {"POST /{tenant}/{rank}/clear",                             "sglang_tenant_clear",            access::sg_admin, start_sg_clear},
    {"POST /{tenant}/{rank}/get_page_indices",                  "sglang_tenant_get_page_indices", access::sg_token, start_sg_get_page_indices},
    {"POST /{tenant}/{rank}/inspect",                           "sglang_tenant_inspect",          access::sg_token, start_sg_inspect},
};
// clang-format on
inline constexpr std::size_t kEndpointCount = std::size(kEndpoints);

// The rows' patterns, for http::match.
inline constexpr auto kPatterns = [] {
  std::array<http::path_pattern, kEndpointCount> patterns{};
  for (std::size_t i = 0; i < kEndpointCount; ++i) patterns[i] = kEndpoints[i].pattern;
  return patterns;
}();

// What a request was, for metrics and the access log: its row's index, or one of the
// labels after the rows for requests no row answers.
using route_label = std::uint8_t;
inline constexpr auto kNotFound = static_cast<route_label>(kEndpointCount);
inline constexpr auto kMethodNotAllowed = static_cast<route_label>(kEndpointCount + 1);
inline constexpr auto kInvalidHttp = static_cast<route_label>(kEndpointCount + 2);  // did not parse
inline constexpr std::size_t kRouteLabels = kEndpointCount + 3;
static_assert(kRouteLabels <= 256);

constexpr std::string_view route_name(route_label route) {
  if (route < kEndpointCount) return kEndpoints[route].label;
  if (route == kNotFound) return "not_found";
  if (route == kMethodNotAllowed) return "method_not_allowed";
  return "invalid_http";
}

}  // namespace metad::pipeline
