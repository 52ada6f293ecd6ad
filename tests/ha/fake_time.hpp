// The fake clock of the ha tests: t0 and at(m), m milliseconds after it.
#pragma once

#include <chrono>

#include "ha/leadership.hpp"

namespace metad::ha::fake_time {

using ms = std::chrono::milliseconds;
inline const time_point t0{std::chrono::seconds(1000)};
inline time_point at(long long m) { return t0 + ms(m); }

}  // namespace metad::ha::fake_time
