// Tenants bound to credentials (--tenants-file; docs/operations.md, "Tenants"): the
// file's parser, the immutable table one load of it makes, and the node's current table.
//
// Who owns what:
// - A tenant_table is immutable once published. The thread that loads the file (the
//   server at start-up, main's signal thread on SIGHUP) builds it and publishes it in
//   node::tenants (tenant_registry::publish): the only writer, one load at a time.
// - Each core keeps its own reference to the table it serves with (core_state::tenants)
//   and takes the published one when the published version changed (take()): one
//   acquire load per request, no lock and no shared reference count touched per request
//   (a core takes the publication's lock once per reload, to copy the new reference). An
//   old table is freed when the last core that held it has taken a newer one (or when
//   the node goes).
// - What a tenant used (tenant_usage: its SGLang ranks, counted against ranks=N) outlives
//   tables: a reload keeps it, and a tenant removed from the file keeps its state and
//   usage (SGLang's clear empties a pool and deletes none, so its rank stays counted).
//   Usage records are never freed while the node lives.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "http/router.hpp"

namespace metad::pipeline {

// SHA-256 of a bearer token, as the file holds it (in hex there).
using token_digest = std::array<unsigned char, 32>;

// SHA-256 of `token`: OpenSSL's libcrypto, its low-level interface, which allocates
// nothing (OpenSSL 3's one-shot SHA256() fetches the algorithm and makes a context per
// call: 3 mallocs a call with Debian's 3.0.19, none this way).
token_digest token_sha256(std::string_view token);

// What a tenant's requests made the server hold, across reloads.
struct tenant_usage {
  // Distinct ranks that hold at least one of the tenant's SGLang pools (all pools of one
  // rank live on the rank's owner core, which counts a rank when its first pool is made).
  std::atomic<std::int64_t> sg_ranks{0};
  // Pages the tenant holds (reserved + bound; quarantined pages are no one's), against
  // pages=N: its SGLang pools' on every core, plus its own vLLM state's ranks' (the
  // unnamed state's while it is the `vllm` tenant). Shared by every core, so one atomic:
  // - an allocation charges it *before* it takes pages, by a compare-and-swap that keeps
  //   it at most N (SGLang's reserve: its keys not bound in the pool, an upper bound of
  //   the pages it takes, cut to what N leaves, and the pool lets no more keys than that
  //   take a free page (sglang_pool::reserve_capped); vLLM's batch_allocate: exactly the
  //   pages its all-or-nothing batch takes, inside rank_table::allocate), and a reserve
  //   gives back what it charged and did not take when it ends (on the same core,
  //   without a suspension);
  // - every other change is measured on the core that makes it and added after it: an
  //   SGLang operation adds its pool's held pages after less before (releases, expiry,
  //   deletes, evictions, clear; sglang_pools::pages_counter), and each core adds its
  //   vLLM ranks' held pages less what it added before (settle_vllm_pages, node.hpp:
  //   after confirm_write, expiry, removal walks, clear, a shrink, and on each tick).
  // So it is never below what the tenant holds, and allocations never take it past N:
  // what a tenant holds stays within pages=N, exactly. It may stand above what is held
  // until the core that freed pages adds them back (at once for SGLang; for vLLM at the
  // end of the freeing step on that core, at the latest on its next tick), so an
  // allocation may be refused while pages are being freed, never admitted too many.
  // Exceptions, all taken up by the next recount or settle: a confirm that binds an
  // unowned page (after an import; not charged before, so up to the unowned pages
  // over), and a reload that moves `vllm` to another tenant (each core moves its vLLM
  // pages over at its next settle: until then the old tenant is charged them).
  // Reset from the state by tenant_registry::recount after recovery and promotion.
  std::atomic<std::int64_t> pages{0};
};

struct tenant {
  std::string name;
  std::vector<token_digest> hashes;  // one, or two while a token is rotated
  std::int64_t ranks = -1;           // ranks=N: at most N ranks (each API's); -1: no quota
  std::int64_t pages = -1;           // pages=N: at most N pages held, both APIs; -1: no quota
  bool vllm = false;                 // it holds the unnamed vLLM state (one tenant at most)
  int line = 0;                      // in the file, for messages
  tenant_usage* usage = nullptr;     // set by tenant_registry::publish
  // Its vLLM state (core_state::spaces): 0, the unnamed one, for the `vllm` tenant, else
  // its own name's; -1 when no space id was left (tenant_registry::kSpacesMax). Set by
  // tenant_registry::publish.
  int space = 0;
};

struct tenant_table {
  std::vector<tenant> tenants;
  // The tenant that holds the unnamed vLLM state (the line with `vllm`): an index into
  // tenants, or -1.
  int vllm = -1;
  std::string path;           // the file it was read from, for messages
  std::uint64_t version = 0;  // set by tenant_registry::publish (1, 2, ...)

  // The tenant whose token hashes to `digest`; nullptr when none.
  //
  // Timing: the presented token is hashed first and the digest looked up in a hash map
  // (no scan of the tenants). The lookup's time depends on the digest only, and what it
  // could reveal (how far SHA-256(guess) matches a stored digest, or which bucket it
  // falls in) gives no way to a token that hashes to a stored digest: that is a preimage
  // of SHA-256. The token's own bytes are compared with nothing.
  const tenant* find(const token_digest& digest) const {
    const auto it = by_digest.find(digest);
    return it == by_digest.end() ? nullptr : &tenants[it->second];
  }
  const tenant* vllm_tenant() const {
    return vllm < 0 ? nullptr : &tenants[static_cast<std::size_t>(vllm)];
  }

  struct digest_hash {
    std::size_t operator()(const token_digest& d) const noexcept {
      std::size_t h;  // a SHA-256 is uniformly distributed: its first bytes are a hash
      std::memcpy(&h, d.data(), sizeof h);
      return h;
    }
  };
  std::unordered_map<token_digest, std::uint32_t, digest_hash> by_digest;
};

// Parses a tenants file's text into `out` (its tenants, hashes and the vLLM tenant).
// Returns "" or the first error, "line N: ...". `routes`: the route table's patterns, whose
// literal first segments no tenant may be named after.
std::string parse_tenants(std::string_view text, std::span<const http::path_pattern> routes,
                          tenant_table& out);
// Reads and parses `path` (at most 1 MiB); "" or the error, naming the file (and the line).
std::string load_tenants_file(const std::string& path, std::span<const http::path_pattern> routes,
                              tenant_table& out);

// The node's current table and every tenant's usage (node::tenants).
class tenant_registry {
 public:
  // Whether a table was ever published (--tenants-file was given).
  bool enabled() const { return version_.load(std::memory_order_acquire) != 0; }
  // The published table's version (0: none); a core compares it with its own.
  std::uint64_t version() const { return version_.load(std::memory_order_acquire); }
  // The published table (null: none). Takes a lock and a reference: once per core and
  // reload, never per request (take()).
  std::shared_ptr<const tenant_table> current() const {
    const std::lock_guard lock(table_mutex_);
    return table_;
  }
  // The usage record of `name`, made on first use; stable for the node's life. Takes a
  // lock: loading threads (start-up, the reload, recovery), and a core once per vLLM space
  // it makes (core_state::space), never per request.
  tenant_usage& usage(std::string_view name);
  // Sets every tenant's SGLang rank count to `sg_ranks`' (tenant name → distinct ranks
  // that hold its pools; a tenant not in it: 0) and its page count to `pages`' (name →
  // pages held; not in it: 0), making the records it lacks. After recovery and after a
  // promotion (count_tenant_usage), while no core serves.
  void recount(const std::unordered_map<std::string, std::int64_t>& sg_ranks,
               const std::unordered_map<std::string, std::int64_t>& pages);
  // A core's side: `held` (the core's own reference) becomes the published table when the
  // published version is not the one it holds; the table to serve this request with.
  // Only the thread that owns `held` calls it. Costs one acquire load when nothing changed.
  const tenant_table& take(std::shared_ptr<const tenant_table>& held) const {
    if (held == nullptr || held->version != version()) held = current();
    return *held;
  }
  // Links each tenant to its usage and vLLM space, numbers the table and makes it the
  // current one. Called by one thread at a time (start-up, then main's signal thread).
  void publish(std::shared_ptr<tenant_table> table);

  // vLLM's state is one space per tenant (core_state::spaces). Space 0 is the unnamed
  // one: the server's without --tenants-file, and the `vllm` tenant's. Any other name
  // gets the next id the first time it is asked for (a tenant's line when a table is
  // published; a record naming it in recovery or replication) and keeps it for the node's
  // life, so ids are dense and never reused. The id is this process's: records name the
  // tenant (store::record_kind::in_tenant), never the id.
  static constexpr int kSpacesMax = 1 << 16;
  // The name's space, made on first use (a lock: not on the request path); -1 when
  // kSpacesMax are taken.
  int space_of(std::string_view name);
  // The name's space, or -1 when none was made.
  int find_space(std::string_view name) const;
  // Space ids made so far (1 + the largest); any thread.
  int spaces() const { return spaces_.load(std::memory_order_acquire); }
  // The tenant of space `id` < spaces() ("" for 0). A lock: a core asks once per space.
  std::string space_name(int id) const;
  // vLLM worker ranks initialised in space `id`, on all cores: a key's tp_world_size when
  // first confirmed, and the tenant's vLLM ranks against ranks=N. Any thread, no lock.
  std::atomic<std::int64_t>& worker_ranks(int id) { return counters(id).worker_ranks; }
  // /clear calls of space `id` begun and finished. A delete or eviction walk of the space,
  // which carries keys from core to core, stops touching state once a clear of it has
  // begun since it started (it would drop what was written after the clear), and does
  // not start while one runs; another tenant's clear leaves it be.
  std::atomic<std::uint64_t>& clears_begun(int id) { return counters(id).clears_begun; }
  std::atomic<std::uint64_t>& clears_done(int id) { return counters(id).clears_done; }
  const std::atomic<std::uint64_t>& clears_begun(int id) const {
    return space_counters_[static_cast<std::size_t>(id)].clears_begun;
  }
  const std::atomic<std::uint64_t>& clears_done(int id) const {
    return space_counters_[static_cast<std::size_t>(id)].clears_done;
  }

 private:
  alignas(64) std::atomic<std::uint64_t> version_{0};  // read by every request: its own line
  // The published table. A mutex, not std::atomic<std::shared_ptr>: libstdc++ 12's makes
  // ThreadSanitizer report its own internal swap, and this lock is taken only by a core
  // whose table is out of date and by the loading thread.
  alignas(64) mutable std::mutex table_mutex_;
  std::shared_ptr<const tenant_table> table_;
  std::mutex usage_mutex_;  // usage_ (loading threads only)
  std::unordered_map<std::string, std::unique_ptr<tenant_usage>> usage_;
  mutable std::mutex space_mutex_;  // space_ids_, space_names_
  std::unordered_map<std::string, int> space_ids_{{"", 0}};
  std::vector<std::string> space_names_{""};
  std::atomic<int> spaces_{1};
  struct space_counters {
    std::atomic<std::int64_t> worker_ranks{0};
    std::atomic<std::uint64_t> clears_begun{0}, clears_done{0};
  };
  space_counters& counters(int id) { return space_counters_[static_cast<std::size_t>(id)]; }
  std::unique_ptr<space_counters[]> space_counters_ =
      std::make_unique<space_counters[]>(kSpacesMax);
};

}  // namespace metad::pipeline
