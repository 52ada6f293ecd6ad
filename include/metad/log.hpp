// One-line log events on stderr: timestamp, level, core, message. The threshold is
// process-wide and set once at start-up; any thread may log.
#pragma once

#include <fmt/core.h>

#include <atomic>
#include <ctime>
#include <string_view>

#include "metad/config.hpp"

namespace metad::log {

inline std::atomic<log_level> threshold{log_level::info};
// The core index of the calling thread (-1: not a core thread).
inline thread_local int current_core = -1;

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
