// The one assertion of the code base, always on (release builds included): a violated
// invariant means the state is corrupt or a caller broke a contract, so the process
// logs the condition and where it failed, then aborts, rather than answer wrongly.
// For invariants and programming errors only; bad input is answered, never asserted.
#pragma once

#include <cstdlib>

#include "metad/log.hpp"

namespace metad::detail {

[[noreturn]] inline void assert_failed(const char* what, const char* file, int line) {
  log::write(log_level::error, fmt::format("invariant violated at {}:{}: {}", file, line, what));
  std::abort();
}

}  // namespace metad::detail

#define METAD_ASSERT(cond) \
  ((cond) ? static_cast<void>(0) : ::metad::detail::assert_failed(#cond, __FILE__, __LINE__))
