// One core's slice of the key-completion directory: how many ranks confirmed each key
// whose hash maps to this core, its recency and leases, removals in progress.
// Single-threaded by design: only the owning core calls it; other cores reach it
// through the mailbox.
//
// Invariants (verify()):
// - its key table's own (dual_key_map), and those of its two key_life lists (recency
//   and leases; the incomplete keys, tracked with recency on);
// - a key of the packed form has at least one confirmation;
// - a key being removed is in neither list; every key being removed is in the table;
// - every other incomplete key is tracked as incomplete and has no recency entry, and
//   the tracked keys are exactly those; their confirmations sum to incomplete_bindings();
// - every other complete key is not tracked as incomplete, and with LRU on has a recency
//   entry; recency entries name only such keys;
// - confirmations owed to keys (absorbed when they arrive) are positive.
// While keys are staged for a restore (restore_key ... restore_finish: a standby's
// directory until promotion) only the first line holds, and: no count is below 0, and no
// key is both unnamed and without a binding.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shard/packed_key.hpp"

namespace metad::shard {

// What the directory knows of one key (POST /keys/inspect). Times on the caller's clock;
// 0: not known.
struct key_report {
  bool present = false;   // in the directory: some rank confirmed it
  bool complete = false;  // as complete(): what batch_exists answers
  bool removing = false;  // a delete or eviction has begun: reads as incomplete
  std::int32_t tp_world_size = 0, confirmations = 0;
  std::uint64_t last_confirmed = 0;  // incomplete keys: their last confirmation
  std::uint64_t last_used = 0;       // complete keys, when tracked (LRU on, or leased)
  std::uint64_t lease_until = 0;     // > now: a reader holds a lease until then
};

class directory {
 public:
  directory();
  ~directory();
  directory(directory&&) noexcept;
  directory& operator=(directory&&) noexcept;

  // With LRU on (eviction), every complete key's last use is tracked; off, only the
  // leases readers hold.
  void set_lru(bool on);

  // One more rank confirmed `key` at now. A new key records tp_world_size; returns
  // true when the key entered the directory (for the log).
  bool add_confirmation(std::string_view key, std::int32_t tp_world_size, std::uint64_t now);
  // add_confirmation() for keys[i] of each i in `at`, in that order: entered[i] = what it
  // returned. Grouped like use_each.
  void add_confirmations(std::span<const std::string_view> keys, std::span<const std::uint32_t> at,
                         std::int32_t tp_world_size, std::uint64_t now,
                         std::span<std::uint8_t> entered);
  // Confirmed by >= tp_world_size ranks, and not being removed.
  bool complete(std::string_view key) const;
  // Read-only: everything known of `key` (changes nothing, touches no recency).
  key_report inspect(std::string_view key) const;
  // A lookup at now: whether the key is complete; if so it counts as used, and with
  // lease_until != 0 a reader holds a lease on its pages until then.
  bool use(std::string_view key, std::uint64_t now, std::uint64_t lease_until);
  // use() for keys[i] of each i in `at`, in that order: used[i] = whether it is complete.
  // The lookups of a group of keys are started together, so their cache misses overlap.
  void use_each(std::span<const std::string_view> keys, std::span<const std::uint32_t> at,
                std::uint64_t now, std::uint64_t lease_until, std::span<std::uint8_t> used);

  // Removal (delete, eviction) in two steps around the ranks dropping their bindings.
  // begin: the key reads as incomplete from now on, unless it is absent, already being
  // removed, or leased at now.
  enum class removal : std::uint8_t { started, absent, busy, leased };
  removal begin_removal(std::string_view key, std::uint64_t now);
  // finish: `bindings` ranks dropped the key since begin. Confirmations that arrived
  // meanwhile keep the key (with the count they make; used at now if that leaves it
  // complete); else it leaves: returns true (for the log). The caller makes sure the
  // directory was not cleared in between (node::clears).
  bool finish_removal(std::string_view key, std::int32_t bindings, std::uint64_t now);
  // A rank lost its binding of `key` without a removal (the rank shrank): one
  // confirmation less, so a complete key becomes incomplete (its leases end). Returns
  // true when that was its last one and the key left the directory (for the log). A
  // key not here yet has its confirmation on the way: it will be absorbed.
  bool lose_binding(std::string_view key, std::uint64_t now);
  // Eviction: begins the removal of up to n least recently used complete keys that no
  // reader holds a lease on, oldest first, calling take(std::string_view key,
  // std::uint64_t used) for each.
  template <typename Take>
  std::size_t take_least_recent(std::uint64_t now, std::size_t n, Take&& take) {
    return take_least_recent_impl(now, n, &take,
                                  [](void* t, std::string_view key, std::uint64_t used) {
                                    (*static_cast<Take*>(t))(key, used);
                                  });
  }
  // Stale-key reclamation: begins the removal of up to n incomplete keys last confirmed
  // at or before `cutoff`, least recently confirmed first, calling take(std::string_view
  // key, std::uint64_t confirmed) for each. O(1) per key: no scan.
  template <typename Take>
  std::size_t take_stale(std::uint64_t cutoff, std::size_t n, Take&& take) {
    return take_stale_impl(cutoff, n, &take,
                           [](void* t, std::string_view key, std::uint64_t confirmed) {
                             (*static_cast<Take*>(t))(key, confirmed);
                           });
  }
  // Calls off a removal take_stale began. in_place: the key goes back where it was, with
  // its last confirmation `confirmed` (keys put back in the reverse order they were taken
  // regain their places); else it is tracked as last confirmed at now (a rank still
  // reserves it: a writer is at work, so it is looked at again a grace later). A key that
  // confirmations completed meanwhile becomes a complete key used at now. The caller
  // makes sure the directory was not cleared in between.
  void abort_stale(std::string_view key, std::uint64_t confirmed, bool in_place, std::uint64_t now);
  // Incomplete keys: confirmed by fewer ranks than their tp_world_size, not being removed.
  std::size_t incomplete_count() const;
  // The pages they hold on the ranks: their confirmations summed.
  std::uint64_t incomplete_bindings() const;
  // When the least recently confirmed incomplete key was last confirmed; UINT64_MAX: none.
  std::uint64_t oldest_incomplete() const;
  // Calls visit(std::string_view key) for each incomplete key until it returns false.
  template <typename Visit>
  void for_each_incomplete(Visit&& visit) const {
    for_each_incomplete_impl(
        &visit, [](void* v, std::string_view key) { return (*static_cast<Visit*>(v))(key); });
  }
  // Calls off a removal take_least_recent began: the key is complete again, with its
  // last use, in front (keys called off in the reverse order they were taken regain
  // their places) or behind the others (passed over). The caller makes sure the
  // directory was not cleared in between.
  void abort_removal(std::string_view key, std::uint64_t used, bool in_front);
  // The last-use times of the keys take_least_recent would take, oldest first (to merge
  // the slices of several cores).
  void oldest_used(std::uint64_t now, std::size_t n, std::vector<std::uint64_t>& out);
  std::size_t leased_count(std::uint64_t now) const;
  // Periodic: ends up to key_life::sweep_batch due leases (see key_life::sweep).
  void sweep(std::uint64_t now);
  // Periodic: moves table growths along (see packed_map::advance_growth).
  void advance_growth();

  std::size_t size() const;
  // Calls visit(key, tp_world_size, count) for every key (snapshots; while staged, every
  // named key).
  template <typename Visit>
  void for_each_key(Visit&& visit) const {
    for_each_key_impl(&visit,
                      [](void* v, std::string_view key, std::int32_t tp, std::int32_t count) {
                        (*static_cast<Visit*>(v))(key, tp, count);
                      });
  }
  // Recovery: sets a key's entry outright (used at now).
  void restore(std::string_view key, std::int32_t tp_world_size, std::int32_t count,
               std::uint64_t now);

  // Recovery in bulk, into an empty directory that nothing else touches meanwhile (and a
  // hot standby's, until promotion), staged: each key's entry is its tp_world_size as
  // the directory records name it (or unnamed) and its count of confirmed bindings,
  // built in place (one lookup a binding), in any order of names and counts.
  // 1. restore_reserve(n) sizes the table for n keys; restore_key() names a key (its
  //    smallest tp_world_size wins), restore_forget() unnames it (a directory_remove),
  //    restore_forget_all() every key (a clear); counts stay.
  // 2. restore_count() once per confirmed binding (a key unnamed then takes fallback_tp,
  //    unless that is unnamed_tp: returns how many keys took it); restore_uncount() once
  //    per binding dropped, which must have been counted.
  // 3. restore_finish(now, fallback_tp): keys still unnamed take fallback_tp (returns how
  //    many), keys with no binding leave; the others are complete (used at now) or
  //    incomplete (last confirmed at now).
  static constexpr std::int32_t unnamed_tp = std::numeric_limits<std::int32_t>::min();
  void restore_reserve(std::size_t n);
  void restore_key(std::string_view key, std::int32_t tp_world_size);
  void restore_key(const packed_key& key, std::int32_t tp_world_size);
  void restore_forget(std::string_view key);
  void restore_forget_all();
  //    The packed keys' lookups read one bucket of each key first (`second`: its second
  //    table bucket, else its first; packed_map::find_sweep): keys in an order in which
  //    that bucket rises are counted at near-sequential speed.
  std::size_t restore_count(std::span<const packed_key> keys, std::int32_t fallback_tp,
                            bool second = false);
  std::size_t restore_count(std::string_view key, std::int32_t fallback_tp);
  void restore_uncount(std::span<const packed_key> keys);
  void restore_uncount(std::string_view key);
  std::size_t restore_finish(std::uint64_t now, std::int32_t fallback_tp);
  void clear();

  // The invariants above, O(keys): "" when they hold, else the first broken one.
  std::string verify() const;

 private:
  template <class>
  friend struct verify_access;  // tests: breaks an invariant to see verify() report it

  void for_each_key_impl(void* visit,
                         void (*call)(void*, std::string_view, std::int32_t, std::int32_t),
                         bool with_unnamed = false) const;
  std::size_t take_least_recent_impl(std::uint64_t now, std::size_t n, void* take,
                                     void (*call)(void*, std::string_view, std::uint64_t));
  std::size_t take_stale_impl(std::uint64_t cutoff, std::size_t n, void* take,
                              void (*call)(void*, std::string_view, std::uint64_t));
  void for_each_incomplete_impl(void* visit, bool (*call)(void*, std::string_view)) const;

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace metad::shard
