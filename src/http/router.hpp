// Path and method → endpoint. Pure function, no state.
#pragma once

#include <cstdint>
#include <string_view>

#include "http/parser.hpp"

namespace http {

enum class endpoint : std::uint8_t {
  initialize,      // POST /rank/{rank}/initialize
  batch_allocate,  // POST /keys/batch_allocate
  confirm_write,   // POST /keys/confirm_write
  batch_exists,    // POST /keys/batch_exists
  get_locations,   // POST /keys/get_locations
  clear,           // POST /clear
  rank_info,       // GET  /rank/{rank} (and HEAD, as for every GET endpoint)
  health,          // GET  /health
  ready,           // GET  /ready
  metrics,         // GET  /metrics
  delete_keys,     // POST /keys/delete
  stats,           // GET  /stats
  not_found,
  method_not_allowed,      // POST-only path, wrong method (answer carries allow: POST)
  method_not_allowed_get,  // GET-only path (HEAD too), wrong method (allow: GET, HEAD)
};

struct route {
  endpoint target = endpoint::not_found;
  std::string_view rank_text;  // the {rank} segment, undecoded, for the rank endpoints
};

route match(method verb, std::string_view path);

}  // namespace http
