#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <deque>
#include <unordered_map>

#include "metad/assert.hpp"
#include "shard/page_pool.hpp"
#include "shard/rank_keys.hpp"
#include "shard/rank_table.hpp"
#include "shard/rank_table_impl.hpp"
#include "shard/reservation_queue.hpp"
#include "shard/verify.hpp"

// rank_table: per rank, a page pool and a key → {page, reserved|confirmed} map, plus the
// reverse map of reserved pages. Only the rank's owning core calls it.
namespace metad::shard {
namespace {

// What creating a rank costs before it holds a page (its table entry and empty maps); the
// pages and keys it takes later are charged as it takes them.
constexpr std::size_t kPoolBytes = 1024;

using rank_table_detail::quarantined;
using rank_table_detail::rank_state;

}  // namespace

rank_table::rank_table() : impl_(std::make_unique<impl>()) {}
rank_table::~rank_table() = default;
rank_table::rank_table(rank_table&&) noexcept = default;
rank_table& rank_table::operator=(rank_table&&) noexcept = default;

void rank_table::set_reservation_ttl(std::uint64_t ttl) { impl_->reservation_ttl = ttl; }

init_result rank_table::initialize(std::int64_t rank, std::int64_t num_pages,
                                   std::vector<std::string>* unbound_out) {
  METAD_ASSERT(num_pages > 0 && static_cast<std::uint64_t>(num_pages) <= page_pool::pages_max);
  const auto pages = static_cast<std::uint64_t>(num_pages);
  auto [it, created] = impl_->ranks.try_emplace(rank);
  rank_state& rs = it->second;
  if (created) {
    rs.keys.map.share(impl_->wide_keys);
    if (impl_->bulk) rs.keys.map.set_bulk(true);
    rs.pool.grow(pages);
    return {init_outcome::created, 0};
  }
  const auto old_pages = static_cast<std::int64_t>(rs.pool.num_pages());
  if (num_pages == old_pages) return {init_outcome::unchanged, old_pages};
  if (num_pages > old_pages) {
    rs.pool.grow(pages);
    return {init_outcome::grown, old_pages};
  }
  // A shrink: first every key on a page past the new end (collected, then dropped: the
  // maps must not change while they are walked).
  std::vector<std::pair<std::string, bool>> past_end;  // key, confirmed
  for_each_entry([&](std::int64_t r, std::string_view key, std::int64_t page, bool confirmed) {
    if (r == rank && page >= num_pages) past_end.emplace_back(key, confirmed);
  });
  parsed_key parsed;
  for (const auto& [key, confirmed] : past_end) {
    parse_key(key, parsed);
    const std::uint32_t page = entry_word::page(*rs.keys.find(key, parsed));
    if (confirmed) {
      const std::int64_t removed = rs.keys.remove_confirmed(key, parsed);
      METAD_ASSERT(removed == page);
      rs.pool.free_bound(page);
      if (unbound_out != nullptr) unbound_out->push_back(key);
    } else {
      rs.keys.release_reserved(page);
      rs.pool.release(page);
    }
  }
  std::erase_if(rs.quarantine, [&](const quarantined& q) {
    if (q.page < pages) return false;
    rs.pool.release(q.page);
    return true;
  });
  rs.pool.shrink(pages);
  METAD_VERIFY_AFTER("rank_table::initialize", rs.verify_size(), rs.verify());
  return {init_outcome::shrunk, old_pages};
}

std::size_t rank_table::pool_bytes(std::int64_t num_pages) {
  METAD_ASSERT(num_pages >= 0 && static_cast<std::uint64_t>(num_pages) <= page_pool::pages_max);
  return num_pages == 0 ? 0 : kPoolBytes;
}

bool rank_table::contains(std::int64_t rank) const { return impl_->find(rank) != nullptr; }

allocate_result rank_table::allocate(std::int64_t rank, std::span<const std::string_view> keys,
                                     std::uint64_t now, std::vector<std::uint32_t>& distinct_out,
                                     std::vector<std::int64_t>& pages_out, std::uint64_t new_max,
                                     page_quota quota) {
  rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return {};
  impl& m = *impl_;
  m.parse_keys(*rs, keys);
  const std::size_t distinct_base = distinct_out.size();
  m.dedupe(keys, distinct_out);
  const std::size_t pages_base = pages_out.size();
  m.misses.clear();
  for (std::size_t k = distinct_base; k < distinct_out.size(); ++k) {
    const std::uint32_t i = distinct_out[k];
    if (const std::uint32_t* word = rs->keys.find(keys[i], m.parsed[i])) {
      pages_out.push_back(entry_word::page(*word));  // held already: reserved or confirmed
    } else {
      pages_out.push_back(-1);
      m.misses.push_back(static_cast<std::uint32_t>(k - distinct_base));
    }
  }
  // All or nothing over the keys that need a new page.
  const std::uint64_t free = std::min<std::uint64_t>(rs->available(), new_max);
  if (m.misses.size() > free) {
    const auto missing = static_cast<std::uint32_t>(m.misses.size() - free);
    return {true, missing, missing <= rs->pool.bound_count()};
  }
  if (quota.held != nullptr && !m.misses.empty()) {
    const auto need = static_cast<std::int64_t>(m.misses.size());
    std::int64_t held = quota.held->load(std::memory_order_relaxed);
    do {
      if (quota.max >= 0 && held + need > quota.max) {
        // Pages to free for this batch to fit (no more than it takes, even when the
        // holder is far over a lowered bound: an allocation evicts for itself only).
        const auto missing = static_cast<std::uint32_t>(std::min(need, held + need - quota.max));
        return {true, missing, missing <= rs->pool.bound_count(), 0, true};
      }
    } while (!quota.held->compare_exchange_weak(held, held + need, std::memory_order_relaxed));
  }
  const std::uint64_t deadline = m.deadline(now);
  for (const std::uint32_t offset : m.misses) {
    const std::uint32_t i = distinct_out[distinct_base + offset];
    const std::uint32_t page = rs->take_page();
    METAD_ASSERT(page < rs->pool.num_pages() && rs->pool.state(page) == page_state::reserved);
    rs->reserve(keys[i], m.parsed[i], page, deadline);
    pages_out[pages_base + offset] = page;
  }
  METAD_VERIFY_AFTER("rank_table::allocate", rs->verify_size(), rs->verify());
  return {true, 0, false, static_cast<std::uint32_t>(m.misses.size())};
}

std::size_t rank_table::expire_impl(std::uint64_t now, void* visit,
                                    void (*call)(void*, std::int64_t,
                                                 std::span<const std::int64_t>)) {
  impl& m = *impl_;
  if (m.reservation_ttl == 0) return 0;
  std::size_t total = 0;
  for (auto& entry : m.ranks) {
    rank_state& rs = entry.second;
    m.expired_pages.clear();
    total += rs.expiry.pop_due(
        now, [&rs](const reservation_queue::entry& e) { return rs.live(e); },
        [&](std::uint32_t page) {
          METAD_ASSERT(rs.pool.state(page) == page_state::reserved);
          rs.keys.release_reserved(page);
          rs.pool.release(page);
          m.expired_pages.push_back(page);
        });
    if (!m.expired_pages.empty()) call(visit, entry.first, m.expired_pages);
    if (!m.expired_pages.empty())
      METAD_VERIFY_AFTER("rank_table::expire", rs.verify_size(), rs.verify());
  }
  m.expired += total;
  return total;
}

bool rank_table::release_reserved(std::int64_t rank, std::span<const std::int64_t> pages) {
  rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return false;
  for (const std::int64_t page : pages) {
    if (page < 0 || static_cast<std::uint64_t>(page) >= rs->pool.num_pages()) return false;
    if (rs->pool.state(static_cast<std::uint64_t>(page)) != page_state::reserved) continue;
    const auto p = static_cast<std::uint32_t>(page);  // reserved: below the high-water mark
    if (!rs->keys.owners.find(p).set) continue;
    rs->keys.release_reserved(p);
    rs->pool.release(p);
  }
  return true;
}

std::size_t rank_table::end_quarantines_impl(std::uint64_t now, void* visit,
                                             void (*call)(void*, std::int64_t,
                                                          std::span<const std::int64_t>)) {
  impl& m = *impl_;
  std::size_t total = 0;
  for (auto& [rank, rs] : m.ranks) {
    if (rs.quarantine.empty() || rs.quarantine.front().until > now) continue;
    m.expired_pages.clear();
    while (!rs.quarantine.empty() && rs.quarantine.front().until <= now) {
      const std::uint32_t page = rs.quarantine.front().page;
      rs.quarantine.pop_front();
      // Quarantined: reserved in the pool, owned by no key.
      METAD_ASSERT(rs.pool.state(page) == page_state::reserved && !rs.keys.owners.find(page).set);
      rs.pool.release(page);
      m.expired_pages.push_back(page);
    }
    total += m.expired_pages.size();
    call(visit, rank, m.expired_pages);
    METAD_VERIFY_AFTER("rank_table::end_quarantines", rs.verify_size(), rs.verify());
  }
  return total;
}

bool rank_table::end_quarantine(std::int64_t rank, std::span<const std::int64_t> pages) {
  rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return false;
  for (const std::int64_t page : pages) {
    if (rs->quarantine.empty() || rs->quarantine.front().page != page) return false;
    rs->quarantine.pop_front();
    rs->pool.release(static_cast<std::uint32_t>(page));
  }
  return true;
}

bool rank_table::restore_quarantine(std::int64_t rank, std::span<const std::int64_t> pages,
                                    std::uint64_t until) {
  rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return false;
  for (const std::int64_t page : pages) {
    if (page < 0 || !rs->pool.can_take(static_cast<std::uint64_t>(page))) return false;
    const auto p = static_cast<std::uint32_t>(page);
    rs->pool.take(p);
    rs->quarantine.push_back({until, p});
  }
  return true;
}

void rank_table::restart_quarantines(std::uint64_t until) {
  for (auto& entry : impl_->ranks) {
    rank_state& rs = entry.second;
    if (until == 0) {
      for (const quarantined& q : rs.quarantine) rs.pool.release(q.page);
      rs.quarantine.clear();
    } else {
      for (quarantined& q : rs.quarantine) q.until = until;
    }
  }
}

void rank_table::for_each_quarantine_impl(void* visit,
                                          void (*call)(void*, std::int64_t,
                                                       std::span<const std::int64_t>)) const {
  std::vector<std::int64_t> pages;
  for (const auto& [rank, rs] : impl_->ranks) {
    if (rs.quarantine.empty()) continue;
    pages.clear();
    for (const quarantined& q : rs.quarantine) pages.push_back(q.page);
    call(visit, rank, pages);
  }
}

bool rank_table::remove_confirmed(std::int64_t rank, std::span<const std::string_view> keys,
                                  std::vector<std::uint32_t>& removed_out) {
  rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return false;
  parsed_key parsed;
  for (std::uint32_t i = 0; i < keys.size(); ++i) {
    parse_key(keys[i], parsed);
    const std::int64_t page = rs->keys.remove_confirmed(keys[i], parsed);
    if (page < 0) continue;
    rs->pool.free_bound(static_cast<std::uint32_t>(page));
    removed_out.push_back(i);
  }
  METAD_VERIFY_AFTER("rank_table::remove_confirmed", rs->verify_size(), rs->verify());
  return true;
}

std::string rank_table::impl::validate_confirm(std::int64_t rank, rank_state& rs,
                                               std::span<const std::string_view> keys,
                                               std::span<const std::int64_t> pages,
                                               std::span<const std::int64_t> releases) {
  const std::int64_t num_pages = rs.pool.num_pages();
  words.resize(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::int64_t page = pages[i];
    if (page < 0 || page >= num_pages) {
      return fmt::format("Page {} out of range for rank {} (num_pages {})", page, rank, num_pages);
    }
    std::uint32_t* word = rs.keys.find(keys[i], parsed[i]);
    words[i] = word;
    if (word != nullptr && entry_word::page(*word) == page) continue;  // reserved or bound
    // Every earlier confirmation was valid, so page p is held by keys[j] if pages[j] == p.
    for (std::size_t j = 0; j < i; ++j) {
      if (pages[j] == page && keys[j] != keys[i]) {
        return fmt::format("Page {} confirmed for two different keys", page);
      }
    }
    return fmt::format("Page {} is not reserved for key {} on rank {}", page, keys[i], rank);
  }
  for (const std::int64_t page : releases) {
    if (page < 0 || page >= num_pages) {
      return fmt::format("Page {} in pages_to_release out of range for rank {} (num_pages {})",
                         page, rank, num_pages);
    }
  }
  return {};
}

void rank_table::impl::release(rank_state& rs, std::uint64_t any_page,
                               std::uint64_t quarantine_until) {
  const page_state state = rs.pool.state(any_page);
  const auto page = static_cast<std::uint32_t>(any_page);  // if held: below the mark
  switch (state) {
    case page_state::free:
      return;
    case page_state::bound:
      ++refused_releases;  // a live cache hit: freeing it would let another key overwrite it
      return;
    case page_state::reserved:
      if (!rs.keys.owners.find(page).set) return;  // quarantined: released already
      rs.keys.release_reserved(page);
      if (quarantine_until == 0) {
        rs.pool.release(page);
      } else {
        METAD_ASSERT(!rs.keys.owners.find(page).set);  // a quarantined page has no owner
        rs.quarantine.push_back({quarantine_until, page});
      }
      return;
  }
}

confirm_outcome rank_table::confirm(std::int64_t rank, std::span<const std::string_view> keys,
                                    std::span<const std::int64_t> pages,
                                    std::span<const std::int64_t> releases,
                                    std::uint64_t quarantine_until, std::string& detail,
                                    std::vector<std::uint32_t>& newly_confirmed_out) {
  METAD_ASSERT(keys.size() == pages.size() && keys.size() < UINT32_MAX);
  rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return confirm_outcome::not_initialized;
  impl& m = *impl_;
  m.parse_keys(*rs, keys);
  if (std::string error = m.validate_confirm(rank, *rs, keys, pages, releases); !error.empty()) {
    detail = std::move(error);
    return confirm_outcome::bad_request;
  }
  for (std::uint32_t i = 0; i < keys.size(); ++i) {
    std::uint32_t* word = m.words[i];
    METAD_ASSERT(word != nullptr && entry_word::page(*word) == pages[i]);
    if (entry_word::confirmed(*word)) continue;  // bound to this key already: a no-op
    const std::uint32_t page = entry_word::page(*word);
    METAD_ASSERT(rank_keys::names(rs->keys.owners.take(page), keys[i], m.parsed[i]));
    rs->pool.bind(page);
    *word = entry_word::make(page, true);
    newly_confirmed_out.push_back(i);
  }
  for (const std::int64_t page : releases)
    m.release(*rs, static_cast<std::uint64_t>(page), quarantine_until);
  METAD_VERIFY_AFTER("rank_table::confirm", rs->verify_size(), rs->verify());
  return confirm_outcome::ok;
}

bool rank_table::restore(std::int64_t rank, std::string_view key, std::int64_t page, bool confirmed,
                         std::uint64_t now) {
  rank_state* rs = impl_->find(rank);
  if (rs == nullptr || page < 0 || !rs->pool.can_take(static_cast<std::uint64_t>(page)))
    return false;
  const auto p = static_cast<std::uint32_t>(page);
  parsed_key parsed;
  parse_key(key, parsed);
  if (rs->keys.find(key, parsed) != nullptr) return false;
  rs->pool.take(p);
  rs->reserve(key, parsed, p, confirmed ? rank_state::no_deadline : impl_->deadline(now));
  if (confirmed) {
    METAD_ASSERT(rank_keys::names(rs->keys.owners.take(p), key, parsed));
    rs->pool.bind(p);
    *rs->keys.find(key, parsed) = entry_word::make(p, true);
  }
  return true;
}

bool rank_table::restore_packed(std::int64_t rank, std::size_t expected,
                                std::span<const packed_binding> entries, std::uint64_t now) {
  rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return false;
  dual_key_map<std::uint32_t>& map = rs->keys.map;
  // Each key holds a page: a damaged count asks for no table larger than the rank (nor
  // than 2^32 keys, under the table's bound of buckets).
  if (map.packed_size() == 0)
    map.reserve(static_cast<std::size_t>(
        std::min<std::uint64_t>({expected, rs->pool.num_pages(), std::uint64_t{1} << 32})));
  const std::uint64_t deadline = impl_->deadline(now);
  // Hashed and prefetched `ahead` entries before their turn: the cache misses overlap.
  constexpr std::size_t ahead = 16;
  parsed_key parsed[ahead];
  auto start = [&](std::size_t i) {
    parsed_key& p = parsed[i % ahead];
    p.packed = entries[i].key;
    p.hash = packed_hash(p.packed);
    p.hex = true;
    map.prefetch(p);
  };
  for (std::size_t i = 0; i < std::min(ahead, entries.size()); ++i) start(i);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const packed_binding& e = entries[i];
    const parsed_key p = parsed[i % ahead];
    if (i + ahead < entries.size()) start(i + ahead);
    if (!rs->pool.can_take(e.page) || map.find_packed(e.key, p.hash) != nullptr) return false;
    rs->pool.take(e.page);
    if (e.confirmed) {
      rs->pool.bind(e.page);
      map.insert_packed(p, entry_word::make(e.page, true));
    } else {
      rs->reserve({}, p, e.page, deadline);
    }
  }
  return true;
}

bool rank_table::begin_image(std::int64_t rank, std::size_t buckets) {
  rank_state* rs = impl_->find(rank);
  // More buckets than the rank has pages: at most a quarter of the slots could be held
  // (a rank shrunk since, or damage); load such an image key by key, into a table sized
  // for its keys. A table's buckets fit 32 bits (packed_map::buckets_of).
  if (rs == nullptr || rs->keys.map.size() != 0 || rs->keys.map.packed_form().growing() ||
      buckets == 0 || buckets >= (std::size_t{1} << 32) ||
      buckets > std::max<std::size_t>(rs->pool.num_pages(), 1024))
    return false;
  rs->keys.map.packed_form().begin_image(buckets);
  return true;
}

bool rank_table::restore_image(std::int64_t rank, std::span<const packed_binding> entries) {
  rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return false;
  dual_key_map<std::uint32_t>& map = rs->keys.map;
  packed_map& packed = map.packed_form();
  // Not begun, or no longer laid out as an image (keys inserted since made it grow).
  if (map.hex_others() != 0 || packed.image_buckets() == 0) return false;
  // The slots are written in order (sequential); the other bucket each key could have
  // used is read, `ahead` entries before its turn, to see that it does not hold the key.
  constexpr std::size_t ahead = 16;
  for (std::size_t i = 0; i < std::min(ahead, entries.size()); ++i)
    packed.prefetch_other(entries[i].slot, entries[i].key);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const packed_binding& e = entries[i];
    if (i + ahead < entries.size())
      packed.prefetch_other(entries[i + ahead].slot, entries[i + ahead].key);
    if (!e.confirmed || !rs->pool.can_take(e.page) ||
        !packed.place_at(e.slot, e.key, entry_word::make(e.page, true)))
      return false;
    rs->pool.take(e.page);
    rs->pool.bind(e.page);
  }
  return true;
}

void rank_table::set_bulk(bool on) {
  impl_->bulk = on;
  for (auto& entry : impl_->ranks) {
    dual_key_map<std::uint32_t>& map = entry.second.keys.map;
    map.set_bulk(on);
    if (!on) map.shrink_to_fit();
  }
  impl_->wide_keys.set_bulk(on);
  if (!on) impl_->wide_keys.shrink_to_fit();
}

void rank_table::reserve_keys(std::int64_t rank, std::size_t n) {
  if (rank_state* rs = impl_->find(rank))
    rs->keys.map.reserve(std::min<std::size_t>(n, rs->pool.num_pages()));
}

void rank_table::for_each_rank_packed_impl(
    void* v, void (*on_rank)(void*, std::int64_t, const rank_stats&, std::size_t, std::size_t),
    void (*on_packed)(void*, const packed_binding&),
    void (*on_other)(void*, std::string_view, std::int64_t, bool)) const {
  for (const auto& [rank, rs] : impl_->ranks) {
    const page_pool& pool = rs.pool;
    const packed_map& packed = rs.keys.map.packed_form();
    const std::size_t image_buckets = packed.image_buckets();
    on_rank(v, rank,
            rank_stats{static_cast<std::int64_t>(pool.num_pages()),
                       static_cast<std::int64_t>(pool.free_count()), pool.reserved_count(),
                       pool.bound_count()},
            rs.keys.map.packed_size(), image_buckets);
    auto visit = [&](std::uint64_t slot, const packed_key& k, std::uint32_t word) {
      on_packed(v, packed_binding{k, entry_word::page(word), entry_word::confirmed(word), slot});
    };
    if (image_buckets != 0)
      packed.for_each_slot(visit);
    else
      packed.for_each([&](const packed_key& k, const std::uint32_t& word) { visit(0, k, word); });
    std::string text;
    rs.keys.map.for_each_wide([&](const key_handle& h, const std::uint32_t& word) {
      dual_key_map<std::uint32_t>::key_text(h, text);
      on_other(v, text, entry_word::page(word), entry_word::confirmed(word));
    });
    rs.keys.map.for_each_other([&](const key_map<std::uint32_t>::slot& s) {
      on_other(v, key_blob::view(s.key), entry_word::page(s.value), entry_word::confirmed(s.value));
    });
  }
}

bool rank_table::confirmed_pages(std::int64_t rank, std::span<const std::string_view> keys,
                                 std::span<std::int64_t> pages_out) const {
  METAD_ASSERT(keys.size() == pages_out.size());
  const rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return false;
  // In groups: parse and prefetch a group's keys, then look them up, so the cache misses
  // of a group overlap instead of queueing one after another.
  constexpr std::size_t group = 16;
  parsed_key parsed[group];
  for (std::size_t first = 0; first < keys.size(); first += group) {
    const std::size_t n = std::min(group, keys.size() - first);
    for (std::size_t g = 0; g < n; ++g) {
      parse_key(keys[first + g], parsed[g]);
      rs->keys.prefetch(parsed[g]);
    }
    for (std::size_t g = 0; g < n; ++g) {
      const std::uint32_t* word = rs->keys.find(keys[first + g], parsed[g]);
      pages_out[first + g] = word != nullptr && entry_word::confirmed(*word)
                                 ? std::int64_t{entry_word::page(*word)}
                                 : -1;
    }
  }
  return true;
}

void rank_table::mark_reserved(std::span<const std::string_view> keys,
                               std::span<std::uint8_t> reserved) const {
  METAD_ASSERT(keys.size() == reserved.size());
  if (impl_->ranks.empty() || keys.empty()) return;
  std::vector<parsed_key> parsed(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) parse_key(keys[i], parsed[i]);
  for (const auto& [rank, rs] : impl_->ranks) {
    if (rs.pool.reserved_count() == 0) continue;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::uint32_t* word = rs.keys.find(keys[i], parsed[i]);
      if (word != nullptr && !entry_word::confirmed(*word)) reserved[i] = 1;
    }
  }
}

void rank_table::inspect_key_impl(std::string_view key, void* visit,
                                  void (*call)(void*, std::int64_t, std::int64_t, bool,
                                               std::uint64_t)) const {
  parsed_key p;
  parse_key(key, p);
  for (const auto& [rank, rs] : impl_->ranks) {
    const std::uint32_t* word = rs.keys.find(key, p);
    if (word == nullptr) continue;
    const std::uint32_t page = entry_word::page(*word);
    const bool confirmed = entry_word::confirmed(*word);
    call(visit, rank, page, confirmed, confirmed ? 0 : rs.keys.owners.find(page).deadline);
  }
}

std::optional<rank_stats> rank_table::stats(std::int64_t rank) const {
  const rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return std::nullopt;
  return rs->stats();
}

void rank_table::for_each_rank_impl(void* visit,
                                    void (*call)(void*, std::int64_t, const rank_stats&)) const {
  for (const auto& [rank, rs] : impl_->ranks) call(visit, rank, rs.stats());
}

void rank_table::for_each_entry_impl(void* visit,
                                     void (*call)(void*, std::int64_t, std::string_view,
                                                  std::int64_t, bool)) const {
  char text[packed_key_chars];
  std::string wide_text;
  for (const auto& entry : impl_->ranks) {
    const std::int64_t rank = entry.first;  // lambdas cannot capture bindings in C++20
    const rank_keys& keys = entry.second.keys;
    keys.map.for_each_packed([&](const packed_key& k, const std::uint32_t& word) {
      unpack_hex_key(k, text);
      call(visit, rank, std::string_view(text, sizeof text), entry_word::page(word),
           entry_word::confirmed(word));
    });
    keys.map.for_each_wide([&](const key_handle& h, const std::uint32_t& word) {
      dual_key_map<std::uint32_t>::key_text(h, wide_text);
      call(visit, rank, wide_text, entry_word::page(word), entry_word::confirmed(word));
    });
    keys.map.for_each_other([&](const key_map<std::uint32_t>::slot& s) {
      call(visit, rank, key_blob::view(s.key), entry_word::page(s.value),
           entry_word::confirmed(s.value));
    });
  }
}

std::size_t rank_table::rank_count() const { return impl_->ranks.size(); }
std::size_t rank_table::reserved_pages() const {
  std::size_t n = 0;
  for (const auto& entry : impl_->ranks) n += entry.second.stats().reserved;
  return n;
}
std::size_t rank_table::quarantined_pages() const {
  std::size_t n = 0;
  for (const auto& entry : impl_->ranks) n += entry.second.quarantine.size();
  return n;
}
std::int64_t rank_table::held_pages() const {
  std::int64_t n = 0;
  for (const auto& entry : impl_->ranks) {
    const rank_stats st = entry.second.stats();
    n += st.reserved + st.bound;
  }
  return n;
}
std::uint64_t rank_table::refused_releases() const { return impl_->refused_releases; }
std::uint64_t rank_table::expired_reservations() const { return impl_->expired; }
void rank_table::advance_growth() {
  for (auto& entry : impl_->ranks) entry.second.keys.map.advance_growth();
  impl_->wide_keys.advance_growth();
}

void rank_table::clear() { impl_->ranks.clear(); }

std::string rank_table_detail::rank_state::verify() const {
  if (std::string e = keys.map.verify(); !e.empty()) return e;
  if (std::string e = keys.check(pool, quarantine.size()); !e.empty()) return e;
  std::vector<std::uint8_t> seen(pool.high_water(), 0);  // every held page lies below
  for (const quarantined& q : quarantine) {
    if (q.page >= pool.high_water() || seen[q.page] || pool.state(q.page) != page_state::reserved ||
        keys.owners.find(q.page).set)
      return fmt::format("quarantined page {} is out of range, listed twice, or held", q.page);
    seen[q.page] = 1;
  }
  if (std::string e = expiry.verify(); !e.empty()) return e;
  // Every reservation with a deadline has its entry in the expiry queue.
  std::vector<std::pair<std::uint32_t, std::uint64_t>> pending;
  pending.reserve(expiry.size());
  expiry.for_each_pending(
      [&](const reservation_queue::entry& e) { pending.emplace_back(e.page, e.deadline); });
  std::sort(pending.begin(), pending.end());
  std::string error;
  keys.owners.for_each([&](std::uint64_t page, const key_owner& o) {
    if (!error.empty() || o.deadline == no_deadline) return;
    const auto want = std::make_pair(static_cast<std::uint32_t>(page), o.deadline);
    if (!std::binary_search(pending.begin(), pending.end(), want))
      error = fmt::format("the reservation of page {} (deadline {}) is not in the expiry queue",
                          page, o.deadline);
  });
  return error;
}

std::string rank_table::verify() const {
  std::size_t held = 0;
  for (const auto& [rank, rs] : impl_->ranks) {
    if (std::string e = rs.verify(); !e.empty()) return fmt::format("rank {}: {}", rank, e);
    if (rs.keys.map.shares_store()) held += rs.keys.map.wide_size();
  }
  std::size_t refs = 0;
  if (std::string e = impl_->wide_keys.verify(refs); !e.empty()) return e;
  if (refs != held) {
    return fmt::format("the ranks hold {} wide keys, their records count {} holders", held, refs);
  }
  return {};
}

std::string rank_table::check_invariants() const { return verify(); }

}  // namespace metad::shard
