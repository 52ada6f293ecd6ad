// The key side of one rank: key → {page, reserved|confirmed} and reserved page → key.
// Keys of 32 lowercase hex characters (nearly all of them) live packed in a packed_map
// (20 bytes a slot, no heap block); any other key lives in a key_map with its bytes on
// the heap. A key's form decides its map, so each key is in exactly one. Only the rank's
// owning core touches it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "metad/assert.hpp"
#include "shard/key_map.hpp"
#include "shard/packed_key.hpp"
#include "shard/packed_map.hpp"
#include "shard/page_pool.hpp"

namespace shard {

// A request key, parsed once per call.
struct parsed_key {
  packed_key packed;   // when hex
  std::uint64_t hash;  // packed_hash(packed) when hex, else table_hash(key)
  bool hex;
};

// Parses in place: returning the struct by value costs a store-forwarding stall per key
// (the copy reads back bytes just written by narrower stores).
inline void parse_key(std::string_view key, parsed_key& p) {
  p.hex = pack_hex_key(key, p.packed);
  p.hash = p.hex ? packed_hash(p.packed) : table_hash(key);
}

// The word stored per key: bit 31 confirmed, bits 0..30 page + 1 (so never 0, which
// marks an empty slot). Pages are < page_pool::pages_max = 2^31 - 1, so page + 1 fits.
namespace entry_word {
static_assert(page_pool::pages_max <= 0x7FFFFFFFu, "page + 1 fits 31 bits");
inline std::uint32_t make(std::uint32_t page, bool confirmed) {
  METAD_ASSERT(page < 0x7FFFFFFFu);
  return (page + 1) | (confirmed ? 0x80000000u : 0u);
}
inline std::uint32_t page(std::uint32_t word) { return (word & 0x7FFFFFFFu) - 1; }
inline bool confirmed(std::uint32_t word) { return (word >> 31) != 0; }
}  // namespace entry_word

// How a reserved page names its key (packed, or by its key_map heap block), and when
// the reservation expires.
struct key_owner {
  packed_key packed;
  const char* blob = nullptr;  // set for keys in `others`
  bool set = false;            // false: no owner
  std::uint64_t deadline = 0;  // reservation_queue entry of this reservation
  bool operator==(const key_owner&) const = default;
  bool same_key(const key_owner& o) const {
    return set == o.set && blob == o.blob && (blob != nullptr || packed == o.packed);
  }
};

struct rank_keys {
  packed_map packed;              // 32-lowercase-hex keys
  key_map<std::uint32_t> others;  // every other key
  page_owners<key_owner> owners;  // reserved page → its key

  std::size_t size() const { return packed.size() + others.size(); }

  // The key's word, or nullptr. Valid until the next insert or erase.
  std::uint32_t* find(std::string_view key, const parsed_key& p) {
    return p.hex ? packed.find(p.packed, p.hash) : find_other(key, p);
  }
  const std::uint32_t* find(std::string_view key, const parsed_key& p) const {
    return const_cast<rank_keys*>(this)->find(key, p);
  }
  void prefetch(const parsed_key& p) const {
    if (p.hex) packed.prefetch(p.hash);
  }

  // Inserts the absent key as reserving `page` until deadline, and records the
  // page's owner.
  void reserve(std::string_view key, const parsed_key& p, std::uint32_t page,
               std::uint64_t deadline) {
    const std::uint32_t word = entry_word::make(page, false);
    if (p.hex) {
      packed.insert_new(p.packed, p.hash, word);
      owners.insert(page, key_owner{p.packed, nullptr, true, deadline});
    } else {
      const auto& s = others.insert_new(key, static_cast<std::uint32_t>(p.hash), word);
      owners.insert(page, key_owner{{}, s.key, true, deadline});
    }
  }

  // Drops the key if it is confirmed here; returns its page, or -1 (absent or only
  // reserved: a key being written keeps its reservation).
  std::int64_t remove_confirmed(std::string_view key, const parsed_key& p);

  [[gnu::noinline]] std::uint32_t* find_other(std::string_view key, const parsed_key& p) {
    auto* s = others.find(key, static_cast<std::uint32_t>(p.hash));
    return s == nullptr ? nullptr : &s->value;
  }

  // Whether `owner` names this key.
  static bool names(const key_owner& owner, std::string_view key, const parsed_key& p) {
    if (!owner.set) return false;
    return p.hex ? owner.blob == nullptr && owner.packed == p.packed
                 : owner.blob != nullptr && key_blob::view(owner.blob) == key;
  }

  // Frees the reserved page's key: the page's owner record and the key's entry. The
  // page must be reserved here.
  void release_reserved(std::uint32_t page);

  // The key an owner names, as the client sent it (for messages; not the hot path).
  static std::string key_text(const key_owner& owner);

  // Every key agrees with the pool (reserved / bound, one key per page) and the owner
  // records; `quarantined` more reserved pages have no key (see rank_table). "" when
  // consistent, else the first violation.
  std::string check(const page_pool& pool, std::size_t quarantined) const;

  void clear() {
    packed.clear();
    others.clear();
    owners.clear();
  }
};

}  // namespace shard
