#include "shard/rank_keys.hpp"

#include <fmt/format.h>

#include <vector>

namespace metad::shard {

void rank_keys::release_reserved(std::uint32_t page) {
  const key_owner owner = owners.take(page);
  METAD_ASSERT(owner.set);
  const auto e = map.find(owner.key);
  METAD_ASSERT(e && !entry_word::confirmed(*e.value()) && entry_word::page(*e.value()) == page);
  map.erase(e);  // frees owner.key.blob
}

std::int64_t rank_keys::remove_confirmed(std::string_view key, const parsed_key& p) {
  const auto e = map.find(key, p);
  if (!e) return -1;
  const std::uint32_t word = *e.value();
  if (!entry_word::confirmed(word)) return -1;
  map.erase(e);
  return entry_word::page(word);
}

std::string rank_keys::key_text(const key_owner& owner) {
  std::string text;
  dual_key_map<std::uint32_t>::key_text(owner.key, text);
  return text;
}

std::string rank_keys::check(const page_pool& pool, std::size_t quarantined) const {
  if (std::string e = pool.check(); !e.empty()) return e;
  // Every page a key holds lies below the high-water mark (pages above it are free).
  const std::uint32_t num_pages = pool.high_water();
  std::vector<std::uint64_t> held((std::uint64_t{num_pages} + 63) / 64, 0);
  std::size_t reserved = 0, confirmed = 0;
  std::string error;
  // One stored key: `reachable` says a lookup by its bytes finds this very entry.
  auto visit = [&](const key_owner& self, std::uint32_t word, bool reachable) {
    if (!error.empty()) return;
    const std::uint32_t page = entry_word::page(word);
    const bool is_confirmed = entry_word::confirmed(word);
    if (!reachable) {
      error = fmt::format("key {} is not reachable in the key map", key_text(self));
    } else if (page >= num_pages) {
      error = fmt::format("key {} holds page {} beyond the high-water mark {}", key_text(self),
                          page, num_pages);
    } else if (held[page / 64] & (std::uint64_t{1} << (page % 64))) {
      error = fmt::format("page {} is held by two keys", page);
    } else if (is_confirmed && pool.state(page) != page_state::bound) {
      error = fmt::format("key {} is confirmed on page {} but the page is not bound",
                          key_text(self), page);
    } else if (!is_confirmed && pool.state(page) != page_state::reserved) {
      error =
          fmt::format("key {} reserves page {} but the page is not reserved", key_text(self), page);
    } else if (!is_confirmed && !owners.find(page).same_key(self)) {
      error = fmt::format("reserved page {} does not point back to key {}", page, key_text(self));
    }
    if (!error.empty()) return;
    held[page / 64] |= std::uint64_t{1} << (page % 64);
    ++(is_confirmed ? confirmed : reserved);
  };
  map.for_each_packed([&](const packed_key& k, const std::uint32_t& word) {
    visit(key_owner{{k, nullptr}, true}, word, map.find(key_handle{k, nullptr}).word == &word);
  });
  std::string text;
  map.for_each_wide([&](const key_handle& h, const std::uint32_t& word) {
    dual_key_map<std::uint32_t>::key_text(h, text);
    parsed_key p;
    parse_key(text, p);
    visit(key_owner{h, true}, word, p.wide && h.names(text, p) && map.find(h).word == &word);
  });
  map.for_each_other([&](const key_map<std::uint32_t>::slot& s) {
    const std::string_view key = key_blob::view(s.key);
    parsed_key p;
    parse_key(key, p);
    // A hex key is stored packed here, never in the other form (a wide one may be).
    const bool reachable = !p.hex && s.hash == table_hash(key) && map.find(key, p).slot == &s;
    visit(key_owner{{{}, s.key}, true}, s.value, reachable);
  });
  if (!error.empty()) return error;
  if (confirmed != pool.bound_count()) {
    return fmt::format("{} confirmed keys but {} bound pages", confirmed, pool.bound_count());
  }
  if (reserved + quarantined != pool.reserved_count() || reserved != owners.size()) {
    return fmt::format("{} reserving keys, {} quarantined pages, {} reserved pages, {} page owners",
                       reserved, quarantined, pool.reserved_count(), owners.size());
  }
  return {};
}

}  // namespace metad::shard
