// sparse_pages: the state of each page of one SGLang pool (free, reserved or bound, as
// page_pool's page_state), costing what is used: a pool of up to pages_max pages holds
// state only for chunks of 4,096 pages in which some page was ever held; every other page
// is free. Creating or growing a pool is O(1); a chunk (1 KiB) is made the first time one
// of its pages is taken and kept until the pool is cleared. The pool hands pages out from
// the top of its free stack, so the pages it holds are a few dense ranges. Owned by one
// core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "metad/assert.hpp"
#include "shard/page_pool.hpp"

namespace metad::shard {

class sparse_pages {
 public:
  static constexpr std::uint64_t pages_max = page_pool::pages_max;

  sparse_pages() = default;
  explicit sparse_pages(std::uint64_t num_pages) { grow(num_pages); }
  sparse_pages(sparse_pages&& o) noexcept { *this = std::move(o); }
  sparse_pages& operator=(sparse_pages&& o) noexcept {
    chunks_ = std::move(o.chunks_);
    num_pages_ = o.num_pages_;
    held_ = o.held_;
    bound_ = o.bound_;
    last_index_ = o.last_index_;
    last_ = o.last_;
    o.reset();
    return *this;
  }

  void grow(std::uint64_t new_pages) {
    METAD_ASSERT(new_pages >= num_pages_ && new_pages <= pages_max);
    num_pages_ = new_pages;
  }
  std::uint64_t num_pages() const { return num_pages_; }
  std::uint64_t free_count() const { return num_pages_ - held_; }
  std::uint64_t bound_count() const { return bound_; }
  std::uint64_t reserved_count() const { return held_ - bound_; }

  page_state state(std::uint64_t page) const {
    const chunk* c = find(page >> chunk_bits);
    if (c == nullptr) return page_state::free;
    const std::size_t w = (page & chunk_mask) / 64;
    const std::uint64_t b = std::uint64_t{1} << (page % 64);
    if (c->bound[w] & b) return page_state::bound;
    return (c->held[w] & b) ? page_state::reserved : page_state::free;
  }
  // free → reserved.
  void take(std::uint64_t page) {
    METAD_ASSERT(page < num_pages_);
    chunk& c = at(page >> chunk_bits);
    std::uint64_t& w = c.held[(page & chunk_mask) / 64];
    const std::uint64_t b = std::uint64_t{1} << (page % 64);
    METAD_ASSERT((w & b) == 0);
    w |= b;
    ++c.count;
    ++held_;
  }
  // reserved → bound.
  void bind(std::uint64_t page) {
    METAD_ASSERT(state(page) == page_state::reserved);
    held_chunk(page).bound[(page & chunk_mask) / 64] |= std::uint64_t{1} << (page % 64);
    ++bound_;
  }
  // reserved → free.
  void release(std::uint64_t page) {
    METAD_ASSERT(state(page) == page_state::reserved);
    chunk& c = held_chunk(page);
    c.held[(page & chunk_mask) / 64] &= ~(std::uint64_t{1} << (page % 64));
    --c.count;
    --held_;
  }
  // bound → free.
  void free_bound(std::uint64_t page) {
    METAD_ASSERT(state(page) == page_state::bound);
    const std::size_t w = (page & chunk_mask) / 64;
    const std::uint64_t b = std::uint64_t{1} << (page % 64);
    chunk& c = held_chunk(page);
    c.bound[w] &= ~b;
    c.held[w] &= ~b;
    --c.count;
    --bound_;
    --held_;
  }
  // fn(page, state) for every page that is not free, in no particular order.
  template <class Fn>
  void for_each_held(Fn&& fn) const {
    for (const auto& [index, c] : chunks_) {
      for (std::size_t w = 0; w < words; ++w) {
        for (std::uint64_t m = c->held[w]; m != 0; m &= m - 1) {
          const std::uint64_t page = (index << chunk_bits) + w * 64 + __builtin_ctzll(m);
          fn(page, (c->bound[w] >> (page % 64)) & 1 ? page_state::bound : page_state::reserved);
        }
      }
    }
  }

  std::size_t memory_bytes() const { return chunks_.size() * (sizeof(chunk) + 48); }
  // Counts agree with the bits, no page is bound without being held, none past the end.
  std::string check() const {
    std::uint64_t held = 0, bound = 0;
    for (const auto& [index, c] : chunks_) {
      std::uint32_t count = 0;
      for (std::size_t w = 0; w < words; ++w) {
        if (c->bound[w] & ~c->held[w]) return "a bound page is not held";
        count += static_cast<std::uint32_t>(__builtin_popcountll(c->held[w]));
        bound += static_cast<std::uint64_t>(__builtin_popcountll(c->bound[w]));
      }
      if (count != c->count) return "a chunk's count disagrees with its bits";
      held += count;
    }
    if (held != held_ || bound != bound_) return "page counts disagree with the bits";
    std::string problem;
    for_each_held([&](std::uint64_t page, page_state) {
      if (page >= num_pages_) problem = "a page past the end is held";
    });
    return problem;
  }

 private:
  static constexpr unsigned chunk_bits = 12;
  static constexpr std::uint64_t chunk_mask = (std::uint64_t{1} << chunk_bits) - 1;
  static constexpr std::size_t words = (std::size_t{1} << chunk_bits) / 64;
  struct chunk {
    std::uint64_t held[words] = {};   // reserved or bound
    std::uint64_t bound[words] = {};  // bound (a subset of held)
    std::uint32_t count = 0;          // pages held
  };

  const chunk* find(std::uint64_t index) const {
    if (index == last_index_) return last_;
    auto it = chunks_.find(index);
    if (it == chunks_.end()) return nullptr;
    last_index_ = index;
    last_ = it->second.get();
    return last_;
  }
  chunk& at(std::uint64_t index) {
    if (index == last_index_) return *last_;
    auto& slot = chunks_[index];
    if (!slot) slot = std::make_unique<chunk>();
    last_index_ = index;
    last_ = slot.get();
    return *last_;
  }
  // The chunk of a page that is held (it exists).
  chunk& held_chunk(std::uint64_t page) { return *const_cast<chunk*>(find(page >> chunk_bits)); }
  void reset() {
    chunks_.clear();
    num_pages_ = held_ = bound_ = 0;
    last_index_ = UINT64_MAX;
    last_ = nullptr;
  }

  std::unordered_map<std::uint64_t, std::unique_ptr<chunk>> chunks_;
  std::uint64_t num_pages_ = 0;
  std::uint64_t held_ = 0;   // pages reserved or bound
  std::uint64_t bound_ = 0;  // pages bound
  // The chunk of the last lookup (pages are taken and freed near the top of the stack).
  mutable std::uint64_t last_index_ = UINT64_MAX;
  mutable chunk* last_ = nullptr;
};

}  // namespace metad::shard
