// The ranks one core owns: each rank's page pool and its keys (rank_table).
// Single-threaded by design: only the owning core calls it; other cores reach it
// through the mailbox.
//
// Invariants (verify(), per rank):
// - the key map's own (dual_key_map) and the page pool's own (page_pool::check: summary
//   levels, counts equal popcounts, no page both free and bound, nothing at or past the
//   high-water mark);
// - every key is reachable, holds one page below the high-water mark, no page is held
//   by two keys; a confirmed key's page is bound, a reserving key's page reserved and
//   its owner record names the key back;
// - bound pages = confirmed keys; reserved pages = reserving keys + quarantined pages;
//   owner records = reserving keys;
// - quarantined pages are in range, listed once, reserved, and owned by no key;
// - the expiry queue is in deadline order and holds an entry for every reservation with
//   a deadline (reservation_queue).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shard/packed_key.hpp"

namespace metad::shard {

enum class init_outcome : std::uint8_t { created, unchanged, grown, shrunk };
struct init_result {
  init_outcome outcome;
  std::int64_t old_pages;  // the pool size before the call (0 if created)
};

enum class confirm_outcome : std::uint8_t { ok, not_initialized, bad_request };

// Quarantined pages (see rank_table) count as free: no key holds them.
struct rank_stats {
  std::int64_t num_pages, free, reserved, bound;
  std::int64_t quarantined = 0;
};

struct allocate_result {
  bool found = false;          // false: the rank is not initialised (nothing appended)
  std::uint32_t short_by = 0;  // > 0: the batch got -1s; this many more free pages would serve it
  bool evictable = false;      // ... and freeing every bound page of the rank would be enough
  std::uint32_t taken = 0;     // keys given a new page
  bool over_quota = false;     // short_by: the page_quota's, not the rank's free pages
  explicit operator bool() const { return found; }
};

// A bound on pages that several cores share (--tenants-file's pages=N): `held` counts
// the pages held against it, `max` is the bound (< 0: none). allocate() adds the pages
// it takes to `held` before it takes them, by a compare-and-swap that keeps held + the
// batch's new pages <= max, or answers the batch as a full rank would.
struct page_quota {
  std::atomic<std::int64_t>* held = nullptr;  // null: no count, no bound
  std::int64_t max = -1;
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

  // Quarantine. A page a client releases (confirm_write's pages_to_release) may be
  // released again by a replay of that request (vLLM's client retries a POST after a
  // 5xx or a lost connection). So a released page is not handed out again until its
  // quarantine ends: it waits in a per-rank queue, in release order, neither free nor
  // held by a key. Allocation takes the lowest free page first and the oldest
  // quarantined page only when no free page is left (a full pool still serves).
  // Allocation stays deterministic: the queue changes only through logged calls.

  // num_pages > 0, already validated against the ceiling. A smaller num_pages than the
  // rank has shrinks it: the pages from num_pages on no longer exist, so each key bound
  // to one loses its binding here (appended to unbound_out, for the directory), and
  // their reservations and quarantines are dropped.
  init_result initialize(std::int64_t rank, std::int64_t num_pages,
                         std::vector<std::string>* unbound_out = nullptr);
  // The heap bytes a rank of num_pages pages holds before it hands out a page: a
  // constant (0 for none), whatever num_pages is. The pages it hands out and their keys
  // grow it from there (what the memory budget charges per allocation).
  static std::size_t pool_bytes(std::int64_t num_pages);
  bool contains(std::int64_t rank) const;

  // batch_allocate on one rank at now (free pages first, then the quarantine, oldest
  // first). `keys` may repeat. For each distinct key, in
  // order of first occurrence, appends its index in `keys` to distinct_out and its page
  // to pages_out (-1: the pool cannot serve the batch). Nothing is appended when the
  // rank is not initialised. At most new_max keys may take a new page (the memory
  // budget's cap: past it the batch is answered as by a full pool); a batch within it
  // gets exactly the pages it would get without a cap. `quota`: the batch's new pages are
  // added to quota.held before they are taken; past quota.max the batch is answered as
  // by a full rank (over_quota; short_by: the pages over, at most the batch's).
  allocate_result allocate(std::int64_t rank, std::span<const std::string_view> keys,
                           std::uint64_t now, std::vector<std::uint32_t>& distinct_out,
                           std::vector<std::int64_t>& pages_out, std::uint64_t new_max = UINT64_MAX,
                           page_quota quota = {});

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

  // Ends every quarantine whose time is <= now: those pages become free. Calls
  // visit(rank, std::span<const std::int64_t> pages) once per rank that freed any, for
  // the log (quarantine_end). Returns how many were freed.
  template <typename Visit>
  std::size_t end_quarantines(std::uint64_t now, Visit&& visit) {
    return end_quarantines_impl(
        now, &visit, [](void* v, std::int64_t rank, std::span<const std::int64_t> pages) {
          (*static_cast<Visit*>(v))(rank, pages);
        });
  }
  // Log replay of end_quarantines(): `pages` must be the rank's oldest quarantined
  // pages, in order. False if not.
  bool end_quarantine(std::int64_t rank, std::span<const std::int64_t> pages);
  // Recovery: puts free `pages` of the rank into quarantine until `until`, in order.
  // False if the rank is absent or a page is out of range or not free.
  bool restore_quarantine(std::int64_t rank, std::span<const std::int64_t> pages,
                          std::uint64_t until);
  // After recovery: every quarantine ends at `until` (0: they end now, the pages free).
  void restart_quarantines(std::uint64_t until);
  // Calls visit(rank, std::span<const std::int64_t> pages) for each rank with
  // quarantined pages, oldest first (snapshots).
  template <typename Visit>
  void for_each_quarantine(Visit&& visit) const {
    for_each_quarantine_impl(&visit,
                             [](void* v, std::int64_t rank, std::span<const std::int64_t> pages) {
                               (*static_cast<Visit*>(v))(rank, pages);
                             });
  }

  // Drops each key that `rank` has confirmed, freeing its page (delete, eviction); a key
  // only reserved here keeps its reservation (it is being written). Appends the index of
  // each key dropped to removed_out. False if the rank is not initialised.
  bool remove_confirmed(std::int64_t rank, std::span<const std::string_view> keys,
                        std::vector<std::uint32_t>& removed_out);

  // confirm_write on one rank: confirmation i binds keys[i] → pages[i]; then releases.
  // A released page goes into quarantine until `quarantine_until` (0: it is free at
  // once); releasing a free or quarantined page is a no-op, a bound one is refused.
  // The whole request is validated first; on bad_request, `detail` says why and nothing
  // changed. On ok, newly_confirmed_out gets the indices i whose key this rank
  // confirmed for the first time (each key once), for the directory.
  confirm_outcome confirm(std::int64_t rank, std::span<const std::string_view> keys,
                          std::span<const std::int64_t> pages,
                          std::span<const std::int64_t> releases, std::uint64_t quarantine_until,
                          std::string& detail, std::vector<std::uint32_t>& newly_confirmed_out);

  // For each key, the page this rank has confirmed for it, or -1. False if the rank is
  // not initialised.
  bool confirmed_pages(std::int64_t rank, std::span<const std::string_view> keys,
                       std::span<std::int64_t> pages_out) const;

  // Sets reserved[i] for each key that some rank here holds a reservation for (a writer
  // is at work on it). Leaves the other flags as they are.
  void mark_reserved(std::span<const std::string_view> keys,
                     std::span<std::uint8_t> reserved) const;

  // Read-only (POST /keys/inspect): calls visit(rank, page, confirmed, deadline) for
  // each rank here that holds `key`, reserved (deadline: when the reservation expires,
  // UINT64_MAX never) or confirmed (deadline 0). O(ranks here).
  template <typename Visit>
  void inspect_key(std::string_view key, Visit&& visit) const {
    inspect_key_impl(
        key, &visit,
        [](void* v, std::int64_t rank, std::int64_t page, bool confirmed, std::uint64_t deadline) {
          (*static_cast<Visit*>(v))(rank, page, confirmed, deadline);
        });
  }

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
    // Images: the key's slot in its rank's table (packed_map::for_each_slot).
    std::uint64_t slot = 0;
  };
  // Recovery in bulk: restore() for each entry, in order. `expected` (the rank's entries
  // in all) sizes the rank's empty key table first, so that filling it never grows it.
  // False as restore() is (what came before the bad entry stays).
  bool restore_packed(std::int64_t rank, std::size_t expected,
                      std::span<const packed_binding> entries, std::uint64_t now);
  // Recovery from an image of a rank's key table (snapshot_rank_slots, issue 35): the
  // table as it was laid out, each bound key put back into the slot it had, with no
  // lookup. begin_image: the rank's key table, empty, takes `buckets` buckets; false
  // (nothing changed: load the entries with restore_packed instead) if the rank is
  // absent, already holds keys, or `buckets` is beyond what its pages could need.
  // restore_image: each entry, bound, into its slot; false as restore_packed is, or if
  // an entry is not bound or its slot is not one of its key's (packed_map::place_at).
  // What came before a bad entry stays.
  bool begin_image(std::int64_t rank, std::size_t buckets);
  bool restore_image(std::int64_t rank, std::span<const packed_binding> entries);
  // Recovery: while on, the key tables of every rank (and of ranks created meanwhile)
  // grow at once instead of incrementally (see packed_map::set_bulk); turning it off
  // rebuilds a table that a reserve_keys() guess left under 70% full.
  void set_bulk(bool on);
  // Recovery: sizes the empty key table of an initialised rank for n keys.
  void reserve_keys(std::int64_t rank, std::size_t n);
  // Snapshots, rank by rank: on_rank(rank, stats, packed_count, image_buckets), then
  // on_packed(const packed_binding&) for each of its packed_count 32-hex keys, then
  // on_other(key, page, confirmed) for each other key of the rank. When image_buckets is
  // not 0 the packed keys come in slot order, each with its slot (an image's layout:
  // packed_map::image_buckets); else their slots mean nothing.
  template <typename OnRank, typename OnPacked, typename OnOther>
  void for_each_rank_packed(OnRank&& on_rank, OnPacked&& on_packed, OnOther&& on_other) const {
    struct visitors {
      OnRank& r;
      OnPacked& p;
      OnOther& o;
    } v{on_rank, on_packed, on_other};
    for_each_rank_packed_impl(
        &v,
        [](void* x, std::int64_t rank, const rank_stats& st, std::size_t n, std::size_t b) {
          static_cast<visitors*>(x)->r(rank, st, n, b);
        },
        [](void* x, const packed_binding& b) { static_cast<visitors*>(x)->p(b); },
        [](void* x, std::string_view key, std::int64_t page, bool confirmed) {
          static_cast<visitors*>(x)->o(key, page, confirmed);
        });
  }

  std::size_t rank_count() const;
  // Reserved pages over all ranks (sizing expire()'s log records), not quarantined.
  std::size_t reserved_pages() const;
  // Quarantined pages over all ranks.
  std::size_t quarantined_pages() const;
  // Pages held for keys over all ranks: reserved (not quarantined) + bound. O(ranks).
  std::int64_t held_pages() const;
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
  // The same as verify().
  std::string check_invariants() const;
  // The invariants above, O(keys + pages held) per rank: "" when they hold, else the
  // first broken one, naming its rank.
  std::string verify() const;

 private:
  template <class>
  friend struct verify_access;  // tests: breaks an invariant to see verify() report it

  void for_each_rank_impl(void* visit, void (*call)(void*, std::int64_t, const rank_stats&)) const;
  void inspect_key_impl(std::string_view key, void* visit,
                        void (*call)(void*, std::int64_t, std::int64_t, bool, std::uint64_t)) const;
  void for_each_entry_impl(void* visit, void (*call)(void*, std::int64_t, std::string_view,
                                                     std::int64_t, bool)) const;
  void for_each_rank_packed_impl(
      void* v, void (*on_rank)(void*, std::int64_t, const rank_stats&, std::size_t, std::size_t),
      void (*on_packed)(void*, const packed_binding&),
      void (*on_other)(void*, std::string_view, std::int64_t, bool)) const;
  std::size_t expire_impl(std::uint64_t now, void* visit,
                          void (*call)(void*, std::int64_t, std::span<const std::int64_t>));
  std::size_t end_quarantines_impl(std::uint64_t now, void* visit,
                                   void (*call)(void*, std::int64_t,
                                                std::span<const std::int64_t>));
  void for_each_quarantine_impl(void* visit, void (*call)(void*, std::int64_t,
                                                          std::span<const std::int64_t>)) const;

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace metad::shard
