#include "http/response.hpp"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace metad::http {
namespace {

std::string json_bytes(std::string_view status_line, std::string_view body, bool keep_alive,
                       std::string_view extra = {}) {
  return std::string(status_line) +
         "\r\ncontent-type: application/json\r\ncontent-length: " + std::to_string(body.size()) +
         "\r\n" + std::string(extra) + (keep_alive ? "" : "connection: close\r\n") + "\r\n" +
         std::string(body);
}

TEST(Response, NoContentHasNoBodyAndNoLength) {
  EXPECT_EQ(canned_bytes(canned::no_content, true), "HTTP/1.1 204 No Content\r\n\r\n");
  EXPECT_EQ(canned_bytes(canned::no_content, false),
            "HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n");
}

TEST(Response, ContinueIsTheSameInBothVariants) {
  EXPECT_EQ(canned_bytes(canned::continue_100, true), "HTTP/1.1 100 Continue\r\n\r\n");
  EXPECT_EQ(canned_bytes(canned::continue_100, false), "HTTP/1.1 100 Continue\r\n\r\n");
}

TEST(Response, CannedJsonAnswersAreExact) {
  struct row {
    canned what;
    std::string_view status_line;
    std::string_view body;
    std::string_view extra = {};
  };
  const row rows[] = {
      {canned::scheduler_initialized, "HTTP/1.1 200 OK",
       R"({"message":"Scheduler role does not require initialization"})"},
      {canned::invalid_initialization, "HTTP/1.1 400 Bad Request",
       R"({"detail":"Invalid initialization parameters"})"},
      {canned::invalid_rank_in_path, "HTTP/1.1 400 Bad Request",
       R"({"detail":"Invalid rank in path"})"},
      {canned::not_found, "HTTP/1.1 404 Not Found", R"({"detail":"Not Found"})"},
      {canned::method_not_allowed, "HTTP/1.1 405 Method Not Allowed",
       R"({"detail":"Method Not Allowed"})", "allow: POST\r\n"},
      {canned::method_not_allowed_get, "HTTP/1.1 405 Method Not Allowed",
       R"({"detail":"Method Not Allowed"})", "allow: GET, HEAD\r\n"},
  };
  for (const row& r : rows) {
    for (bool keep_alive : {true, false}) {
      EXPECT_EQ(canned_bytes(r.what, keep_alive),
                json_bytes(r.status_line, r.body, keep_alive, r.extra))
          << r.body << " keep_alive " << keep_alive;
    }
  }
}

TEST(Response, MethodNotAllowedBytesSpelledOut) {
  EXPECT_EQ(canned_bytes(canned::method_not_allowed, true),
            "HTTP/1.1 405 Method Not Allowed\r\ncontent-type: application/json\r\n"
            "content-length: 31\r\nallow: POST\r\n\r\n{\"detail\":\"Method Not Allowed\"}");
  EXPECT_EQ(canned_bytes(canned::not_found, false),
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
            "content-length: 22\r\nconnection: close\r\n\r\n{\"detail\":\"Not Found\"}");
}

TEST(Response, CannedBytesAreBuiltOnce) {
  EXPECT_EQ(canned_bytes(canned::not_found, true).data(),
            canned_bytes(canned::not_found, true).data());
  EXPECT_TRUE(canned_bytes(canned::count_, true).empty());
}

TEST(Response, ParseErrorsCloseWithAJsonDetail) {
  struct row {
    parse_error error;
    std::string_view status_line;
    std::string_view body;
  };
  const row rows[] = {
      {parse_error::bad_request_line, "HTTP/1.1 400 Bad Request",
       R"({"detail":"Malformed request line"})"},
      {parse_error::bad_header, "HTTP/1.1 400 Bad Request", R"({"detail":"Malformed header"})"},
      {parse_error::bad_version, "HTTP/1.1 505 HTTP Version Not Supported",
       R"({"detail":"HTTP version not supported"})"},
      {parse_error::bad_content_length, "HTTP/1.1 400 Bad Request",
       R"({"detail":"Invalid Content-Length"})"},
      {parse_error::length_and_chunked, "HTTP/1.1 400 Bad Request",
       R"({"detail":"Both Content-Length and Transfer-Encoding"})"},
      {parse_error::bad_chunk, "HTTP/1.1 400 Bad Request",
       R"({"detail":"Malformed chunked body"})"},
      {parse_error::unknown_coding, "HTTP/1.1 501 Not Implemented",
       R"({"detail":"Unsupported Transfer-Encoding"})"},
      {parse_error::headers_too_large, "HTTP/1.1 431 Request Header Fields Too Large",
       R"({"detail":"Request headers too large"})"},
      {parse_error::body_too_large, "HTTP/1.1 413 Content Too Large",
       R"({"detail":"Request body too large"})"},
  };
  for (const row& r : rows) {
    EXPECT_EQ(parse_error_bytes(r.error), json_bytes(r.status_line, r.body, false)) << r.body;
  }
  EXPECT_TRUE(parse_error_bytes(parse_error::none).empty());
}

TEST(Response, AppendJsonWritesHeadAndBody) {
  std::string out = "previous";
  append_json(out, 200, R"({"exists":[true,false]})", true);
  EXPECT_EQ(out,
            "previousHTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            "content-length: 23\r\n\r\n{\"exists\":[true,false]}");
}

TEST(Response, AppendJsonClosingVariant) {
  std::string out;
  append_json(out, 409, R"({"detail":"Rank 1 already initialized with 8 pages"})", false);
  EXPECT_EQ(out,
            "HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\n"
            "content-length: 52\r\nconnection: close\r\n\r\n"
            "{\"detail\":\"Rank 1 already initialized with 8 pages\"}");
}

TEST(Response, AppendJsonEmptyAndLargeBodies) {
  std::string out;
  append_json(out, 404, "", true);
  EXPECT_EQ(out,
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
            "content-length: 0\r\n\r\n");
  out.clear();
  const std::string big(1234567, 'x');
  append_json(out, 200, big, true);
  EXPECT_TRUE(
      out.starts_with("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                      "content-length: 1234567\r\n\r\nxxx"));
  EXPECT_EQ(out.size(), big.size() + 76);
}

TEST(Response, ReasonPhrases) {
  const std::pair<int, std::string_view> rows[] = {
      {100, "Continue"},
      {200, "OK"},
      {204, "No Content"},
      {400, "Bad Request"},
      {401, "Unauthorized"},
      {403, "Forbidden"},
      {404, "Not Found"},
      {405, "Method Not Allowed"},
      {409, "Conflict"},
      {413, "Content Too Large"},
      {431, "Request Header Fields Too Large"},
      {500, "Internal Server Error"},
      {501, "Not Implemented"},
      {503, "Service Unavailable"},
      {505, "HTTP Version Not Supported"},
  };
  for (const auto& [status, phrase] : rows) EXPECT_EQ(reason_phrase(status), phrase) << status;
  EXPECT_TRUE(reason_phrase(299).empty());
}

}  // namespace
}  // namespace metad::http
