// lifo_pages: the free pages of one SGLang pool as the reference's LIFO stack (a list that
// starts [0, 1, ..., n-1], pops from the end, and takes freed pages on the end), stored as
// ascending runs: a fresh pool of any size (up to 2^48 pages) is one 16-byte run, and a
// page freed right above the top run extends it. Invariant: no page appears twice (the
// caller pushes only pages it took out of the free state). Owned by the pool's core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "metad/assert.hpp"

namespace metad::shard {

class lifo_pages {
 public:
  std::uint64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Pushes lo, lo+1, ..., hi-1 (hi-1 ends on top).
  void push_range(std::uint64_t lo, std::uint64_t hi) {
    METAD_ASSERT(lo <= hi);
    if (lo == hi) return;
    if (!runs_.empty() && runs_.back().hi == lo) {
      runs_.back().hi = hi;
    } else {
      runs_.push_back(run{lo, hi});
    }
    size_ += hi - lo;
  }
  void push(std::uint64_t page) { push_range(page, page + 1); }

  // The top page, removed. Precondition: !empty().
  std::uint64_t pop() {
    METAD_ASSERT(!runs_.empty());
    run& top = runs_.back();
    const std::uint64_t page = --top.hi;
    if (top.hi == top.lo) runs_.pop_back();
    --size_;
    return page;
  }

  // fn(lo, hi) for each run of pages lo..hi-1, from the bottom of the stack to its top
  // (hi-1 of the last run is handed out first).
  template <class Fn>
  void for_each_run(Fn&& fn) const {
    for (const run& r : runs_) fn(r.lo, r.hi);
  }
  std::size_t run_count() const { return runs_.size(); }

  void clear() {
    std::deque<run>().swap(runs_);
    size_ = 0;
  }
  std::size_t memory_bytes() const { return runs_.size() * sizeof(run); }

 private:
  struct run {
    std::uint64_t lo, hi;  // pages lo..hi-1, hi-1 nearest the top
  };
  // A deque: growing it never copies the runs already there (no stall at millions).
  std::deque<run> runs_;
  std::uint64_t size_ = 0;
};

}  // namespace metad::shard
