// HTTP/1.1 keep-alive client connections for the load generator and the memory run:
// one request at a time per connection (as vLLM's client issues them), buffers reused
// across requests so a steady stream does not allocate. Loopback only.
//
// `http_connection` is the non-blocking core: it advances one request as far as the
// socket allows and says what it waits for. `http_client` waits for it with poll() (the
// setup calls and the memory run); the load generator's event loop waits for many.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace bench {

class http_connection {
 public:
  enum class progress { done, want_read, want_write, failed };

  http_connection(std::string host, std::uint16_t port);
  ~http_connection();
  http_connection(const http_connection&) = delete;
  http_connection& operator=(const http_connection&) = delete;

  // Connects (blocking, loopback) if not connected; the socket is then non-blocking.
  // False if the connection could not be made.
  bool connect();
  int fd() const { return fd_; }
  void close();

  // Starts `method path` with a JSON body (Content-Length framing); the body is copied.
  void begin(std::string_view method, std::string_view path, std::string_view body);
  // Sends what is left of the request, reads what the socket holds and parses the
  // response. On `failed` the connection is closed (the next begin() reconnects).
  progress advance();

  // The last response's status and body, valid after advance() answered `done` until
  // the next begin().
  int status() const { return status_; }
  std::string_view body() const { return {in_.data() + body_begin_, body_size_}; }

 private:
  progress parse();  // done once in_ holds the whole response

  std::string host_;
  std::uint16_t port_;
  int fd_ = -1;
  std::string out_;
  std::size_t sent_ = 0;  // bytes of out_ already sent
  std::string in_;
  std::size_t in_size_ = 0;   // valid bytes in in_
  std::size_t consumed_ = 0;  // bytes of in_ belonging to the last response
  int status_ = -1;
  std::size_t body_begin_ = 0;
  std::size_t body_size_ = 0;
};

// A blocking client over one http_connection.
class http_client {
 public:
  http_client(std::string host, std::uint16_t port, int timeout_ms = 10'000);

  // Sends the request and waits for the whole response. Returns the status code, or -1
  // on a connection error or timeout (the next call reconnects). body() holds the
  // response body until the next call.
  int request(std::string_view method, std::string_view path, std::string_view body);
  int post(std::string_view path, std::string_view body) { return request("POST", path, body); }
  std::string_view body() const { return conn_.body(); }

 private:
  http_connection conn_;
  int timeout_ms_;
};

}  // namespace bench
