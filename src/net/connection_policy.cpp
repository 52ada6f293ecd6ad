#include "net/connection_policy.hpp"

#include <utility>

namespace metad::net {

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

}  // namespace metad::net
