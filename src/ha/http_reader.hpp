// Incremental HTTP/1.1 response reader (sans-IO) for the etcd gateway client: status
// line, headers, then a Content-Length, chunked (trailers skipped) or until-close body.
// Decoded body bytes accumulate in body(), so a streamed answer (watch) can be consumed
// as it arrives. One per connection; the ha thread only.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace metad::ha {

class http_reader {
 public:
  enum class state { head, body, done, error };

  // Limits: a head or a chunk-size line longer than this is an error.
  static constexpr std::size_t kHeadBytesMax = 16384;

  // Parses what it can of `bytes`; returns the state afterwards.
  state feed(std::string_view bytes);
  // The peer closed: completes an until-close body, else an error unless already done.
  state feed_eof();
  void reset();

  state current() const { return state_; }
  int status() const { return status_; }
  bool keep_alive() const { return keep_alive_; }
  bool chunked() const { return chunked_; }
  const std::string& error() const { return error_; }
  // Decoded body bytes received so far; the caller may erase a consumed prefix.
  std::string& body() { return body_; }

 private:
  enum class chunk_step { size, data, data_end, trailer };
  bool parse_head(std::string_view head);
  void parse_body();
  bool parse_chunks();
  state fail(std::string why);

  state state_ = state::head;
  std::string in_;  // undecoded bytes
  std::string body_;
  std::string error_;
  int status_ = 0;
  bool keep_alive_ = true;
  bool chunked_ = false;
  bool until_close_ = false;
  std::size_t remaining_ = 0;  // Content-Length left, or the current chunk's bytes left
  chunk_step chunk_ = chunk_step::size;
};

}  // namespace metad::ha
