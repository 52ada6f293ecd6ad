// The monotonic clock the server times requests, group commits and the summary with.
// Any thread may call these.
#pragma once

#include <time.h>

#include <cstdint>

namespace metad::smp {

inline constexpr std::uint64_t kNsPerMs = 1'000'000;

inline std::uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

// Coarse (a few ms), cheaper: for periodic work only.
inline std::uint64_t monotonic_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000 +
         static_cast<std::uint64_t>(ts.tv_nsec) / 1'000'000;
}

}  // namespace metad::smp
