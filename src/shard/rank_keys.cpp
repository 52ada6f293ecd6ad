#include "shard/rank_keys.hpp"

#include <fmt/format.h>

#include <vector>

namespace shard {

void rank_keys::release_reserved(std::uint32_t page) {
  const key_owner owner = owners.take(page);
  METAD_ASSERT(owner.set);
  if (owner.blob == nullptr) {
    std::uint32_t* word = packed.find(owner.packed, packed_hash(owner.packed));
    METAD_ASSERT(word != nullptr && !entry_word::confirmed(*word) &&
                 entry_word::page(*word) == page);
    packed.erase(word);
    return;
  }
  const std::string_view key = key_blob::view(owner.blob);
  auto* s = others.find(key, table_hash(key));
  METAD_ASSERT(s != nullptr && s->key == owner.blob && !entry_word::confirmed(s->value) &&
               entry_word::page(s->value) == page);
  others.erase(*s);  // frees owner.blob
}

std::int64_t rank_keys::remove_confirmed(std::string_view key, const parsed_key& p) {
  if (p.hex) {
    std::uint32_t* word = packed.find(p.packed, p.hash);
    if (word == nullptr || !entry_word::confirmed(*word)) return -1;
    const std::uint32_t page = entry_word::page(*word);
    packed.erase(word);
    return page;
  }
  auto* s = others.find(key, static_cast<std::uint32_t>(p.hash));
  if (s == nullptr || !entry_word::confirmed(s->value)) return -1;
  const std::uint32_t page = entry_word::page(s->value);
  others.erase(*s);
  return page;
}

std::string rank_keys::key_text(const key_owner& owner) {
  if (owner.blob != nullptr) return std::string(key_blob::view(owner.blob));
  std::string text(packed_key_chars, '\0');
  unpack_hex_key(owner.packed, text.data());
  return text;
}

std::string rank_keys::check(const page_pool& pool, std::size_t quarantined) const {
  if (std::string e = pool.check(); !e.empty()) return e;
  const std::uint32_t num_pages = pool.num_pages();
  std::vector<std::uint64_t> held((num_pages + 63) / 64, 0);
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
      error =
          fmt::format("key {} holds page {} beyond num_pages {}", key_text(self), page, num_pages);
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
  packed.for_each([&](const packed_key& k, const std::uint32_t& word) {
    visit(key_owner{k, nullptr, true}, word, packed.find(k, packed_hash(k)) == &word);
  });
  others.for_each([&](const key_map<std::uint32_t>::slot& s) {
    const std::string_view key = key_blob::view(s.key);
    packed_key unused;
    const bool reachable =
        !pack_hex_key(key, unused) && s.hash == table_hash(key) && others.find(key, s.hash) == &s;
    visit(key_owner{{}, s.key, true}, s.value, reachable);
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

}  // namespace shard
