#include "shard/page_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "metad/assert.hpp"

namespace metad::shard {
namespace {

constexpr std::uint64_t bit(std::uint64_t i) { return std::uint64_t{1} << (i % 64); }
constexpr std::size_t words_for(std::uint64_t bits) {
  return static_cast<std::size_t>((bits + 63) / 64);
}

// A copy of `v` resized to exactly `words`, new words zero.
std::vector<std::uint64_t> resized_exact(const std::vector<std::uint64_t>& v, std::size_t words) {
  std::vector<std::uint64_t> out(words, 0);
  std::copy_n(v.begin(), std::min(v.size(), words), out.begin());
  return out;
}

}  // namespace

void page_pool::grow(std::uint64_t new_pages) {
  METAD_ASSERT(new_pages >= num_pages_ && new_pages <= pages_max);
  num_pages_ = new_pages;  // the new pages lie above the high-water mark: free, no state
}

void page_pool::shrink(std::uint64_t new_pages) {
  METAD_ASSERT(new_pages > 0 && new_pages <= num_pages_);
  if (new_pages < high_) {
    const auto to = static_cast<std::uint32_t>(new_pages);
    for (std::uint32_t p = to; p < high_; ++p) METAD_ASSERT(state(p) == page_state::free);
    free_below_ -= high_ - to;
    high_ = to;
    const std::size_t words = words_for(high_);
    levels_[0] = resized_exact(levels_[0], words);
    bound_ = resized_exact(bound_, words);
    if (high_ % 64 != 0) levels_[0].back() &= bit(high_) - 1;  // no bit at the mark or past
    if (words == 0) {
      levels_.clear();
    } else {
      rebuild_summaries();
    }
  }
  num_pages_ = new_pages;
}

void page_pool::cover(std::uint64_t pages) {
  const std::size_t need = words_for(pages);
  const std::size_t have = levels_.empty() ? 0 : levels_[0].size();
  if (need <= have) return;
  // Doubling (amortised O(1) per page), but never past what the pool can hand out.
  const std::size_t limit = words_for(std::min<std::uint64_t>(num_pages_, held_max));
  const std::size_t words = std::max(need, std::min(limit, std::max<std::size_t>(have * 2, 1)));
  if (levels_.empty()) levels_.emplace_back();
  levels_[0] = resized_exact(levels_[0], words);
  bound_ = resized_exact(bound_, words);
  rebuild_summaries();
}

void page_pool::raise_to(std::uint32_t to) {
  if (to <= high_) return;
  cover(to);
  for (std::uint32_t p = high_; p < to; ++p) set_free(p);
  free_below_ += to - high_;
  high_ = to;
}

void page_pool::rebuild_summaries() {
  levels_.resize(1);
  while (levels_.back().size() > 1) {
    const auto& below = levels_.back();
    std::vector<std::uint64_t> above(words_for(below.size()), 0);
    for (std::size_t w = 0; w < below.size(); ++w) {
      if (below[w] != 0) above[w / 64] |= bit(w);
    }
    levels_.push_back(std::move(above));
  }
}

std::uint64_t page_pool::available() const {
  return free_below_ + (std::min<std::uint64_t>(num_pages_, held_max) - high_);
}

std::uint32_t page_pool::take_lowest() {
  if (free_below_ == 0) {  // every page below the mark is held: the mark's page is next
    METAD_ASSERT(high_ < num_pages_ && high_ < held_max);
    cover(std::uint64_t{high_} + 1);
    return high_++;  // neither free nor bound: reserved
  }
  std::size_t index = 0;  // word index in the level below, finally the page
  for (std::size_t k = levels_.size(); k-- > 0;) {
    const std::uint64_t w = levels_[k][index];
    METAD_ASSERT(w != 0);
    index = index * 64 + static_cast<std::size_t>(std::countr_zero(w));
  }
  const auto page = static_cast<std::uint32_t>(index);
  METAD_ASSERT(page < high_);
  clear_free(page);
  --free_below_;
  return page;
}

void page_pool::take(std::uint32_t page) {
  METAD_ASSERT(can_take(page));
  raise_to(page + 1);
  clear_free(page);
  --free_below_;
}

void page_pool::bind(std::uint32_t page) {
  METAD_ASSERT(state(page) == page_state::reserved);
  bound_[page / 64] |= bit(page);
  ++bound_count_;
}

void page_pool::release(std::uint32_t page) {
  METAD_ASSERT(state(page) == page_state::reserved);
  set_free(page);
  ++free_below_;
}

void page_pool::free_bound(std::uint32_t page) {
  METAD_ASSERT(state(page) == page_state::bound);
  bound_[page / 64] &= ~bit(page);
  --bound_count_;
  set_free(page);
  ++free_below_;
}

page_state page_pool::state(std::uint64_t page) const {
  if (page >= high_) return page_state::free;
  if (levels_[0][page / 64] & bit(page)) return page_state::free;
  if (bound_[page / 64] & bit(page)) return page_state::bound;
  return page_state::reserved;
}

void page_pool::set_free(std::uint32_t page) {
  std::size_t i = page;
  for (auto& level : levels_) {
    std::uint64_t& w = level[i / 64];
    const bool was_empty = w == 0;
    w |= bit(i);
    if (!was_empty) return;  // the levels above already say "something free here"
    i /= 64;
  }
}

void page_pool::clear_free(std::uint32_t page) {
  std::size_t i = page;
  for (auto& level : levels_) {
    std::uint64_t& w = level[i / 64];
    w &= ~bit(i);
    if (w != 0) return;  // the word still has a free page: the levels above stay set
    i /= 64;
  }
}

std::size_t page_pool::memory_bytes() const {
  std::size_t bytes = bound_.capacity() * sizeof(std::uint64_t);
  for (const auto& level : levels_) bytes += level.capacity() * sizeof(std::uint64_t);
  return bytes + levels_.capacity() * sizeof(levels_[0]);
}

std::string page_pool::check() const {
  if (high_ > num_pages_ || high_ > held_max) return "high-water mark past the pool";
  if (free_below_ + bound_count_ > high_) return "counts exceed the high-water mark";
  if (levels_.empty()) {
    return high_ == 0 && bound_.empty() ? "" : "no bitmaps below the high-water mark";
  }
  const std::size_t words = levels_[0].size();
  if (words < words_for(high_) || bound_.size() != words) {
    return "bitmap sizes disagree with the high-water mark";
  }
  std::uint64_t free_bits = 0, bound_bits = 0;
  for (std::size_t w = 0; w < words; ++w) {
    const std::uint64_t f = levels_[0][w], b = bound_[w];
    if (f & b) return fmt::format("word {}: a page is both free and bound", w);
    const std::uint64_t first = std::uint64_t{w} * 64;
    const std::uint64_t valid =
        first >= high_ ? 0 : (high_ - first >= 64 ? ~std::uint64_t{0} : bit(high_) - 1);
    if ((f | b) & ~valid) return "bits set at or beyond the high-water mark";
    free_bits += static_cast<std::uint64_t>(std::popcount(f));
    bound_bits += static_cast<std::uint64_t>(std::popcount(b));
  }
  if (free_bits != free_below_) {
    return fmt::format("free count {} below the mark but {} free bits", free_below_, free_bits);
  }
  if (bound_bits != bound_count_) {
    return fmt::format("bound count {} but {} bound bits", bound_count_, bound_bits);
  }
  for (std::size_t k = 1; k < levels_.size(); ++k) {
    const auto &below = levels_[k - 1], &level = levels_[k];
    if (level.size() != words_for(below.size())) return fmt::format("level {} size", k);
    for (std::size_t w = 0; w < level.size() * 64; ++w) {
      const bool summary = (level[w / 64] & bit(w)) != 0;
      const bool any = w < below.size() && below[w] != 0;
      if (summary != any)
        return fmt::format("level {} bit {} disagrees with level {}", k, w, k - 1);
    }
  }
  if (levels_.back().size() != 1) return "top level is not one word";
  return "";
}

}  // namespace metad::shard
