// The pages of one rank as bitmaps: free bits with summary levels above them (so the
// lowest free page is found in O(levels), not by a scan) and bound bits. A page that is
// neither free nor bound is reserved. About 2.03 bits per page. Owned by the rank's core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace metad::shard {

enum class page_state : std::uint8_t { free, reserved, bound };

class page_pool {
 public:
  // Pages are uint32 and key-map entries keep 31 bits of page number.
  static constexpr std::uint32_t pages_max = (std::uint32_t{1} << 31) - 1;

  page_pool() = default;
  explicit page_pool(std::uint32_t num_pages) { grow(num_pages); }

  // Adds free pages up to new_pages (>= num_pages()); existing pages keep their state.
  void grow(std::uint32_t new_pages);
  // Drops the pages from new_pages (> 0, <= num_pages()) on, which must all be free.
  void shrink(std::uint32_t new_pages);

  std::uint32_t num_pages() const { return num_pages_; }
  std::uint32_t free_count() const { return free_count_; }
  std::uint32_t bound_count() const { return bound_count_; }
  std::uint32_t reserved_count() const { return num_pages_ - free_count_ - bound_count_; }

  // The lowest free page, now reserved. Precondition: free_count() > 0.
  std::uint32_t take_lowest();
  // free → reserved, for one given page (recovery). Precondition: it is free.
  void take(std::uint32_t page);
  // reserved → bound.
  void bind(std::uint32_t page);
  // reserved → free.
  void release(std::uint32_t page);
  // bound → free (a key deleted or evicted).
  void free_bound(std::uint32_t page);

  page_state state(std::uint32_t page) const;

  // Heap bytes held by the bitmaps.
  std::size_t memory_bytes() const;
  // ... by those of a pool of num_pages pages.
  static std::size_t bytes_for(std::uint32_t num_pages);
  // Summary levels agree with the free bits, counts agree with popcounts, no page is
  // both free and bound, no bit beyond num_pages. "" when consistent.
  std::string check() const;

 private:
  void set_free(std::uint32_t page);
  void clear_free(std::uint32_t page);
  void rebuild_summaries();

  // levels_[0]: one bit per page, set when free. levels_[k + 1]: one bit per word of
  // levels_[k], set when that word is non-zero. The last level is exactly one word.
  std::vector<std::vector<std::uint64_t>> levels_;
  std::vector<std::uint64_t> bound_;  // one bit per page, set when bound
  std::uint32_t num_pages_ = 0;
  std::uint32_t free_count_ = 0;
  std::uint32_t bound_count_ = 0;
};

}  // namespace metad::shard
