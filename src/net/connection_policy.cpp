#include "net/connection_policy.hpp"

#include <utility>

namespace net {

policy_limits limits_of(const loop_options& options) {
  policy_limits limits;
  limits.idle_timeout_ms = options.idle_timeout_ms;
  limits.header_timeout_ms = options.header_timeout_ms;
  limits.drain_timeout_ms = options.drain_timeout_ms;
  return limits;
}

connection_policy::connection_policy(std::unique_ptr<connection_handler> handler, waker& peer,
                                     const policy_limits& limits, std::uint64_t now_ms)
    : handler_(std::move(handler)),
      peer_(peer),
      limits_(limits),
      deadline_ms_(now_ms + limits.idle_timeout_ms) {}

action connection_policy::next() {
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

action connection_policy::next_read() {
  const bool mid = handler_->mid_request();
  // Stopping: an idle connection closes, unless the client sent more before it could
  // know (those requests are served first).
  if (stopping_ && !mid && !peer_.input_pending()) return action::close;
  idle_ = !mid;
  if (idle_) handler_->trim();
  reading_ = true;
  return action::read;
}

void connection_policy::read_done(read_status status, std::size_t bytes, std::uint64_t now_ms) {
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

bool connection_policy::parking() {
  if (woken_) return false;
  waiting_ = true;
  return true;
}

void connection_policy::resumed() {
  waiting_ = false;
  woken_ = false;
  flow_ = handler_->on_resume();
}

void connection_policy::drained() {
  if (failed_) return;  // next() closes
  flow_ = handler_->on_drained();
}

void connection_policy::linger_started(std::uint64_t now_ms) {
  lingering_ = true;
  deadline_ms_ = now_ms + limits_.linger_ms;
  mid_request_ = true;  // no longer idle: only the deadline ends it
}

void connection_policy::discarded(read_status status) {
  ++discards_;
  if (status != read_status::data) ended_ = true;
}

bool connection_policy::wake() {
  woken_ = true;
  return waiting_;
}

bool connection_policy::shut() { return !std::exchange(shut_, true); }

bool connection_policy::stop(std::uint64_t now_ms) {
  stopping_ = true;
  drain_deadline_ms_ = now_ms + limits_.drain_timeout_ms;
  return reading_ && !mid_request_;
}

bool connection_policy::expired(std::uint64_t now_ms) const {
  if (waiting_ || shut_) return false;
  return (stopping_ && now_ms >= drain_deadline_ms_) || now_ms >= deadline_ms_;
}

}  // namespace net
