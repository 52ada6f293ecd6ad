// key_life: what one directory slice knows of its keys' lives beyond completeness —
// when each was last used (for least-recently-used eviction) and until when a reader
// holds a lease on its pages (get_locations). With LRU tracking on (eviction), every
// complete key sits on one intrusive list, least recently used first, so eviction takes
// from the front in O(1) per key. Each leased key has one entry that comes due no later
// than its lease ends: new leases in a queue in the order they were granted (one lease
// length, so in order of their ends), and leases found extended when their entry came
// due in a min-heap by their new end. Ended leases are thus found without a scan, and
// counted exactly. With LRU tracking off only leased keys are kept. Times are in the
// caller's unit. Only the owning core calls it.
//
// Invariants (verify()):
// - the list is a well-linked cycle through the sentinel (each node's prev names the
//   node before it), of size() nodes, none of them dead;
// - the key map holds exactly the listed keys, each naming its own node;
// - without LRU tracking every listed key has a lease (found ended or not, not yet swept);
// - every node is listed, dead (prev == dead: left while its lease entry was queued), or
//   on the free chain (exactly once), and nothing else;
// - lease entries name nodes with a lease (lease_until != 0), each such node exactly one
//   entry, due no later than its lease ends; leases_ is in order of its entries' ends,
//   extended_ is a min-heap by them;
// - leased_ counts the listed nodes with a lease.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "shard/chunked_vector.hpp"
#include "shard/dual_key_map.hpp"

namespace metad::shard {

class key_life {
 public:
  key_life();
  key_life(key_life&&) noexcept = default;
  key_life& operator=(key_life&&) noexcept = default;

  // On: every complete key is tracked (touch() inserts). Off: only leased keys are.
  void set_lru(bool on) { lru_ = on; }
  bool lru() const { return lru_; }
  std::size_t size() const { return keys_.size(); }

  // The complete key was used at now: it becomes the most recently used (inserted
  // when LRU tracking is on).
  void touch(std::string_view key, const parsed_key& p, std::uint64_t now);
  // A reader got the key's pages at now: leased until `until`, and used.
  void lease(std::string_view key, const parsed_key& p, std::uint64_t now, std::uint64_t until);
  bool leased(std::string_view key, std::uint64_t now) const;
  // Read-only (POST /keys/inspect): whether the key is tracked, and if so its last use
  // and the end of its lease (0: none, or found ended by the sweep).
  bool times(std::string_view key, const parsed_key& p, std::uint64_t& used,
             std::uint64_t& lease_until) const;
  // Starts loading what touch() or lease() of the key will read first.
  void prefetch(const parsed_key& p) const { keys_.prefetch(p); }
  // Keys under a lease at now: O(leases ended since the last sweep).
  std::size_t leased_count(std::uint64_t now) const;
  // The key leaves (deleted, evicted).
  void forget(std::string_view key);
  void forget(std::string_view key, const parsed_key& p);

  // Eviction: the least recently used keys without a lease at now, oldest first: offers
  // each to take(key, used) until n were taken. A leased key moves to the recent end (a
  // lease is a use), so it is passed over at most once per use: O(1) amortised.
  enum class offer : std::uint8_t { take, discard };  // discard: not a key any more
  template <typename Take>
  std::size_t take_oldest(std::uint64_t now, std::size_t n, Take&& take) {
    std::size_t taken = 0;
    for (std::size_t seen = 0, limit = size(); taken < n && seen < limit; ++seen) {
      const std::uint32_t i = nodes_[0].next;
      if (i == 0) break;
      if (nodes_[i].lease_until > now) {
        unlink(i);
        link_last(i);
        continue;
      }
      key_text(i, text_);
      if (take(std::string_view(text_), nodes_[i].used) == offer::take) ++taken;
      drop(i);
    }
    return taken;
  }
  // Calls fn(std::string_view key) for each key, least recently used first, until fn
  // returns false.
  template <typename Fn>
  void for_each_key(Fn&& fn) const {
    std::string text;
    for (std::uint32_t i = nodes_[0].next; i != 0; i = nodes_[i].next) {
      key_text(i, text);
      if (!fn(std::string_view(text))) return;
    }
  }
  // The last use of the least recently used key (leased or not); UINT64_MAX when empty.
  std::uint64_t oldest_time() const {
    const std::uint32_t i = nodes_[0].next;
    return i == 0 ? UINT64_MAX : nodes_[i].used;
  }
  // Appends the last-use times of the first n keys without a lease at now, oldest first
  // (to merge the slices of several cores); moves leased keys behind as take_oldest does.
  void oldest_used(std::uint64_t now, std::size_t n, std::vector<std::uint64_t>& out);
  // Puts a key back: in front with its last use (an eviction called off), or behind (a
  // key passed over: it holds no page on the rank that wanted pages).
  void restore(std::string_view key, const parsed_key& p, std::uint64_t used, bool first);

  // Ends up to `max` of the leases due by now, oldest first (without LRU tracking their
  // keys are dropped). Bounded so that no call stops the core: the periodic tick ends
  // sweep_batch, and every new lease ends two, so the due backlog cannot grow faster
  // than leases are granted.
  static constexpr std::size_t sweep_batch = 4096;
  void sweep(std::uint64_t now, std::size_t max = sweep_batch);
  // Periodic: see packed_map::advance_growth.
  void advance_growth() { keys_.advance_growth(); }
  // Periodic: gives back what a past peak left (nodes and the key map are sized for the
  // most keys ever held). When at most an eighth of the nodes are in use, at least
  // shrink_nodes_min were made, no lease entry is queued and the keys are few enough to
  // move in one call (shrink_keys_max: well under a millisecond), the keys move, in
  // order and with their last use, into storage of their own size. Returns whether it
  // did.
  static constexpr std::size_t shrink_nodes_min = 4096;
  static constexpr std::size_t shrink_keys_max = 16384;
  bool shrink_if_sparse();
  // The nodes held, in use or free (what a peak left; tests and memory accounting).
  std::size_t nodes_held() const { return nodes_.size(); }
  void clear();

  // The invariants above, O(nodes): "" when they hold, else the first broken one.
  std::string verify() const;

 private:
  template <class>
  friend struct verify_access;  // tests: breaks an invariant to see verify() report it

  struct node {
    key_handle key;  // how keys_ names it
    // List links; prev == dead: the key left while its entry was queued (the node is
    // freed when the entry comes due, so no entry ever names a reused node).
    std::uint32_t prev = 0, next = 0;
    std::uint64_t used = 0;
    // The end of its lease; 0 once the sweep found it ended (or never leased). Nonzero:
    // one entry in leases_ or extended_ names this node, due no later than this, and
    // (unless dead) the node is counted in leased_.
    std::uint64_t lease_until = 0;
  };
  static_assert(sizeof(node) == 48, "a node's size is its recency cost per key");
  static constexpr std::uint32_t dead = UINT32_MAX;
  struct lease_entry {
    std::uint64_t until;
    std::uint32_t node;
  };
  struct later {  // orders extended_ as a min-heap
    bool operator()(const lease_entry& a, const lease_entry& b) const { return a.until > b.until; }
  };
  // The node of `key`, or 0.
  std::uint32_t find(std::string_view key, const parsed_key& p) const;
  std::uint32_t insert(std::string_view key, const parsed_key& p);
  void drop(std::uint32_t i);
  void free_node(std::uint32_t i);
  bool due(std::uint64_t now) const {
    return (!leases_.empty() && leases_.front().until <= now) ||
           (!extended_.empty() && extended_.front().until <= now);
  }
  void push_extended(const lease_entry& e);  // into the heap, by its end
  // Takes the earliest due entry of leases_ and extended_, if one is due by now.
  bool pop_due(std::uint64_t now, lease_entry& out);
  // Whether the entry's node is counted in leased_ but its lease has ended by now.
  bool ended_unswept(const lease_entry& e, std::uint64_t now) const;
  void unlink(std::uint32_t i);
  void link_last(std::uint32_t i);
  void link_first(std::uint32_t i);
  void key_text(std::uint32_t i, std::string& out) const;

  bool lru_ = false;
  // nodes_[0] is the list's sentinel: its next is the least recently used key, its prev
  // the most recent. Free nodes are chained through `next` from free_. In blocks that
  // never move: a core that grows this to millions of nodes does not stop for a copy.
  chunked_vector<node> nodes_;
  std::uint32_t free_ = 0;
  dual_key_map<std::uint32_t> keys_;  // key → node index
  // New leases, in order of their ends (a lease granted out of order goes to extended_),
  // each with the end it had then. A deque: entries leave from the front, and growing it
  // never copies the queue.
  std::deque<lease_entry> leases_;
  // Entries that came due on a lease extended since, re-queued by its new end.
  std::deque<lease_entry> extended_;
  std::size_t leased_ = 0;  // nodes whose lease has not been found ended
  std::string text_;        // scratch for take_oldest
};

}  // namespace metad::shard
