#include "repl/sync_set.hpp"

namespace metad::repl {

namespace {
constexpr std::uint64_t kNsPerMs = 1'000'000;
}

void ack_latency::on_ack(std::uint64_t latency_ns, std::uint64_t now_ns) {
  const auto l = static_cast<double>(latency_ns);
  ewma_ns_ = ewma_ns_ == 0 ? l : ewma_ns_ + (l - ewma_ns_) / 4;
  if (ewma_ns_ <= static_cast<double>(bound_ns_) / 2) {
    slow_since_ns_ = 0;
    slow_acks_ = 0;
    return;
  }
  // Late since the write this ack covers was sent.
  if (slow_since_ns_ == 0) slow_since_ns_ = now_ns > latency_ns ? now_ns - latency_ns : 1;
  ++slow_acks_;
}

// A core whose standby has been silent past its bound, or (in the set) whose stream
// ended or is not caught up.
bool sync_set::lagging(const sync_inputs& in, bool in_set) const {
  const std::uint64_t bound =
      (in_set ? config_.sync_timeout_ms : config_.catch_up_silence_ms) * kNsPerMs;
  for (const core_report& c : in.cores) {
    if (in_set && c.state != progress::caught_up) return true;
    if (c.oldest_unacked_ns != 0 && in.now_ns > c.oldest_unacked_ns &&
        in.now_ns - c.oldest_unacked_ns > bound)
      return true;
  }
  return false;
}

// A core whose standby has acked late on average for long enough.
bool sync_set::slow(const sync_inputs& in) const {
  const std::uint64_t window = 4 * config_.sync_timeout_ms * kNsPerMs;
  for (const core_report& c : in.cores)
    if (c.slow_since_ns != 0 && in.now_ns > c.slow_since_ns &&
        in.now_ns - c.slow_since_ns >= window && c.slow_acks >= config_.slow_acks_min)
      return true;
  return false;
}

sync_actions sync_set::step(const sync_inputs& in) {
  using A = sync_actions;
  A out;
  if (in.epoch != epoch_) {  // a new leadership (or none): its /sync lists no standby
    epoch_ = in.epoch;
    if (state_ != state::alone) {
      out.require = A::require_change::off;
      out.why = A::reason::new_epoch;
      state_ = state::alone;
      return out;
    }
  }
  if (in.epoch == 0) return out;
  auto all_caught_up = [&] {
    for (const core_report& c : in.cores)
      if (c.state != progress::caught_up) return false;
    return !in.cores.empty();
  };
  switch (state_) {
    case state::alone:
      if (lagging(in, false)) {
        out.close_streams = true;
        out.why = A::reason::catch_up_silent;
      } else if (all_caught_up() && in.now_ns >= rejoin_after_ns_) {
        out.require = A::require_change::on;  // into the ack set first
        out.why = A::reason::caught_up;
        state_ = state::requiring;
      }
      return out;
    case state::requiring:
      if (lagging(in, true)) {  // not yet named in /sync: release at once
        out.require = A::require_change::off;
        out.close_streams = true;
        out.why = A::reason::lost_before_sync;
        state_ = state::alone;
        return out;
      }
      for (const core_report& c : in.cores)
        if (!c.require_applied) return out;
      out.write = A::sync_write::standby;
      state_ = state::publishing;
      return out;
    case state::publishing:
    case state::in_sync: {
      const bool gone = lagging(in, true);
      const bool late = !gone && slow(in);
      if (gone || late) {
        if (late) rejoin_after_ns_ = in.now_ns + config_.slow_rejoin_ms * kNsPerMs;
        out.close_streams = true;
        out.write = A::sync_write::nobody;  // /sync first; the requirement stays until then
        out.why = late ? A::reason::late_acks : A::reason::stopped_acking;
        state_ = state::dropping;
      } else if (state_ == state::publishing && in.written) {
        out.why = A::reason::published;
        state_ = state::in_sync;
      }
      return out;
    }
    case state::dropping:
      if (!in.written) return out;  // until /sync no longer names it
      out.require = A::require_change::off;
      out.why = A::reason::dropped;
      state_ = state::alone;
      return out;
  }
  return out;
}

const char* to_string(sync_set::state s) {
  switch (s) {
    case sync_set::state::alone:
      return "alone";
    case sync_set::state::requiring:
      return "requiring";
    case sync_set::state::publishing:
      return "publishing";
    case sync_set::state::in_sync:
      return "in_sync";
    case sync_set::state::dropping:
      return "dropping";
  }
  return "?";
}

}  // namespace metad::repl
