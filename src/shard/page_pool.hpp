// The pages of one vLLM rank, costing what is used: a pool declares num_pages (up to
// pages_max, 2^48) but holds state only for the pages below its high-water mark, the
// pages it ever handed out (lowest free first, so the mark is the most pages it ever
// held at once, plus those recovery restored). Every page at or above the mark is free
// and costs nothing; initialize and grow are O(1). Below the mark: free bits with summary
// levels above them (so the lowest free page is found in O(levels), not by a scan) and
// bound bits; a page that is neither free nor bound is reserved. About 2.03 bits per
// page below the mark. Owned by the rank's core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace metad::shard {

enum class page_state : std::uint8_t { free, reserved, bound };

class page_pool {
 public:
  // The largest num_pages (the default of --pages-per-rank-max).
  static constexpr std::uint64_t pages_max = std::uint64_t{1} << 48;
  // Pages handed out are numbered below this: key-map entries keep 31 bits of page
  // number. A rank holds at most this many pages at once (past it an allocation is
  // answered as by a full pool); the memory budget refuses long before.
  static constexpr std::uint32_t held_max = (std::uint32_t{1} << 31) - 1;

  page_pool() = default;
  explicit page_pool(std::uint64_t num_pages) { grow(num_pages); }

  // Adds free pages up to new_pages (>= num_pages(), <= pages_max); existing pages keep
  // their state. O(1).
  void grow(std::uint64_t new_pages);
  // Drops the pages from new_pages (> 0, <= num_pages()) on, which must all be free.
  void shrink(std::uint64_t new_pages);

  std::uint64_t num_pages() const { return num_pages_; }
  // Pages ever handed out (every page from here on is free and holds no memory).
  std::uint32_t high_water() const { return high_; }
  std::uint64_t free_count() const { return num_pages_ - high_ + free_below_; }
  std::uint32_t bound_count() const { return bound_count_; }
  std::uint32_t reserved_count() const { return high_ - free_below_ - bound_count_; }
  // Free pages take_lowest() can hand out: free_count() less those numbered past held_max.
  std::uint64_t available() const;

  // The lowest free page, now reserved. Precondition: available() > 0.
  std::uint32_t take_lowest();
  // Whether take(page) may be called: the page exists, is free and below held_max.
  bool can_take(std::uint64_t page) const {
    return page < num_pages_ && page < held_max && state(page) == page_state::free;
  }
  // free → reserved, for one given page (recovery). Precondition: can_take(page).
  void take(std::uint32_t page);
  // reserved → bound.
  void bind(std::uint32_t page);
  // reserved → free.
  void release(std::uint32_t page);
  // bound → free (a key deleted or evicted).
  void free_bound(std::uint32_t page);

  // Any page number: free at or above the high-water mark (or past the end).
  page_state state(std::uint64_t page) const;

  // Heap bytes held by the bitmaps.
  std::size_t memory_bytes() const;
  // Summary levels agree with the free bits, counts agree with popcounts, no page is
  // both free and bound, no bit at or beyond the high-water mark. "" when consistent.
  std::string check() const;

 private:
  void set_free(std::uint32_t page);
  void clear_free(std::uint32_t page);
  void rebuild_summaries();
  // The bitmaps cover at least `pages` pages (growing geometrically).
  void cover(std::uint64_t pages);
  // Raises the high-water mark to `to`: the pages in between become free below it.
  void raise_to(std::uint32_t to);

  // levels_[0]: one bit per page below the bitmaps' capacity, set when free (never at or
  // above high_). levels_[k + 1]: one bit per word of levels_[k], set when that word is
  // non-zero. The last level is exactly one word.
  std::vector<std::vector<std::uint64_t>> levels_;
  std::vector<std::uint64_t> bound_;  // one bit per page, set when bound
  std::uint64_t num_pages_ = 0;
  std::uint32_t high_ = 0;        // pages [0, high_) have state bits
  std::uint32_t free_below_ = 0;  // free pages below high_
  std::uint32_t bound_count_ = 0;
};

}  // namespace metad::shard
