#include "shard/page_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "metad/assert.hpp"

namespace metad::shard {
namespace {

constexpr std::uint64_t bit(std::uint64_t i) { return std::uint64_t{1} << (i % 64); }
constexpr std::size_t words_for(std::size_t bits) { return (bits + 63) / 64; }

// A copy of `v` resized to exactly `words` (vector::resize may double the capacity,
// and the pool promises a fixed cost per page).
std::vector<std::uint64_t> resized_exact(const std::vector<std::uint64_t>& v, std::size_t words) {
  std::vector<std::uint64_t> out(words, 0);
  std::copy_n(v.begin(), std::min(v.size(), words), out.begin());
  return out;
}

}  // namespace

void page_pool::grow(std::uint32_t new_pages) {
  METAD_ASSERT(new_pages >= num_pages_ && new_pages <= pages_max);
  if (new_pages == num_pages_) return;
  const std::size_t words = words_for(new_pages);
  if (levels_.empty()) levels_.emplace_back();
  levels_[0] = resized_exact(levels_[0], words);
  bound_ = resized_exact(bound_, words);
  auto& free_bits = levels_[0];
  for (std::uint64_t p = num_pages_; p < new_pages;) {
    if (p % 64 == 0 && new_pages - p >= 64) {
      free_bits[p / 64] = ~std::uint64_t{0};
      p += 64;
    } else {
      free_bits[p / 64] |= bit(p);
      ++p;
    }
  }
  free_count_ += new_pages - num_pages_;
  num_pages_ = new_pages;
  rebuild_summaries();
}

void page_pool::shrink(std::uint32_t new_pages) {
  METAD_ASSERT(new_pages > 0 && new_pages <= num_pages_);
  for (std::uint32_t p = new_pages; p < num_pages_; ++p) METAD_ASSERT(state(p) == page_state::free);
  const std::size_t words = words_for(new_pages);
  levels_[0] = resized_exact(levels_[0], words);
  bound_ = resized_exact(bound_, words);
  if (new_pages % 64 != 0) levels_[0].back() &= bit(new_pages) - 1;  // no bit past the end
  free_count_ -= num_pages_ - new_pages;
  num_pages_ = new_pages;
  rebuild_summaries();
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

std::uint32_t page_pool::take_lowest() {
  METAD_ASSERT(free_count_ > 0);
  std::size_t index = 0;  // word index in the level below, finally the page
  for (std::size_t k = levels_.size(); k-- > 0;) {
    const std::uint64_t w = levels_[k][index];
    METAD_ASSERT(w != 0);
    index = index * 64 + static_cast<std::size_t>(std::countr_zero(w));
  }
  const auto page = static_cast<std::uint32_t>(index);
  METAD_ASSERT(page < num_pages_);
  clear_free(page);
  --free_count_;
  return page;
}

void page_pool::take(std::uint32_t page) {
  METAD_ASSERT(state(page) == page_state::free);
  clear_free(page);
  --free_count_;
}

void page_pool::bind(std::uint32_t page) {
  METAD_ASSERT(state(page) == page_state::reserved);
  bound_[page / 64] |= bit(page);
  ++bound_count_;
}

void page_pool::release(std::uint32_t page) {
  METAD_ASSERT(state(page) == page_state::reserved);
  set_free(page);
  ++free_count_;
}

void page_pool::free_bound(std::uint32_t page) {
  METAD_ASSERT(state(page) == page_state::bound);
  bound_[page / 64] &= ~bit(page);
  --bound_count_;
  set_free(page);
  ++free_count_;
}

page_state page_pool::state(std::uint32_t page) const {
  METAD_ASSERT(page < num_pages_);
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

std::size_t page_pool::bytes_for(std::uint32_t num_pages) {
  if (num_pages == 0) return 0;
  std::size_t words = words_for(num_pages);
  std::size_t total = words;  // bound bits
  for (;;) {                  // free bits and their summaries
    total += words;
    if (words <= 1) break;
    words = words_for(words);
  }
  return total * sizeof(std::uint64_t);
}

std::string page_pool::check() const {
  if (num_pages_ == 0) return levels_.empty() && free_count_ == 0 ? "" : "empty pool with state";
  const std::size_t words = words_for(num_pages_);
  if (levels_.empty() || levels_[0].size() != words || bound_.size() != words) {
    return "bitmap sizes disagree with num_pages";
  }
  const std::uint64_t tail = num_pages_ % 64 == 0 ? ~std::uint64_t{0} : bit(num_pages_) - 1;
  std::uint64_t free_bits = 0, bound_bits = 0;
  for (std::size_t w = 0; w < words; ++w) {
    const std::uint64_t f = levels_[0][w], b = bound_[w];
    if (f & b) return fmt::format("word {}: a page is both free and bound", w);
    if (w + 1 == words && ((f | b) & ~tail)) return "bits set beyond num_pages";
    free_bits += static_cast<std::uint64_t>(std::popcount(f));
    bound_bits += static_cast<std::uint64_t>(std::popcount(b));
  }
  if (free_bits != free_count_) {
    return fmt::format("free count {} but {} free bits", free_count_, free_bits);
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
