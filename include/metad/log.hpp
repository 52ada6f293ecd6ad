// One-line log events on stderr: timestamp, level, core, message. The threshold is
// process-wide and set once at start-up; any thread may log.
#pragma once

#include <fmt/core.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <ctime>
#include <mutex>
#include <string>
#include <string_view>

#include "metad/config.hpp"

namespace metad::log {

inline std::atomic<log_level> threshold{log_level::info};
// The core index of the calling thread (-1: not a core thread).
inline thread_local int current_core = -1;

// The last warning and error lines, for the status page (GET /status.json): a small
// ring under a mutex, written only by warn() and error() (rare, never per request on the
// hot path) and read by the page's poll. Log lines carry no tokens.
struct recent_line {
  std::int64_t unix_ms = 0;
  log_level level = log_level::warn;
  std::string message;
};
class recent_lines {
 public:
  static constexpr std::size_t kCapacity = 32;
  static constexpr std::size_t kMessageBytesMax = 512;
  void add(std::int64_t unix_ms, log_level level, std::string_view message) {
    std::lock_guard<std::mutex> lock(mutex_);
    recent_line& slot = lines_[next_ % kCapacity];
    slot.unix_ms = unix_ms;
    slot.level = level;
    slot.message.assign(message.substr(0, kMessageBytesMax));
    ++next_;
  }
  // visit(const recent_line&) for each kept line, the newest first, at most n.
  template <typename Visit>
  void newest(std::size_t n, Visit&& visit) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t kept = next_ < kCapacity ? static_cast<std::size_t>(next_) : kCapacity;
    for (std::size_t i = 0; i < kept && i < n; ++i) visit(lines_[(next_ - 1 - i) % kCapacity]);
  }
  std::uint64_t total() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return next_;
  }

 private:
  mutable std::mutex mutex_;
  std::array<recent_line, kCapacity> lines_{};
  std::uint64_t next_ = 0;
};
inline recent_lines recent_warnings;

// At most `max` bytes of text someone else chose (a peer's node name, a certificate's
// name, an etcd value), printable in a log line: anything but printable ASCII, and '\\'
// and ',' (names are listed comma-separated), as \xNN; longer text ends "... (N bytes)".
inline std::string printable(std::string_view text, std::size_t max = 96) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= ' ' && c <= '~' && c != '\\' && c != ',') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (text.size() > max) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

inline void write(log_level level, std::string_view message) {
  static constexpr std::string_view names[] = {"error", "warn", "info", "debug"};
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm utc{};
  gmtime_r(&now.tv_sec, &utc);
  // One fmt::print call per line: lines from different cores do not interleave.
  fmt::print(stderr, "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z {} core={} {}\n",
             utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
             now.tv_nsec / 1'000'000, names[static_cast<int>(level)], current_core, message);
  if (level <= log_level::warn)
    recent_warnings.add(static_cast<std::int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1'000'000,
                        level, message);
}

template <typename... Args>
void at(log_level level, fmt::format_string<Args...> format, Args&&... args) {
  if (level > threshold.load(std::memory_order_relaxed)) return;
  write(level, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... a) {
  at(log_level::error, f, std::forward<Args>(a)...);
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... a) {
  at(log_level::warn, f, std::forward<Args>(a)...);
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... a) {
  at(log_level::info, f, std::forward<Args>(a)...);
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... a) {
  at(log_level::debug, f, std::forward<Args>(a)...);
}

}  // namespace metad::log
