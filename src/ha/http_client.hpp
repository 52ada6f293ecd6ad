// A small blocking HTTP/1.1 client for etcd's JSON gateway, for the ha thread only:
// POST with deadlines (connect and read are bounded by poll), keep-alive reuse, and
// several endpoints tried in turn. http_stream reads one streamed answer (watch) line
// by line. https:// endpoints speak TLS (OpenSSL over the same non-blocking socket,
// every step bounded by the same deadlines): the server's certificate is verified
// against the context's CAs and must name the URL's host (SNI sent for DNS names).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ha/http_reader.hpp"

struct ssl_st;

namespace metad::ha {

using steady = std::chrono::steady_clock;
using time_point = steady::time_point;

class tls_context;

struct endpoint {
  std::string host;
  std::uint16_t port = 0;
  std::string url;   // as given, for messages
  bool tls = false;  // https://
};

// "http://HOST:PORT" or "https://HOST:PORT" (a trailing '/' allowed); nullopt for
// anything else.
std::optional<endpoint> parse_endpoint(std::string_view url);
// "URL[,URL...]"; nullopt if any element is bad or the list is empty.
std::optional<std::vector<endpoint>> parse_endpoints(std::string_view urls);

// One TCP connection with deadlines, TLS to an https endpoint; closed on destruction.
class connection {
 public:
  connection() = default;
  ~connection() { close(); }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  // Connects (and for an https endpoint completes the TLS handshake with `tls`, which
  // it needs) before the deadline.
  bool open(const endpoint& to, time_point deadline, std::string& error,
            const tls_context* tls = nullptr);
  // The last open() failed because the server's certificate did not verify (a wrong
  // CA, an expired certificate, another host name): a configuration error, not an outage.
  bool certificate_refused() const { return certificate_refused_; }
  bool is_open() const { return fd_ >= 0; }
  void close();
  bool send_all(std::string_view bytes, time_point deadline, std::string& error);
  enum class read_status { progress, timeout, closed, error };
  // Waits (until deadline) for bytes and feeds what one recv returns to `reader`.
  read_status read_some(http_reader& reader, time_point deadline, std::string& error);

 private:
  bool handshake(const endpoint& to, const tls_context& tls, time_point deadline,
                 std::string& error);
  read_status read_tls(http_reader& reader, time_point deadline, std::string& error);

  int fd_ = -1;
  ssl_st* ssl_ = nullptr;
  bool certificate_refused_ = false;
};

struct http_result {
  bool ok = false;  // an answer arrived (any status)
  int status = 0;
  std::string body;
  std::string error;  // transport failure, when !ok
};

class http_client {
 public:
  // `tls`: for https endpoints (shared with the watch streams).
  http_client(std::vector<endpoint> endpoints, std::chrono::milliseconds connect_timeout,
              std::shared_ptr<const tls_context> tls = nullptr);

  // POSTs a JSON body to `path` (with "Authorization: <authorization>" unless empty). A
  // transport failure or a 5xx moves on to the next endpoint, each tried at most once,
  // while the deadline allows; the last outcome is returned. The endpoint that answered
  // is tried first next time.
  http_result post(std::string_view path, std::string_view json, time_point deadline,
                   std::string_view authorization = {});

  const std::vector<endpoint>& endpoints() const { return endpoints_; }
  const tls_context* tls() const { return tls_.get(); }
  std::size_t current() const { return current_; }
  std::chrono::milliseconds connect_timeout() const { return connect_timeout_; }
  void drop_connection() { conn_.close(); }

 private:
  http_result attempt(std::string_view request, time_point deadline);

  std::vector<endpoint> endpoints_;
  std::chrono::milliseconds connect_timeout_;
  std::shared_ptr<const tls_context> tls_;
  std::size_t current_ = 0;
  connection conn_;
};

std::string format_post(const endpoint& to, std::string_view path, std::string_view json,
                        std::string_view authorization = {});

// One streamed answer (a watch): open() sends the request and waits for the head;
// next_line() returns each newline-terminated body line as it arrives.
class http_stream {
 public:
  enum class status { line, timeout, ended, error };

  bool open(const endpoint& to, std::string_view path, std::string_view json, time_point deadline,
            std::string& error, const tls_context* tls = nullptr,
            std::string_view authorization = {});
  status next_line(time_point deadline, std::string& line, std::string& error);
  bool is_open() const { return conn_.is_open(); }
  void close();
  int http_status() const { return reader_.status(); }

 private:
  connection conn_;
  http_reader reader_;
};

}  // namespace metad::ha
