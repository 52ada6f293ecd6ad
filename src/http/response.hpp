// Writes HTTP/1.1 responses into a connection's output buffer. Fixed answers are
// precomputed bytes built once at start-up; dynamic JSON answers get a header in front.
#pragma once

#include <string>
#include <string_view>

#include "http/parser.hpp"

namespace metad::http {

// Answers whose bytes never change. Each exists in a keep-alive and a closing variant
// (the closing one carries `connection: close`).
enum class canned : std::uint8_t {
  no_content,              // 204, no body, no content-length
  continue_100,            // "HTTP/1.1 100 Continue\r\n\r\n" (same in both variants)
  scheduler_initialized,   // 200 {"message":"Scheduler role does not require initialization"}
  invalid_initialization,  // 400 {"detail":"Invalid initialization parameters"}
  invalid_rank_in_path,    // 400 {"detail":"Invalid rank in path"}
  not_found,               // 404 {"detail":"Not Found"}
  method_not_allowed,      // 405 {"detail":"Method Not Allowed"} + allow: POST
  method_not_allowed_get,  // 405 {"detail":"Method Not Allowed"} + allow: GET, HEAD
  health_ok,               // 200 {"status":"ok"}
  ready_ok,                // 200 {"status":"ready"}
  not_ready,               // 503 {"detail":"Not ready: recovering or stopping"}
  unauthorized,            // 401 {"detail":"Missing or invalid bearer token"}, www-authenticate
  count_
};

// The bytes for a fixed answer.
std::string_view canned_bytes(canned what, bool keep_alive);

// The fixed answer for a parse error (400/413/431/501/505 with a JSON detail); these
// always close the connection.
std::string_view parse_error_bytes(parse_error err);
// The status code of a response's bytes ("HTTP/1.1 NNN ..."), 0 if none.
int status_of(std::string_view answer);

// Appends "HTTP/1.1 <status> <reason>", content-type: application/json, content-length
// and (if !keep_alive) connection: close, then the body.
void append_json(std::string& out, int status, std::string_view json_body, bool keep_alive);
// The same with another content type (e.g. Prometheus text).
void append_body(std::string& out, int status, std::string_view content_type, std::string_view body,
                 bool keep_alive);

std::string_view reason_phrase(int status);

}  // namespace metad::http
