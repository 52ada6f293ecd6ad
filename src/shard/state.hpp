// The state one core owns: the page pools and key maps of its ranks (rank_table) and
// its slice of the key-completion directory (directory). Single-threaded by design:
// only the owning core calls these; other cores reach them through the mailbox.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shard/packed_key.hpp"

namespace shard {

// Rank r is owned by core r mod cores (non-negative for negative ranks too).
int owner_of_rank(std::int64_t rank, int cores);
// A stable 64-bit hash of a key; its directory slice is owned by core hash mod cores.
std::uint64_t key_hash(std::string_view key);
int owner_of_key(std::string_view key, int cores);

enum class init_outcome : std::uint8_t { created, unchanged, grown, shrink_refused };
struct init_result {
  init_outcome outcome;
  std::int64_t old_pages;  // the pool size before the call (0 if created)
};

enum class confirm_outcome : std::uint8_t { ok, not_initialized, bad_request };

struct rank_stats {
  std::int64_t num_pages, free, reserved, bound;
};

struct allocate_result {
  bool found = false;          // false: the rank is not initialised (nothing appended)
  std::uint32_t short_by = 0;  // > 0: the batch got -1s; this many more free pages would serve it
  bool evictable = false;      // ... and freeing every bound page of the rank would be enough
  explicit operator bool() const { return found; }
};

class rank_table {
 public:
  rank_table();
  ~rank_table();
  rank_table(rank_table&&) noexcept;
  rank_table& operator=(rank_table&&) noexcept;

  // A reservation neither confirmed nor released within ttl of now expires (see
  // expire()); 0 (the default) keeps reservations until then.
  void set_reservation_ttl(std::uint64_t ttl);

  // num_pages > 0, already validated against the ceiling.
  init_result initialize(std::int64_t rank, std::int64_t num_pages);
  // The heap bytes a rank's page pool of num_pages pages holds (its key table grows with
  // its keys, on top).
  static std::size_t pool_bytes(std::int64_t num_pages);
  bool contains(std::int64_t rank) const;

  // batch_allocate on one rank at now. `keys` may repeat. For each distinct key, in
  // order of first occurrence, appends its index in `keys` to distinct_out and its page
  // to pages_out (-1: the pool cannot serve the batch). Nothing is appended when the
  // rank is not initialised.
  allocate_result allocate(std::int64_t rank, std::span<const std::string_view> keys,
                           std::uint64_t now, std::vector<std::uint32_t>& distinct_out,
                           std::vector<std::int64_t>& pages_out);

  // Returns every reservation whose deadline is <= now to the free pool (its key
  // forgotten), on every rank; calls visit(rank, std::span<const std::int64_t> pages) once
  // per rank that lost any, for the log. Returns how many expired. O(1) amortised per
  // reservation: no scan.
  template <typename Visit>
  std::size_t expire(std::uint64_t now, Visit&& visit) {
    return expire_impl(now, &visit,
                       [](void* v, std::int64_t rank, std::span<const std::int64_t> pages) {
                         (*static_cast<Visit*>(v))(rank, pages);
                       });
  }
  // Log replay of expire(): releases each page that is reserved. False if no such rank.
  bool release_reserved(std::int64_t rank, std::span<const std::int64_t> pages);

  // Drops each key that `rank` has confirmed, freeing its page (delete, eviction); a key
  // only reserved here keeps its reservation (it is being written). Appends the index of
  // each key dropped to removed_out. False if the rank is not initialised.
  bool remove_confirmed(std::int64_t rank, std::span<const std::string_view> keys,
                        std::vector<std::uint32_t>& removed_out);

  // confirm_write on one rank: confirmation i binds keys[i] → pages[i]; then releases.
  // The whole request is validated first; on bad_request, `detail` says why and nothing
  // changed. On ok, newly_confirmed_out gets the indices i whose key this rank
  // confirmed for the first time (each key once), for the directory.
  confirm_outcome confirm(std::int64_t rank, std::span<const std::string_view> keys,
                          std::span<const std::int64_t> pages,
                          std::span<const std::int64_t> releases, std::string& detail,
                          std::vector<std::uint32_t>& newly_confirmed_out);

  // For each key, the page this rank has confirmed for it, or -1. False if the rank is
  // not initialised.
  bool confirmed_pages(std::int64_t rank, std::span<const std::string_view> keys,
                       std::span<std::int64_t> pages_out) const;

  // Sets reserved[i] for each key that some rank here holds a reservation for (a writer
  // is at work on it). Leaves the other flags as they are.
  void mark_reserved(std::span<const std::string_view> keys,
                     std::span<std::uint8_t> reserved) const;

  std::optional<rank_stats> stats(std::int64_t rank) const;
  // Calls visit(rank, stats) for every rank, in no particular order (metrics).
  template <typename Visit>
  void for_each_rank(Visit&& visit) const {
    for_each_rank_impl(&visit, [](void* v, std::int64_t rank, const rank_stats& s) {
      (*static_cast<Visit*>(v))(rank, s);
    });
  }
  // Calls visit(rank, key, page, confirmed) for every reserved or bound page (snapshots).
  template <typename Visit>
  void for_each_entry(Visit&& visit) const {
    for_each_entry_impl(
        &visit, [](void* v, std::int64_t rank, std::string_view key, std::int64_t page,
                   bool confirmed) { (*static_cast<Visit*>(v))(rank, key, page, confirmed); });
  }
  // Recovery: puts `key` on `page` of an initialised rank, reserved (with a fresh TTL
  // from now) or bound. False if the rank is absent, the page is out of range or
  // taken, or the key already has one.
  bool restore(std::int64_t rank, std::string_view key, std::int64_t page, bool confirmed,
               std::uint64_t now);

  // A binding of a key of 32 lowercase hex characters, packed (snapshots, recovery).
  struct packed_binding {
    packed_key key;
    std::uint32_t page = 0;
    bool confirmed = false;
  };
  // Recovery in bulk: restore() for each entry, in order. `expected` (the rank's entries
  // in all) sizes the rank's empty key table first, so that filling it never grows it.
  // False as restore() is (what came before the bad entry stays).
  bool restore_packed(std::int64_t rank, std::size_t expected,
                      std::span<const packed_binding> entries, std::uint64_t now);
  // Recovery: while on, the key tables of every rank (and of ranks created meanwhile)
  // grow at once instead of incrementally (see packed_map::set_bulk); turning it off
  // rebuilds a table that a reserve_keys() guess left under 70% full.
  void set_bulk(bool on);
  // Recovery: sizes the empty key table of an initialised rank for n keys.
  void reserve_keys(std::int64_t rank, std::size_t n);
  // Snapshots, rank by rank: on_rank(rank, stats, packed_count), then on_packed(const
  // packed_binding&) for each of its packed_count 32-hex keys, then on_other(key, page,
  // confirmed) for each other key of the rank.
  template <typename OnRank, typename OnPacked, typename OnOther>
  void for_each_rank_packed(OnRank&& on_rank, OnPacked&& on_packed, OnOther&& on_other) const {
    struct visitors {
      OnRank& r;
      OnPacked& p;
      OnOther& o;
    } v{on_rank, on_packed, on_other};
    for_each_rank_packed_impl(
        &v,
        [](void* x, std::int64_t rank, const rank_stats& st, std::size_t n) {
          static_cast<visitors*>(x)->r(rank, st, n);
        },
        [](void* x, const packed_binding& b) { static_cast<visitors*>(x)->p(b); },
        [](void* x, std::string_view key, std::int64_t page, bool confirmed) {
          static_cast<visitors*>(x)->o(key, page, confirmed);
        });
  }

  std::size_t rank_count() const;
  // Reserved pages over all ranks (sizing expire()'s log records).
  std::size_t reserved_pages() const;
  // Releases refused because the page was bound to a confirmed key (a metric).
  std::uint64_t refused_releases() const;
  // Reservations that expired (a metric).
  std::uint64_t expired_reservations() const;
  // Periodic: moves the ranks' key table growths along (see packed_map::advance_growth).
  void advance_growth();
  void clear();

  // Full consistency check (tests, fuzzers): every page of every rank is exactly one of
  // free, reserved or bound, agreeing with the key map; no page belongs to two keys.
  // Returns an empty string when consistent, else a description of the first violation.
  std::string check_invariants() const;

 private:
  void for_each_rank_impl(void* visit, void (*call)(void*, std::int64_t, const rank_stats&)) const;
  void for_each_entry_impl(void* visit, void (*call)(void*, std::int64_t, std::string_view,
                                                     std::int64_t, bool)) const;
  void for_each_rank_packed_impl(
      void* v, void (*on_rank)(void*, std::int64_t, const rank_stats&, std::size_t),
      void (*on_packed)(void*, const packed_binding&),
      void (*on_other)(void*, std::string_view, std::int64_t, bool)) const;
  std::size_t expire_impl(std::uint64_t now, void* visit,
                          void (*call)(void*, std::int64_t, std::span<const std::int64_t>));

  struct impl;
  std::unique_ptr<impl> impl_;
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
  // directory was not cleared in between (cluster::clears).
  bool finish_removal(std::string_view key, std::int32_t bindings, std::uint64_t now);
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
  // Calls visit(key, tp_world_size, count) for every key (snapshots).
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

  // Recovery in bulk, into an empty directory that nothing else touches meanwhile: the
  // keys' entries are built in place, counted where they lie (one lookup a binding).
  // 1. restore_reserve(n) sizes the table for n keys; restore_key() for each key the
  //    files name (its smallest tp_world_size wins), restore_forget() for each they drop.
  // 2. restore_count() once per confirmed binding; a key that step 1 did not name
  //    enters with fallback_tp. Returns how many keys did so.
  // 3. restore_finish(now): keys with no binding leave; the others are complete (used
  //    at now) or incomplete (last confirmed at now).
  void restore_reserve(std::size_t n);
  void restore_key(std::string_view key, std::int32_t tp_world_size);
  void restore_key(const packed_key& key, std::int32_t tp_world_size);
  void restore_forget(std::string_view key);
  std::size_t restore_count(std::span<const packed_key> keys, std::int32_t fallback_tp);
  std::size_t restore_count(std::string_view key, std::int32_t fallback_tp);
  void restore_finish(std::uint64_t now);
  void clear();

 private:
  void for_each_key_impl(void* visit,
                         void (*call)(void*, std::string_view, std::int32_t, std::int32_t)) const;
  std::size_t take_least_recent_impl(std::uint64_t now, std::size_t n, void* take,
                                     void (*call)(void*, std::string_view, std::uint64_t));
  std::size_t take_stale_impl(std::uint64_t cutoff, std::size_t n, void* take,
                              void (*call)(void*, std::string_view, std::uint64_t));
  void for_each_incomplete_impl(void* visit, bool (*call)(void*, std::string_view)) const;

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace shard
