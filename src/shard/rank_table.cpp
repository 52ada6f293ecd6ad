#include <fmt/format.h>

#include <bit>
#include <unordered_map>

#include "shard/check.hpp"
#include "shard/key_map.hpp"
#include "shard/page_pool.hpp"
#include "shard/state.hpp"

// rank_table: per rank, a page pool and a key → {page, reserved|confirmed} map, plus the
// reverse map of reserved pages. Only the rank's owning core calls it.
namespace shard {
namespace {

struct entry {
  std::uint32_t page : 31;
  std::uint32_t confirmed : 1;
};
static_assert(sizeof(entry) == 4);
static_assert(page_pool::pages_max < (std::uint32_t{1} << 31), "pages fit entry::page");

struct rank_state {
  page_pool pool;
  key_map<entry> keys;  // one entry per key: its page, reserved or confirmed
  page_owners owners;   // reserved page → its key's bytes (owned by `keys`)
};

}  // namespace

struct rank_table::impl {
  std::unordered_map<std::int64_t, rank_state> ranks;
  std::uint64_t refused_releases = 0;
  // Scratch reused across calls, so steady-state calls do not allocate here.
  std::vector<std::uint32_t> hashes;  // table_hash of each request key
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

  void hash_keys(std::span<const std::string_view> keys) {
    hashes.resize(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) hashes[i] = table_hash(keys[i]);
  }

  // Appends the index of each distinct key's first occurrence. Needs hash_keys first.
  void dedupe(std::span<const std::string_view> keys, std::vector<std::uint32_t>& out) {
    SHARD_CHECK(keys.size() < UINT32_MAX);
    if (keys.size() <= 1) {
      if (keys.size() == 1) out.push_back(0);
      return;
    }
    const std::size_t capacity = std::bit_ceil(std::max<std::size_t>(16, keys.size() * 2));
    const std::size_t mask = capacity - 1;
    seen.assign(capacity, 0);
    for (std::uint32_t i = 0; i < keys.size(); ++i) {
      std::size_t slot = hashes[i] & mask;
      for (;; slot = (slot + 1) & mask) {
        const std::uint32_t other = seen[slot];
        if (other == 0) {
          seen[slot] = i + 1;
          out.push_back(i);
          break;
        }
        if (hashes[other - 1] == hashes[i] && keys[other - 1] == keys[i]) break;
      }
    }
  }

  std::string validate_confirm(std::int64_t rank, const rank_state& rs,
                               std::span<const std::string_view> keys,
                               std::span<const std::int64_t> pages,
                               std::span<const std::int64_t> releases);
  void release(rank_state& rs, std::uint32_t page);
};

rank_table::rank_table() : impl_(std::make_unique<impl>()) {}
rank_table::~rank_table() = default;
rank_table::rank_table(rank_table&&) noexcept = default;
rank_table& rank_table::operator=(rank_table&&) noexcept = default;

init_result rank_table::initialize(std::int64_t rank, std::int64_t num_pages) {
  SHARD_CHECK(num_pages > 0 && num_pages <= page_pool::pages_max);
  const auto pages = static_cast<std::uint32_t>(num_pages);
  auto [it, created] = impl_->ranks.try_emplace(rank);
  page_pool& pool = it->second.pool;
  if (created) {
    pool.grow(pages);
    return {init_outcome::created, 0};
  }
  const std::int64_t old_pages = pool.num_pages();
  if (num_pages == old_pages) return {init_outcome::unchanged, old_pages};
  if (num_pages < old_pages) return {init_outcome::shrink_refused, old_pages};
  pool.grow(pages);
  return {init_outcome::grown, old_pages};
}

bool rank_table::contains(std::int64_t rank) const { return impl_->find(rank) != nullptr; }

bool rank_table::allocate(std::int64_t rank, std::span<const std::string_view> keys,
                          std::vector<std::uint32_t>& distinct_out,
                          std::vector<std::int64_t>& pages_out) {
  rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return false;
  impl& m = *impl_;
  m.hash_keys(keys);
  const std::size_t distinct_base = distinct_out.size();
  m.dedupe(keys, distinct_out);
  const std::size_t pages_base = pages_out.size();
  m.misses.clear();
  for (std::size_t k = distinct_base; k < distinct_out.size(); ++k) {
    const std::uint32_t i = distinct_out[k];
    if (const auto* s = rs->keys.find(keys[i], m.hashes[i])) {
      pages_out.push_back(s->value.page);  // held already: reserved or confirmed
    } else {
      pages_out.push_back(-1);
      m.misses.push_back(static_cast<std::uint32_t>(k - distinct_base));
    }
  }
  // All or nothing over the keys that need a new page.
  if (m.misses.size() > rs->pool.free_count()) return true;
  for (const std::uint32_t offset : m.misses) {
    const std::uint32_t i = distinct_out[distinct_base + offset];
    const std::uint32_t page = rs->pool.take_lowest();
    const auto& s = rs->keys.insert_new(keys[i], m.hashes[i], entry{page, 0});
    rs->owners.insert(page, s.key);
    pages_out[pages_base + offset] = page;
  }
  return true;
}

std::string rank_table::impl::validate_confirm(std::int64_t rank, const rank_state& rs,
                                               std::span<const std::string_view> keys,
                                               std::span<const std::int64_t> pages,
                                               std::span<const std::int64_t> releases) {
  const std::int64_t num_pages = rs.pool.num_pages();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::int64_t page = pages[i];
    if (page < 0 || page >= num_pages) {
      return fmt::format("Page {} out of range for rank {} (num_pages {})", page, rank, num_pages);
    }
    const auto* s = rs.keys.find(keys[i], hashes[i]);
    if (s != nullptr && s->value.page == page) continue;  // reserved for it or bound to it
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

void rank_table::impl::release(rank_state& rs, std::uint32_t page) {
  switch (rs.pool.state(page)) {
    case page_state::free:
      return;
    case page_state::bound:
      ++refused_releases;  // a live cache hit: freeing it would let another key overwrite it
      return;
    case page_state::reserved: {
      char* owner = rs.owners.take(page);
      SHARD_CHECK(owner != nullptr);
      const std::string_view key = key_blob::view(owner);
      auto* s = rs.keys.find(key, table_hash(key));
      SHARD_CHECK(s != nullptr && s->key == owner && !s->value.confirmed && s->value.page == page);
      rs.keys.erase(*s);  // frees `owner`
      rs.pool.release(page);
      return;
    }
  }
}

confirm_outcome rank_table::confirm(std::int64_t rank, std::span<const std::string_view> keys,
                                    std::span<const std::int64_t> pages,
                                    std::span<const std::int64_t> releases, std::string& detail,
                                    std::vector<std::uint32_t>& newly_confirmed_out) {
  SHARD_CHECK(keys.size() == pages.size() && keys.size() < UINT32_MAX);
  rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return confirm_outcome::not_initialized;
  impl& m = *impl_;
  m.hash_keys(keys);
  if (std::string error = m.validate_confirm(rank, *rs, keys, pages, releases); !error.empty()) {
    detail = std::move(error);
    return confirm_outcome::bad_request;
  }
  for (std::uint32_t i = 0; i < keys.size(); ++i) {
    auto* s = rs->keys.find(keys[i], m.hashes[i]);
    SHARD_CHECK(s != nullptr && s->value.page == pages[i]);
    if (s->value.confirmed) continue;  // bound to this key already: a no-op
    const std::uint32_t page = s->value.page;
    SHARD_CHECK(rs->owners.take(page) == s->key);
    rs->pool.bind(page);
    s->value.confirmed = 1;
    newly_confirmed_out.push_back(i);
  }
  for (const std::int64_t page : releases) m.release(*rs, static_cast<std::uint32_t>(page));
  return confirm_outcome::ok;
}

bool rank_table::confirmed_pages(std::int64_t rank, std::span<const std::string_view> keys,
                                 std::span<std::int64_t> pages_out) const {
  SHARD_CHECK(keys.size() == pages_out.size());
  const rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return false;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto* s = rs->keys.find(keys[i], table_hash(keys[i]));
    pages_out[i] = s != nullptr && s->value.confirmed ? std::int64_t{s->value.page} : -1;
  }
  return true;
}

std::optional<rank_stats> rank_table::stats(std::int64_t rank) const {
  const rank_state* rs = impl_->find(rank);
  if (rs == nullptr) return std::nullopt;
  const page_pool& pool = rs->pool;
  return rank_stats{pool.num_pages(), pool.free_count(), pool.reserved_count(), pool.bound_count()};
}

void rank_table::for_each_rank_impl(void* visit,
                                    void (*call)(void*, std::int64_t, const rank_stats&)) const {
  for (const auto& [rank, rs] : impl_->ranks) {
    const page_pool& pool = rs.pool;
    call(visit, rank,
         rank_stats{pool.num_pages(), pool.free_count(), pool.reserved_count(), pool.bound_count()});
  }
}

std::size_t rank_table::rank_count() const { return impl_->ranks.size(); }
std::uint64_t rank_table::refused_releases() const { return impl_->refused_releases; }
void rank_table::clear() { impl_->ranks.clear(); }

namespace {

std::string check_rank(const rank_state& rs) {
  if (std::string e = rs.pool.check(); !e.empty()) return e;
  const std::uint32_t num_pages = rs.pool.num_pages();
  std::vector<std::uint64_t> held((num_pages + 63) / 64, 0);
  std::size_t reserved = 0, confirmed = 0;
  std::string error;
  rs.keys.for_each([&](const key_map<entry>::slot& s) {
    if (!error.empty()) return;
    const std::string_view key = key_blob::view(s.key);
    const std::uint32_t page = s.value.page;
    if (s.hash != table_hash(key) || rs.keys.find(key, s.hash) != &s) {
      error = fmt::format("key {} is not reachable in the key map", key);
    } else if (page >= num_pages) {
      error = fmt::format("key {} holds page {} beyond num_pages {}", key, page, num_pages);
    } else if (held[page / 64] & (std::uint64_t{1} << (page % 64))) {
      error = fmt::format("page {} is held by two keys", page);
    } else if (s.value.confirmed && rs.pool.state(page) != page_state::bound) {
      error = fmt::format("key {} is confirmed on page {} but the page is not bound", key, page);
    } else if (!s.value.confirmed && rs.pool.state(page) != page_state::reserved) {
      error = fmt::format("key {} reserves page {} but the page is not reserved", key, page);
    } else if (!s.value.confirmed && rs.owners.find(page) != s.key) {
      error = fmt::format("reserved page {} does not point back to key {}", page, key);
    }
    if (!error.empty()) return;
    held[page / 64] |= std::uint64_t{1} << (page % 64);
    ++(s.value.confirmed ? confirmed : reserved);
  });
  if (!error.empty()) return error;
  if (confirmed != rs.pool.bound_count()) {
    return fmt::format("{} confirmed keys but {} bound pages", confirmed, rs.pool.bound_count());
  }
  if (reserved != rs.pool.reserved_count() || reserved != rs.owners.size()) {
    return fmt::format("{} reserving keys, {} reserved pages, {} page owners", reserved,
                       rs.pool.reserved_count(), rs.owners.size());
  }
  return {};
}

}  // namespace

std::string rank_table::check_invariants() const {
  for (const auto& [rank, rs] : impl_->ranks) {
    if (std::string e = check_rank(rs); !e.empty()) return fmt::format("rank {}: {}", rank, e);
  }
  return {};
}

}  // namespace shard
