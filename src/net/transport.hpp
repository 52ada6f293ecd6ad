// The contract between a per-core event loop (uring or epoll) and whoever handles the
// bytes. The loop only moves bytes, accepts, times out and closes; it knows nothing of
// HTTP. Everything here runs on the loop's own core thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "smp/flush_job.hpp"

namespace metad::net {

// What the loop does next with a connection.
enum class flow : std::uint8_t {
  read,   // send any output, then read more input
  wait,   // work is pending elsewhere: don't read; wake() will follow
  drain,  // the unsent output reached its bound: send all of it, then on_drained()
  close,  // send any output, then close
};

// A handler's handle on its connection: resumes it after flow::wait (same thread, any
// time later; the loop defers the actual resumption to its own iteration).
class waker {
 public:
  virtual void wake() = 0;
  // Bytes have arrived that the handler has not been given yet (the loop peeks at the
  // socket; a syscall, so only worth asking while stopping).
  virtual bool input_pending() = 0;

 protected:
  ~waker() = default;
};

class connection_handler {
 public:
  virtual ~connection_handler() = default;
  // Where the next read goes.
  virtual std::span<char> read_space() = 0;
  // `bytes` arrived in read_space().
  virtual flow on_bytes(std::size_t bytes) = 0;
  // Pending work finished (after waker::wake()).
  virtual flow on_resume() = 0;
  // Every byte of the output was sent (after flow::drain): go on with buffered input.
  // Reading stops meanwhile, so a client that sends requests without reading answers
  // holds a bounded amount of the server's memory.
  virtual flow on_drained() = 0;
  // The connection is idle (no request in progress, its answers handed over): give back
  // buffer memory above a small steady size, whatever the last request needed.
  virtual void trim() = 0;
  // Bytes to send; the loop sends them all and then clears the string.
  virtual std::string& output() = 0;
  // A request is partly received: the header timeout applies instead of the idle one.
  virtual bool mid_request() const = 0;
};

// A durable write the loop performs for the server (its log's group commit).
using flush_job = smp::flush_job;

// The server side of one core's loop.
class core_hooks {
 public:
  virtual std::unique_ptr<connection_handler> open(waker& w) = 0;
  // Cross-core work: resume what other cores handed over. Returns the count.
  virtual std::size_t poll() = 0;
  // About to block: false if work arrived meanwhile.
  virtual bool prepare_sleep() = 0;
  virtual void woke() = 0;
  // Readable when another core wants this one awake.
  virtual int wake_fd() = 0;
  // Stop was requested: stop accepting, finish what is in flight.
  virtual bool stopping() = 0;
  // This loop has no connections left after a stop; true once every core's loop may
  // exit (until then the loop keeps serving cross-core work).
  virtual bool may_exit() = 0;
  // Called about every 250 ms (timeouts are swept at the same pace).
  virtual void tick() = 0;
  // Once per loop iteration when no flush is in flight: a write to issue now, if any.
  // retry_failed: the tick came by, so a write that failed may be tried again.
  virtual bool take_flush(flush_job& job, bool retry_failed) = 0;
  // The write's result (bytes or -errno) and the fdatasync's (0 or -errno).
  virtual void flush_done(long written, int synced) = 0;

 protected:
  ~core_hooks() = default;
};

// Per-core connection counters, written by the loop, read on the same core only.
struct loop_stats {
  std::uint64_t accepted = 0, closed = 0, rejected = 0, timed_out = 0;
};

struct loop_options {
  std::vector<int> listen_fds;  // TCP and/or unix listening sockets, all accepted from
  std::uint32_t idle_timeout_ms = 60'000;
  std::uint32_t header_timeout_ms = 10'000;
  std::uint32_t drain_timeout_ms = 5'000;
  std::uint32_t connections_max = 16'384;
  loop_stats* stats = nullptr;  // required
};

// Run until hooks.may_exit(). Throw std::system_error if the loop cannot start.
void run_uring_loop(const loop_options& options, core_hooks& hooks);
void run_epoll_loop(const loop_options& options, core_hooks& hooks);

// Whether this process may create io_uring instances (containers often forbid it).
bool uring_available();

// A non-blocking listening TCP socket with SO_REUSEPORT bound to host:port (port 0:
// an ephemeral port). Throws std::system_error.
int listen_tcp(const std::string& host, std::uint16_t port, int backlog = 4096);
std::uint16_t local_port(int fd);
// A non-blocking listening unix stream socket at `path` (a stale socket file there is
// replaced). Throws std::system_error.
int listen_unix(const std::string& path, int backlog = 4096);

}  // namespace metad::net
