#include "load/http_client.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace bench {
namespace {

bool iequals_prefix(std::string_view line, std::string_view name) {
  if (line.size() < name.size()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = line[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != name[i]) return false;
  }
  return true;
}

}  // namespace

http_connection::http_connection(std::string host, std::uint16_t port)
    : host_(std::move(host)), port_(port) {
  in_.resize(64 * 1024);
}

http_connection::~http_connection() { close(); }

void http_connection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  in_size_ = consumed_ = 0;
}

bool http_connection::connect() {
  if (fd_ >= 0) return true;
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return false;
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port_);
  if (::inet_pton(AF_INET, host_.c_str(), &addr.sin_addr) != 1 ||
      ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK) != 0) {
    close();
    return false;
  }
  return true;
}

void http_connection::begin(std::string_view method, std::string_view path, std::string_view body) {
  out_.clear();
  out_.append(method).append(" ").append(path).append(" HTTP/1.1\r\nHost: ").append(host_);
  out_.append("\r\nContent-Type: application/json\r\nContent-Length: ");
  char digits[24];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, body.size());
  out_.append(digits, end).append("\r\n\r\n").append(body);
  sent_ = 0;
  status_ = -1;
  body_size_ = 0;
  // Drop the previous response's bytes (a well-behaved server sends nothing unasked).
  if (consumed_ > 0) {
    std::memmove(in_.data(), in_.data() + consumed_, in_size_ - consumed_);
    in_size_ -= consumed_;
    consumed_ = 0;
  }
}

http_connection::progress http_connection::advance() {
  if (fd_ < 0) return progress::failed;
  while (sent_ < out_.size()) {
    const ssize_t n = ::send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return progress::want_write;
    if (n <= 0) {
      close();
      return progress::failed;
    }
    sent_ += static_cast<std::size_t>(n);
  }
  // Read until the socket is empty (the event loop waits edge-triggered), then parse.
  for (;;) {
    if (in_size_ == in_.size()) in_.resize(in_.size() * 2);
    const ssize_t n = ::recv(fd_, in_.data() + in_size_, in_.size() - in_size_, 0);
    if (n > 0) {
      in_size_ += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close();  // EOF or error: the response cannot complete
    return progress::failed;
  }
  return parse();
}

// One response: status line, headers (only Content-Length matters: the server frames
// every body with it, and 204s carry none), then the body.
http_connection::progress http_connection::parse() {
  const std::string_view have(in_.data(), in_size_);
  const std::size_t head_end = have.find("\r\n\r\n");
  if (head_end == std::string_view::npos) return progress::want_read;
  const std::string_view head = have.substr(0, head_end);
  if (head.size() < 12 || head.substr(0, 7) != "HTTP/1.") {
    close();
    return progress::failed;
  }
  int status = -1;
  std::from_chars(head.data() + 9, head.data() + 12, status);
  std::size_t length = 0;
  for (std::size_t at = head.find("\r\n"); at != std::string_view::npos;) {
    const std::size_t next = head.find("\r\n", at + 2);
    const std::string_view line = head.substr(
        at + 2, next == std::string_view::npos ? std::string_view::npos : next - at - 2);
    if (iequals_prefix(line, "content-length:")) {
      std::string_view v = line.substr(15);
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      std::from_chars(v.data(), v.data() + v.size(), length);
    }
    at = next;
  }
  if (in_size_ < head_end + 4 + length) {
    if (in_.size() < head_end + 4 + length) in_.resize(head_end + 4 + length);
    return progress::want_read;
  }
  status_ = status;
  body_begin_ = head_end + 4;
  body_size_ = length;
  consumed_ = body_begin_ + length;
  return progress::done;
}

http_client::http_client(std::string host, std::uint16_t port, int timeout_ms)
    : conn_(std::move(host), port), timeout_ms_(timeout_ms) {}

int http_client::request(std::string_view method, std::string_view path, std::string_view body) {
  // No retry: a failed call is an error the caller reports, and the next call reconnects.
  if (!conn_.connect()) return -1;
  conn_.begin(method, path, body);
  for (;;) {
    const http_connection::progress p = conn_.advance();
    if (p == http_connection::progress::done) return conn_.status();
    if (p == http_connection::progress::failed) return -1;
    pollfd pfd{conn_.fd(),
               static_cast<short>(p == http_connection::progress::want_write ? POLLOUT : POLLIN),
               0};
    const int ready = ::poll(&pfd, 1, timeout_ms_);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      conn_.close();
      return -1;
    }
  }
}

}  // namespace bench
