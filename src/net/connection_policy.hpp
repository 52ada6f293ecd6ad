// What one connection does next, decided without I/O: both transports (uring_loop.cpp,
// asio_loop.cpp) report what happened on the socket and carry out the action returned.
// It owns the connection's handler, its deadlines (idle, header, linger, drain) and the
// read / wait / drain / linger / close transitions of net::flow. The loop's core only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "net/transport.hpp"

namespace metad::net {

// What the loop does next. Before each one it starts sending the handler's output.
enum class action : std::uint8_t {
  read,     // read into handler().read_space(), then read_done() (idle(): give buffers back)
  park,     // if parking(): suspend until the waker fires; then resumed()
  drain,    // wait until every byte of the output is sent, then drained()
  linger,   // wait until every byte is sent, shut the write side, then linger_started()
  discard,  // read the peer's bytes into a scratch buffer and drop them; then discarded()
  close,    // wait until every byte is sent, then close the socket and free the connection
};

// How a read ended, as either transport sees it.
enum class read_status : std::uint8_t {
  data,       // bytes arrived
  cancelled,  // the loop cancelled it (stop()): look at the connection again
  ended,      // end of stream or an error
};

struct policy_limits {
  std::uint64_t idle_timeout_ms = 60'000;
  std::uint64_t header_timeout_ms = 10'000;  // a whole request, from its first byte
  std::uint64_t drain_timeout_ms = 5'000;    // after stop(), whatever the connection does
  // A closing connection reads and drops what the peer still sends (a refused body): a
  // close with unread input sends a reset, which can destroy the answer before the peer
  // reads it. For at most this long, and this many reads.
  std::uint64_t linger_ms = 1'000;
  int linger_reads_max = 64;
};

policy_limits limits_of(const loop_options& options);

class connection_policy {
 public:
  // `peer` is the connection's waker (input_pending() is asked while stopping).
  connection_policy(std::unique_ptr<connection_handler> handler, waker& peer,
                    const policy_limits& limits, std::uint64_t now_ms);

  connection_handler& handler() { return *handler_; }

  // The next action: ask once after each event below (the first time after
  // construction). Before a read it may trim the handler, and while stopping it asks the
  // peer whether input is pending.
  action next();
  // After action::read: whether the connection was idle (the loop may shrink its buffers).
  bool idle() const { return idle_; }

  // Events of the connection.
  void read_done(read_status status, std::size_t bytes, std::uint64_t now_ms);
  bool parking();  // false: already woken, do not suspend
  void resumed();
  void drained();
  void linger_started(std::uint64_t now_ms);
  void discarded(read_status status);
  void send_failed() { failed_ = true; }
  bool failed() const { return failed_; }

  // From waker::wake(): true if the loop must resume the parked connection.
  bool wake();
  // The socket is to be shut down (a timeout, a failed send): true the first time.
  bool shut();
  // The loop stops: true if the pending read is to be cancelled (an idle connection,
  // which may hold a request it has not read yet; read() then looks again).
  bool stop(std::uint64_t now_ms);
  // The sweep: true if the connection's time is up (the loop counts it and shuts it).
  // A parked request is on another core and finishes quickly: it is never cut.
  bool expired(std::uint64_t now_ms) const;

 private:
  action next_read();

  std::unique_ptr<connection_handler> handler_;
  waker& peer_;
  policy_limits limits_;
  flow flow_ = flow::read;
  std::uint64_t deadline_ms_;
  std::uint64_t drain_deadline_ms_ = 0;
  int discards_ = 0;
  bool mid_request_ = false;  // as of the last read: a request was partly received
  bool idle_ = false;
  bool reading_ = false;
  bool waiting_ = false;
  bool woken_ = false;
  bool shut_ = false;
  bool failed_ = false;
  bool ended_ = false;
  bool stopping_ = false;
  bool lingering_ = false;
};

// Called for every request, so inline in both loops: out of line, the uring loop's
// serve path took 1,896 instead of 1,861 instructions per GET /health (callgrind).
inline action connection_policy::next() {
  if (failed_ || ended_) return action::close;
  switch (flow_) {
    case flow::close:
      if (!lingering_) return action::linger;
      if (discards_ < limits_.linger_reads_max && !shut_) return action::discard;
      return action::close;
    case flow::wait:
      return action::park;
    case flow::drain:
      return action::drain;
    case flow::read:
      break;
  }
  return next_read();
}

inline action connection_policy::next_read() {
  const bool mid = handler_->mid_request();
  // Stopping: an idle connection closes, unless the client sent more before it could
  // know (those requests are served first).
  if (stopping_ && !mid && !peer_.input_pending()) return action::close;
  idle_ = !mid;
  if (idle_) handler_->trim();
  reading_ = true;
  return action::read;
}

inline void connection_policy::read_done(read_status status, std::size_t bytes,
                                         std::uint64_t now_ms) {
  reading_ = false;
  if (status == read_status::cancelled && !shut_) return;  // stop(): read again, or close
  if (status != read_status::data || shut_ || failed_) {
    ended_ = true;
    return;
  }
  flow_ = handler_->on_bytes(bytes);
  const bool mid = handler_->mid_request();
  if (!mid) {
    deadline_ms_ = now_ms + limits_.idle_timeout_ms;
  } else if (!mid_request_) {
    deadline_ms_ = now_ms + limits_.header_timeout_ms;  // whole request, not per byte
  }
  mid_request_ = mid;
}

}  // namespace metad::net
