// packed_map: packed 16-byte key → nonzero uint32, the compact map behind a rank's key
// map and the completion directory. Bucketised cuckoo hashing: each key may sit in one
// of 4 slots in each of two buckets, so a lookup reads at most two 64-byte key lines
// (plus one value line on a hit), and the table runs at 72–90% load: 20 bytes a slot,
// 22–28 bytes a key. Single-threaded: only the owning core touches it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "shard/packed_key.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace shard {

class packed_map {
 public:
  static constexpr std::size_t ways = 4;  // slots per bucket: one cache line of keys

  using hash_fn = std::uint64_t (*)(const packed_key&) noexcept;

  packed_map() = default;
  // Tests only: a map whose keys hash with `hash` (callers pass hash(k) as h).
  explicit packed_map(hash_fn hash) : hash_(hash) {}
  packed_map(const packed_map&) = delete;
  packed_map& operator=(const packed_map&) = delete;
  packed_map(packed_map&& other) noexcept { swap(other); }
  packed_map& operator=(packed_map&& other) noexcept {
    packed_map(std::move(other)).swap(*this);
    return *this;
  }

  void swap(packed_map& other) noexcept {
    keys_.swap(other.keys_);
    values_.swap(other.values_);
    stash_.swap(other.stash_);
    std::swap(buckets_, other.buckets_);
    std::swap(size_, other.size_);
    std::swap(rng_, other.rng_);
    std::swap(hash_, other.hash_);
  }

  std::size_t size() const { return size_; }
  std::size_t capacity() const { return buckets_ * ways; }
  // The most entries before the table grows: 90% of the slots. Higher loads cost
  // memory-bound eviction walks on insert (at 15/16, a quarter of inserts walked).
  std::size_t max_size() const { return capacity() * 9 / 10; }
  // Keys that found no slot (pathological hash collisions); 0 in practice.
  std::size_t stash_size() const { return stash_.size(); }

  // The value stored for `k` (h = packed_hash(k), the map's one hash), or nullptr. The value may be
  // changed in place (to another nonzero value); the pointer is valid until the next insert or
  // erase.
  std::uint32_t* find(const packed_key& k, std::uint64_t h) {
    return const_cast<std::uint32_t*>(std::as_const(*this).find(k, h));
  }
  const std::uint32_t* find(const packed_key& k, std::uint64_t h) const {
    if (size_ == 0) return nullptr;
    const auto [b1, b2] = buckets_of(h);
    // Both buckets are compared, then one is picked without a branch: which bucket
    // holds a key is a coin flip the branch predictor cannot learn.
    const unsigned m1 = match_mask(b1, k);
    const unsigned m2 = match_mask(b2, k);
    if ((m1 | m2) != 0) {
      const std::size_t i = m1 != 0 ? b1 * ways + static_cast<std::size_t>(__builtin_ctz(m1)) / 2
                                    : b2 * ways + static_cast<std::size_t>(__builtin_ctz(m2)) / 2;
      if (values_[i] != 0) return &values_[i];
      // Only the all-zero key matches an empty slot's bytes: look at every match.
      if (const std::uint32_t* v = find_in(b1, k)) return v;
      if (const std::uint32_t* v = find_in(b2, k)) return v;
    }
    return stash_.empty() ? nullptr : find_in_stash(k);
  }

  // Starts loading the lines a lookup of hash h reads (batches hash first, then probe).
  void prefetch(std::uint64_t h) const {
    if (buckets_ == 0) return;
    const auto [b1, b2] = buckets_of(h);
    __builtin_prefetch(&keys_[b1]);
    __builtin_prefetch(&keys_[b2]);
  }

  // Inserts `k`, which must be absent, with value != 0.
  void insert_new(const packed_key& k, std::uint64_t h, std::uint32_t value);
  // Erases the entry whose value `find` returned.
  void erase(std::uint32_t* value);

  // fn(const packed_key&, const std::uint32_t& value) for every entry, in no particular
  // order (the value's address is the one find returns).
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (std::size_t b = 0; b < buckets_; ++b) {
      for (std::size_t j = 0; j < ways; ++j) {
        if (values_[b * ways + j] != 0) fn(keys_[b].k[j], values_[b * ways + j]);
      }
    }
    for (const auto& e : stash_) fn(e.first, e.second);
  }

  void clear() noexcept;
  // Heap bytes held by the table.
  std::size_t memory_bytes() const;

 private:
  struct alignas(64) bucket {
    packed_key k[ways];
  };
  static_assert(sizeof(bucket) == 64);

  std::pair<std::size_t, std::size_t> buckets_of(std::uint64_t h) const {
    // Two independent 32-bit halves, each mapped onto [0, buckets_) without a modulo.
    const std::uint64_t n = buckets_;
    return {static_cast<std::size_t>(((h & 0xFFFFFFFFu) * n) >> 32),
            static_cast<std::size_t>(((h >> 32) * n) >> 32)};
  }
  // Bit 2j set when slot j of bucket b holds key bytes equal to k.
  unsigned match_mask(std::size_t b, const packed_key& k) const {
#if defined(__AVX2__)
    const auto* line = reinterpret_cast<const __m256i*>(&keys_[b]);
    const __m256i want =
        _mm256_set_epi64x(static_cast<long long>(k.hi), static_cast<long long>(k.lo),
                          static_cast<long long>(k.hi), static_cast<long long>(k.lo));
    unsigned words = 0;  // bit w: 64-bit word w of the bucket equals k's
    for (std::size_t r = 0; r < ways / 2; ++r) {
      const __m256i eq = _mm256_cmpeq_epi64(_mm256_load_si256(line + r), want);
      words |= static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(eq))) << (4 * r);
    }
    return words & (words >> 1) & 0x5555u;  // both words of a slot equal
#else
    unsigned mask = 0;
    for (std::size_t j = 0; j < ways; ++j) mask |= unsigned{keys_[b].k[j] == k} << (2 * j);
    return mask;
#endif
  }
  const std::uint32_t* find_in(std::size_t b, const packed_key& k) const {
    // An empty slot holds value 0 and zero key bytes (a valid key, hence the value test).
    for (unsigned mask = match_mask(b, k); mask != 0; mask &= mask - 1) {
      const std::uint32_t* v =
          &values_[b * ways + static_cast<std::size_t>(__builtin_ctz(mask)) / 2];
      if (*v != 0) return v;
    }
    return nullptr;
  }
  const std::uint32_t* find_in_stash(const packed_key& k) const;
  bool put(std::size_t b, const packed_key& k, std::uint32_t value);
  std::size_t free_slots(std::size_t b) const;
  bool put_balanced(std::size_t b1, std::size_t b2, const packed_key& k, std::uint32_t value);
  bool move_one_aside(std::size_t b1, std::size_t b2, const packed_key& k, std::uint32_t value);
  // Places an entry (size_ already counts it); may grow the table when `may_grow`.
  void place(packed_key k, std::uint32_t value, bool may_grow);
  void grow();

  std::vector<bucket> keys_;           // buckets_ buckets
  std::vector<std::uint32_t> values_;  // buckets_ * ways values, 0 = empty slot
  std::vector<std::pair<packed_key, std::uint32_t>> stash_;
  std::size_t buckets_ = 0;
  std::size_t size_ = 0;
  std::uint64_t rng_ = 0x9E3779B97F4A7C15ull;  // picks eviction victims
  hash_fn hash_ = packed_hash;                 // recomputes a stored key's buckets
};

}  // namespace shard
