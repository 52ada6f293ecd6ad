#include "http/response.hpp"

#include <fmt/format.h>

#include <array>
#include <cstddef>

namespace metad::http {
namespace {

constexpr std::size_t canned_count = static_cast<std::size_t>(canned::count_);
constexpr std::size_t parse_error_count = static_cast<std::size_t>(parse_error::body_too_large) + 1;

void append_status_line(std::string& out, int status) {
  out += "HTTP/1.1 ";
  const fmt::format_int code(status);
  out.append(code.data(), code.size());
  out += ' ';
  out += reason_phrase(status);
  out += "\r\n";
}

// A JSON answer with one optional extra header line (e.g. "allow: POST\r\n").
std::string json_answer(int status, std::string_view body, bool keep_alive,
                        std::string_view extra_header = {}) {
  std::string out;
  append_status_line(out, status);
  out += "content-type: application/json\r\ncontent-length: ";
  out += fmt::format_int(body.size()).str();
  out += "\r\n";
  out += extra_header;
  if (!keep_alive) out += "connection: close\r\n";
  out += "\r\n";
  out += body;
  return out;
}

std::string canned_answer(canned what, bool keep_alive) {
  switch (what) {
    case canned::no_content:
      return keep_alive ? "HTTP/1.1 204 No Content\r\n\r\n"
                        : "HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n";
    case canned::continue_100:
      return "HTTP/1.1 100 Continue\r\n\r\n";
    case canned::scheduler_initialized:
      return json_answer(200, R"({"message":"Scheduler role does not require initialization"})",
                         keep_alive);
    case canned::invalid_initialization:
      return json_answer(400, R"({"detail":"Invalid initialization parameters"})", keep_alive);
    case canned::invalid_rank_in_path:
      return json_answer(400, R"({"detail":"Invalid rank in path"})", keep_alive);
    case canned::not_found:
      return json_answer(404, R"({"detail":"Not Found"})", keep_alive);
    case canned::method_not_allowed:
      return json_answer(405, R"({"detail":"Method Not Allowed"})", keep_alive, "allow: POST\r\n");
    case canned::method_not_allowed_get:
      return json_answer(405, R"({"detail":"Method Not Allowed"})", keep_alive,
                         "allow: GET, HEAD\r\n");
    case canned::health_ok:
      return json_answer(200, R"({"status":"ok"})", keep_alive);
    case canned::ready_ok:
      return json_answer(200, R"({"status":"ready"})", keep_alive);
    case canned::not_ready:
      return json_answer(503, R"({"detail":"Not ready: recovering or stopping"})", keep_alive);
    case canned::unauthorized:
      return json_answer(401, R"({"detail":"Missing or invalid bearer token"})", keep_alive,
                         "www-authenticate: Bearer\r\n");
    case canned::count_:
      break;
  }
  return {};
}

// The one table from parse errors to answers; they all close the connection.
std::string parse_error_answer(parse_error err) {
  switch (err) {
    case parse_error::none:
      break;
    case parse_error::bad_request_line:
      return json_answer(400, R"({"detail":"Malformed request line"})", false);
    case parse_error::bad_header:
      return json_answer(400, R"({"detail":"Malformed header"})", false);
    case parse_error::bad_version:
      return json_answer(505, R"({"detail":"HTTP version not supported"})", false);
    case parse_error::bad_content_length:
      return json_answer(400, R"({"detail":"Invalid Content-Length"})", false);
    case parse_error::length_and_chunked:
      return json_answer(400, R"({"detail":"Both Content-Length and Transfer-Encoding"})", false);
    case parse_error::bad_chunk:
      return json_answer(400, R"({"detail":"Malformed chunked body"})", false);
    case parse_error::unknown_coding:
      return json_answer(501, R"({"detail":"Unsupported Transfer-Encoding"})", false);
    case parse_error::headers_too_large:
      return json_answer(431, R"({"detail":"Request headers too large"})", false);
    case parse_error::body_too_large:
      return json_answer(413, R"({"detail":"Request body too large"})", false);
  }
  return {};
}

struct answer_table {
  // [what][keep_alive]
  std::array<std::array<std::string, 2>, canned_count> canned_bytes;
  std::array<std::string, parse_error_count> parse_errors;

  answer_table() {
    for (std::size_t i = 0; i < canned_count; ++i) {
      canned_bytes[i][0] = canned_answer(static_cast<canned>(i), false);
      canned_bytes[i][1] = canned_answer(static_cast<canned>(i), true);
    }
    for (std::size_t i = 0; i < parse_error_count; ++i) {
      parse_errors[i] = parse_error_answer(static_cast<parse_error>(i));
    }
  }
};

const answer_table& answers() {
  static const answer_table table;
  return table;
}

}  // namespace

std::string_view canned_bytes(canned what, bool keep_alive) {
  const auto i = static_cast<std::size_t>(what);
  if (i >= canned_count) return {};
  return answers().canned_bytes[i][keep_alive ? 1 : 0];
}

std::string_view parse_error_bytes(parse_error err) {
  const auto i = static_cast<std::size_t>(err);
  if (i >= parse_error_count) return {};
  return answers().parse_errors[i];
}

void append_json(std::string& out, int status, std::string_view json_body, bool keep_alive) {
  append_body(out, status, "application/json", json_body, keep_alive);
}

void append_body(std::string& out, int status, std::string_view content_type, std::string_view body,
                 bool keep_alive) {
  append_status_line(out, status);
  out += "content-type: ";
  out += content_type;
  out += "\r\ncontent-length: ";
  const fmt::format_int length(body.size());
  out.append(length.data(), length.size());
  out +=
      keep_alive ? std::string_view("\r\n\r\n") : std::string_view("\r\nconnection: close\r\n\r\n");
  out += body;
}

int status_of(std::string_view answer) {
  if (answer.size() < 12 || !answer.starts_with("HTTP/1.1 ")) return 0;
  return (answer[9] - '0') * 100 + (answer[10] - '0') * 10 + (answer[11] - '0');
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 417:
      return "Expectation Failed";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    case 507:
      return "Insufficient Storage";
  }
  // The reason phrase is optional (RFC 9112 4): an unknown status gets none.
  return {};
}

}  // namespace metad::http
