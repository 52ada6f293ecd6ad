// A minimal blocking HTTP/1.1 keep-alive client for the load generator and the memory
// run: one connection, one request at a time (as vLLM's client issues them), buffers
// reused across requests so a steady stream does not allocate. Loopback only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace bench {

class http_client {
 public:
  http_client(std::string host, std::uint16_t port, int timeout_ms = 10'000);
  ~http_client();
  http_client(const http_client&) = delete;
  http_client& operator=(const http_client&) = delete;

  // Sends `method path` with a JSON body (Content-Length framing) and waits for the whole
  // response. Returns the status code, or -1 on a connection error (the connection is
  // then closed and the next call reconnects). body() holds the response body until the
  // next call.
  int request(std::string_view method, std::string_view path, std::string_view body);
  int post(std::string_view path, std::string_view body) { return request("POST", path, body); }
  std::string_view body() const { return {in_.data() + body_begin_, body_size_}; }
  // Reconnections after errors since construction (a healthy run has none).
  std::uint64_t reconnects() const { return reconnects_; }

 private:
  bool ensure_connected();
  void close_socket();
  bool send_all(const char* data, std::size_t size);
  bool read_response(int& status);
  bool fill();  // reads more bytes into in_; false on EOF, error or timeout

  std::string host_;
  std::uint16_t port_;
  int timeout_ms_;
  int fd_ = -1;
  bool ever_connected_ = false;
  std::uint64_t reconnects_ = 0;
  std::string out_;
  std::string in_;
  std::size_t in_size_ = 0;     // valid bytes in in_
  std::size_t body_begin_ = 0;  // body of the last response
  std::size_t body_size_ = 0;
  std::size_t consumed_ = 0;  // bytes of in_ belonging to the last response
};

}  // namespace bench
