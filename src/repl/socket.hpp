// Blocking TCP for one replication stream (a leader core and a standby core): listen,
// accept, connect, whole writes and partial reads, with TCP_NODELAY (a batch or an ack
// is latency-bound, never worth Nagle's delay). The link (link.hpp) binds its listener
// here; the standby tests use the blocking calls. The protocol itself is sans-IO
// (protocol.hpp, session.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace metad::repl {

// An owned socket; -1 when closed. Move-only.
class socket_fd {
 public:
  socket_fd() = default;
  explicit socket_fd(int fd) : fd_(fd) {}
  ~socket_fd();
  socket_fd(socket_fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  socket_fd& operator=(socket_fd&& o) noexcept;
  socket_fd(const socket_fd&) = delete;
  socket_fd& operator=(const socket_fd&) = delete;
  int get() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  // Ends both directions now: a thread blocked reading it returns (fencing: a promoted
  // standby cuts the old leader's stream before it serves).
  void shut_down();

 private:
  int fd_ = -1;
};

// Listens on host:port (port 0: any free one, see bound_port). Throws std::system_error.
socket_fd listen_tcp(const std::string& host, std::uint16_t port);
std::uint16_t bound_port(const socket_fd& s);
// Blocks for the next connection (invalid socket on error or shutdown).
socket_fd accept_tcp(const socket_fd& listener);
// Throws std::system_error.
socket_fd connect_tcp(const std::string& host, std::uint16_t port);

// Writes all of `bytes`; false on an error (the peer is gone).
bool write_all(const socket_fd& s, std::string_view bytes);
// Reads what is there (at least one byte) and appends it to `out`; false at the end of
// the stream or on an error.
bool read_some(const socket_fd& s, std::string& out);

}  // namespace metad::repl
