// A small blocking HTTP/1.1 client over one POSIX TCP socket, for end-to-end tests.
// It writes raw bytes (so tests can pipeline, chunk or send garbage) and reads responses
// framed by Content-Length or chunked coding. One connection belongs to one thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace e2e {

// A bound on every blocking read, so that a server that never answers fails the test
// instead of hanging it. Not a performance assertion.
inline constexpr int kReadTimeoutSeconds = 30;
inline constexpr std::size_t kResponseHeadBytesMax = 64 * 1024;

inline std::string to_lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

struct http_response {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names lowercased
  std::string body;

  bool has_header(std::string_view name) const {
    return std::any_of(headers.begin(), headers.end(),
                       [&](const auto& h) { return h.first == to_lower(name); });
  }
  std::string header(std::string_view name) const {
    for (const auto& [key, val] : headers) {
      if (key == to_lower(name)) return val;
    }
    return {};
  }
  bool closes_connection() const { return to_lower(header("connection")) == "close"; }

  std::string describe() const { return "HTTP " + std::to_string(status) + " " + body; }
};

struct header_field {
  std::string name;
  std::string value;
};

// The bytes of one request with a Content-Length body.
inline std::string format_request(std::string_view method, std::string_view target,
                                  std::string_view body,
                                  const std::vector<header_field>& extra = {}) {
  std::string out;
  out.reserve(body.size() + 160);
  out.append(method).append(" ").append(target).append(" HTTP/1.1\r\n");
  out.append("Host: 127.0.0.1\r\n");
  for (const auto& h : extra) out.append(h.name).append(": ").append(h.value).append("\r\n");
  if (method != "GET" || !body.empty()) {
    out.append("Content-Type: application/json\r\n");
    out.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n");
  }
  out.append("\r\n").append(body);
  return out;
}

inline std::string format_post(std::string_view target, std::string_view body) {
  return format_request("POST", target, body);
}

class http_connection {
 public:
  explicit http_connection(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw_errno("socket");
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval timeout{kReadTimeoutSeconds, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      const int err = errno;
      ::close(fd_);
      errno = err;
      throw_errno("connect to 127.0.0.1:" + std::to_string(port));
    }
  }
  ~http_connection() {
    if (fd_ >= 0) ::close(fd_);
  }
  http_connection(const http_connection&) = delete;
  http_connection& operator=(const http_connection&) = delete;

  // Writes all bytes; throws if the peer is gone.
  void send_all(std::string_view bytes) {
    if (!try_send_all(bytes)) throw_errno("send");
  }

  // Writes all bytes; false if the peer closed or reset the connection meanwhile (a
  // server may legitimately close while a bad request is still being sent).
  bool try_send_all(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  // Reads exactly `count` bytes (after whatever is already buffered).
  std::string read_exact(std::size_t count) {
    fill_to(count);
    std::string out = buffer_.substr(0, count);
    buffer_.erase(0, count);
    return out;
  }

  // Reads one response, interim (1xx) responses included.
  http_response read_response() {
    const std::size_t head_end = fill_until("\r\n\r\n", kResponseHeadBytesMax);
    http_response response = parse_head(std::string_view(buffer_).substr(0, head_end));
    buffer_.erase(0, head_end + 4);
    if (response.status < 200 || response.status == 204 || response.status == 304) {
      return response;
    }
    if (to_lower(response.header("transfer-encoding")).find("chunked") != std::string::npos) {
      response.body = read_chunked_body();
    } else if (response.has_header("content-length")) {
      response.body = read_exact(std::stoull(response.header("content-length")));
    } else {
      response.body = read_until_eof();
    }
    return response;
  }

  http_response request(std::string_view method, std::string_view target,
                        std::string_view body = {}) {
    send_all(format_request(method, target, body));
    return read_response();
  }
  http_response post(std::string_view target, std::string_view body) {
    return request("POST", target, body);
  }

  // True once the peer has closed (EOF or reset) with no further response bytes pending;
  // false if bytes arrive or the read times out.
  bool peer_closed() {
    if (!buffer_.empty()) return false;
    char byte;
    while (true) {
      const ssize_t n = ::recv(fd_, &byte, 1, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
      buffer_.push_back(byte);
      return false;
    }
  }

 private:
  [[noreturn]] static void throw_errno(const std::string& what) {
    throw std::runtime_error(what + ": " + std::strerror(errno));
  }

  // Appends what one recv returns; false on EOF.
  bool read_some() {
    char chunk[16 * 1024];
    while (true) {
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        throw std::runtime_error("no response within " + std::to_string(kReadTimeoutSeconds) +
                                 " s");
      }
      if (n < 0) throw_errno("recv");
      buffer_.append(chunk, static_cast<std::size_t>(n));
      return n > 0;
    }
  }

  void fill_to(std::size_t count) {
    while (buffer_.size() < count) {
      if (!read_some()) throw std::runtime_error("connection closed mid-response");
    }
  }

  // Offset of `delimiter` in the buffer, reading until it appears within `limit` bytes.
  std::size_t fill_until(std::string_view delimiter, std::size_t limit) {
    while (true) {
      const std::size_t at = buffer_.find(delimiter);
      if (at != std::string::npos) return at;
      if (buffer_.size() > limit) throw std::runtime_error("response head too long");
      if (!read_some()) {
        throw std::runtime_error(buffer_.empty() ? "connection closed before a response"
                                                 : "connection closed mid-response");
      }
    }
  }

  std::string read_until_eof() {
    while (read_some()) {
    }
    return std::exchange(buffer_, {});
  }

  std::string read_line() {
    const std::size_t at = fill_until("\r\n", kResponseHeadBytesMax);
    std::string line = buffer_.substr(0, at);
    buffer_.erase(0, at + 2);
    return line;
  }

  std::string read_chunked_body() {
    std::string body;
    while (true) {
      const std::size_t size = std::stoull(read_line(), nullptr, 16);
      if (size == 0) break;
      body += read_exact(size);
      if (read_exact(2) != "\r\n") throw std::runtime_error("bad chunk terminator");
    }
    while (!read_line().empty()) {  // trailer fields, then the empty line
    }
    return body;
  }

  static http_response parse_head(std::string_view head) {
    http_response response;
    std::size_t line_end = head.find("\r\n");
    const std::string_view status_line = head.substr(0, line_end);
    if (status_line.substr(0, 9) != "HTTP/1.1 " || status_line.size() < 12) {
      throw std::runtime_error("bad status line: " + std::string(status_line));
    }
    response.status = std::stoi(std::string(status_line.substr(9, 3)));
    while (line_end != std::string_view::npos) {
      const std::size_t start = line_end + 2;
      line_end = head.find("\r\n", start);
      const std::string_view line = head.substr(start, line_end - start);
      const std::size_t colon = line.find(':');
      if (colon == std::string_view::npos) throw std::runtime_error("bad header line");
      std::string_view val = line.substr(colon + 1);
      while (!val.empty() && (val.front() == ' ' || val.front() == '\t')) val.remove_prefix(1);
      while (!val.empty() && (val.back() == ' ' || val.back() == '\t')) val.remove_suffix(1);
      response.headers.emplace_back(to_lower(line.substr(0, colon)), std::string(val));
    }
    return response;
  }

  int fd_ = -1;
  std::string buffer_;  // received bytes not yet consumed
};

}  // namespace e2e
