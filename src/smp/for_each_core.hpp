// Walks over the cores: the order a walk visits them in (walk_from) and for_each_core,
// which visits the wanted ones, each on its own thread, and comes back. Called from a
// coroutine on a core (this_core() >= 0).
#pragma once

#include <type_traits>

#include "smp/core.hpp"
#include "smp/mailbox.hpp"
#include "smp/request_task.hpp"

namespace metad::smp {

// The cores first, first + 1, ... wrapping around: each of the `cores` once.
//   for (const int c : walk_from(home, mb.cores())) { co_await mb.hop_to(c); ... }
// For walks that end elsewhere than where they began; else for_each_core.
class walk_from {
 public:
  walk_from(int first, int cores) : first_(first), cores_(cores) {}
  struct iterator {
    int first, cores, step;
    int operator*() const { return (first + step) % cores; }
    iterator& operator++() {
      ++step;
      return *this;
    }
    bool operator!=(const iterator& other) const { return step != other.step; }
  };
  iterator begin() const { return {first_, cores_, 0}; }
  iterator end() const { return {first_, cores_, cores_}; }

 private:
  int first_, cores_;
};

// Visits each core c with wanted(c), in walk_from(first) order, on c's own thread, then
// comes back to the core it was called on (its frame is freed where it was allocated).
// visit(c) returns void, or bool, or a subtask<bool> that is awaited on core c (and must
// end there); false ends the walk at once, and for_each_core then returns false.
template <typename Wanted, typename Visit>
subtask<bool> for_each_core(mailbox& mb, int first, Wanted wanted, Visit visit) {
  const int home = this_core();
  bool going = true;
  for (const int c : walk_from(first, mb.cores())) {
    if (!wanted(c)) continue;
    co_await mb.hop_to(c);
    using result = std::invoke_result_t<Visit&, int>;
    if constexpr (std::is_void_v<result>) {
      visit(c);
    } else if constexpr (std::is_same_v<result, bool>) {
      going = visit(c);
    } else {
      going = co_await visit(c);
    }
    if (!going) break;
  }
  co_await mb.hop_to(home);
  co_return going;
}

// for_each_core's `wanted` for a walk over every core.
inline bool every_core(int) { return true; }

}  // namespace metad::smp
