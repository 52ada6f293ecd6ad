#include "repl/socket.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

namespace metad::repl {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

sockaddr_in address(const std::string& host, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    errno = EINVAL;
    fail("replication address " + host);
  }
  return a;
}

void no_delay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

socket_fd::~socket_fd() {
  if (fd_ >= 0) ::close(fd_);
}

socket_fd& socket_fd::operator=(socket_fd&& o) noexcept {
  std::swap(fd_, o.fd_);
  return *this;
}

void socket_fd::shut_down() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

socket_fd listen_tcp(const std::string& host, std::uint16_t port) {
  socket_fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.open()) fail("socket");
  const int one = 1;
  ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const sockaddr_in a = address(host, port);
  if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    fail("bind " + host + ":" + std::to_string(port));
  if (::listen(s.get(), 16) != 0) fail("listen");
  return s;
}

std::uint16_t bound_port(const socket_fd& s) {
  sockaddr_in a{};
  socklen_t length = sizeof a;
  if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &length) != 0) fail("getsockname");
  return ntohs(a.sin_port);
}

socket_fd accept_tcp(const socket_fd& listener) {
  for (;;) {
    const int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      no_delay(fd);
      return socket_fd(fd);
    }
    if (errno != EINTR) return socket_fd();
  }
}

socket_fd connect_tcp(const std::string& host, std::uint16_t port) {
  socket_fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.open()) fail("socket");
  const sockaddr_in a = address(host, port);
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    fail("connect " + host + ":" + std::to_string(port));
  no_delay(s.get());
  return s;
}

bool write_all(const socket_fd& s, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(s.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

bool read_some(const socket_fd& s, std::string& out) {
  char buffer[64 * 1024];
  for (;;) {
    const ssize_t n = ::recv(s.get(), buffer, sizeof buffer, 0);
    if (n > 0) {
      out.append(buffer, static_cast<std::size_t>(n));
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

}  // namespace metad::repl
