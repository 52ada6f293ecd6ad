// Always-on invariant checks for the shard module (TigerBeetle style): a violated
// invariant means the state is corrupt, so the process stops rather than answer wrongly.
// Internal to src/shard; any core may use it.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace shard::detail {

[[noreturn]] inline void check_failed(const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: shard invariant violated: %s\n", file, line, what);
  std::abort();
}

}  // namespace shard::detail

#define SHARD_CHECK(cond) \
  ((cond) ? static_cast<void>(0) : ::shard::detail::check_failed(#cond, __FILE__, __LINE__))
