// The key side of one rank: key → {page, reserved|confirmed} and reserved page → key.
// Keys are stored in their own form (dual_key_map): 32 lowercase hex characters packed,
// the other hex shapes in the wide form, any other key with its bytes on the heap; a
// hex key is never stored in the other form (a wide one only on an index collision).
// Only the rank's owning core touches it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "metad/assert.hpp"
#include "shard/dual_key_map.hpp"
#include "shard/key_map.hpp"
#include "shard/page_pool.hpp"

namespace metad::shard {

// The word stored per key: bit 31 confirmed, bits 0..30 page + 1 (so never 0, which
// marks an empty slot). Pages handed out are < page_pool::held_max = 2^31 - 1, so page + 1
// fits.
namespace entry_word {
static_assert(page_pool::held_max <= 0x7FFFFFFFu, "page + 1 fits 31 bits");
inline std::uint32_t make(std::uint32_t page, bool confirmed) {
  METAD_ASSERT(page < 0x7FFFFFFFu);
  return (page + 1) | (confirmed ? 0x80000000u : 0u);
}
inline std::uint32_t page(std::uint32_t word) { return (word & 0x7FFFFFFFu) - 1; }
inline bool confirmed(std::uint32_t word) { return (word >> 31) != 0; }
}  // namespace entry_word

// How a reserved page names its key, and when the reservation expires.
struct key_owner {
  key_handle key;
  bool set = false;            // false: no owner
  std::uint64_t deadline = 0;  // reservation_queue entry of this reservation
  bool operator==(const key_owner&) const = default;
  bool same_key(const key_owner& o) const {
    return set == o.set && key.blob == o.key.blob &&
           (key.blob != nullptr || key.packed == o.key.packed);
  }
};
static_assert(sizeof(key_owner) == 40, "an owner record's size is its cost per reservation");

struct rank_keys {
  dual_key_map<std::uint32_t> map;  // key → entry_word
  page_owners<key_owner> owners;    // reserved page → its key

  std::size_t size() const { return map.size(); }

  // The key's word, or nullptr. Valid until the next insert or erase.
  std::uint32_t* find(std::string_view key, const parsed_key& p) { return map.find_value(key, p); }
  const std::uint32_t* find(std::string_view key, const parsed_key& p) const {
    return map.find_value(key, p);
  }
  void prefetch(const parsed_key& p) const { map.prefetch(p); }

  // Inserts the absent key as reserving `page` until deadline, and records the
  // page's owner.
  void reserve(std::string_view key, const parsed_key& p, std::uint32_t page,
               std::uint64_t deadline) {
    const key_handle h = map.insert(key, p, entry_word::make(page, false));
    owners.insert(page, key_owner{h, true, deadline});
  }

  // Drops the key if it is confirmed here; returns its page, or -1 (absent or only
  // reserved: a key being written keeps its reservation).
  std::int64_t remove_confirmed(std::string_view key, const parsed_key& p);

  // Whether `owner` names this key.
  static bool names(const key_owner& owner, std::string_view key, const parsed_key& p) {
    return owner.set && owner.key.names(key, p);
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
    map.clear();
    owners.clear();
  }
};

}  // namespace metad::shard
