// What both transports do when accept fails for lack of file descriptors (EMFILE: the
// process's limit; ENFILE: the system's): every retry would fail at once until some
// connection closes, burning a core and flooding the log. So they stop accepting for a
// while (pending connections wait in the listen backlog) and log this at most once a
// second. Owned by one loop; no locking.
#pragma once

#include <cerrno>
#include <cstdint>
#include <system_error>

#include "metad/log.hpp"

namespace metad::net {

class accept_backoff {
 public:
  static constexpr std::uint32_t pause_ms = 100;

  static bool out_of_descriptors(int err) { return err == EMFILE || err == ENFILE; }

  // One such failure (errno `err`) at now_ms.
  void failed(std::uint64_t now_ms, int err) {
    ++failures_;
    if (now_ms < next_log_ms_) return;
    metad::log::warn(
        "accept failed {} time(s) in the last second: {}; accepting pauses, new connections "
        "wait in the listen backlog until connections close (raise LimitNOFILE / ulimit -n?)",
        failures_, std::system_category().message(err));
    failures_ = 0;
    next_log_ms_ = now_ms + 1000;
  }

 private:
  std::uint64_t next_log_ms_ = 0;
  std::uint64_t failures_ = 0;
};

}  // namespace metad::net
