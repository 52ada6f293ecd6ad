#include "pipeline/endpoints.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "metad/log.hpp"
#include "pipeline/removal.hpp"
#include "pipeline/sglang_journal.hpp"
#include "pipeline/walk.hpp"
#include "store/record.hpp"

namespace metad::pipeline {
namespace {

bool same_stats(const std::optional<shard::rank_stats>& a,
                const std::optional<shard::rank_stats>& b) {
  return a && b && a->free == b->free && a->reserved == b->reserved && a->bound == b->bound &&
         a->num_pages == b->num_pages;
}

// Why an initialization that would create or grow a rank was not carried out.
enum class init_refusal : std::uint8_t { none, too_many_ranks, over_quota, over_budget };

// On the rank's owner core: a new rank needs a place under --ranks-max (and under the
// ranks=N quota of the space's tenant, `quota`; -1: none) and what an empty
// rank holds under --memory-max. Growing one costs nothing (a pool holds only the pages
// it hands out: those are charged as it does).
init_refusal admit_initialize(node& nd, const vllm_space& sp, const api::initialize_cmd& cmd,
                              std::int64_t quota, std::uint64_t& needed) {
  const auto before = sp.ranks.stats(cmd.rank);
  const std::int64_t old_pages = before ? before->num_pages : 0;
  if (cmd.num_pages <= old_pages) return init_refusal::none;  // unchanged or shrunk
  std::atomic<std::int64_t>& space_ranks = nd.tenants.worker_ranks(sp.id);
  if (!before) {
    std::int64_t ranks = nd.worker_ranks.load(std::memory_order_relaxed);
    do {
      if (ranks >= nd.cfg.ranks_max) return init_refusal::too_many_ranks;
    } while (!nd.worker_ranks.compare_exchange_weak(ranks, ranks + 1, std::memory_order_relaxed));
    std::int64_t mine = space_ranks.load(std::memory_order_relaxed);
    do {
      if (quota >= 0 && mine >= quota) {
        nd.worker_ranks.fetch_sub(1, std::memory_order_relaxed);
        return init_refusal::over_quota;
      }
    } while (!space_ranks.compare_exchange_weak(mine, mine + 1, std::memory_order_relaxed));
  }
  needed = shard::rank_table::pool_bytes(cmd.num_pages) - shard::rank_table::pool_bytes(old_pages);
  if (needed == 0 || nd.memory.charge_kept(needed)) return init_refusal::none;
  if (!before) {
    nd.worker_ranks.fetch_sub(1, std::memory_order_relaxed);
    space_ranks.fetch_sub(1, std::memory_order_relaxed);
  }
  nd.memory.refused_ranks.fetch_add(1, std::memory_order_relaxed);
  return init_refusal::over_budget;
}

// On the rank's owner core. vLLM's keys name neither model nor layout, so engines of two
// models on one server share ranks and keys; a rank asked for another page count is
// usually the first visible sign (another engine's file size), hence a warning.
void note_reinitialize(core_state& core, const api::initialize_cmd& cmd,
                       const shard::init_result& r, std::size_t unbound) {
  if (r.outcome == shard::init_outcome::grown) {
    ++core.ranks_grown;
    metad::log::warn(
        "rank {} initialized again with {} pages: grown from {}. Do engines with different "
        "KV layouts share this server?",
        cmd.rank, cmd.num_pages, r.old_pages);
  } else if (r.outcome == shard::init_outcome::shrunk) {
    ++core.ranks_shrunk;
    metad::log::warn(
        "rank {} initialized again with {} pages: shrunk from {}, {} key(s) bound past the "
        "new end lost their page here. Was hf3fs_file_size lowered, or do engines with "
        "different KV layouts share this server?",
        cmd.rank, cmd.num_pages, r.old_pages, unbound);
  }
}

// After a rank shrank (on its owner core): the keys it unbound have one confirmation
// less in the directory; a key left with none leaves it. Ends on the owner core.
smp::subtask<bool> count_lost_bindings(node& nd, const std::vector<std::string>& unbound,
                                       scratch& s) {
  const int space = s.space;
  std::vector<std::string_view> keys(unbound.begin(), unbound.end());
  plan_directory_walk(nd, keys, nullptr, 0, s);
  bool stored = true;
  co_await smp::for_each_core(nd.mailbox, smp::this_core(), needed_by(s),
                              [&](int c) -> smp::subtask<bool> {
                                core_state& core = *nd.core[c];
                                // The rank's change is queued in its log already: these records go
                                // with it even without room (they are written once the disk
                                // recovers).
                                if (!core.journal.reserve(record_bytes(keys, kKeyRecordBytes)))
                                  stored = false;
                                vllm_space& sp = core.space(space);
                                for (const std::uint32_t i : walk_of(s, c)) {
                                  if (sp.directory.lose_binding(keys[i], nd.clock()))
                                    core.journal.directory_remove(sp.tenant, keys[i]);
                                }
                                core.publish_incomplete();
                                if (stored) stored = co_await core.journal.durable();
                                co_return true;
                              });
  co_return stored;
}

}  // namespace

endpoint_task run_initialize(connection& x) {
  node& nd = x.shared();
  const int home = x.home().index;
  const api::initialize_cmd& cmd = x.work().init;
  const int owner = shard::owner_of_rank(cmd.rank, nd.cores);
  co_await nd.mailbox.hop_to(owner);
  core_state& core = *nd.core[owner];
  vllm_space& sp = core.space(x.work().space);
  shard::init_result r{shard::init_outcome::unchanged, 0};
  init_refusal refusal = init_refusal::none;
  std::uint64_t needed = 0;
  bool stored = core.journal.reserve(64 + kScopeBytes);
  std::vector<std::string> unbound;  // keys a shrink unbound (rare: allocated only then)
  if (stored) refusal = admit_initialize(nd, sp, cmd, x.work().rank_quota, needed);
  if (stored && refusal == init_refusal::none) {
    // Counted in worker_ranks if created.
    r = sp.ranks.initialize(cmd.rank, cmd.num_pages, &unbound);
    if (r.outcome == shard::init_outcome::shrunk) settle_vllm_pages(nd, core, sp);
    note_reinitialize(core, cmd, r, unbound.size());
    if (r.outcome != shard::init_outcome::unchanged)
      core.journal.initialize(sp.tenant, cmd.rank, cmd.num_pages);  // replay shrinks too
    stored = co_await core.journal.durable();
    if (!unbound.empty()) {
      const bool counted = co_await count_lost_bindings(nd, unbound, x.work());
      stored = stored && counted;
    }
  }
  co_await nd.mailbox.hop_to(home);
  scratch& s = x.work();
  if (!stored) {
    co_return answer::error(503, kStorageFailed);
  }
  if (refusal == init_refusal::too_many_ranks) {
    s.detail =
        fmt::format("Rank {} not initialized: {} ranks exist already, the limit set by --ranks-max",
                    cmd.rank, nd.cfg.ranks_max);
    co_return answer::error(400, s.detail);
  }
  if (refusal == init_refusal::over_quota) {
    s.detail = fmt::format(
        "Rank {} not initialized: tenant {} has as many vLLM ranks as its quota allows "
        "(ranks={} in --tenants-file)",
        cmd.rank, s.quota_tenant, s.rank_quota);
    co_return answer::error(403, s.detail);
  }
  if (refusal == init_refusal::over_budget) {
    s.detail = fmt::format(
        "Rank {} not initialized: its {} pages need {} bytes more, over the memory budget "
        "(--memory-max {} bytes, {} in use)",
        cmd.rank, cmd.num_pages, needed, nd.memory.max(), nd.memory.used());
    co_return answer::error(507, s.detail);
  }
  s.body.clear();
  api::encode_initialized(s.body, cmd.rank, cmd.num_pages);
  co_return answer::json(200, s.body);
}

namespace {

// What one key given a new page on a rank may add to the server, for the memory budget:
// its bytes twice (the rank's key table and, once confirmed, the directory) and its
// entries in both, its reservation, its page's bits, allocator slack. An estimate made
// before the fact; the resident size measured at the next sample replaces it.
std::uint64_t allocation_bytes(std::span<const std::string_view> keys) {
  constexpr std::uint64_t kBindingBytes = 128;
  std::uint64_t bytes = keys.size() * kBindingBytes;
  for (const std::string_view key : keys) bytes += 2 * key.size();
  return bytes;
}

// One attempt at a batch_allocate on the rank's owner core, logged if it changed the
// rank. Allocation is deterministic: replaying the same request on the same state takes
// the same pages, so the request itself is the record (the memory budget only ever
// refuses a batch whole, which changes nothing and logs nothing). Past the budget the
// batch is answered as by a full pool, except for up to `evicted` keys: the pages and
// memory that evictions for this request freed.
// `fresh`: the pages it reserved for keys that held none (all-or-nothing: 0 unless the
// whole batch was served).
shard::allocate_result try_allocate(node& nd, core_state& core, scratch& s, bool& stored,
                                    std::uint64_t evicted, std::uint64_t& fresh) {
  const api::allocate_cmd& cmd = s.allocate;
  s.indices.clear();
  s.pages.clear();
  fresh = 0;
  if (!core.journal.reserve(record_bytes(cmd.keys.views(), 0))) {
    stored = false;
    return {};
  }
  vllm_space& sp = core.space(s.space);
  const auto before = sp.ranks.stats(cmd.rank);
  const std::uint64_t bytes = allocation_bytes(cmd.keys.views());
  const bool fits = core.credit.take(nd.memory, bytes);
  // --tenants-file's pages=N of the space's tenant: what this core's ranks of the space
  // freed is added back first, then the batch's new pages are charged before they are
  // taken (rank_table::allocate); past the quota the batch is answered as by a full rank.
  shard::page_quota quota;
  settle_vllm_pages(nd, core, sp);
  if (sp.pages_usage != nullptr) quota = {&sp.pages_usage->pages, s.page_quota};
  const shard::allocate_result r =
      sp.ranks.allocate(cmd.rank, cmd.keys.views(), nd.clock(), s.indices, s.pages,
                        fits ? UINT64_MAX : evicted, quota);
  if (quota.held != nullptr) sp.pages_added += r.taken;  // charged by allocate
  if (fits && r.taken < cmd.keys.size())                 // the hits and repeats hold nothing new
    core.credit.give_back(bytes - bytes / cmd.keys.size() * r.taken);
  if (!r.found) return r;
  const auto after = sp.ranks.stats(cmd.rank);
  // A quarantined page taken counts as reserved now (stats count it as free before).
  if (before && after && after->reserved > before->reserved)
    fresh = static_cast<std::uint64_t>(after->reserved - before->reserved);
  if (core.journal.enabled() && !same_stats(before, after))
    core.journal.allocate(sp.tenant, cmd.rank, cmd.keys.views());
  return r;
}

// Evictions one allocation may start before it answers -1: each frees as many pages as
// were missing, so another is needed only when concurrent allocations took them first.
constexpr int kEvictionRounds = 8;
// Stale keys hold pages on ranks other than the short one too: a reclamation for an
// allocation takes this many beyond the pages it misses (all of them are dead).
constexpr std::size_t kStaleExtra = 256;
// Under eviction, incomplete keys nobody reserves that were last confirmed this long ago
// (or --incomplete-grace-ms, if shorter) go before complete keys: the ranks of one save
// confirm within moments of each other.
constexpr std::uint64_t kSettleNs = 1'000 * smp::kNsPerMs;

}  // namespace

endpoint_task run_allocate(connection& x) {
  node& nd = x.shared();
  const int home = x.home().index;
  scratch& s = x.work();
  const api::allocate_cmd& cmd = s.allocate;
  const int owner = shard::owner_of_rank(cmd.rank, nd.cores);
  // Sized here so the owner core never grows (allocates) memory this core frees.
  s.indices.reserve(cmd.keys.size());
  s.pages.reserve(cmd.keys.size());
  if (nd.cfg.evict == metad::eviction::lru && nd.cfg.read_lease_ms > 0) {
    // A writer may rewrite the pages of keys this rank holds already (hits): lease the
    // complete keys first, so that no eviction frees such a page while it is written.
    plan_directory_walk(nd, cmd.keys.views(), nullptr, 0, s);
    s.flags.assign(cmd.keys.size(), 0);  // not read: only the leases matter
    const std::uint64_t now = nd.clock();
    const std::uint64_t lease_until = now + nd.cfg.read_lease_ms * smp::kNsPerMs;
    co_await smp::for_each_core(nd.mailbox, home, needed_by(s), [&](int c) {
      nd.core[c]->space(s.space).directory.use_each(cmd.keys.views(), walk_of(s, c), now,
                                                    lease_until, s.flags);
    });
  }
  co_await nd.mailbox.hop_to(owner);
  core_state& core = *nd.core[owner];
  bool stored = true;
  std::uint64_t fresh = 0;
  std::uint64_t evicted_total = 0;  // keys expired, reclaimed or evicted for this request
  shard::allocate_result r = try_allocate(nd, core, s, stored, evicted_total, fresh);
  // Short of pages: first reservations past their deadline, then stale incomplete keys
  // (in every eviction mode: they are dead), then the least recently used complete keys.
  if (stored && r.short_by > 0) {
    if (const std::size_t expired = expire_due(nd, core); expired > 0) {
      evicted_total += expired;
      r = try_allocate(nd, core, s, stored, evicted_total, fresh);
    }
  }
  const bool lru = nd.cfg.evict == metad::eviction::lru;
  const std::uint64_t grace = stale_grace_ns(nd);
  for (int round = 0; stored && r.short_by > 0 && r.evictable && round < kEvictionRounds &&
                      grace != 0 && incomplete_keys_older_than(nd, grace);
       ++round) {
    const std::size_t reclaimed =
        co_await reclaim_incomplete(nd, s.space, -1, std::size_t{r.short_by} + kStaleExtra, grace,
                                    removal_kind::stale, s.removal, stored);
    if (reclaimed == 0 || !stored) break;
    evicted_total += reclaimed;
    r = try_allocate(nd, core, s, stored, evicted_total, fresh);
  }
  // Eviction takes the dead before the living. Incomplete keys within their grace that
  // no rank reserves and that hold a page here are unreadable, and once kSettleNs old
  // almost surely dead (the ranks of one save write together): they go first. Then the
  // least recently used complete keys. Then, rather than answer -1, younger incomplete
  // keys nobody reserves: a -1 loses this save for sure, such an eviction only the save
  // of a rank so far behind that it has not even allocated. Each core's least recently
  // confirmed first. When saves fail often, the incomplete keys of the last moments
  // would otherwise fill the pool (measured: bench.sh --stale).
  const std::uint64_t settle = grace == 0 ? kSettleNs : std::min(grace, kSettleNs);
  // Pages the batch lacked when eviction began: those of `fresh` that eviction freed.
  std::uint64_t evicted_for = 0;
  for (int round = 0; stored && r.short_by > 0 && r.evictable && lru && round < kEvictionRounds;
       ++round) {
    if (round == 0) evicted_for = r.short_by;
    std::size_t evicted = 0;
    for (const std::uint64_t age : {settle, std::uint64_t{0}}) {
      if (evicted == 0 && stored && incomplete_keys_older_than(nd, age))
        evicted = co_await reclaim_incomplete(nd, s.space, -1, r.short_by, age,
                                              removal_kind::evicted, s.removal, stored, &cmd.rank);
      if (evicted == 0 && stored && age != 0)
        evicted = co_await evict(nd, s.space, cmd.rank, r.short_by, s.removal, stored);
    }
    if (evicted == 0 || !stored) break;
    evicted_total += evicted;
    r = try_allocate(nd, core, s, stored, evicted_total, fresh);
  }
  // Counted on the owner core, which alone writes its counters.
  const std::uint64_t from_eviction = std::min(fresh, evicted_for);
  core.allocations.vllm_eviction += from_eviction;
  core.allocations.vllm_free += fresh - from_eviction;
  if (stored) stored = co_await core.journal.durable();
  co_await nd.mailbox.hop_to(home);
  if (!stored) {
    co_return answer::error(503, kStorageFailed);
  }
  if (!r.found) {
    s.detail = fmt::format("Allocation failed: Rank {} not initialized", cmd.rank);
    co_return answer::error(404, s.detail);
  }
  s.selected.clear();
  for (std::uint32_t i : s.indices) s.selected.push_back(cmd.keys[i]);
  s.body.clear();
  api::encode_allocation(s.body, cmd.rank, s.selected, s.pages);
  co_return answer::json(200, s.body);
}

endpoint_task run_confirm(connection& x) {
  node& nd = x.shared();
  const int home = x.home().index;
  scratch& s = x.work();
  const api::confirm_cmd& cmd = s.confirm;
  const int owner = shard::owner_of_rank(cmd.rank, nd.cores);
  s.indices.clear();
  s.indices.reserve(cmd.keys.size());
  s.flags.reserve(cmd.keys.size());
  reserve_walk(nd, cmd.keys.size(), s);
  s.detail.reserve(256);
  co_await nd.mailbox.hop_to(owner);
  shard::confirm_outcome outcome = shard::confirm_outcome::ok;
  bool stored =
      nd.core[owner]->journal.reserve(record_bytes(cmd.keys.views(), 8, 8 * cmd.releases.size()));
  const int space = s.space;
  const auto tp_world_size =
      static_cast<std::int32_t>(nd.tenants.worker_ranks(space).load(std::memory_order_relaxed));
  if (stored) {
    core_state& core = *nd.core[owner];
    vllm_space& sp = core.space(space);
    const auto before = core.journal.enabled() ? sp.ranks.stats(cmd.rank) : std::nullopt;
    const std::uint64_t quarantine_until =
        nd.cfg.release_quarantine_ms == 0
            ? 0
            : nd.clock() + nd.cfg.release_quarantine_ms * smp::kNsPerMs;
    outcome = sp.ranks.confirm(cmd.rank, cmd.keys.views(), cmd.pages, cmd.releases,
                               quarantine_until, s.detail, s.indices);
    settle_vllm_pages(nd, core, sp);  // releases (and re-bindings) free pages
    if (outcome == shard::confirm_outcome::ok && core.journal.enabled() &&
        !same_stats(before, sp.ranks.stats(cmd.rank)))
      core.journal.confirm(sp.tenant, cmd.rank, tp_world_size, cmd.keys.views(), cmd.pages,
                           cmd.releases, quarantine_until != 0);
    stored = co_await core.journal.durable();
  }
  if (outcome == shard::confirm_outcome::ok && !s.indices.empty()) {
    // The rank's pages are bound; now count the confirmations in the directory, before
    // the 204 goes out (read-your-writes for batch_exists/get_locations). A key new to
    // the directory logs its tp_world_size there; its count is derived on recovery.
    // Once the binding is in the owner's log queue it stays there (a failed write is
    // retried), so the directory counts it even when that write failed or a directory
    // core's disk refuses: the answer is then a 503, but live state is what the logs
    // describe, and a retry of the confirm (a no-op on the rank) answers 204.
    plan_directory_walk(nd, cmd.keys.views(), s.indices.data(), s.indices.size(), s);
    s.flags.assign(cmd.keys.size(), 0);  // which keys entered the directory
    // Not for_each_core: the walk goes home from its last core, not back to the owner.
    for (const int c : smp::walk_from(owner, nd.cores)) {
      if (walk_of(s, c).empty()) continue;
      co_await nd.mailbox.hop_to(c);
      core_state& dir_core = *nd.core[c];
      // Without room the records are still queued: they go out once the disk recovers.
      if (!dir_core.journal.reserve(record_bytes(cmd.keys.views(), kKeyRecordBytes)))
        stored = false;
      vllm_space& dir = dir_core.space(space);
      dir.directory.add_confirmations(cmd.keys.views(), walk_of(s, c), tp_world_size, nd.clock(),
                                      s.flags);
      dir_core.publish_incomplete();
      for (const std::uint32_t i : walk_of(s, c))
        if (s.flags[i]) dir_core.journal.directory_key(dir.tenant, tp_world_size, cmd.keys[i]);
      if (stored) stored = co_await dir_core.journal.durable();
    }
  }
  co_await nd.mailbox.hop_to(home);
  if (!stored) co_return answer::error(503, kStorageFailed);
  switch (outcome) {
    case shard::confirm_outcome::ok:
      co_return answer::canned(http::canned::no_content);
    case shard::confirm_outcome::not_initialized:
      s.detail = fmt::format("Confirm failed: Rank {} not initialized", cmd.rank);
      co_return answer::error(404, s.detail);
    case shard::confirm_outcome::bad_request:
      break;
  }
  co_return answer::error(400, s.detail);
}

endpoint_task run_lookup(connection& x, bool with_rank) {
  node& nd = x.shared();
  const int home = x.home().index;
  scratch& s = x.work();
  const api::key_list& keys = with_rank ? s.locations.keys : s.exists.keys;
  const std::int64_t rank = s.locations.rank;
  s.flags.assign(keys.size(), 0);
  s.pages.assign(keys.size(), -1);
  // Sized here: the directory walk is planned on the rank's core.
  s.indices.clear();
  s.indices.reserve(keys.size());
  reserve_walk(nd, keys.size(), s);
  const std::uint64_t now = nd.clock();
  bool found = true;
  std::uint64_t lease_until = 0;
  if (with_rank) {
    // The rank's pages first: only the keys it has a page for are asked of the
    // directory, and they take a lease — a reader that gets pages holds them against
    // eviction and delete while it may still be reading the file. A page is answered
    // only if its key is still complete after that (a removal hides a key from the
    // directory before any rank frees its page).
    const int owner = shard::owner_of_rank(rank, nd.cores);
    co_await nd.mailbox.hop_to(owner);
    const vllm_space* sp = nd.core[owner]->find_space(s.space);
    found = sp != nullptr && sp->ranks.confirmed_pages(rank, keys.views(), s.pages);
    for (std::uint32_t i = 0; found && i < keys.size(); ++i)
      if (s.pages[i] >= 0) s.indices.push_back(i);
    if (nd.cfg.read_lease_ms > 0) lease_until = now + nd.cfg.read_lease_ms * smp::kNsPerMs;
  }
  if (!with_rank || !s.indices.empty()) {
    plan_directory_walk(nd, keys.views(), with_rank ? s.indices.data() : nullptr, s.indices.size(),
                        s);
    // Not for_each_core: from the rank's owner, the walk goes on to the directory's
    // cores and home from the last of them.
    for (const int c : smp::walk_from(home, nd.cores)) {
      if (walk_of(s, c).empty()) continue;
      co_await nd.mailbox.hop_to(c);
      if (vllm_space* sp = nd.core[c]->find_space(s.space); sp != nullptr)
        sp->directory.use_each(keys.views(), walk_of(s, c), now, lease_until, s.flags);
    }
  }
  co_await nd.mailbox.hop_to(home);
  s.body.clear();
  if (!with_rank) {
    std::uint64_t hits = 0;
    for (const std::uint8_t f : s.flags) hits += f;
    x.home().lookups.count(lookup_endpoint::batch_exists, hits, keys.size() - hits);
    if (s.tenant_row != nullptr) {
      s.tenant_row->hit += hits;
      s.tenant_row->miss += keys.size() - hits;
    }
    api::encode_exists(s.body, s.flags);
    co_return answer::json(200, s.body);
  }
  if (!found) {
    s.detail = fmt::format("Failed to get key locations: Rank {} not initialized", rank);
    co_return answer::error(404, s.detail);
  }
  std::uint64_t hits = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!s.flags[i]) s.pages[i] = -1;
    hits += s.pages[i] >= 0 ? 1 : 0;
  }
  x.home().lookups.count(lookup_endpoint::get_locations, hits, keys.size() - hits);
  api::encode_locations(s.body, s.pages);
  co_return answer::json(200, s.body);
}

}  // namespace metad::pipeline
