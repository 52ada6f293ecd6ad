#include "shard/packed_map.hpp"

#include "metad/assert.hpp"

namespace metad::shard {
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
    std::uint32_t& v = cur_.values[b * ways + j];
    if (v == 0) {
      cur_.keys[b].k[j] = k;
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
  for (std::size_t j = 0; j < ways; ++j) n += cur_.values[b * ways + j] == 0;
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
      const auto [c1, c2] = cur_.buckets_of(hash_(cur_.keys[homes[h]].k[j]));
      others[h * ways + j] = c1 == homes[h] ? c2 : c1;
      __builtin_prefetch(&cur_.values[others[h * ways + j] * ways]);
    }
  }
  for (std::size_t h = 0; h < 2; ++h) {
    const std::size_t b = homes[h];
    for (std::size_t j = 0; j < ways; ++j) {
      const std::size_t other = others[h * ways + j];
      if (other != b && put(other, cur_.keys[b].k[j], cur_.values[b * ways + j])) {
        cur_.keys[b].k[j] = k;
        cur_.values[b * ways + j] = value;
        return true;
      }
    }
  }
  return false;
}

void packed_map::insert_new(const packed_key& k, std::uint64_t h, std::uint32_t value) {
  METAD_ASSERT(value != 0);
  image_open_ = false;
  if (bulk_) {
    if (size_ + 1 > max_size()) {
      grow();
      if (growing()) migrate(old_.buckets);
    }
  } else {
    if (growing())
      migrate(migrate_per_insert);
    else
      prepare_growth();
    if (size_ + 1 > max_size()) grow();
  }
  ++size_;
  const auto [b1, b2] = cur_.buckets_of(h);
  if (put_balanced(b1, b2, k, value)) return;
  place(k, value, true);
}

void packed_map::place(packed_key k, std::uint32_t value, bool may_grow) {
  for (;;) {
    const auto [b1, b2] = cur_.buckets_of(hash_(k));
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
      std::swap(k, cur_.keys[b].k[j]);
      std::swap(value, cur_.values[b * ways + j]);
      const auto [c1, c2] = cur_.buckets_of(hash_(k));
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

namespace {

// Buckets of the table after one of `n` buckets: doubling while small (cheap), then
// +25%: the load after growth stays >= 0.9 / 1.25 = 0.72, so a key never costs more
// than ~28 bytes once the table is large.
std::size_t grown_buckets(std::size_t n) {
  const std::size_t next = n < 1024 ? std::max<std::size_t>(4, n * 2) : n + n / 4;
  METAD_ASSERT(next < (std::size_t{1} << 32));  // buckets_of maps 32-bit halves
  return next;
}

}  // namespace

void packed_map::prepare_growth() {
  const std::size_t from = capacity() * prepare_load_pct / 100;
  if (cur_.buckets <= incremental_buckets || size_ < from) return;
  if (next_.buckets == 0) table(grown_buckets(cur_.buckets)).swap(next_);
  // Pages faulted in keep pace with the load: all of them once the table is full.
  const std::size_t pages = next_.pages();
  const std::size_t span = std::max<std::size_t>(1, max_size() - from);
  const std::size_t due = pages * std::min(size_ - from + 1, span) / span;
  const std::size_t done = pages - next_.pages_left();
  if (due > done) next_.prefault(due - done);
}

void packed_map::reserve(std::size_t n) {
  if (size_ != 0 || growing()) return;
  const std::size_t buckets = std::max<std::size_t>(4, (n * 10 / 8 + ways - 1) / ways);
  if (buckets <= cur_.buckets) return;
  METAD_ASSERT(buckets < (std::size_t{1} << 32));
  table(buckets).swap(cur_);
  table().swap(next_);
  cur_.prefault(cur_.pages_left());
}

void packed_map::shrink_to_fit() {
  if (growing() || cur_.buckets <= incremental_buckets || size_ * 10 >= capacity() * 7) return;
  packed_map fit(hash_);
  fit.bulk_ = true;
  fit.reserve(size_);
  for_each(
      [&](const packed_key& k, const std::uint32_t& value) { fit.insert_new(k, hash_(k), value); });
  fit.bulk_ = bulk_;
  fit.rng_ = rng_;
  swap(fit);
}

void packed_map::find_sweep(const packed_key* keys, const std::uint64_t* hashes, std::size_t n,
                            bool second, std::uint32_t** out) {
  METAD_ASSERT(n <= sweep_batch);
  if (size_ == 0 || growing() || !stash_.empty()) {
    for (std::size_t i = 0; i < n; ++i) out[i] = find(keys[i], hashes[i]);
    return;
  }
  std::size_t missed[sweep_batch];
  std::size_t misses = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto [b1, b2] = cur_.buckets_of(hashes[i]);
    out[i] = const_cast<std::uint32_t*>(cur_.find_in(second ? b2 : b1, keys[i]));
    if (out[i] != nullptr || b1 == b2) continue;
    __builtin_prefetch(&cur_.keys[second ? b1 : b2]);
    missed[misses++] = i;
  }
  for (std::size_t m = 0; m < misses; ++m) {
    const std::size_t i = missed[m];
    const auto [b1, b2] = cur_.buckets_of(hashes[i]);
    out[i] = const_cast<std::uint32_t*>(cur_.find_in(second ? b1 : b2, keys[i]));
  }
}

void packed_map::begin_image(std::size_t buckets) {
  METAD_ASSERT(size_ == 0 && !growing() && buckets > 0 && buckets < (std::size_t{1} << 32));
  METAD_ASSERT(hash_ == packed_hash);  // the layout images assume
  if (cur_.buckets != buckets) {
    table(buckets).swap(cur_);
    cur_.prefault(cur_.pages_left());
  }
  table().swap(next_);
  image_open_ = true;
  image_next_ = 0;
}

bool packed_map::place_at(std::size_t slot, const packed_key& k, std::uint32_t value) {
  const std::size_t b = slot / ways;
  if (!image_open_ || slot < image_next_ || value == 0) return false;
  const auto [b1, b2] = cur_.buckets_of(packed_hash(k));
  if (b != b1 && b != b2) return false;
  // k held already: a match whose slot is taken (an empty slot's key bytes are zero). A
  // second copy of k sits in its other bucket; slots fill in order, so the copy placed
  // second finds the first: only the other bucket when it comes earlier is read.
  const std::size_t other = b == b1 ? b2 : b1;
  for (const std::size_t c : {b, other}) {
    if (c > b) break;
    for (unsigned m = cur_.match_mask(c, k); m != 0; m &= m - 1)
      if (cur_.values[c * ways + static_cast<std::size_t>(__builtin_ctz(m)) / 2] != 0) return false;
  }
  cur_.keys[b].k[slot % ways] = k;
  cur_.values[slot] = value;
  image_next_ = slot + 1;
  ++size_;
  return true;
}

void packed_map::grow() {
  // A growth still under way finishes first (only a homeless entry can ask that early).
  if (growing()) migrate(old_.buckets);
  if (next_.buckets == 0) table(grown_buckets(cur_.buckets)).swap(next_);
  if (bulk_) next_.prefault(next_.pages_left());  // all of it is written now
  old_.swap(cur_);
  cur_.swap(next_);  // next_ is now the empty table cur_ was
  migrated_ = 0;
  // Stashed entries may fit now; they are few (none in practice).
  std::vector<std::pair<packed_key, std::uint32_t>> stashed;
  stashed.swap(stash_);
  for (const auto& e : stashed) place(e.first, e.second, false);
  if (old_.buckets <= incremental_buckets) migrate(old_.buckets);
}

void packed_map::migrate(std::size_t n) {
  const std::size_t end = std::min(old_.buckets, migrated_ + n);
  // Buckets map monotonically onto the hash halves, so an entry that sat in bucket b as
  // its first (second) choice belongs near b * next / old as its first (second) choice
  // again: trying that bucket first makes the move a near-sequential sweep instead of
  // two cache misses per entry.
  for (std::size_t b = migrated_; b < end; ++b) {
    for (std::size_t j = 0; j < ways; ++j) {
      std::uint32_t& value = old_.values[b * ways + j];
      if (value == 0) continue;
      const packed_key& k = old_.keys[b].k[j];
      const std::uint64_t h = hash_(k);
      const auto [c1, c2] = cur_.buckets_of(h);
      if (!put(old_.buckets_of(h).first == b ? c1 : c2, k, value)) place(k, value, false);
      value = 0;
    }
  }
  migrated_ = end;
  old_.keys.drop_prefix(end);
  old_.values.drop_prefix(end * ways);
  if (migrated_ == old_.buckets) {
    table().swap(old_);
    migrated_ = 0;
  }
}

void packed_map::erase(std::uint32_t* value) {
  METAD_ASSERT(value != nullptr && *value != 0);
  image_open_ = false;
  if (old_.holds(value)) {
    *value = 0;
    --size_;
    return;
  }
  if (cur_.holds(value)) {
    const auto i = static_cast<std::size_t>(value - cur_.values.data());
    *value = 0;
    cur_.keys[i / ways].k[i % ways] = packed_key{};
    --size_;
    // A freed slot may take back a stashed key.
    for (std::size_t s = 0; s < stash_.size(); ++s) {
      const auto [b1, b2] = cur_.buckets_of(hash_(stash_[s].first));
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
  METAD_ASSERT(false && "erase of a value not in the map");
}

void packed_map::clear() noexcept {
  image_open_ = false;
  table().swap(cur_);
  table().swap(old_);
  table().swap(next_);
  migrated_ = 0;
  std::vector<std::pair<packed_key, std::uint32_t>>().swap(stash_);
  size_ = 0;
}

std::size_t packed_map::memory_bytes() const {
  std::size_t bytes = stash_.capacity() * sizeof(stash_[0]);
  for (const table* t : {&cur_, &old_, &next_}) bytes += t->keys.bytes() + t->values.bytes();
  return bytes;
}

}  // namespace metad::shard
