#include "load/http_client.hpp"

#include <arpa/inet.h>
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

http_client::http_client(std::string host, std::uint16_t port, int timeout_ms)
    : host_(std::move(host)), port_(port), timeout_ms_(timeout_ms) {
  in_.resize(64 * 1024);
}

http_client::~http_client() { close_socket(); }

void http_client::close_socket() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  in_size_ = consumed_ = 0;
}

bool http_client::ensure_connected() {
  if (fd_ >= 0) return true;
  if (ever_connected_) ++reconnects_;
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return false;
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port_);
  if (::inet_pton(AF_INET, host_.c_str(), &addr.sin_addr) != 1 ||
      ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close_socket();
    return false;
  }
  ever_connected_ = true;
  return true;
}

bool http_client::send_all(const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd_, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool http_client::fill() {
  if (in_size_ == in_.size()) in_.resize(in_.size() * 2);
  pollfd pfd{fd_, POLLIN, 0};
  for (;;) {
    const int ready = ::poll(&pfd, 1, timeout_ms_);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t n = ::recv(fd_, in_.data() + in_size_, in_.size() - in_size_, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    in_size_ += static_cast<std::size_t>(n);
    return true;
  }
}

// Parses one response: status line, headers (only Content-Length matters: the server
// frames every body with it, and 204s carry none), then the body.
bool http_client::read_response(int& status) {
  // Drop the previous response's bytes (a well-behaved server sends nothing unasked).
  if (consumed_ > 0) {
    std::memmove(in_.data(), in_.data() + consumed_, in_size_ - consumed_);
    in_size_ -= consumed_;
    consumed_ = 0;
  }
  std::size_t head_end;
  for (;;) {
    const std::string_view have(in_.data(), in_size_);
    head_end = have.find("\r\n\r\n");
    if (head_end != std::string_view::npos) break;
    if (!fill()) return false;
  }
  const std::string_view head(in_.data(), head_end);
  if (head.size() < 12 || head.substr(0, 7) != "HTTP/1.") return false;
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
  body_begin_ = head_end + 4;
  body_size_ = length;
  while (in_size_ < body_begin_ + length) {
    if (in_size_ == in_.size() && in_.size() < body_begin_ + length)
      in_.resize(body_begin_ + length);
    if (!fill()) return false;
  }
  consumed_ = body_begin_ + length;
  return true;
}

int http_client::request(std::string_view method, std::string_view path, std::string_view body) {
  out_.clear();
  out_.append(method).append(" ").append(path).append(" HTTP/1.1\r\nHost: ").append(host_);
  out_.append("\r\nContent-Type: application/json\r\nContent-Length: ");
  char digits[24];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, body.size());
  out_.append(digits, end).append("\r\n\r\n");
  // One send for small requests; large bodies go out without being copied.
  const bool inline_body = body.size() <= 16 * 1024;
  if (inline_body) out_.append(body);
  // No retry: a failed call is an error the run reports, and the next call reconnects.
  int status = -1;
  if (!ensure_connected()) return -1;
  const bool sent =
      send_all(out_.data(), out_.size()) && (inline_body || send_all(body.data(), body.size()));
  if (sent && read_response(status)) return status;
  close_socket();
  body_size_ = 0;
  return -1;
}

}  // namespace bench
