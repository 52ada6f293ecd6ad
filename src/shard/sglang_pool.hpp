// sglang_pool: one SGLang HiCache pool (one (rank, namespace) of docs/sglang-api.md), sans-IO.
// Every page is in exactly one state: free (in the LIFO stack `free_`), in flight (handed
// out by reserve; its key, clear-epoch and deadline in `owners_`), bound (the page of one
// confirmed key, on the LRU list), quarantined (released by a confirm_write and held for
// no key until its quarantine ends: a replay of that release must not free another
// writer's page), or unowned (only after restore(): leaked, bindable by a confirm).
// Bound keys of 32 or 64 hex digits of one case are packed inline in their LRU node (64
// bytes; packed_key.hpp), other keys are heap copies; either comes back byte for byte.
// sparse_pages holds the state bits and counts; no page is ever held by two keys. A pool
// costs what it holds: its free stack is runs of pages and only the chunks of pages ever
// taken have state bits, so a pool of 2^40 pages is created in O(1).
// Deterministic: the same calls with the same arguments (and `now`s) in the same order
// give the same pages, so a caller may log each mutating call and replay it. Owned by one
// core; not thread-safe.
//
// Invariants (verify(): check()'s, then the expiry queue's and the node pool's):
// - page states: sparse_pages' own (counts agree with the state bits);
// - the free stack holds exactly the free pages: disjoint runs, in range, each page once;
// - the LRU list is well linked, names exactly the key map's keys (each naming its node
//   back), one per bound page, each page in range and bound;
// - each in-flight page is in range, reserved and owned (a key copy);
// - quarantined pages are in range, reserved and marked, as many marks as pages;
// - no page is held twice (by a key, a reservation or the quarantine);
// - the expiry queue is in deadline order, each entry's serial at most the last one
//   given, and every reservation with a deadline has exactly one live entry;
// - each reservation's clear-epoch is at most the pool's;
// - every node is the sentinel, listed, or on the free chain exactly once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shard/chunked_vector.hpp"
#include "shard/key_map.hpp"
#include "shard/lifo_pages.hpp"
#include "shard/packed_key.hpp"
#include "shard/page_pool.hpp"
#include "shard/sparse_pages.hpp"

namespace metad::shard {

struct sglang_config {
  // A reservation neither confirmed nor released within this of its reserve expires and
  // its page is free again (a dead writer). 0: never. In the caller's time unit.
  std::uint64_t reservation_ttl = 0;
  // get_page_indices leases each key it finds for this long: eviction passes it over.
  // 0 (default): no leases, the reference's eviction order exactly.
  std::uint64_t read_lease = 0;
};

// One element of a reserve answer: [already_exists, page]; page -1: none.
struct sglang_slot {
  bool exists = false;
  std::int64_t page = -1;
  bool operator==(const sglang_slot&) const = default;
};

struct sglang_reserve_stats {
  std::uint32_t hits = 0;           // answers (true, page), duplicates included
  std::uint32_t allocated = 0;      // distinct keys given a page (free or evicted)
  std::uint32_t evicted = 0;        // bound keys evicted for them
  std::uint32_t no_page = 0;        // answers (false, -1), duplicates included
  std::uint32_t expired = 0;        // reservations expired before the batch ran
  std::uint32_t unquarantined = 0;  // keys given a quarantined page (nothing else was left)
};

enum class sglang_confirm_outcome : std::uint8_t { ok, bad_request };

struct sglang_confirm_stats {
  std::uint32_t bound = 0;    // confirmations that bound (or re-confirmed) their key
  std::uint32_t skipped = 0;  // page free, bound to / reserved for another key
  std::uint32_t stale = 0;    // reserved before a clear: not bound, page freed
  // Released pages that were in flight or unowned: freed, or quarantined (counted in
  // `quarantined` too) when the confirm names a quarantine.
  std::uint32_t released = 0;
  std::uint32_t quarantined = 0;
  std::uint32_t release_refused = 0;  // released pages bound to a key: kept
  std::uint32_t release_noop = 0;     // released pages already free or quarantined
  std::uint32_t rebound_freed = 0;    // old pages freed by re-binding a key
  std::uint32_t expired = 0;          // reservations expired before the request ran
};

// Quarantined pages count as free (no key holds them; as vLLM's rank_stats), and in
// `quarantined`.
struct sglang_pool_stats {
  std::uint64_t num_pages, free;
  std::uint32_t in_flight, bound;
  std::uint64_t unowned;
  std::uint64_t keys;
  std::uint32_t quarantined = 0;
};

// A pool's whole state, for snapshots and restore. Pages in none of the lists are unowned.
struct sglang_image {
  struct in_flight {
    std::uint64_t page;
    std::string key;
    std::uint32_t epoch;
    std::uint64_t deadline;  // UINT64_MAX: none
  };
  std::uint64_t num_pages = 0;
  std::uint32_t epoch = 0;
  // The free stack as runs [lo, hi) of ascending pages, bottom → top (the top run's hi-1
  // is next): a fresh pool of any size is one run.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> free;
  std::vector<std::pair<std::string, std::uint64_t>> bound;  // LRU first
  std::vector<in_flight> reserved;                           // in reservation order
  std::vector<std::uint64_t> quarantined;                    // oldest release first
  // Appends page p on top of `free` (merging it into the top run when it extends it).
  void push_free(std::uint64_t p) {
    if (!free.empty() && free.back().second == p) {
      ++free.back().second;
    } else {
      free.emplace_back(p, p + 1);
    }
  }
};

// What a pool knows of one key (POST /{rank}/inspect).
struct sglang_key_report {
  std::int64_t page = -1;            // bound page, or -1
  std::uint64_t lease_until = 0;     // bound keys: a read lease's end (0: none)
  std::int64_t reserved_page = -1;   // a page in flight for the key, or -1
  std::uint64_t reserved_until = 0;  // ... its deadline (UINT64_MAX: none)
  bool reserved_stale = false;       // ... reserved before a clear: it will not bind
};

class sglang_pool {
 public:
  // The largest num_pages (2^48, the default of --pages-per-rank-max).
  static constexpr std::uint64_t pages_max = page_pool::pages_max;
  // restore() refuses an image whose unowned pages (listed nowhere) are more than this:
  // each costs state bits, and no pool's clients could have made so many.
  static constexpr std::uint64_t unowned_max = std::uint64_t{1} << 28;
  static constexpr std::uint64_t no_deadline = UINT64_MAX;

  explicit sglang_pool(std::uint64_t num_pages, const sglang_config& config = {});
  ~sglang_pool();
  sglang_pool(sglang_pool&&) noexcept;
  sglang_pool& operator=(sglang_pool&&) noexcept;

  std::uint64_t num_pages() const { return pages_.num_pages(); }
  std::uint32_t epoch() const { return epoch_; }
  // Grows to new_pages (>= num_pages()): the new pages are pushed on the free stack in
  // ascending order (the highest is handed out next), as free_pages.extend(range(old, new)).
  // O(1) whatever the sizes.
  void grow(std::uint64_t new_pages);

  // exists: out[i] = 1 iff keys[i] is bound. Touches nothing (no recency, no lease).
  void exists(std::span<const std::string_view> keys, std::span<std::uint8_t> out) const;

  // reserve_and_allocate_page_indices at now: out gets one answer per key, in order.
  // Expires due reservations first. Pass 1: bound keys answer (true, page) and move to
  // the MRU end in input order. Pass 2: every other distinct key, in order, takes the top
  // free page, else the page of the least recently used bound key that is neither a hit
  // of this batch nor leased (evicted), else the oldest quarantined page, else -1. A
  // repeated key copies its first answer. With fresh = false (the memory budget is
  // spent) the pool answers as a full one: neither a free nor a quarantined page is
  // taken, only evicted ones (a replay passes the same flag: the log records it).
  sglang_reserve_stats reserve(std::span<const std::string_view> keys, std::uint64_t now,
                               std::vector<sglang_slot>& out, bool fresh = true) {
    return reserve_capped(keys, now, out, fresh ? UINT64_MAX : 0);
  }
  // As reserve(), but at most fresh_max keys take a free or quarantined page (a tenant's
  // pages=N: the pages it may still add); past them the pool answers as a full one
  // (evictions, which add no page held, else -1). reserve(fresh) is fresh_max
  // UINT64_MAX or 0.
  sglang_reserve_stats reserve_capped(std::span<const std::string_view> keys, std::uint64_t now,
                                      std::vector<sglang_slot>& out, std::uint64_t fresh_max);

  // confirm_write at now: binds keys[i] → pages[i] in order, then frees `releases`.
  // bad_request (detail set, nothing changed): a page outside 0..num_pages-1 in either
  // list, or a page both confirmed and released. Otherwise every confirmation binds iff
  // its page is in flight for its key (this epoch), already bound to it, or unowned; the
  // others (free, bound to or reserved for another key, quarantined) are skipped
  // (stats). Re-binding a key frees its old page. A released page that is in flight or
  // unowned is freed (quarantine_until 0) or quarantined until quarantine_until; a
  // released page that is bound is kept; one that is free or quarantined: a no-op (so a
  // replay of the release changes nothing while the quarantine runs).
  sglang_confirm_outcome confirm(std::span<const std::string_view> keys,
                                 std::span<const std::int64_t> pages,
                                 std::span<const std::int64_t> releases, std::uint64_t now,
                                 std::string& detail, sglang_confirm_stats& stats,
                                 std::uint64_t quarantine_until = 0);

  // delete_keys: each bound key is dropped and its page pushed on the free stack. Returns
  // how many were dropped. Reservations are untouched.
  std::size_t delete_keys(std::span<const std::string_view> keys);

  // clear: drops every key (their pages are free again), bumps the epoch so that writes
  // reserved before it never bind. Pages still in flight stay out of the free stack until
  // their writer confirms, releases or expires, and quarantined pages until their
  // quarantine ends: the free stack becomes [0..n-1] minus both, ascending.
  void clear();

  // get_page_indices at now: out[i] = the bound page of keys[i], or -1. Found keys move to
  // the MRU end in input order (and are leased with a read lease configured).
  void get_page_indices(std::span<const std::string_view> keys, std::uint64_t now,
                        std::span<std::int64_t> out);

  // Frees every reservation whose deadline is <= now, oldest first; appends their pages
  // to expired_out when given. Returns how many.
  std::size_t expire(std::uint64_t now, std::vector<std::uint64_t>* expired_out = nullptr);

  // The quarantine. reserve() takes the top free page, else evicts, and only when
  // neither is possible takes the oldest quarantined page (a full pool still serves).
  // Quarantines end only through these calls (the caller logs them), never inside
  // another call, so that a pool replayed from a log is the same whatever the times.
  //
  // Ends every quarantine at the front of the queue whose time is <= now, oldest first:
  // each page is pushed on the free stack as if released then (the most recently
  // released of them on top, handed out next). Appends their pages to ended_out when
  // given. Returns how many.
  std::size_t end_quarantines(std::uint64_t now, std::vector<std::int64_t>* ended_out = nullptr);
  // Log replay of end_quarantines(): `pages` must be the oldest quarantined pages, in
  // order. False (nothing changed) if not.
  bool end_quarantine(std::span<const std::int64_t> pages);
  // Recovery: puts unowned `pages` (a snapshot lists them after the pool's image) into
  // quarantine until `until`, oldest first. False (nothing changed) if one is out of
  // range, not unowned, or listed twice.
  bool restore_quarantine(std::span<const std::int64_t> pages, std::uint64_t until);
  // After recovery or a promotion: every running quarantine ends at `until`.
  void restart_quarantines(std::uint64_t until);
  std::size_t quarantined() const { return quarantine_.size(); }

  // Read-only: out[i] = what the pool holds for keys[i] (touches no recency). One pass
  // over the pages in flight when there are any.
  void inspect(std::span<const std::string_view> keys, std::span<sglang_key_report> out) const;

  sglang_pool_stats stats() const;
  // Pages held for keys: in flight + bound (stats()' in_flight + bound), O(1).
  std::uint64_t held() const { return owners_.size() + pages_.bound_count(); }
  std::size_t memory_bytes() const;
  // Every structure agrees with every other; "" when consistent, else the first problem.
  std::string check() const;
  // check() and the invariants it leaves out (see the top of this file), O(pages held +
  // keys): "" when they all hold, else the first broken one.
  std::string verify() const;

  sglang_image image() const;
  // The pool an image describes (validated: pages in range, each in one list at most, no
  // key twice); its quarantines end only when told (restart_quarantines). On a bad image
  // returns false with `error` set and leaves `out` alone.
  static bool restore(const sglang_image& image, const sglang_config& config, sglang_pool& out,
                      std::string& error);

 private:
  // A key as the pool looks it up and stores it: 32- and 64-hex keys (either case)
  // packed (packed_key.hpp), other keys by their bytes; `hash` picks the bucket.
  struct probe {
    std::string_view text;
    packed_key first, rest;  // shape != other: the packed halves (rest zero for 32)
    std::uint32_t hash = 0;
    key_shape shape = key_shape::other;
  };
  static probe make_probe(std::string_view key);
  // A bound key's node: 64 bytes, the key inline when packed (no heap block), else a
  // heap copy (key_blob). The key index is a table of bucket heads chained through
  // `chain`; a free node has shape free_shape.
  static constexpr std::uint8_t free_shape = 0xFF;
  struct node {
    std::uint64_t key[4] = {};  // packed: first.lo, first.hi, rest.lo, rest.hi; other: key[0]
                                // the address of the key's key_blob
    std::uint64_t lease_until = 0;
    std::uint32_t page_lo = 0;         // page bits 0..31
    std::uint32_t prev = 0, next = 0;  // LRU list; node 0 is the sentinel
    std::uint32_t stamp = 0;           // == stamp_: a hit or passed over in this batch
    std::uint32_t chain = 0;           // the next node of its bucket (0: none)
    std::uint16_t page_hi = 0;         // page bits 32..47 (pages < pages_max = 2^48)
    std::uint8_t shape = free_shape;   // key_shape, or free_shape
    std::uint8_t tag = 0;              // the key's hash bits 24..31: most mismatches end here
    std::uint64_t page() const { return page_lo | std::uint64_t{page_hi} << 32; }
    void set_page(std::uint64_t p) {
      page_lo = static_cast<std::uint32_t>(p);
      page_hi = static_cast<std::uint16_t>(p >> 32);
    }
  };
  static_assert(sizeof(node) == 64);
  static_assert(page_pool::pages_max <= std::uint64_t{1} << 48);
  static bool matches(const node& n, const probe& k);
  // The key a node holds, exactly as the client sent it.
  static std::string key_of(const node& n);
  struct owner {
    const char* blob = nullptr;  // a heap copy of the key (key_blob); nullptr: none
    std::uint32_t epoch = 0;
    std::uint64_t deadline = no_deadline;
    std::uint64_t serial = 0;  // names this reservation in expiry_
    bool operator==(const owner&) const = default;
  };
  // A reservation with a deadline, in the order made (one TTL: also deadline order). An
  // entry whose reservation ended early stays until it reaches the front or a compaction
  // (when stale entries outnumber live ones) drops it: O(1) amortised per reservation.
  struct expiry_entry {
    std::uint64_t deadline;
    std::uint64_t serial;
    std::uint64_t page;
  };
  bool live(const expiry_entry& e) const { return owners_.find(e.page).serial == e.serial; }
  void push_expiry(std::uint64_t page, const owner& o);

  // The LRU list.
  void unlink(std::uint32_t i);
  void link_last(std::uint32_t i);
  std::uint32_t new_node();
  void free_node(std::uint32_t i);
  // The node of a bound key, or 0.
  std::uint32_t find(const probe& k) const;
  // The key index: adds node i (its key stored) to its bucket, or takes it out.
  void index_node(std::uint32_t i, std::uint32_t hash);
  void unindex_node(std::uint32_t i);
  std::uint32_t hash_of(const node& n) const;
  // Frees the heap copies of every node's key (keys of shape other).
  void release_keys() noexcept;
  // Binds key → page (page already in the bound state); frees the key's old page.
  void bind_key(const probe& k, std::uint64_t page, sglang_confirm_stats& stats);
  // Drops a bound key's node and map entry; returns its page (still bound in pages_).
  std::uint64_t drop_node(std::uint32_t i);
  // A page for a missing key: the top free one, else an evicted one, else none (false).
  // Without `fresh`, only an evicted one.
  bool take_page(std::uint64_t now, std::uint64_t& page, sglang_reserve_stats& stats, bool fresh);
  void start_reservation(std::string_view key, std::uint64_t page, std::uint64_t now);
  // Ends the in-flight reservation of `page` (if any) and frees the page.
  void free_in_flight(std::uint64_t page);
  void next_stamp();
  // confirm_write's 400s; sorted_ is its scratch.
  bool validate_confirm(std::span<const std::int64_t> pages, std::span<const std::int64_t> releases,
                        std::string& detail);
  void apply_confirmation(std::string_view key, std::uint64_t page, sglang_confirm_stats& stats);
  void apply_release(std::uint64_t page, std::uint64_t quarantine_until,
                     sglang_confirm_stats& stats);
  bool in_quarantine(std::uint64_t page) const { return in_quarantine_.find(page) != 0; }
  // Ends the in-flight reservation of `page` (if any); the page stays reserved in pages_,
  // quarantined until `until`.
  void quarantine(std::uint64_t page, std::uint64_t until);
  // first_[i]: the index of the first occurrence of keys[i]; probes_[i] its probe.
  void dedupe(std::span<const std::string_view> keys);

  template <class>
  friend struct verify_access;  // tests: breaks an invariant to see verify() report it
  // What verify() walks (METAD_VERIFY_AFTER's n): every page held, bound (one a key) or
  // reserved (in flight, quarantined or unowned: an image may hold 2^28 unowned pages),
  // and the free stack's runs.
  std::size_t verify_size() const {
    return key_count_ + pages_.reserved_count() + free_.run_count();
  }

  sglang_config config_;
  sparse_pages pages_;  // free / reserved (in flight or unowned) / bound, with counts
  lifo_pages free_;     // the free pages in hand-out order
  // Bound key → node: bucket heads (node indices, 0: empty; a power of two, at most one
  // key per bucket on average), chained through node::chain.
  std::vector<std::uint32_t> buckets_;
  std::size_t key_count_ = 0;
  chunked_vector<node> nodes_;  // nodes_[0]: sentinel; free nodes chained through next
  std::uint32_t free_nodes_ = 0;
  page_owners<owner> owners_;  // in-flight page → its reservation
  std::deque<expiry_entry> expiry_;
  // Quarantined pages, oldest release first (reserved in pages_, in no other structure);
  // allocation's fallback and the end of quarantines both take from the front.
  struct quarantined_page {
    std::uint64_t until;
    std::uint64_t page;
  };
  std::deque<quarantined_page> quarantine_;
  page_owners<std::uint8_t> in_quarantine_;  // quarantined page → 1
  std::uint64_t serial_ = 0;                 // the last reservation's serial
  std::uint32_t epoch_ = 0;
  std::uint32_t stamp_ = 0;
  // Scratch reused across calls.
  std::vector<probe> probes_;
  std::vector<std::uint32_t> first_, seen_, found_;
  std::vector<std::int64_t> sorted_;
};

}  // namespace metad::shard
