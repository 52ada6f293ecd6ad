// The reservations of one rank in the order they were made, for expiry: since every
// reservation gets the same TTL, that order is also the order of their deadlines, so the
// due ones are always at the front. An entry whose reservation ended early (confirmed or
// released) stays until it reaches the front or a compaction drops it; compaction runs
// when stale entries outnumber live ones, so the queue stays within a constant factor of
// the reserved pages and every entry is touched O(1) times. Owned by the rank's core.
//
// Invariants (verify(); the owner checks the last one with for_each_pending):
// - the popped prefix ends within the entries (head <= entries);
// - the pending entries are in order of their deadlines (so the due ones are in front);
// - every reservation that holds a page and has a deadline has a pending entry with
//   that page and deadline (else it would never expire).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace metad::shard {

class reservation_queue {
 public:
  struct entry {
    std::uint64_t deadline;
    std::uint32_t page;
  };

  std::size_t size() const { return entries_.size() - head_; }

  // Appends a reservation. `live(entry)` says whether an entry's reservation still
  // holds; `live_count` is how many do (the reserved pages), for compaction.
  template <typename Live>
  void push(std::uint32_t page, std::uint64_t deadline, std::size_t live_count, Live&& live) {
    entries_.push_back(entry{deadline, page});
    if (size() > 2 * live_count + 64) compact(live);
  }

  // Calls expire(page) for each live entry whose deadline has come (<= now), in order.
  template <typename Live, typename Expire>
  std::size_t pop_due(std::uint64_t now, Live&& live, Expire&& expire) {
    std::size_t expired = 0;
    while (head_ < entries_.size() && entries_[head_].deadline <= now) {
      const entry e = entries_[head_++];
      if (!live(e)) continue;
      expire(e.page);
      ++expired;
    }
    if (head_ == entries_.size()) {
      entries_.clear();
      head_ = 0;
    } else if (head_ > 64 && head_ * 2 > entries_.size()) {
      entries_.erase(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
    return expired;
  }

  void clear() {
    entries_.clear();
    head_ = 0;
  }

  // Calls fn(const entry&) for each entry not yet popped (live or not), in queue order.
  template <typename Fn>
  void for_each_pending(Fn&& fn) const {
    for (std::size_t i = head_; i < entries_.size(); ++i) fn(entries_[i]);
  }

  // The queue's own invariants above, O(size()): "" when they hold, else the first broken.
  std::string verify() const {
    if (head_ > entries_.size()) return "reservation_queue: the popped prefix is past the end";
    for (std::size_t i = head_ + 1; i < entries_.size(); ++i) {
      if (entries_[i - 1].deadline > entries_[i].deadline) {
        return "reservation_queue: entry " + std::to_string(i - head_) +
               " is due before the one ahead of it";
      }
    }
    return {};
  }

 private:
  template <typename Live>
  void compact(Live&& live) {
    entries_.erase(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
    entries_.erase(
        std::remove_if(entries_.begin(), entries_.end(), [&](const entry& e) { return !live(e); }),
        entries_.end());
  }

  template <class>
  friend struct verify_access;  // tests: breaks an invariant to see verify() report it

  std::vector<entry> entries_;
  std::size_t head_ = 0;  // entries before it were popped
};

}  // namespace metad::shard
