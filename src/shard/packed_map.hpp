// packed_map: packed 16-byte key → nonzero uint32, the compact map behind a rank's key
// map and the completion directory. Bucketised cuckoo hashing: each key may sit in one
// of 4 slots in each of two buckets, so a lookup reads at most two 64-byte key lines
// (plus one value line on a hit), and the table runs at 72–90% load: 20 bytes a slot,
// 22–28 bytes a key. Growth is incremental (see incremental_buckets), so no insert
// stops the core for a whole rehash (2.5 ms at 130k keys, 20 ms at 1M). Single-
// threaded: only the owning core touches it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "shard/packed_key.hpp"
#include "shard/zeroed_array.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace metad::shard {

class packed_map {
 public:
  static constexpr std::size_t ways = 4;  // slots per bucket: one cache line of keys
  // Growth of a table of more than `incremental_buckets` buckets is spread over inserts:
  // - from 86% load on, the next table is allocated and each insert faults in a share
  //   of its pages, all of them by the time the table is full (90%): a few pages per
  //   insert, not thousands at once;
  // - then the next table takes inserts, and each insert moves `migrate_per_insert` old
  //   buckets over (at most 64 entries, ~0.5 µs). Growing from C to 1.25 C slots at 90%
  //   load leaves 0.225 C inserts before the next growth; the C / 4 old buckets take
  //   C / 64 of them. While it lasts lookups read both tables.
  // Smaller tables grow at once (a move of 1,000 entries costs less than the bookkeeping).
  static constexpr std::size_t incremental_buckets = 256;
  static constexpr std::size_t migrate_per_insert = 16;
  static constexpr std::size_t prepare_load_pct = 86;

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
    cur_.swap(other.cur_);
    old_.swap(other.old_);
    next_.swap(other.next_);
    stash_.swap(other.stash_);
    std::swap(migrated_, other.migrated_);
    std::swap(size_, other.size_);
    std::swap(rng_, other.rng_);
    std::swap(hash_, other.hash_);
    std::swap(bulk_, other.bulk_);
    std::swap(image_open_, other.image_open_);
    std::swap(image_next_, other.image_next_);
  }

  std::size_t size() const { return size_; }
  // Slots of the current table (a growth under way still holds entries in the old one).
  std::size_t capacity() const { return cur_.buckets * ways; }
  // The most entries before the table grows: 90% of the slots. Higher loads cost
  // memory-bound eviction walks on insert (at 15/16, a quarter of inserts walked).
  std::size_t max_size() const { return max_size_of(cur_.buckets); }
  static std::size_t max_size_of(std::size_t buckets) { return buckets * ways * 9 / 10; }
  // Keys that found no slot (pathological hash collisions); 0 in practice.
  std::size_t stash_size() const { return stash_.size(); }
  // Whether entries are still being moved from the table before the last growth.
  bool growing() const { return old_.buckets != 0; }

  // The value stored for `k` (h = packed_hash(k), the map's one hash), or nullptr. The value may be
  // changed in place (to another nonzero value); the pointer is valid until the next insert,
  // erase or advance_growth (which moves entries too).
  std::uint32_t* find(const packed_key& k, std::uint64_t h) {
    return const_cast<std::uint32_t*>(std::as_const(*this).find(k, h));
  }
  const std::uint32_t* find(const packed_key& k, std::uint64_t h) const {
    if (size_ == 0) return nullptr;
    if (const std::uint32_t* v = cur_.find(k, h, 0)) return v;
    if (growing()) {
      if (const std::uint32_t* v = old_.find(k, h, migrated_)) return v;
    }
    return stash_.empty() ? nullptr : find_in_stash(k);
  }

  // The two buckets of hash h in a table of n buckets: two independent 32-bit halves,
  // each mapped onto [0, n) without a modulo (so each rises with its half of h).
  static std::pair<std::size_t, std::size_t> buckets_of(std::uint64_t h, std::size_t n) {
    return {static_cast<std::size_t>(((h & 0xFFFFFFFFu) * n) >> 32),
            static_cast<std::size_t>(((h >> 32) * n) >> 32)};
  }

  // Sweeps (recovery's and a standby's directory counts): looks up keys[i] (hashes[i] =
  // packed_hash) for i < n <= sweep_batch, each value's address (or nullptr) into out[i],
  // reading one bucket of each key first (`second`: its second, else its first) and the
  // other only for the keys not there, all of those together. Keys in an order in which
  // that bucket rises (a rank table's keys in slot order that sat in that bucket) make
  // most reads near-sequential: about half a random line a key, not two. The addresses
  // are valid until the map changes.
  static constexpr std::size_t sweep_batch = 64;
  void find_sweep(const packed_key* keys, const std::uint64_t* hashes, std::size_t n, bool second,
                  std::uint32_t** out);

  // Starts loading the lines a lookup of hash h reads (batches hash first, then probe).
  void prefetch(std::uint64_t h) const {
    cur_.prefetch(h, 0);
    if (growing()) old_.prefetch(h, migrated_);
  }

  // Inserts `k`, which must be absent, with value != 0.
  void insert_new(const packed_key& k, std::uint64_t h, std::uint32_t value);

  // Recovery (bulk building). reserve: an empty map takes a table for n entries at about
  // 80% load, faulted in with one call, so that filling it neither grows nor faults page
  // by page. bulk: while on, a growth happens at once (no table prepared ahead, nothing
  // left for later inserts to move), which is cheaper in total when nothing is served.
  void reserve(std::size_t n);
  // After a reserve() that guessed high: a table under 70% full is rebuilt at ~80% load.
  void shrink_to_fit();
  void set_bulk(bool on) {
    bulk_ = on;
    if (on && growing()) migrate(old_.buckets);
  }
  // Moves a growth under way along by up to tick_buckets old buckets (~30 µs): the
  // core's periodic tick calls it, so that a table which stops taking inserts mid-growth
  // still finishes and lets the old table go.
  static constexpr std::size_t tick_buckets = 512;
  void advance_growth() {
    if (growing()) migrate(tick_buckets);
  }
  // Erases the entry whose value `find` returned.
  void erase(std::uint32_t* value);

  // The layout an image assumes: packed_hash, table::buckets_of, `ways` slots a bucket.
  // Snapshots record it; change it with any of those (an image of another layout is
  // then loaded key by key).
  static constexpr std::uint32_t image_layout = 1;

  // Images (snapshots load a table as it was laid out, not key by key: issue 35).
  // image_buckets: the buckets of a table that can be dumped as an image, 0 if it cannot
  // (a growth under way, a stash, or a test's own hash): every entry then sits in slot
  // j of bucket b, one of its two buckets (packed_hash, buckets_of), and
  // for_each_slot(fn) calls fn(b * ways + j, key, value) in bucket order.
  std::size_t image_buckets() const {
    return growing() || !stash_.empty() || hash_ != packed_hash ? 0 : cur_.buckets;
  }
  template <class Fn>
  void for_each_slot(Fn&& fn) const {
    for (std::size_t i = 0; i < cur_.values.size(); ++i)
      if (cur_.values[i] != 0) fn(i, cur_.keys[i / ways].k[i % ways], cur_.values[i]);
  }
  // An empty map takes a table of exactly `buckets` buckets (an image's), faulted in,
  // and the image is open: place_at fills it, slot after slot, until anything else
  // changes the map (insert_new, erase, clear).
  void begin_image(std::size_t buckets);
  // Puts k with `value` (nonzero) into slot `slot` (b * ways + j) of the open image.
  // False, changing nothing, unless the slot comes after every slot placed so far, b is
  // one of k's two buckets, and the map does not hold k. Reads k's other bucket when it
  // comes before b: prefetch_other first.
  bool place_at(std::size_t slot, const packed_key& k, std::uint32_t value);
  // Starts loading the line place_at(slot, k) reads besides the slot's own.
  void prefetch_other(std::size_t slot, const packed_key& k) const {
    const auto [b1, b2] = cur_.buckets_of(packed_hash(k));
    const std::size_t other = slot / ways == b1 ? b2 : b1;
    if (other < slot / ways) __builtin_prefetch(&cur_.keys[other]);
  }

  // fn(const packed_key&, const std::uint32_t& value) for every entry, in no particular
  // order (the value's address is the one find returns).
  template <class Fn>
  void for_each(Fn&& fn) const {
    cur_.for_each(0, fn);
    old_.for_each(migrated_, fn);
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

  // One cuckoo table: buckets of `ways` key slots, and their values (0 = empty slot).
  struct table {
    zeroed_array<bucket> keys;
    zeroed_array<std::uint32_t> values;  // 0 = empty slot
    std::size_t buckets = 0;

    table() = default;
    explicit table(std::size_t n) : keys(n), values(n * ways), buckets(n) {}
    void swap(table& o) noexcept {
      keys.swap(o.keys);
      values.swap(o.values);
      std::swap(buckets, o.buckets);
    }
    std::size_t pages() const { return keys.pages() + values.pages(); }
    std::size_t pages_left() const { return keys.pages_left() + values.pages_left(); }
    void prefault(std::size_t pages) {
      const std::size_t k = std::min(pages, keys.pages_left());
      keys.prefault(k);
      values.prefault(pages - k);
    }
    std::pair<std::size_t, std::size_t> buckets_of(std::uint64_t h) const {
      return packed_map::buckets_of(h, buckets);
    }
    // Bit 2j set when slot j of bucket b holds key bytes equal to k.
    unsigned match_mask(std::size_t b, const packed_key& k) const {
#if defined(__AVX2__)
      const auto* line = reinterpret_cast<const __m256i*>(&keys[b]);
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
      for (std::size_t j = 0; j < ways; ++j) mask |= unsigned{keys[b].k[j] == k} << (2 * j);
      return mask;
#endif
    }
    // Buckets below `from` are empty (moved out during a growth) and not read. Inlined:
    // callers batch their lookups (hash, prefetch, probe) and a call per probe costs them
    // ~8% of a get_locations.
    [[gnu::always_inline]] const std::uint32_t* find(const packed_key& k, std::uint64_t h,
                                                     std::size_t from) const {
      if (buckets == 0) return nullptr;
      const auto [b1, b2] = buckets_of(h);
      // Both buckets are compared, then one is picked without a branch: which bucket
      // holds a key is a coin flip the branch predictor cannot learn.
      const unsigned m1 = b1 >= from ? match_mask(b1, k) : 0;
      const unsigned m2 = b2 >= from ? match_mask(b2, k) : 0;
      if ((m1 | m2) == 0) return nullptr;
      const std::size_t i = m1 != 0 ? b1 * ways + static_cast<std::size_t>(__builtin_ctz(m1)) / 2
                                    : b2 * ways + static_cast<std::size_t>(__builtin_ctz(m2)) / 2;
      if (values[i] != 0) return &values[i];
      // Only the all-zero key matches an empty slot's bytes: look at every match.
      if (const std::uint32_t* v = b1 >= from ? find_in(b1, k) : nullptr) return v;
      return b2 >= from ? find_in(b2, k) : nullptr;
    }
    const std::uint32_t* find_in(std::size_t b, const packed_key& k) const {
      // An empty slot holds value 0 and zero key bytes (a valid key, hence the value test).
      for (unsigned mask = match_mask(b, k); mask != 0; mask &= mask - 1) {
        const std::uint32_t* v =
            &values[b * ways + static_cast<std::size_t>(__builtin_ctz(mask)) / 2];
        if (*v != 0) return v;
      }
      return nullptr;
    }
    void prefetch(std::uint64_t h, std::size_t from) const {
      if (buckets == 0) return;
      const auto [b1, b2] = buckets_of(h);
      if (b1 >= from) __builtin_prefetch(&keys[b1]);
      if (b2 >= from) __builtin_prefetch(&keys[b2]);
    }
    bool holds(const std::uint32_t* value) const {
      return !values.empty() && value >= values.data() && value < values.data() + values.size();
    }
    template <class Fn>
    void for_each(std::size_t from, Fn& fn) const {
      for (std::size_t b = from; b < buckets; ++b) {
        for (std::size_t j = 0; j < ways; ++j) {
          if (values[b * ways + j] != 0) fn(keys[b].k[j], values[b * ways + j]);
        }
      }
    }
  };

  const std::uint32_t* find_in_stash(const packed_key& k) const;
  // Placement into the current table.
  bool put(std::size_t b, const packed_key& k, std::uint32_t value);
  std::size_t free_slots(std::size_t b) const;
  bool put_balanced(std::size_t b1, std::size_t b2, const packed_key& k, std::uint32_t value);
  bool move_one_aside(std::size_t b1, std::size_t b2, const packed_key& k, std::uint32_t value);
  // Places an entry (size_ already counts it); may grow the table when `may_grow`.
  void place(packed_key k, std::uint32_t value, bool may_grow);
  // Allocates and prefaults the next table once the current one nears full.
  void prepare_growth();
  // Starts a growth: the next table becomes the current one, the old one is moved over
  // by later inserts (small tables: at once).
  void grow();
  // Moves up to `n` old buckets into the current table; frees the old one when done.
  void migrate(std::size_t n);

  table cur_;   // where inserts go
  table old_;   // the table before the last growth, buckets [migrated_, buckets) still full
  table next_;  // the table the next growth moves to, while it is being faulted in
  std::size_t migrated_ = 0;
  std::vector<std::pair<packed_key, std::uint32_t>> stash_;
  std::size_t size_ = 0;
  std::uint64_t rng_ = 0x9E3779B97F4A7C15ull;  // picks eviction victims
  hash_fn hash_ = packed_hash;                 // recomputes a stored key's buckets
  bool bulk_ = false;
  bool image_open_ = false;     // begin_image, until another change: place_at may fill
  std::size_t image_next_ = 0;  // the lowest slot place_at may fill
};

}  // namespace metad::shard
