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

namespace server {

class exchange;

// Who may call an endpoint.
enum class access : std::uint8_t {
  open,   // anyone: probes carry no secrets
  token,  // --auth-token-file's token, when set
  admin,  // --admin-token-file's token when set, else as `token`
};

// Decodes the request into exchange::work() and starts the endpoint (an endpoint
// coroutine, or an answer at once); every path ends in exchange::complete().
using start_fn = void (*)(exchange& x, const http::request& request, const http::route& route);

struct endpoint_row {
  http::path_pattern pattern;
  std::string_view label;  // hf3fs_metad_requests_total{endpoint="..."} and the access log
  access auth;
  start_fn start;
};

// The start functions (routes.cpp).
void start_initialize(exchange& x, const http::request& request, const http::route& route);
void start_allocate(exchange& x, const http::request& request, const http::route& route);
void start_confirm(exchange& x, const http::request& request, const http::route& route);
void start_exists(exchange& x, const http::request& request, const http::route& route);
void start_locations(exchange& x, const http::request& request, const http::route& route);
void start_clear(exchange& x, const http::request& request, const http::route& route);
void start_rank_info(exchange& x, const http::request& request, const http::route& route);
void start_health(exchange& x, const http::request& request, const http::route& route);
void start_ready(exchange& x, const http::request& request, const http::route& route);
void start_metrics(exchange& x, const http::request& request, const http::route& route);
void start_delete(exchange& x, const http::request& request, const http::route& route);
void start_stats(exchange& x, const http::request& request, const http::route& route);

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
    {"GET /health",                  "health",         access::open,  start_health},
    {"GET /ready",                   "ready",          access::token, start_ready},
    {"GET /metrics",                 "metrics",        access::token, start_metrics},
    {"POST /keys/delete",            "delete",         access::admin, start_delete},
    {"GET /stats",                   "stats",          access::token, start_stats},
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

}  // namespace server
