// rank_table's state, for rank_table.cpp and for the tests that break an invariant
// through verify_access (tests/shard/verify_test.cpp): per rank, a page pool and a key ->
// {page, reserved|confirmed} map, plus the reverse map of reserved pages.
#pragma once

#include <algorithm>
#include <bit>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "metad/assert.hpp"
#include "shard/page_pool.hpp"
#include "shard/rank_keys.hpp"
#include "shard/rank_table.hpp"
#include "shard/reservation_queue.hpp"
#include "shard/wide_store.hpp"

namespace metad::shard {
namespace rank_table_detail {

struct quarantined {
  std::uint64_t until;
  std::uint32_t page;
};

struct rank_state {
  page_pool pool;
  rank_keys keys;            // key → {page, reserved|confirmed}; reserved page → key
  reservation_queue expiry;  // reservations by deadline (only with a TTL)
  // Released pages, oldest first: reserved in the pool, owned by no key. Allocation
  // and the end of quarantines both take from the front, so it stays in order.
  std::deque<quarantined> quarantine;

  // Pages an allocation can take: free ones it may hand out, then quarantined ones.
  std::uint64_t available() const { return pool.available() + quarantine.size(); }
  // The lowest free page, else the oldest quarantined one; now reserved (for no key
  // yet). Precondition: available() > 0.
  std::uint32_t take_page() {
    if (pool.available() > 0) return pool.take_lowest();
    METAD_ASSERT(!quarantine.empty());
    const std::uint32_t page = quarantine.front().page;
    quarantine.pop_front();
    // A quarantined page is reserved in the pool and owned by no key.
    METAD_ASSERT(pool.state(page) == page_state::reserved && !keys.owners.find(page).set);
    return page;
  }
  rank_stats stats() const {
    const auto q = static_cast<std::int64_t>(quarantine.size());
    return rank_stats{static_cast<std::int64_t>(pool.num_pages()),
                      static_cast<std::int64_t>(pool.free_count()) + q,
                      std::int64_t{pool.reserved_count()} - q, pool.bound_count(), q};
  }

  // Whether the queue entry's reservation still holds the page.
  bool live(const reservation_queue::entry& e) const {
    const key_owner owner = keys.owners.find(e.page);
    return owner.set && owner.deadline == e.deadline;
  }
  void reserve(std::string_view key, const parsed_key& p, std::uint32_t page,
               std::uint64_t deadline) {
    keys.reserve(key, p, page, deadline);
    if (deadline == no_deadline) return;
    expiry.push(page, deadline, keys.owners.size(),
                [this](const reservation_queue::entry& e) { return live(e); });
  }
  static constexpr std::uint64_t no_deadline = UINT64_MAX;

  // What verify() walks for this rank (METAD_VERIFY_AFTER's n).
  std::size_t verify_size() const {
    return keys.size() + keys.map.store_size() + quarantine.size() + pool.high_water() / 16;
  }
  // The rank's invariants (rank_table.hpp); "" when they hold.
  std::string verify() const;
};

}  // namespace rank_table_detail

struct rank_table::impl {
  using rank_state = rank_table_detail::rank_state;

  // The records of the ranks' wide keys (SHA-256 hashes: see wide_store), one per key
  // whichever of this core's ranks hold it. Declared first: the ranks release theirs.
  wide_store wide_keys;
  std::unordered_map<std::int64_t, rank_state> ranks;
  std::uint64_t reservation_ttl = 0;  // 0: reservations never expire
  bool bulk = false;                  // recovery: key tables grow at once
  std::uint64_t refused_releases = 0;
  std::uint64_t expired = 0;
  std::vector<std::int64_t> expired_pages;  // scratch of expire()
  // Scratch reused across calls, so steady-state calls do not allocate here.
  std::vector<parsed_key> parsed;     // each request key, parsed
  std::vector<std::uint32_t*> words;  // each confirmed key's stored word
  std::vector<std::uint32_t> seen;    // dedupe table: request key index + 1, 0 = empty
  std::vector<std::uint32_t> misses;  // offsets (from the first output) needing a page

  rank_state* find(std::int64_t rank) {
    auto it = ranks.find(rank);
    return it == ranks.end() ? nullptr : &it->second;
  }
  const rank_state* find(std::int64_t rank) const {
    auto it = ranks.find(rank);
    return it == ranks.end() ? nullptr : &it->second;
  }

  // Parses every key and starts loading the lines its lookup will read.
  void parse_keys(const rank_state& rs, std::span<const std::string_view> keys) {
    parsed.resize(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      parse_key(keys[i], parsed[i]);
      rs.keys.prefetch(parsed[i]);
    }
  }

  // Appends the index of each distinct key's first occurrence. Needs parse_keys first.
  void dedupe(std::span<const std::string_view> keys, std::vector<std::uint32_t>& out) {
    METAD_ASSERT(keys.size() < UINT32_MAX);
    if (keys.size() <= 1) {
      if (keys.size() == 1) out.push_back(0);
      return;
    }
    const std::size_t capacity = std::bit_ceil(std::max<std::size_t>(16, keys.size() * 2));
    const std::size_t mask = capacity - 1;
    seen.assign(capacity, 0);
    for (std::uint32_t i = 0; i < keys.size(); ++i) {
      std::size_t slot = parsed[i].hash & mask;
      for (;; slot = (slot + 1) & mask) {
        const std::uint32_t other = seen[slot];
        if (other == 0) {
          seen[slot] = i + 1;
          out.push_back(i);
          break;
        }
        if (parsed[other - 1].hash == parsed[i].hash && keys[other - 1] == keys[i]) break;
      }
    }
  }

  // Also leaves each key's word in `words` for the confirm loop (no insert or erase
  // happens in between, so the pointers stay valid).
  std::string validate_confirm(std::int64_t rank, rank_state& rs,
                               std::span<const std::string_view> keys,
                               std::span<const std::int64_t> pages,
                               std::span<const std::int64_t> releases);
  void release(rank_state& rs, std::uint64_t page, std::uint64_t quarantine_until);
  std::uint64_t deadline(std::uint64_t now) const {
    return reservation_ttl == 0 ? rank_state::no_deadline : now + reservation_ttl;
  }
};

}  // namespace metad::shard
