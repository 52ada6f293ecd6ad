#include "shard/sglang_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "metad/assert.hpp"
#include "shard/verify.hpp"

// sglang_pool: the operations of docs/sglang-api.md on one pool; see the header for the rules.
namespace metad::shard {

sglang_pool::sglang_pool(std::uint64_t num_pages, const sglang_config& config) : config_(config) {
  nodes_.emplace_back();  // the LRU sentinel
  grow(num_pages);
}

sglang_pool::~sglang_pool() {
  release_keys();
  owners_.for_each(
      [](std::uint64_t, const owner& o) { key_blob::destroy(const_cast<char*>(o.blob)); });
}

sglang_pool::sglang_pool(sglang_pool&& other) noexcept { *this = std::move(other); }

sglang_pool& sglang_pool::operator=(sglang_pool&& other) noexcept {
  if (this == &other) return *this;
  release_keys();
  owners_.for_each(
      [](std::uint64_t, const owner& o) { key_blob::destroy(const_cast<char*>(o.blob)); });
  config_ = other.config_;
  pages_ = std::move(other.pages_);
  free_ = std::move(other.free_);
  buckets_ = std::move(other.buckets_);
  key_count_ = std::exchange(other.key_count_, 0);
  nodes_ = std::move(other.nodes_);
  free_nodes_ = std::exchange(other.free_nodes_, 0);
  owners_ = std::exchange(other.owners_, page_owners<owner>{});
  expiry_ = std::move(other.expiry_);
  quarantine_ = std::move(other.quarantine_);
  in_quarantine_ = std::exchange(other.in_quarantine_, page_owners<std::uint8_t>{});
  serial_ = other.serial_;
  epoch_ = other.epoch_;
  stamp_ = other.stamp_;
  other.pages_ = sparse_pages{};
  other.free_.clear();
  other.expiry_.clear();
  other.quarantine_.clear();
  other.buckets_.clear();
  other.nodes_.clear();
  other.nodes_.emplace_back();
  return *this;
}

void sglang_pool::grow(std::uint64_t new_pages) {
  const std::uint64_t old = pages_.num_pages();
  METAD_ASSERT(new_pages >= old && new_pages <= pages_max);
  pages_.grow(new_pages);
  free_.push_range(old, new_pages);
}

// ---------------------------------------------------------------------------------------
// The LRU list and its nodes

void sglang_pool::unlink(std::uint32_t i) {
  node& n = nodes_[i];
  nodes_[n.prev].next = n.next;
  nodes_[n.next].prev = n.prev;
}

void sglang_pool::link_last(std::uint32_t i) {
  const std::uint32_t last = nodes_[0].prev;
  nodes_[i].prev = last;
  nodes_[i].next = 0;
  nodes_[last].next = i;
  nodes_[0].prev = i;
}

std::uint32_t sglang_pool::new_node() {
  if (free_nodes_ != 0) {
    const std::uint32_t i = free_nodes_;
    free_nodes_ = nodes_[i].next;
    nodes_[i] = node{};
    return i;
  }
  METAD_ASSERT(nodes_.size() < UINT32_MAX);
  nodes_.emplace_back();
  return static_cast<std::uint32_t>(nodes_.size() - 1);
}

void sglang_pool::free_node(std::uint32_t i) {
  if (nodes_[i].shape == static_cast<std::uint8_t>(key_shape::other)) {
    key_blob::destroy(reinterpret_cast<char*>(nodes_[i].key[0]));
  }
  nodes_[i] = node{};
  nodes_[i].next = free_nodes_;
  free_nodes_ = i;
}

// ---------------------------------------------------------------------------------------
// Keys: packed inline when they are 32 or 64 hex characters of one case

namespace {
std::uint32_t packed_bucket_hash(key_shape shape, const packed_key& first, const packed_key& rest) {
  const std::uint64_t h1 = packed_hash(first);
  const std::uint64_t h2 =
      packed_hash(packed_key{rest.lo ^ h1, rest.hi ^ static_cast<std::uint64_t>(shape)});
  return static_cast<std::uint32_t>(h2 ^ (h2 >> 32));
}
}  // namespace

sglang_pool::probe sglang_pool::make_probe(std::string_view key) {
  probe k;
  k.text = key;
  k.shape = pack_any_hex_key(key, k.first, k.rest);
  k.hash =
      k.shape == key_shape::other ? table_hash(key) : packed_bucket_hash(k.shape, k.first, k.rest);
  return k;
}

bool sglang_pool::matches(const node& n, const probe& k) {
  if (n.tag != static_cast<std::uint8_t>(k.hash >> 24) ||
      n.shape != static_cast<std::uint8_t>(k.shape))
    return false;
  if (k.shape == key_shape::other) {
    return key_blob::view(reinterpret_cast<const char*>(n.key[0])) == k.text;
  }
  return n.key[0] == k.first.lo && n.key[1] == k.first.hi && n.key[2] == k.rest.lo &&
         n.key[3] == k.rest.hi;
}

std::string sglang_pool::key_of(const node& n) {
  const auto shape = static_cast<key_shape>(n.shape);
  if (shape == key_shape::other) {
    return std::string(key_blob::view(reinterpret_cast<const char*>(n.key[0])));
  }
  std::string out(shape_chars(shape), '\0');
  unpack_any_hex_key(shape, packed_key{n.key[0], n.key[1]}, packed_key{n.key[2], n.key[3]},
                     out.data());
  return out;
}

std::uint32_t sglang_pool::hash_of(const node& n) const {
  const auto shape = static_cast<key_shape>(n.shape);
  if (shape == key_shape::other) {
    return table_hash(key_blob::view(reinterpret_cast<const char*>(n.key[0])));
  }
  return packed_bucket_hash(shape, packed_key{n.key[0], n.key[1]}, packed_key{n.key[2], n.key[3]});
}

void sglang_pool::release_keys() noexcept {
  for (std::size_t i = 1; i < nodes_.size(); ++i) {
    node& n = nodes_[i];
    if (n.shape == static_cast<std::uint8_t>(key_shape::other)) {
      key_blob::destroy(reinterpret_cast<char*>(n.key[0]));
      n.key[0] = 0;
      n.shape = free_shape;
    }
  }
}

std::uint32_t sglang_pool::find(const probe& k) const {
  if (key_count_ == 0) return 0;
  for (std::uint32_t i = buckets_[k.hash & (buckets_.size() - 1)]; i != 0; i = nodes_[i].chain) {
    if (matches(nodes_[i], k)) return i;
  }
  return 0;
}

void sglang_pool::index_node(std::uint32_t i, std::uint32_t hash) {
  if (key_count_ + 1 > buckets_.size()) {
    // Rehash into twice the buckets: every node holding a key but i (not yet indexed).
    std::vector<std::uint32_t>(buckets_.empty() ? 16 : buckets_.size() * 2, 0).swap(buckets_);
    const std::size_t mask = buckets_.size() - 1;
    for (std::size_t j = 1; j < nodes_.size(); ++j) {
      node& n = nodes_[j];
      if (n.shape == free_shape || j == i) continue;
      std::uint32_t& head = buckets_[hash_of(n) & mask];
      n.chain = head;
      head = static_cast<std::uint32_t>(j);
    }
  }
  std::uint32_t& head = buckets_[hash & (buckets_.size() - 1)];
  nodes_[i].chain = head;
  head = i;
  ++key_count_;
}

void sglang_pool::unindex_node(std::uint32_t i) {
  std::uint32_t* link = &buckets_[hash_of(nodes_[i]) & (buckets_.size() - 1)];
  while (*link != i) {
    METAD_ASSERT(*link != 0);
    link = &nodes_[*link].chain;
  }
  *link = nodes_[i].chain;
  nodes_[i].chain = 0;
  --key_count_;
}

std::uint64_t sglang_pool::drop_node(std::uint32_t i) {
  const std::uint64_t page = nodes_[i].page();
  unlink(i);
  unindex_node(i);
  free_node(i);
  return page;
}

void sglang_pool::bind_key(const probe& k, std::uint64_t page, sglang_confirm_stats& stats) {
  std::uint32_t i = find(k);
  if (i != 0) {
    const std::uint64_t old = nodes_[i].page();
    if (old != page) {  // re-binding: the old page would be orphaned in the reference
      pages_.free_bound(old);
      free_.push(old);
      ++stats.rebound_freed;
      nodes_[i].set_page(page);
    }
    unlink(i);
  } else {
    i = new_node();
    node& n = nodes_[i];
    if (k.shape == key_shape::other) {
      n.key[0] = reinterpret_cast<std::uint64_t>(key_blob::make(k.text));
    } else {
      n.key[0] = k.first.lo;
      n.key[1] = k.first.hi;
      n.key[2] = k.rest.lo;
      n.key[3] = k.rest.hi;
    }
    n.shape = static_cast<std::uint8_t>(k.shape);
    n.tag = static_cast<std::uint8_t>(k.hash >> 24);
    n.set_page(page);
    index_node(i, k.hash);
  }
  link_last(i);
}

void sglang_pool::next_stamp() {
  if (++stamp_ != 0) return;
  // Wrapped (once per 2^32 batches): no node may keep a stamp that could match again.
  for (std::size_t i = 0; i < nodes_.size(); ++i) nodes_[i].stamp = 0;
  stamp_ = 1;
}

void sglang_pool::dedupe(std::span<const std::string_view> keys) {
  const std::size_t n = keys.size();
  METAD_ASSERT(n < UINT32_MAX);
  probes_.resize(n);
  first_.resize(n);
  for (std::size_t i = 0; i < n; ++i) probes_[i] = make_probe(keys[i]);
  if (n <= 1) {
    if (n == 1) first_[0] = 0;
    return;
  }
  const std::size_t capacity = std::bit_ceil(std::max<std::size_t>(16, n * 2));
  const std::size_t mask = capacity - 1;
  seen_.assign(capacity, 0);  // request index + 1; 0 = empty
  for (std::uint32_t i = 0; i < n; ++i) {
    for (std::size_t s = probes_[i].hash & mask;; s = (s + 1) & mask) {
      if (seen_[s] == 0) {
        seen_[s] = i + 1;
        first_[i] = i;
        break;
      }
      const std::uint32_t j = seen_[s] - 1;
      if (probes_[j].hash == probes_[i].hash && keys[j] == keys[i]) {
        first_[i] = j;
        break;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Reservations

void sglang_pool::start_reservation(std::string_view key, std::uint64_t page, std::uint64_t now) {
  const std::uint64_t ttl = config_.reservation_ttl;
  const std::uint64_t deadline = ttl == 0 || now >= no_deadline - ttl ? no_deadline : now + ttl;
  const owner o{key_blob::make(key), epoch_, deadline, ++serial_};
  owners_.insert(page, o);
  push_expiry(page, o);
}

void sglang_pool::push_expiry(std::uint64_t page, const owner& o) {
  if (o.deadline == no_deadline) return;
  const expiry_entry e{o.deadline, o.serial, page};
  if (expiry_.empty() || expiry_.back().deadline <= e.deadline) {
    expiry_.push_back(e);
  } else {
    // Deadlines come in order while the TTL stays the same. A pool restored from an image
    // made under a longer --reservation-ttl (lowered across a restart) holds reservations
    // due after new ones: those go before them, or expire() (which stops at the first
    // entry not due) would keep them past their deadline and the next image would list
    // deadlines out of order, which restore() refuses. O(entries) only while such old
    // reservations are in flight.
    expiry_.insert(
        std::upper_bound(expiry_.begin(), expiry_.end(), e.deadline,
                         [](std::uint64_t d, const expiry_entry& x) { return d < x.deadline; }),
        e);
  }
  if (expiry_.size() > 2 * owners_.size() + 64) {
    std::erase_if(expiry_, [this](const expiry_entry& e) { return !live(e); });
  }
}

void sglang_pool::free_in_flight(std::uint64_t page) {
  const owner o = owners_.take(page);
  if (o.blob != nullptr) key_blob::destroy(const_cast<char*>(o.blob));
  pages_.release(page);
  free_.push(page);
}

void sglang_pool::quarantine(std::uint64_t page, std::uint64_t until) {
  METAD_ASSERT(pages_.state(page) == page_state::reserved && !in_quarantine(page));
  const owner o = owners_.take(page);
  if (o.blob != nullptr) key_blob::destroy(const_cast<char*>(o.blob));
  quarantine_.push_back(quarantined_page{until, page});
  in_quarantine_.insert(page, 1);
}

std::size_t sglang_pool::end_quarantines(std::uint64_t now, std::vector<std::int64_t>* ended_out) {
  std::size_t ended = 0;
  while (!quarantine_.empty() && quarantine_.front().until <= now) {
    const std::uint64_t page = quarantine_.front().page;
    quarantine_.pop_front();
    in_quarantine_.take(page);
    pages_.release(page);
    free_.push(page);
    if (ended_out != nullptr) ended_out->push_back(page);
    ++ended;
  }
  if (ended != 0) METAD_VERIFY_AFTER("sglang_pool::end_quarantines", verify_size(), verify());
  return ended;
}

bool sglang_pool::end_quarantine(std::span<const std::int64_t> pages) {
  if (pages.size() > quarantine_.size()) return false;
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0 || static_cast<std::uint64_t>(pages[i]) != quarantine_[i].page) return false;
  }
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const std::uint64_t page = quarantine_.front().page;
    quarantine_.pop_front();
    in_quarantine_.take(page);
    pages_.release(page);
    free_.push(page);
  }
  return true;
}

bool sglang_pool::restore_quarantine(std::span<const std::int64_t> pages, std::uint64_t until) {
  std::vector<std::int64_t> sorted(pages.begin(), pages.end());
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return false;
  for (const std::int64_t p : pages) {
    if (p < 0 || static_cast<std::uint64_t>(p) >= num_pages()) return false;
    const auto page = static_cast<std::uint64_t>(p);
    if (pages_.state(page) != page_state::reserved || owners_.find(page).blob != nullptr ||
        in_quarantine(page))
      return false;  // not unowned
  }
  for (const std::int64_t p : pages) quarantine(static_cast<std::uint64_t>(p), until);
  return true;
}

void sglang_pool::restart_quarantines(std::uint64_t until) {
  for (quarantined_page& q : quarantine_) q.until = until;
}

std::size_t sglang_pool::expire(std::uint64_t now, std::vector<std::uint64_t>* expired_out) {
  std::size_t expired = 0;
  while (!expiry_.empty() && expiry_.front().deadline <= now) {
    const expiry_entry e = expiry_.front();
    expiry_.pop_front();
    if (!live(e)) continue;
    METAD_ASSERT(e.deadline <= now && pages_.state(e.page) == page_state::reserved);
    free_in_flight(e.page);
    if (expired_out != nullptr) expired_out->push_back(e.page);
    ++expired;
  }
  return expired;
}

bool sglang_pool::take_page(std::uint64_t now, std::uint64_t& page, sglang_reserve_stats& stats,
                            bool fresh) {
  if (fresh && !free_.empty()) {
    page = free_.pop();
    pages_.take(page);
    return true;
  }
  // Evict the LRU head. The hits of this batch were moved to the MRU end in pass 1 and
  // carry this batch's stamp, as do leased keys already passed over; so once the head
  // carries it, no evictable key is left (B5: a hit is never evicted by its own batch).
  // Eviction comes before the quarantine: a pool that is full (an SGLang cache's steady
  // state) would otherwise hand every released page straight out again.
  for (;;) {
    const std::uint32_t i = nodes_[0].next;
    if (i == 0 || nodes_[i].stamp == stamp_) break;
    if (nodes_[i].lease_until > now) {  // leased: passed over (a lease counts as a use)
      nodes_[i].stamp = stamp_;
      unlink(i);
      link_last(i);
      continue;
    }
    page = drop_node(i);
    pages_.free_bound(page);
    pages_.take(page);
    ++stats.evicted;
    return true;
  }
  if (!fresh || quarantine_.empty()) return false;
  // The last resort: the oldest quarantined page (reserved already, for no key).
  page = quarantine_.front().page;
  quarantine_.pop_front();
  METAD_ASSERT(pages_.state(page) == page_state::reserved && owners_.find(page).blob == nullptr);
  in_quarantine_.take(page);
  ++stats.unquarantined;
  return true;
}

sglang_reserve_stats sglang_pool::reserve_capped(std::span<const std::string_view> keys,
                                                 std::uint64_t now, std::vector<sglang_slot>& out,
                                                 std::uint64_t fresh_max) {
  sglang_reserve_stats stats;
  stats.expired = static_cast<std::uint32_t>(expire(now));
  next_stamp();
  dedupe(keys);
  const std::size_t n = keys.size();
  out.assign(n, sglang_slot{});
  found_.assign(n, 0);
  // Pass 1: hits, every occurrence moved to the MRU end in input order (as the reference).
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t f = first_[i];
    const std::uint32_t node_index = f == i ? find(probes_[i]) : found_[f];
    if (node_index == 0) continue;
    found_[i] = node_index;
    node& nd = nodes_[node_index];
    nd.stamp = stamp_;
    unlink(node_index);
    link_last(node_index);
    out[i] = sglang_slot{true, static_cast<std::int64_t>(nd.page())};
    ++stats.hits;
  }
  // Pass 2: one page per distinct missing key, in input order; repeats copy (B4).
  for (std::size_t i = 0; i < n; ++i) {
    if (found_[i] != 0) continue;
    const std::uint32_t f = first_[i];
    if (f != i) {
      out[i] = out[f];
    } else {
      std::uint64_t page = 0;
      const std::uint32_t evicted = stats.evicted;
      if (take_page(now, page, stats, fresh_max > 0)) {
        if (stats.evicted == evicted) --fresh_max;  // a free or quarantined page
        start_reservation(keys[i], page, now);
        out[i] = sglang_slot{false, static_cast<std::int64_t>(page)};
        ++stats.allocated;
      }
    }
    if (out[i].page < 0) ++stats.no_page;
  }
  METAD_VERIFY_AFTER("sglang_pool::reserve", verify_size(), verify());
  return stats;
}

// ---------------------------------------------------------------------------------------
// Lookups

void sglang_pool::exists(std::span<const std::string_view> keys,
                         std::span<std::uint8_t> out) const {
  METAD_ASSERT(out.size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out[i] = find(make_probe(keys[i])) != 0 ? 1 : 0;
  }
}

void sglang_pool::inspect(std::span<const std::string_view> keys,
                          std::span<sglang_key_report> out) const {
  METAD_ASSERT(out.size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out[i] = sglang_key_report{};
    if (const std::uint32_t n = find(make_probe(keys[i])); n != 0) {
      out[i].page = static_cast<std::int64_t>(nodes_[n].page());
      out[i].lease_until = nodes_[n].lease_until;
    }
  }
  if (owners_.size() == 0 || keys.empty()) return;
  owners_.for_each([&](std::uint32_t page, const owner& o) {
    if (o.blob == nullptr) return;
    const std::string_view key = key_blob::view(o.blob);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] != key || out[i].reserved_page >= 0) continue;
      out[i].reserved_page = page;
      out[i].reserved_until = o.deadline;
      out[i].reserved_stale = o.epoch != epoch_;
    }
  });
}

void sglang_pool::get_page_indices(std::span<const std::string_view> keys, std::uint64_t now,
                                   std::span<std::int64_t> out) {
  METAD_ASSERT(out.size() == keys.size());
  const std::uint64_t until =
      config_.read_lease == 0
          ? 0
          : (now > UINT64_MAX - config_.read_lease ? UINT64_MAX : now + config_.read_lease);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::uint32_t node_index = find(make_probe(keys[i]));
    if (node_index == 0) {
      out[i] = -1;
      continue;
    }
    node& nd = nodes_[node_index];
    out[i] = static_cast<std::int64_t>(nd.page());
    nd.lease_until = std::max(nd.lease_until, until);
    unlink(node_index);
    link_last(node_index);
  }
  METAD_VERIFY_AFTER("sglang_pool::get_page_indices", verify_size(), verify());
}

}  // namespace metad::shard
