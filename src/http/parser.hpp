// Sans-IO incremental HTTP/1.x request parser. Owns the connection's input buffer: the
// transport reads into read_space(), calls commit(), then pulls requests with next().
// One parser per connection; touched only by the connection's core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace metad::http {

// Bytes kept readable (and zeroed) after every body, as simdjson requires.
inline constexpr std::size_t body_padding_bytes = 64;

enum class method : std::uint8_t { get, head, post, put, delete_, patch, options, other };

struct limits {
  std::size_t header_bytes_max = 64 * 1024;  // request line + headers + final CRLF
  std::size_t body_bytes_max = 32 * 1024 * 1024;
};

// Why a request could not be parsed. Each maps to one fixed response (see response.hpp);
// after any of them the connection is closed.
enum class parse_error : std::uint8_t {
  none,
  bad_request_line,    // 400
  bad_header,          // 400
  bad_version,         // 505 (not HTTP/1.0 or HTTP/1.1)
  bad_content_length,  // 400 (non-digits, overflow, repeated with different values)
  length_and_chunked,  // 400 (both Content-Length and Transfer-Encoding)
  bad_chunk,           // 400 (malformed chunk size line or chunk framing)
  unknown_coding,      // 501 (a Transfer-Encoding other than chunked)
  headers_too_large,   // 431
  body_too_large,      // 413
};

// One complete request. Views stay valid until the next call to next() or consume().
struct request {
  method verb = method::other;
  std::string_view target;  // path only: the query string is stripped
  bool http_1_0 = false;
  bool keep_alive = true;  // false for HTTP/1.0 (unless keep-alive asked) or Connection: close
  // The Authorization header's value (trimmed), empty when absent.
  std::string_view authorization;
  // The X-Metad-Tenant header's value (trimmed), empty when absent: the tenant whose vLLM
  // state an admin-token call (/clear, /keys/delete) acts on.
  std::string_view tenant;
  // The body; data()[size() .. size()+body_padding_bytes) is readable.
  std::string_view body;
};

enum class parse_status : std::uint8_t { need_more, ready, error };

class parser {
 public:
  explicit parser(limits lim = {});

  // Free space at the end of the input buffer, at least min_bytes (the buffer grows, up
  // to the limits, as needed).
  std::span<char> read_space(std::size_t min_bytes = 16 * 1024);
  void commit(std::size_t bytes_read);

  // Advances over the buffered input. `ready`: request() holds a full request, which
  // stays valid until consume(). `need_more`: read more. `error`: error() says why.
  parse_status next();
  const request& current() const { return request_; }
  parse_error error() const { return error_; }
  // Releases the current request so the next pipelined one can be parsed.
  void consume();

  // True once per request when its headers carried `Expect: 100-continue` and the body
  // has not fully arrived: the transport should send "HTTP/1.1 100 Continue".
  bool take_continue_request();
  // A request has started (bytes buffered) but is not complete: the header timeout,
  // not the idle timeout, applies.
  bool mid_request() const;
  // The body bytes the request being received will have once what its framing announced
  // so far arrives (Content-Length, or the chunks decoded plus the one under way); 0
  // before its headers are complete. Lets the caller refuse a body before it is read.
  std::size_t body_bytes_announced() const;
  // Bytes past the ready request are buffered: the next pipelined one has begun.
  bool more_buffered() const { return stage_ == stage::ready && buffered() > request_bytes_; }
  // Heap bytes of its buffers.
  std::size_t buffer_bytes() const { return capacity_ + decoded_capacity_; }

 private:
  // implementation-defined state
  enum class stage : std::uint8_t {
    start,         // skipping empty lines before a request
    request_line,  // waiting for the request line
    headers,       // waiting for header lines
    body_length,   // Content-Length body (possibly empty)
    body_chunked,  // chunked body, decoded into decoded_
    ready,         // request_ holds a request until consume()
    failed,        // error_ says why; the parser is dead
  };
  enum class chunk_stage : std::uint8_t { size_line, data, data_crlf, trailers };

  char* input() const { return buffer_.get() + begin_; }
  std::size_t buffered() const { return end_ - begin_; }
  parse_status fail(parse_error err);
  parse_status parse_head();
  parse_error parse_request_line(std::string_view line);
  // The path (and query) of an absolute-form target; empty for "http://host"; a null
  // view when the target is not one.
  static std::string_view absolute_form_path(std::string_view target);
  parse_error parse_header_line(std::string_view line);
  parse_error finish_head();
  parse_status parse_chunked();
  parse_status parse_trailers();
  void append_decoded(const char* data, std::size_t size);
  void make_ready(std::string_view body, std::size_t request_bytes);
  void reset_request();
  std::size_t live_bytes() const;
  void move_input(char* to);

  limits limits_;
  // Input bytes [begin_, end_) are unconsumed; at least body_padding_bytes follow end_.
  std::unique_ptr<char[]> buffer_;
  std::size_t capacity_ = 0;
  // The previous buffer while a ready request's views still point into it (read_space had
  // to grow it before consume()).
  std::unique_ptr<char[]> retired_;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  request request_;
  parse_error error_ = parse_error::none;
  stage stage_ = stage::start;

  // Positions below are relative to begin_, so compaction only moves begin_.
  std::size_t line_start_ = 0;  // first byte of the header line being looked for
  std::size_t scan_from_ = 0;   // where the search for its '\n' resumes
  std::size_t head_bytes_ = 0;  // request line + headers + blank line
  std::size_t target_offset_ = 0;
  std::size_t target_size_ = 0;
  bool root_target_ = false;  // the target is "/" (an absolute-form without a path)
  std::size_t authorization_offset_ = 0;
  std::size_t authorization_size_ = 0;
  std::size_t tenant_offset_ = 0;
  std::size_t tenant_size_ = 0;
  std::size_t request_bytes_ = 0;  // size of the ready request in the input
  method verb_ = method::other;
  bool http_1_0_ = false;
  bool has_length_ = false;
  std::uint64_t content_length_ = 0;
  std::uint8_t transfer_encodings_ = 0;  // Transfer-Encoding header lines seen
  bool chunked_value_ = false;           // the last one said exactly "chunked"
  bool connection_close_ = false;
  bool connection_keep_alive_ = false;
  bool expect_continue_ = false;
  bool continue_pending_ = false;

  // Chunked decoding: input positions relative to begin_; encoded bytes between
  // head_bytes_ and chunk_pos_ are already decoded and may be dropped by read_space.
  chunk_stage chunk_stage_ = chunk_stage::size_line;
  std::size_t chunk_pos_ = 0;
  std::size_t chunk_scan_ = 0;
  std::size_t chunk_left_ = 0;
  std::size_t trailer_bytes_ = 0;  // trailer lines complete so far
  std::unique_ptr<char[]> decoded_;
  std::size_t decoded_capacity_ = 0;
  std::size_t decoded_size_ = 0;
};

}  // namespace metad::http
