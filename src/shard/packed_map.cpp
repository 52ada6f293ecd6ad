#include "shard/packed_map.hpp"

#include "shard/check.hpp"

namespace shard {
namespace {

// Evictions tried before an entry is declared homeless. Below 90% load with 4-slot
// buckets a random walk ends in a few steps on average; the bound only stops cycles.
constexpr int max_kicks = 500;
// A homeless entry grows the table only above this load; below it the keys collide
// pathologically (equal hashes) and growing would not help, so they go to the stash.
constexpr std::size_t grow_on_failure_load_pct = 80;

}  // namespace

bool packed_map::put(std::size_t b, const packed_key& k, std::uint32_t value) {
  for (std::size_t j = 0; j < ways; ++j) {
    std::uint32_t& v = values_[b * ways + j];
    if (v == 0) {
      keys_[b].k[j] = k;
      v = value;
      return true;
    }
  }
  return false;
}

const std::uint32_t* packed_map::find_in_stash(const packed_key& k) const {
  for (const auto& e : stash_) {
    if (e.first == k) return &e.second;
  }
  return nullptr;
}

std::size_t packed_map::free_slots(std::size_t b) const {
  std::size_t n = 0;
  for (std::size_t j = 0; j < ways; ++j) n += values_[b * ways + j] == 0;
  return n;
}

bool packed_map::put_balanced(std::size_t b1, std::size_t b2, const packed_key& k,
                              std::uint32_t value) {
  // The emptier of the two buckets: balanced buckets make evictions rare.
  const std::size_t f1 = free_slots(b1), f2 = free_slots(b2);
  if (f1 == 0 && f2 == 0) return false;
  return put(f1 >= f2 ? b1 : b2, k, value);
}

bool packed_map::move_one_aside(std::size_t b1, std::size_t b2, const packed_key& k,
                                std::uint32_t value) {
  // One eviction step, searched exhaustively: an occupant of either bucket whose other
  // bucket has room moves there, and k takes its slot. The other buckets are loaded in
  // parallel first: one memory latency, not eight in a row.
  const std::size_t homes[2] = {b1, b2};
  std::size_t others[2 * ways];
  for (std::size_t h = 0; h < 2; ++h) {
    for (std::size_t j = 0; j < ways; ++j) {
      const auto [c1, c2] = buckets_of(hash_(keys_[homes[h]].k[j]));
      others[h * ways + j] = c1 == homes[h] ? c2 : c1;
      __builtin_prefetch(&values_[others[h * ways + j] * ways]);
    }
  }
  for (std::size_t h = 0; h < 2; ++h) {
    const std::size_t b = homes[h];
    for (std::size_t j = 0; j < ways; ++j) {
      const std::size_t other = others[h * ways + j];
      if (other != b && put(other, keys_[b].k[j], values_[b * ways + j])) {
        keys_[b].k[j] = k;
        values_[b * ways + j] = value;
        return true;
      }
    }
  }
  return false;
}

void packed_map::insert_new(const packed_key& k, std::uint64_t h, std::uint32_t value) {
  SHARD_CHECK(value != 0);
  if (size_ + 1 > max_size()) grow();
  ++size_;
  const auto [b1, b2] = buckets_of(h);
  if (put_balanced(b1, b2, k, value)) return;
  place(k, value, true);
}

void packed_map::place(packed_key k, std::uint32_t value, bool may_grow) {
  for (;;) {
    const auto [b1, b2] = buckets_of(hash_(k));
    if (put_balanced(b1, b2, k, value) || move_one_aside(b1, b2, k, value)) return;
    // Random walk: evict a random occupant into its other bucket, and so on.
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    std::size_t b = (rng_ & 1) != 0 ? b1 : b2;
    for (int kick = 0; kick < max_kicks; ++kick) {
      rng_ ^= rng_ << 13;
      rng_ ^= rng_ >> 7;
      rng_ ^= rng_ << 17;
      const std::size_t j = (rng_ >> 32) % ways;
      std::swap(k, keys_[b].k[j]);
      std::swap(value, values_[b * ways + j]);
      const auto [c1, c2] = buckets_of(hash_(k));
      b = c1 == b ? c2 : c1;
      if (put(b, k, value)) return;
    }
    if (may_grow && size_ * 100 >= capacity() * grow_on_failure_load_pct) {
      grow();  // then place the homeless entry in the larger table
      continue;
    }
    stash_.emplace_back(k, value);
    return;
  }
}

void packed_map::grow() {
  // Doubling while small (cheap), then +25%: the load after growth stays >= 0.9 / 1.25
  // = 0.72, so a key never costs more than ~28 bytes once the table is large.
  const std::size_t next =
      buckets_ < 1024 ? std::max<std::size_t>(4, buckets_ * 2) : buckets_ + buckets_ / 4;
  SHARD_CHECK(next < (std::size_t{1} << 32));  // buckets_of maps 32-bit halves
  // The new arrays are swapped in; old_* then hold the old table.
  std::vector<bucket> old_keys(next);
  std::vector<std::uint32_t> old_values(next * ways, 0);
  std::vector<std::pair<packed_key, std::uint32_t>> old_stash;
  old_keys.swap(keys_);
  old_values.swap(values_);
  old_stash.swap(stash_);
  const std::size_t old_buckets = buckets_;
  buckets_ = next;
  // Buckets map monotonically onto the hash halves, so an entry that sat in bucket b as
  // its first (second) choice belongs near b * next / old_buckets as its first (second)
  // choice again: trying that bucket first turns the rebuild into a near-sequential
  // sweep instead of two cache misses per entry.
  for (std::size_t b = 0; b < old_buckets; ++b) {
    for (std::size_t j = 0; j < ways; ++j) {
      const std::uint32_t value = old_values[b * ways + j];
      if (value == 0) continue;
      const packed_key& k = old_keys[b].k[j];
      const std::uint64_t h = hash_(k);
      const bool first_choice = ((h & 0xFFFFFFFFu) * old_buckets) >> 32 == b;
      const std::uint64_t half = first_choice ? h & 0xFFFFFFFFu : h >> 32;
      if (!put(static_cast<std::size_t>((half * next) >> 32), k, value)) place(k, value, false);
    }
  }
  for (const auto& e : old_stash) place(e.first, e.second, false);
}

void packed_map::erase(std::uint32_t* value) {
  SHARD_CHECK(value != nullptr && *value != 0);
  if (!values_.empty() && value >= values_.data() && value < values_.data() + values_.size()) {
    const auto i = static_cast<std::size_t>(value - values_.data());
    *value = 0;
    keys_[i / ways].k[i % ways] = packed_key{};
    --size_;
    // A freed slot may take back a stashed key.
    for (std::size_t s = 0; s < stash_.size(); ++s) {
      const auto [b1, b2] = buckets_of(hash_(stash_[s].first));
      if (put(b1, stash_[s].first, stash_[s].second) ||
          put(b2, stash_[s].first, stash_[s].second)) {
        stash_[s] = stash_.back();
        stash_.pop_back();
        break;
      }
    }
    return;
  }
  for (std::size_t s = 0; s < stash_.size(); ++s) {
    if (&stash_[s].second == value) {
      stash_[s] = stash_.back();
      stash_.pop_back();
      --size_;
      return;
    }
  }
  SHARD_CHECK(false && "erase of a value not in the map");
}

void packed_map::clear() noexcept {
  std::vector<bucket>().swap(keys_);
  std::vector<std::uint32_t>().swap(values_);
  std::vector<std::pair<packed_key, std::uint32_t>>().swap(stash_);
  buckets_ = 0;
  size_ = 0;
}

std::size_t packed_map::memory_bytes() const {
  return keys_.capacity() * sizeof(bucket) + values_.capacity() * sizeof(std::uint32_t) +
         stash_.capacity() * sizeof(stash_[0]);
}

}  // namespace shard
