// directory's state, for directory.cpp and for the tests that break an invariant
// through verify_access (tests/shard/verify_test.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

#include "metad/assert.hpp"
#include "shard/directory.hpp"
#include "shard/dual_key_map.hpp"
#include "shard/key_life.hpp"
#include "shard/key_map.hpp"

namespace metad::shard {
namespace directory_detail {

struct completion {
  std::int32_t tp_world_size;
  std::int32_t confirmed_count;  // ranks that confirmed the key
};

// Packed word: tp_world_size in the high 16 bits (a tp <= 0 is stored as 0: like tp 1
// it is complete from the first confirmation), the count in the low 16 bits (>= 1, so
// the word is never 0). The count saturates at 65535: since tp <= 65534, "count >= tp"
// answers the same as with the exact count. While the directory is staged (restore_*),
// tp bits of 0xFFFF mean unnamed_tp, and counts stay below 65535 (exact).
constexpr std::int32_t packed_tp_max = 0xFFFE;
constexpr std::uint32_t packed_count_max = 0xFFFF;
// A staged key whose tp_world_size no directory record names (yet, or any more).
constexpr std::int32_t unnamed_tp = directory::unnamed_tp;
constexpr std::uint32_t unnamed_bits = 0xFFFF;

inline std::uint32_t packed_word(std::int32_t tp, std::int32_t count) {
  const auto t = static_cast<std::uint32_t>(std::max<std::int32_t>(tp, 0));
  const auto n = std::min(static_cast<std::uint32_t>(count), packed_count_max);
  return (t << 16) | n;
}

}  // namespace directory_detail

struct directory::impl {
  using completion = directory_detail::completion;
  static constexpr std::int32_t packed_tp_max = directory_detail::packed_tp_max;
  static constexpr std::uint32_t packed_count_max = directory_detail::packed_count_max;
  static std::uint32_t packed_word(std::int32_t tp, std::int32_t count) {
    return directory_detail::packed_word(tp, count);
  }

  dual_key_map<completion> keys;  // packed: hex keys with tp <= packed_tp_max
  key_life life;
  // The incomplete keys (fewer confirmations than their tp_world_size, not being
  // removed), least recently confirmed first: a key_life with recency on and no leases.
  // A key confirmed on some ranks and then never on the others is found at the front.
  key_life incomplete;
  std::uint64_t incomplete_bindings = 0;  // their confirmations summed: the pages they hold
  // Removals in progress: begun (the key reads as incomplete), not yet finished.
  key_map<std::uint32_t> removing;
  // Confirmations still in flight for bindings a finished removal already dropped
  // (their count went below zero): each absorbs one add_confirmation of its key.
  key_map<std::int32_t> owed;
  // Keys are staged (restore_reserve/restore_key, as a standby applies what it receives)
  // and not yet counted: restore_finish has not run, so only the maps' own invariants
  // hold (verify()).
  bool staged = false;

  impl() { incomplete.set_lru(true); }

  // What verify() walks (METAD_VERIFY_AFTER's n).
  std::size_t verify_size() const {
    return keys.size() + life.size() + incomplete.size() + removing.size() + owed.size();
  }

  // The key's entry in whichever map holds it.
  struct entry : dual_key_map<completion>::entry {
    completion get() const {
      if (slot != nullptr) return slot->value;
      return {static_cast<std::int32_t>(*word >> 16),
              static_cast<std::int32_t>(*word & packed_count_max)};
    }
  };
  entry find(std::string_view key, const parsed_key& p) { return {keys.find(key, p)}; }
  // Staging (directory.cpp): an entry's (tp, count), tp possibly unnamed_tp; and the key's
  // entry replaced by c (e: its entry found, or none), in the form c fits.
  completion staged_of(const entry& e) const;
  void stage(std::string_view key, const parsed_key& p, const entry& e, const completion& c);
  void erase(const entry& e) { keys.erase(e); }
  // Stores a new entry in the form its tp calls for.
  void insert(std::string_view key, const parsed_key& p, std::int32_t tp, std::int32_t count) {
    if (!((p.hex || p.wide) && tp <= packed_tp_max && count >= 1 &&
          keys.insert_packed(p, packed_word(tp, count)))) {
      keys.insert_other(key, p, completion{tp, count});
    }
  }
  static bool is_complete(const completion& c) {
    return c.confirmed_count >= 1 && c.confirmed_count >= c.tp_world_size;
  }
  // An incomplete key with `count` confirmations, last confirmed at now.
  void track(std::string_view key, const parsed_key& p, std::int32_t count, std::uint64_t now) {
    incomplete.touch(key, p, now);
    incomplete_bindings += static_cast<std::uint64_t>(count);
  }
  void untrack(std::string_view key, const parsed_key& p, std::int32_t count) {
    incomplete.forget(key, p);
    METAD_ASSERT(incomplete_bindings >= static_cast<std::uint64_t>(count));
    incomplete_bindings -= static_cast<std::uint64_t>(count);
  }
  // Ends the key's removal in progress: false if there is none (a clear dropped it).
  bool end_removal(std::string_view key) {
    if (removing.size() == 0) return false;
    auto* r = removing.find(key, table_hash(key));
    if (r == nullptr) return false;
    removing.erase(*r);
    return true;
  }
  bool is_removing(std::string_view key) const {
    return removing.size() != 0 && removing.find(key, table_hash(key)) != nullptr;
  }
  bool complete(std::string_view key, const parsed_key& p) {
    const entry e = find(key, p);
    return e && is_complete(e.get()) && !is_removing(key);
  }
  bool add_confirmation(std::string_view key, const parsed_key& p, std::int32_t tp_world_size,
                        std::uint64_t now) {
    if (owed.size() != 0) {
      if (auto* s = owed.find(key, table_hash(key))) {
        if (--s->value == 0) owed.erase(*s);
        return false;
      }
    }
    const entry e = find(key, p);
    if (!e) {
      insert(key, p, tp_world_size, 1);
      if (!is_complete({tp_world_size, 1})) {
        track(key, p, 1, now);
      } else if (life.lru()) {
        life.touch(key, p, now);
      }
      return true;
    }
    const completion before = e.get();
    if (e.word != nullptr) {
      if ((*e.word & packed_count_max) < packed_count_max) ++*e.word;
    } else if (e.slot->value.confirmed_count < std::numeric_limits<std::int32_t>::max()) {
      ++e.slot->value.confirmed_count;
    }
    const completion after = e.get();
    // A key being removed is in neither list: its removal's end decides where it goes.
    if (is_complete(before) || is_removing(key)) return false;
    if (is_complete(after)) {
      untrack(key, p, before.confirmed_count);
      if (life.lru()) life.touch(key, p, now);
    } else {
      track(key, p, after.confirmed_count - before.confirmed_count, now);
    }
    return false;
  }
  bool use(std::string_view key, const parsed_key& p, std::uint64_t now,
           std::uint64_t lease_until) {
    if (!complete(key, p)) return false;
    if (lease_until != 0) {
      life.lease(key, p, now, lease_until);
    } else if (life.lru()) {
      life.touch(key, p, now);
    }
    return true;
  }
  // Calls visit(i, parsed key) for keys[i] of each i in `at`, in order, 16 at a time: a
  // group's keys are parsed and the lines their lookups read (with `life_too`, also the
  // lease table's) are prefetched before the first is visited, so their cache misses
  // overlap instead of queueing one after another (as in rank_table::confirmed_pages).
  template <class Visit>
  void grouped(std::span<const std::string_view> asked, std::span<const std::uint32_t> at,
               bool life_too, Visit&& visit) {
    constexpr std::size_t group = 16;
    parsed_key parsed[group];
    for (std::size_t first = 0; first < at.size(); first += group) {
      const std::size_t n = std::min(group, at.size() - first);
      for (std::size_t g = 0; g < n; ++g) {
        parse_key(asked[at[first + g]], parsed[g]);
        if (!parsed[g].hex && !parsed[g].wide) continue;
        keys.prefetch(parsed[g]);
        if (life_too) life.prefetch(parsed[g]);
      }
      for (std::size_t g = 0; g < n; ++g) visit(at[first + g], parsed[g]);
    }
  }
};
}  // namespace metad::shard
