#include "http/parser.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "metad/assert.hpp"

namespace metad::http {
namespace {

// First allocation of the input buffer, and of the decoded-body buffer.
constexpr std::size_t initial_buffer_bytes = 4 * 1024;
// Growth doubles up to one maximal request plus this much read-ahead.
constexpr std::size_t read_slack_bytes = 64 * 1024;
// After a request, a buffer larger than this is freed rather than kept for the next one:
// an idle connection should not pin the memory of its one big body.
constexpr std::size_t retained_buffer_bytes = 64 * 1024;
// A chunk-size line (hex digits and extensions) longer than this is malformed.
constexpr std::size_t chunk_line_bytes_max = 4 * 1024;
static_assert(initial_buffer_bytes > body_padding_bytes);

// Empty bodies point here, so that they too are followed by readable padding.
alignas(64) constexpr char empty_body[body_padding_bytes] = {};

// RFC 9110 tchar.
constexpr std::array<bool, 256> token_chars = [] {
  std::array<bool, 256> t{};
  for (int c = '0'; c <= '9'; ++c) t[c] = true;
  for (int c = 'a'; c <= 'z'; ++c) t[c] = true;
  for (int c = 'A'; c <= 'Z'; ++c) t[c] = true;
  for (char c : std::string_view("!#$%&'*+-.^_`|~")) t[static_cast<unsigned char>(c)] = true;
  return t;
}();

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!token_chars[static_cast<unsigned char>(c)]) return false;
  }
  return true;
}

// Field values may hold visible characters, SP, HTAB and obs-text; no other controls.
bool is_field_value(std::string_view s) {
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && u != '\t') || u == 0x7f) return false;
  }
  return true;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + ('a' - 'A')) : c; }

// `lowercase` must be lowercase already.
bool iequals(std::string_view s, std::string_view lowercase) {
  if (s.size() != lowercase.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (lower(s[i]) != lowercase[i]) return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

method method_of(std::string_view s) {
  switch (s.size()) {
    case 3:
      if (s == "GET") return method::get;
      if (s == "PUT") return method::put;
      break;
    case 4:
      if (s == "POST") return method::post;
      if (s == "HEAD") return method::head;
      break;
    case 5:
      if (s == "PATCH") return method::patch;
      break;
    case 6:
      if (s == "DELETE") return method::delete_;
      break;
    case 7:
      if (s == "OPTIONS") return method::options;
      break;
  }
  return method::other;
}

// "HTTP/" 1*DIGIT "." 1*DIGIT: well-formed, though maybe not a version we speak.
bool is_http_version(std::string_view v) {
  if (!v.starts_with("HTTP/")) return false;
  v.remove_prefix(5);
  const auto dot = v.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot + 1 == v.size()) return false;
  return std::all_of(v.begin(), v.begin() + dot, is_digit) &&
         std::all_of(v.begin() + dot + 1, v.end(), is_digit);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

const char* find_newline(const char* data, std::size_t from, std::size_t to) {
  if (from >= to) return nullptr;
  return static_cast<const char*>(std::memchr(data + from, '\n', to - from));
}

}  // namespace

parser::parser(limits lim) : limits_(lim) {
  constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();
  METAD_ASSERT(limits_.header_bytes_max > 0);
  // The limits fit the buffer arithmetic.
  METAD_ASSERT(limits_.header_bytes_max < size_max / 4 && limits_.body_bytes_max < size_max / 4);
}

std::span<char> parser::read_space(std::size_t min_bytes) {
  const std::size_t need = min_bytes + body_padding_bytes;
  if (capacity_ - end_ < need) {
    const std::size_t live = live_bytes();
    const std::size_t cap =
        limits_.header_bytes_max + limits_.body_bytes_max + body_padding_bytes + read_slack_bytes;
    const bool pinned = stage_ == stage::ready && !retired_;
    if (!pinned && live + need <= capacity_ && (live <= capacity_ / 2 || capacity_ >= cap)) {
      move_input(buffer_.get());
    } else {
      std::size_t size = std::min(std::max(2 * capacity_, initial_buffer_bytes), cap);
      if (stage_ == stage::body_length) {
        // No more than this request needs: the client may announce a body it never sends.
        size = std::min(size, head_bytes_ + content_length_ + body_padding_bytes);
      }
      size = std::max(size, live + need);
      auto grown = std::make_unique_for_overwrite<char[]>(size);
      move_input(grown.get());
      // A ready request's views point into the old buffer: keep it until consume().
      if (pinned) retired_ = std::move(buffer_);
      buffer_ = std::move(grown);
      capacity_ = size;
    }
  }
  return {buffer_.get() + end_, capacity_ - end_ - body_padding_bytes};
}

std::size_t parser::body_bytes_announced() const {
  if (stage_ == stage::body_length) return content_length_;
  if (stage_ == stage::body_chunked) return decoded_size_ + chunk_left_;
  return 0;
}

void parser::commit(std::size_t bytes_read) {
  METAD_ASSERT(bytes_read <= capacity_ - end_ - body_padding_bytes);  // within read_space
  end_ += bytes_read;
}

std::size_t parser::live_bytes() const {
  const std::size_t dead = stage_ == stage::body_chunked ? chunk_pos_ - head_bytes_ : 0;
  return buffered() - dead;
}

// Moves the unconsumed input to the front of `to` (which may be the current buffer),
// dropping chunked bytes that are already decoded. Relative positions stay valid except
// the chunk positions, which shift down by the dropped amount.
void parser::move_input(char* to) {
  const std::size_t size = buffered();
  if (size == 0) {
    begin_ = end_ = 0;
    return;
  }
  if (stage_ == stage::body_chunked && chunk_pos_ > head_bytes_) {
    const std::size_t dead = chunk_pos_ - head_bytes_;
    std::memmove(to, input(), head_bytes_);
    std::memmove(to + head_bytes_, input() + chunk_pos_, size - chunk_pos_);
    chunk_pos_ -= dead;
    chunk_scan_ -= dead;
    end_ = size - dead;
  } else {
    std::memmove(to, input(), size);
    end_ = size;
  }
  begin_ = 0;
}

parse_status parser::fail(parse_error err) {
  stage_ = stage::failed;
  error_ = err;
  continue_pending_ = false;
  return parse_status::error;
}

parse_status parser::next() {
  if (stage_ == stage::failed) return parse_status::error;
  if (stage_ == stage::ready) return parse_status::ready;
  if (stage_ == stage::start) {
    // RFC 9112 2.2: ignore empty lines before a request (some clients add CRLF after a body).
    while (buffered() >= 2 && input()[0] == '\r' && input()[1] == '\n') begin_ += 2;
    if (buffered() == 0) {
      begin_ = end_ = 0;
      return parse_status::need_more;
    }
    if (buffered() == 1 && input()[0] == '\r') return parse_status::need_more;
    stage_ = stage::request_line;
  }
  bool head_parsed_now = false;
  if (stage_ == stage::request_line || stage_ == stage::headers) {
    const parse_status head = parse_head();
    if (head != parse_status::ready) return head;
    head_parsed_now = true;
  }
  parse_status status = parse_status::need_more;
  if (stage_ == stage::body_length) {
    const std::size_t total = head_bytes_ + content_length_;
    if (buffered() >= total) {
      std::string_view body(empty_body, 0);
      if (content_length_ > 0) {
        body = std::string_view(input() + head_bytes_, content_length_);
        // Padding past the valid input is zeroed; a pipelined request's bytes stay.
        if (total + body_padding_bytes > buffered()) {
          std::memset(buffer_.get() + end_, 0, total + body_padding_bytes - buffered());
        }
      }
      make_ready(body, total);
      status = parse_status::ready;
    }
  } else {
    status = parse_chunked();
  }
  if (head_parsed_now && status == parse_status::need_more && expect_continue_) {
    continue_pending_ = true;
  }
  return status;
}

// Request line and header lines, one line at a time; each line is scanned once however
// the bytes arrive. Returns `ready` once the blank line ending the headers is parsed.
parse_status parser::parse_head() {
  const char* in = input();
  const std::size_t size = buffered();
  const std::size_t max = limits_.header_bytes_max;
  for (;;) {
    const char* newline = find_newline(in, scan_from_, size);
    if (newline == nullptr) {
      scan_from_ = size;
      // Even a blank line completing here would end past the limit.
      if (size >= max) return fail(parse_error::headers_too_large);
      return parse_status::need_more;
    }
    const auto newline_at = static_cast<std::size_t>(newline - in);
    const std::size_t line_end = newline_at + 1;
    if (line_end > max) return fail(parse_error::headers_too_large);
    const bool request_line = stage_ == stage::request_line;
    if (newline_at == line_start_ || in[newline_at - 1] != '\r') {
      return fail(request_line ? parse_error::bad_request_line : parse_error::bad_header);
    }
    const std::string_view line(in + line_start_, newline_at - 1 - line_start_);
    line_start_ = scan_from_ = line_end;
    parse_error err = parse_error::none;
    if (request_line) {
      err = parse_request_line(line);
      stage_ = stage::headers;
    } else if (line.empty()) {
      head_bytes_ = line_end;
      err = finish_head();
      if (err == parse_error::none) return parse_status::ready;
    } else {
      err = parse_header_line(line);
    }
    if (err != parse_error::none) return fail(err);
  }
}

parse_error parser::parse_request_line(std::string_view line) {
  const auto first_space = line.find(' ');
  if (first_space == std::string_view::npos) return parse_error::bad_request_line;
  const auto second_space = line.find(' ', first_space + 1);
  if (second_space == std::string_view::npos) return parse_error::bad_request_line;
  const std::string_view name = line.substr(0, first_space);
  const std::string_view target = line.substr(first_space + 1, second_space - first_space - 1);
  const std::string_view version = line.substr(second_space + 1);
  if (!is_token(name)) return parse_error::bad_request_line;
  if (version == "HTTP/1.1") {
    http_1_0_ = false;
  } else if (version == "HTTP/1.0") {
    http_1_0_ = true;
  } else {
    return is_http_version(version) ? parse_error::bad_version : parse_error::bad_request_line;
  }
  if (target.empty()) return parse_error::bad_request_line;
  for (char c : target) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) return parse_error::bad_request_line;
  }
  const std::string_view path = target.front() == '/' ? target : absolute_form_path(target);
  if (path.data() == nullptr) return parse_error::bad_request_line;
  verb_ = method_of(name);
  // An empty path (absolute-form "http://host") means "/" (see make_ready).
  root_target_ = path.empty();
  target_offset_ = root_target_ ? 0 : static_cast<std::size_t>(path.data() - input());
  target_size_ = root_target_ ? 1 : std::min(path.find('?'), path.size());
  return parse_error::none;
}

std::string_view parser::absolute_form_path(std::string_view target) {
  // absolute-form (RFC 9112 3.2.2), which a server must accept: http[s]://authority,
  // then the path (possibly empty) and query. Any other form is not ours to serve.
  const std::size_t sep = target.find("://");
  if (sep == std::string_view::npos) return {};
  const std::string_view scheme = target.substr(0, sep);
  auto is = [scheme](std::string_view name) {
    if (scheme.size() != name.size()) return false;
    for (std::size_t i = 0; i < name.size(); ++i)
      if ((scheme[i] | 0x20) != name[i]) return false;
    return true;
  };
  if (!is("http") && !is("https")) return {};
  const std::string_view rest = target.substr(sep + 3);
  const std::size_t end = rest.find_first_of("/?#");
  if (end == 0) return {};  // no authority
  if (end == std::string_view::npos || rest[end] != '/') return rest.substr(rest.size());
  return rest.substr(end);
}

parse_error parser::parse_header_line(std::string_view line) {
  const auto colon = line.find(':');
  if (colon == std::string_view::npos) return parse_error::bad_header;
  // A token check also refuses whitespace before the colon and obs-fold lines.
  const std::string_view name = line.substr(0, colon);
  if (!is_token(name)) return parse_error::bad_header;
  const std::string_view value = trim(line.substr(colon + 1));
  if (!is_field_value(value)) return parse_error::bad_header;
  switch (name.size()) {
    case 14:
      if (iequals(name, "content-length")) {
        if (value.empty()) return parse_error::bad_content_length;
        std::uint64_t length = 0;
        for (char c : value) {
          if (!is_digit(c)) return parse_error::bad_content_length;
          const auto digit = static_cast<std::uint64_t>(c - '0');
          if (length > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) {
            return parse_error::bad_content_length;
          }
          length = length * 10 + digit;
        }
        if (has_length_ && length != content_length_) return parse_error::bad_content_length;
        has_length_ = true;
        content_length_ = length;
      } else if (iequals(name, "x-metad-tenant")) {
        tenant_offset_ = static_cast<std::size_t>(value.data() - input());
        tenant_size_ = value.size();
      }
      break;
    case 17:
      if (iequals(name, "transfer-encoding")) {
        if (transfer_encodings_ < 255) ++transfer_encodings_;
        chunked_value_ = iequals(value, "chunked");
      }
      break;
    case 10:
      if (iequals(name, "connection")) {
        std::string_view rest = value;
        while (!rest.empty()) {
          const auto comma = std::min(rest.find(','), rest.size());
          const std::string_view option = trim(rest.substr(0, comma));
          if (iequals(option, "close")) connection_close_ = true;
          if (iequals(option, "keep-alive")) connection_keep_alive_ = true;
          rest.remove_prefix(std::min(comma + 1, rest.size()));
        }
      }
      break;
    case 13:
      if (iequals(name, "authorization")) {
        authorization_offset_ = static_cast<std::size_t>(value.data() - input());
        authorization_size_ = value.size();
      }
      break;
    case 6:
      if (iequals(name, "expect") && iequals(value, "100-continue")) expect_continue_ = true;
      break;
  }
  return parse_error::none;
}

parse_error parser::finish_head() {
  // HTTP/1.0 clients do not know 100-continue (RFC 9110 10.1.1).
  if (http_1_0_) expect_continue_ = false;
  if (transfer_encodings_ > 0) {
    // Both framings at once is the classic request-smuggling shape: refuse, never guess.
    if (has_length_) return parse_error::length_and_chunked;
    // Two Transfer-Encoding lines form a list ("gzip, chunked"): not plain chunked.
    if (transfer_encodings_ > 1 || !chunked_value_) return parse_error::unknown_coding;
    stage_ = stage::body_chunked;
    chunk_stage_ = chunk_stage::size_line;
    chunk_pos_ = chunk_scan_ = head_bytes_;
    decoded_size_ = 0;
    return parse_error::none;
  }
  if (content_length_ > limits_.body_bytes_max) return parse_error::body_too_large;
  stage_ = stage::body_length;
  return parse_error::none;
}

parse_status parser::parse_chunked() {
  const char* in = input();
  const std::size_t size = buffered();
  for (;;) {
    switch (chunk_stage_) {
      case chunk_stage::size_line: {
        const char* newline = find_newline(in, chunk_scan_, size);
        if (newline == nullptr) {
          chunk_scan_ = size;
          // Even with the CR already here, the line is too long.
          if (size - chunk_pos_ > chunk_line_bytes_max + 1) return fail(parse_error::bad_chunk);
          return parse_status::need_more;
        }
        const auto newline_at = static_cast<std::size_t>(newline - in);
        if (newline_at == chunk_pos_ || in[newline_at - 1] != '\r') {
          return fail(parse_error::bad_chunk);
        }
        const std::string_view line(in + chunk_pos_, newline_at - 1 - chunk_pos_);
        if (line.size() > chunk_line_bytes_max) return fail(parse_error::bad_chunk);
        std::size_t digits = 0;
        std::size_t chunk_size = 0;
        const std::size_t room = limits_.body_bytes_max - decoded_size_;
        for (; digits < line.size() && hex_value(line[digits]) >= 0; ++digits) {
          chunk_size = chunk_size * 16 + static_cast<std::size_t>(hex_value(line[digits]));
          if (chunk_size > room) return fail(parse_error::body_too_large);
        }
        if (digits == 0) return fail(parse_error::bad_chunk);
        const std::string_view rest = trim(line.substr(digits));
        if (!rest.empty() && (rest.front() != ';' || !is_field_value(rest))) {
          return fail(parse_error::bad_chunk);
        }
        chunk_pos_ = chunk_scan_ = newline_at + 1;
        if (chunk_size == 0) {
          chunk_stage_ = chunk_stage::trailers;
          trailer_bytes_ = 0;
          return parse_trailers();
        }
        chunk_left_ = chunk_size;
        chunk_stage_ = chunk_stage::data;
        break;
      }
      case chunk_stage::data: {
        const std::size_t take = std::min(chunk_left_, size - chunk_pos_);
        if (take > 0) append_decoded(in + chunk_pos_, take);
        chunk_pos_ = chunk_scan_ = chunk_pos_ + take;
        chunk_left_ -= take;
        if (chunk_left_ > 0) return parse_status::need_more;
        chunk_stage_ = chunk_stage::data_crlf;
        break;
      }
      case chunk_stage::data_crlf: {
        const std::size_t available = size - chunk_pos_;
        if (available >= 1 && in[chunk_pos_] != '\r') return fail(parse_error::bad_chunk);
        if (available < 2) return parse_status::need_more;
        if (in[chunk_pos_ + 1] != '\n') return fail(parse_error::bad_chunk);
        chunk_pos_ = chunk_scan_ = chunk_pos_ + 2;
        chunk_stage_ = chunk_stage::size_line;
        break;
      }
      case chunk_stage::trailers:
        return parse_trailers();
    }
  }
}

// Trailer fields after the last chunk are checked for shape and dropped; their section
// has the same size limit as the headers.
parse_status parser::parse_trailers() {
  const char* in = input();
  const std::size_t size = buffered();
  const std::size_t max = limits_.header_bytes_max;
  for (;;) {
    const char* newline = find_newline(in, chunk_scan_, size);
    if (newline == nullptr) {
      chunk_scan_ = size;
      if (trailer_bytes_ + (size - chunk_pos_) >= max) {
        return fail(parse_error::headers_too_large);
      }
      return parse_status::need_more;
    }
    const auto newline_at = static_cast<std::size_t>(newline - in);
    const std::size_t line_bytes = newline_at + 1 - chunk_pos_;
    if (trailer_bytes_ + line_bytes > max) return fail(parse_error::headers_too_large);
    if (newline_at == chunk_pos_ || in[newline_at - 1] != '\r') {
      return fail(parse_error::bad_chunk);
    }
    const std::string_view line(in + chunk_pos_, newline_at - 1 - chunk_pos_);
    chunk_pos_ = chunk_scan_ = newline_at + 1;
    trailer_bytes_ += line_bytes;
    if (line.empty()) {
      if (decoded_size_ == 0) {
        make_ready(std::string_view(empty_body, 0), chunk_pos_);
      } else {
        std::memset(decoded_.get() + decoded_size_, 0, body_padding_bytes);
        make_ready(std::string_view(decoded_.get(), decoded_size_), chunk_pos_);
      }
      return parse_status::ready;
    }
    const auto colon = line.find(':');
    if (colon == std::string_view::npos || !is_token(line.substr(0, colon)) ||
        !is_field_value(line.substr(colon + 1))) {
      return fail(parse_error::bad_chunk);
    }
  }
}

void parser::append_decoded(const char* data, std::size_t size) {
  const std::size_t need = decoded_size_ + size + body_padding_bytes;
  if (need > decoded_capacity_) {
    // Grows with the bytes that actually arrived, never with what a chunk size announces.
    const std::size_t cap = limits_.body_bytes_max + body_padding_bytes;
    const std::size_t grown =
        std::max(need, std::min(std::max(2 * decoded_capacity_, initial_buffer_bytes), cap));
    auto bigger = std::make_unique_for_overwrite<char[]>(grown);
    if (decoded_size_ > 0) std::memcpy(bigger.get(), decoded_.get(), decoded_size_);
    decoded_ = std::move(bigger);
    decoded_capacity_ = grown;
  }
  std::memcpy(decoded_.get() + decoded_size_, data, size);
  decoded_size_ += size;
}

void parser::make_ready(std::string_view body, std::size_t request_bytes) {
  request_.verb = verb_;
  request_.target = root_target_ ? std::string_view("/")
                                 : std::string_view(input() + target_offset_, target_size_);
  request_.authorization = std::string_view(input() + authorization_offset_, authorization_size_);
  request_.tenant = std::string_view(input() + tenant_offset_, tenant_size_);
  request_.http_1_0 = http_1_0_;
  request_.keep_alive =
      http_1_0_ ? connection_keep_alive_ && !connection_close_ : !connection_close_;
  request_.body = body;
  request_bytes_ = request_bytes;
  stage_ = stage::ready;
  // The body is here: a 100 Continue would only be noise now.
  continue_pending_ = false;
}

void parser::consume() {
  METAD_ASSERT(stage_ == stage::ready);  // consume() follows a ready next()
  begin_ += request_bytes_;
  retired_.reset();
  if (begin_ == end_) {
    begin_ = end_ = 0;
    if (capacity_ > retained_buffer_bytes) {
      buffer_.reset();
      capacity_ = 0;
    }
  }
  if (decoded_capacity_ > retained_buffer_bytes) {
    decoded_.reset();
    decoded_capacity_ = 0;
  }
  reset_request();
}

void parser::reset_request() {
  request_ = request{};
  stage_ = stage::start;
  line_start_ = scan_from_ = head_bytes_ = 0;
  target_offset_ = target_size_ = request_bytes_ = 0;
  root_target_ = false;
  authorization_offset_ = authorization_size_ = 0;
  tenant_offset_ = tenant_size_ = 0;
  verb_ = method::other;
  http_1_0_ = false;
  has_length_ = false;
  content_length_ = 0;
  transfer_encodings_ = 0;
  chunked_value_ = false;
  connection_close_ = connection_keep_alive_ = false;
  expect_continue_ = continue_pending_ = false;
  chunk_stage_ = chunk_stage::size_line;
  chunk_pos_ = chunk_scan_ = chunk_left_ = trailer_bytes_ = 0;
  decoded_size_ = 0;
}

bool parser::take_continue_request() {
  const bool pending = continue_pending_;
  continue_pending_ = false;
  return pending;
}

bool parser::mid_request() const {
  return stage_ != stage::ready && stage_ != stage::failed && end_ > begin_;
}

}  // namespace metad::http
