#include "ha/http_reader.hpp"

#include <algorithm>
#include <cctype>
#include "ha/parse_int.hpp"

namespace metad::ha {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace

void http_reader::reset() { *this = http_reader{}; }

http_reader::state http_reader::fail(std::string why) {
  error_ = std::move(why);
  state_ = state::error;
  return state_;
}

http_reader::state http_reader::feed(std::string_view bytes) {
  if (state_ == state::error || state_ == state::done) return state_;
  in_.append(bytes);
  if (state_ == state::head) {
    const std::size_t end = in_.find("\r\n\r\n");
    if (end == std::string::npos) {
      return in_.size() > kHeadBytesMax ? fail("response head too long") : state_;
    }
    if (end > kHeadBytesMax) return fail("response head too long");
    if (!parse_head(std::string_view(in_).substr(0, end + 2))) return state_;
    in_.erase(0, end + 4);
    state_ = state::body;
  }
  parse_body();
  return state_;
}

http_reader::state http_reader::feed_eof() {
  if (state_ == state::body && until_close_) {
    state_ = state::done;
    keep_alive_ = false;
    return state_;
  }
  if (state_ != state::done && state_ != state::error) return fail("connection closed early");
  return state_;
}

bool http_reader::parse_head(std::string_view head) {
  std::size_t line_end = head.find("\r\n");
  const std::string_view status_line = head.substr(0, line_end);
  // "HTTP/1.1 200 OK"
  if (status_line.size() < 12 || status_line.substr(0, 5) != "HTTP/" || status_line[8] != ' ') {
    fail("bad status line");
    return false;
  }
  const bool http10 = status_line.substr(5, 3) == "1.0";
  keep_alive_ = !http10;
  const auto code = status_line.substr(9, 3);
  if (std::from_chars(code.data(), code.data() + 3, status_).ec != std::errc{} || status_ < 100 ||
      status_ > 999) {
    fail("bad status code");
    return false;
  }
  bool has_length = false;
  std::size_t pos = line_end + 2;
  while (pos < head.size()) {
    line_end = head.find("\r\n", pos);
    const std::string_view line = head.substr(pos, line_end - pos);
    pos = line_end + 2;
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      fail("bad header line");
      return false;
    }
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = trim(line.substr(colon + 1));
    if (iequals(name, "content-length")) {
      if (!parse_whole(value, remaining_)) {
        fail("bad Content-Length");
        return false;
      }
      has_length = true;
    } else if (iequals(name, "transfer-encoding")) {
      if (!iequals(value, "chunked")) {
        fail("unsupported Transfer-Encoding");
        return false;
      }
      chunked_ = true;
    } else if (iequals(name, "connection")) {
      if (iequals(value, "close")) keep_alive_ = false;
      if (iequals(value, "keep-alive")) keep_alive_ = true;
    }
  }
  if (chunked_) {
    has_length = false;
  } else if (!has_length) {
    // 1xx, 204 and 304 have no body; anything else without a length runs to the close.
    until_close_ = !(status_ < 200 || status_ == 204 || status_ == 304);
    remaining_ = 0;
    keep_alive_ = keep_alive_ && !until_close_;
  }
  return true;
}

void http_reader::parse_body() {
  if (chunked_) {
    while (state_ == state::body && parse_chunks()) {
    }
    return;
  }
  if (until_close_) {
    body_ += in_;
    in_.clear();
    return;
  }
  const std::size_t take = std::min(remaining_, in_.size());
  body_.append(in_, 0, take);
  in_.erase(0, take);
  remaining_ -= take;
  if (remaining_ == 0) state_ = in_.empty() ? state::done : fail("bytes after the body");
}

// One step of the chunked decoding; false when it needs more bytes (or failed).
bool http_reader::parse_chunks() {
  switch (chunk_) {
    case chunk_step::size: {
      const std::size_t end = in_.find("\r\n");
      if (end == std::string::npos) {
        if (in_.size() > kHeadBytesMax) fail("chunk size line too long");
        return false;
      }
      std::string_view line(in_.data(), end);
      line = line.substr(0, line.find(';'));  // chunk extensions are ignored
      line = trim(line);
      if (!parse_whole(line, remaining_, 16)) {
        fail("bad chunk size");
        return false;
      }
      in_.erase(0, end + 2);
      chunk_ = remaining_ == 0 ? chunk_step::trailer : chunk_step::data;
      return true;
    }
    case chunk_step::data: {
      if (in_.empty()) return false;
      const std::size_t take = std::min(remaining_, in_.size());
      body_.append(in_, 0, take);
      in_.erase(0, take);
      remaining_ -= take;
      if (remaining_ == 0) chunk_ = chunk_step::data_end;
      return true;
    }
    case chunk_step::data_end:
      if (in_.size() < 2) return false;
      if (in_.compare(0, 2, "\r\n") != 0) {
        fail("chunk not followed by CRLF");
        return false;
      }
      in_.erase(0, 2);
      chunk_ = chunk_step::size;
      return true;
    case chunk_step::trailer: {
      // Trailer fields (the gateway sends Grpc-Trailer-Content-Type), then an empty line.
      const std::size_t end = in_.find("\r\n");
      if (end == std::string::npos) {
        if (in_.size() > kHeadBytesMax) fail("trailer too long");
        return false;
      }
      in_.erase(0, end + 2);
      if (end == 0) state_ = in_.empty() ? state::done : fail("bytes after the body");
      return true;
    }
  }
  return false;
}

}  // namespace metad::ha
