// Invariants as code. Each shard structure (dual_key_map, key_life, reservation_queue,
// directory, rank_table, sglang_pool, sglang_pools) has a `std::string verify() const`:
// an O(n) walk that checks every invariant its header lists, returning "" when they all
// hold, else a description of the first broken one. It is never on the release hot path:
// the randomized model tests (tests/shard) and the fuzzers run it after every step, and
// the sanitizer builds turn on METAD_VERIFY (CMakeLists.txt), under which the directory,
// the rank table and the SGLang pools verify themselves after their mutating operations
// through METAD_VERIFY_AFTER below, aborting (METAD_ASSERT's way) on a broken invariant.
//
// METAD_VERIFY_AFTER's cost bound: a structure of n entries is verified after an
// operation when the operation's count (per call site and thread) is a multiple of
// 2^k, the smallest power of two >= n / verify_budget: after every operation while
// n < 2 * verify_budget (32), and in general at most verify_budget (16) entries checked
// per operation, amortised, whatever n is. So a test that builds a million bindings pays
// a constant factor (~16 entry checks per call), not a quadratic cost.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

#include "metad/assert.hpp"

namespace metad::shard {

#ifdef METAD_VERIFY
inline constexpr bool verify_enabled = true;
#else
inline constexpr bool verify_enabled = false;
#endif

inline constexpr std::size_t verify_budget = 16;

// Tests only: specialised in tests/shard/verify_test.cpp to reach a structure's members
// and break an invariant, to see verify() report it (the structures befriend it).
template <class T>
struct verify_access;

// Aborts with `what` and the broken invariant when `problem` is not empty.
inline void verify_or_die(const char* what, const std::string& problem, const char* file,
                          int line) {
  if (problem.empty()) return;
  const std::string message = std::string(what) + ": " + problem;
  ::metad::detail::assert_failed(message.c_str(), file, line);
}

// Whether the operation just counted by `ops` should be followed by a verify of a
// structure of n entries (see the cost bound above).
inline bool verify_due(std::uint64_t& ops, std::size_t n) {
  ++ops;
  const std::uint64_t period = std::bit_ceil(std::max<std::uint64_t>(1, n / verify_budget));
  return (ops & (period - 1)) == 0;
}

}  // namespace metad::shard

// After a mutating operation on a structure of about n entries: with METAD_VERIFY, when
// verify_due says so, evaluates `problem` (a verify() call: "" or the broken invariant)
// and aborts naming `what` if it is not empty; without METAD_VERIFY, nothing (`problem`
// is not evaluated). One counter per call site and thread (each core's state is its own).
#define METAD_VERIFY_AFTER(what, n, problem)                                  \
  do {                                                                        \
    if constexpr (::metad::shard::verify_enabled) {                           \
      static thread_local std::uint64_t metad_verify_ops_ = 0;                \
      if (::metad::shard::verify_due(metad_verify_ops_, (n)))                 \
        ::metad::shard::verify_or_die((what), (problem), __FILE__, __LINE__); \
    }                                                                         \
  } while (false)
