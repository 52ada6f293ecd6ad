// The endpoints that read or change every core at once: /clear, GET /rank/{rank},
// /metrics, /keys/delete and /stats. Each starts home, walks the cores with
// for_each_core (or the removal walk), and answers from home.
#include "pipeline/endpoints.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "pipeline/ha_gate.hpp"
#include "pipeline/removal.hpp"
#include "pipeline/sglang_journal.hpp"
#include "pipeline/walk.hpp"

namespace metad::pipeline {
namespace {

// Drops core c's ranks and directory slice of vLLM space `space` (on core c).
void clear_core(node& nd, int c, int space) {
  core_state& core = *nd.core[c];
  vllm_space* sp = core.find_space(space);
  if (sp == nullptr) return;
  const auto ranks = static_cast<std::int64_t>(sp->ranks.rank_count());
  nd.worker_ranks.fetch_sub(ranks, std::memory_order_relaxed);
  nd.tenants.worker_ranks(space).fetch_sub(ranks, std::memory_order_relaxed);
  sp->ranks.clear();
  sp->directory.clear();
  settle_vllm_pages(nd, core, *sp);
}

// Core c's record of a clear of vLLM space `space` (on core c).
void log_clear(core_state& core, int space) {
  if (space == 0 && core.space_count() == 1) {
    // The unnamed state, alone on this core: the bare clear of a server without tenants
    // (it voids all before it; SGLang's pools outlive it, their images after it), which
    // older builds and standbys read too.
    core.journal.clear();
    log_sg_pools(core);
  } else if (const vllm_space* sp = core.find_space(space); sp != nullptr) {
    // Scoped to the tenant (record.hpp, in_tenant): SGLang's pools and the other tenants'
    // states before it stay in the log. A core with no space of the tenant holds none of
    // its records either: nothing to void.
    core.journal.clear(sp->tenant);
  }
}

constexpr std::string_view kDeleteStorageFailed =
    "Storage unavailable: the data directory cannot be written (disk full or I/O error); "
    "the delete may be partly applied: retry it";
constexpr std::string_view kRestarting =
    "Deletes are refused for --read-lease-ms after a restart: readers' leases were not kept";

}  // namespace

endpoint_task run_clear(connection& x) {
  node& nd = x.shared();
  bool stored = true;  // a clear is not refused for a failing disk: it frees, it never binds
  const int space = x.work().space;  // the tenant's own vLLM state, no other
  nd.tenants.clears_begun(space).fetch_add(1);
  co_await smp::for_each_core(nd.mailbox, x.home().index, smp::every_core,
                              [&](int c) -> smp::subtask<bool> {
                                clear_core(nd, c, space);
                                core_state& core = *nd.core[c];
                                log_clear(core, space);
                                if (!co_await core.journal.durable()) stored = false;
                                co_return true;
                              });
  nd.tenants.clears_done(space).fetch_add(1);
  if (stored) {
    co_return answer::canned(http::canned::no_content);
  }
  co_return answer::error(503, kStorageFailed);
}

endpoint_task run_rank_info(connection& x) {
  node& nd = x.shared();
  const int home = x.home().index;
  scratch& s = x.work();
  const std::int64_t rank = s.init.rank;
  const int owner = shard::owner_of_rank(rank, nd.cores);
  // How many of the rank's bound pages hold incomplete keys: the incomplete keys of
  // every directory slice (few in a healthy cluster: a key is incomplete between its
  // first and its last rank's confirmation, or until it is reclaimed as stale), then
  // those bound on the rank. The copy is sized on this core first, so the walk allocates
  // nowhere else: their count and bytes, then the copy into twice that room. If other
  // requests made more keys incomplete meanwhile than the room holds, again, larger.
  removal_job& job = s.removal;
  std::size_t count = 0, bytes = 0;
  const int space = s.space;
  co_await smp::for_each_core(nd.mailbox, home, smp::every_core, [&](int c) {
    const vllm_space* sp = nd.core[c]->find_space(space);
    if (sp == nullptr) return;
    sp->directory.for_each_incomplete([&](std::string_view key) {
      ++count;
      bytes += key.size();
      return true;
    });
  });
  for (bool complete = false; !complete;) {
    job.begin(nd, space);
    job.bytes.reserve(2 * bytes + 4096);
    job.ends.reserve(2 * count + 64);
    job.used.reserve(2 * count + 64);
    job.member.reserve(2 * count + 64);
    complete = true;
    co_await smp::for_each_core(nd.mailbox, home, smp::every_core, [&](int c) {
      const vllm_space* sp = nd.core[c]->find_space(space);
      if (sp == nullptr) return true;
      sp->directory.for_each_incomplete([&](std::string_view key) {
        complete = job.ends.size() < job.ends.capacity() &&
                   job.bytes.size() + key.size() <= job.bytes.capacity();
        if (complete) job.add(key);
        return complete;
      });
      return complete;  // out of room: again, larger
    });
    count = 2 * count + 64;
    bytes = 2 * bytes + 4096;
  }
  job.seal(nd);
  s.pages.assign(job.keys.size(), -1);
  co_await nd.mailbox.hop_to(owner);
  const vllm_space* sp = nd.core[owner]->find_space(space);
  const std::optional<shard::rank_stats> stats =
      sp != nullptr ? sp->ranks.stats(rank) : std::nullopt;
  if (stats) sp->ranks.confirmed_pages(rank, job.keys, s.pages);
  co_await nd.mailbox.hop_to(home);
  s.body.clear();
  if (!stats) {
    s.detail = fmt::format("Rank {} not initialized", rank);
    co_return answer::error(404, s.detail);
  }
  const auto held = static_cast<std::uint64_t>(
      std::count_if(s.pages.begin(), s.pages.end(), [](std::int64_t p) { return p >= 0; }));
  api::encode_rank_info(s.body, stats->num_pages, stats->free, stats->reserved, stats->bound, held);
  co_return answer::json(200, s.body);
}

namespace {

// A core's per-tenant counters and what its SGLang pools hold, by tenant (on that core).
void collect_tenants(const core_state& core, metrics_snapshot& snap) {
  for (const auto& [tenant, counts] : core.tenant_rows.named) {
    auto it = snap.tenants.find(tenant);
    if (it == snap.tenants.end()) it = snap.tenants.try_emplace(tenant).first;
    it->second.counts.add(counts);
  }
  const tenant_counts& other = core.tenant_rows.other;  // tenants refused a row there
  if (other.requests[0] + other.requests[1] + other.hit + other.miss > 0) {
    snap.tenants_other.counts.add(other);
    snap.tenants_folded = true;
  }
  for (const auto& entry : core.sg_tenants) {
    tenant_figures* f = nullptr;
    entry.second.for_each([&](std::int64_t, std::string_view, const shard::sglang_pool& pool) {
      if (f == nullptr) {
        auto it = snap.tenants.find(entry.first);
        if (it == snap.tenants.end()) it = snap.tenants.try_emplace(entry.first).first;
        f = &it->second;
      }
      const shard::sglang_pool_stats st = pool.stats();
      f->keys += st.keys;
      f->pages_reserved += st.in_flight;
      f->pages_bound += st.bound;
    });
  }
}

}  // namespace

void begin_metrics(node& nd, scratch& s) {
  if (!s.snapshot) s.snapshot = std::make_unique<metrics_snapshot>();
  metrics_snapshot& snap = *s.snapshot;
  snap = metrics_snapshot{};
  snap.connections.assign(static_cast<std::size_t>(nd.cores), connection_counts{});
  s.rank_rows.clear();
  s.sg_rows.clear();
  s.sg_sum = {};
}

void collect_metrics(node& nd, const core_state& core, scratch& s) {
  metrics_snapshot& snap = *s.snapshot;
  collect_sg_pools(core, s);
  snap.requests.add(core.metrics);
  snap.flushes.add(core.flushes);
  snap.lookups.add(core.lookups);
  for (const auto& [tenant, counts] : core.sg_tenant_lookups)
    snap.tenant_lookups[tenant].add(counts);
  snap.allocations.add(core.allocations);
  collect_tenants(core, snap);
  core.for_each_space([&](const vllm_space& sp) {
    snap.keys += sp.directory.size();
    snap.refused_releases += sp.ranks.refused_releases();
    snap.expired_reservations += sp.ranks.expired_reservations();
    snap.incomplete_keys += sp.directory.incomplete_count();
    snap.incomplete_pages += sp.directory.incomplete_bindings();
    snap.ranks += sp.ranks.rank_count();
    if (sp.id == 0) {  // the unnamed state: one series per rank (a rank label alone)
      snap.unnamed_keys += sp.directory.size();
      sp.ranks.for_each_rank([&s](std::int64_t rank, const shard::rank_stats& st) {
        s.rank_rows.add({rank, st.num_pages, st.free, st.reserved, st.bound});
      });
      return;
    }
    // A tenant's own state: its keys and pages in the tenant series, in the totals too.
    tenant_figures& f = snap.tenants.try_emplace(sp.tenant).first->second;
    f.keys += sp.directory.size();
    sp.ranks.for_each_rank([&](std::int64_t, const shard::rank_stats& st) {
      snap.named_pages.total += static_cast<std::uint64_t>(st.num_pages);
      snap.named_pages.free += static_cast<std::uint64_t>(st.free);
      snap.named_pages.reserved += static_cast<std::uint64_t>(st.reserved);
      snap.named_pages.bound += static_cast<std::uint64_t>(st.bound);
      f.pages_reserved += static_cast<std::uint64_t>(st.reserved);
      f.pages_bound += static_cast<std::uint64_t>(st.bound);
    });
  });
  snap.evicted_keys += core.evicted_keys;
  snap.deleted_keys += core.deleted_keys;
  snap.stale_keys += core.stale_keys;
  snap.ranks_grown += core.ranks_grown;
  snap.ranks_shrunk += core.ranks_shrunk;
  snap.hops += nd.mailbox.posted(core.index);
  const net::loop_stats& conn = core.connections;
  snap.connections[static_cast<std::size_t>(core.index)] = {
      conn.accepted - conn.closed, conn.accepted, conn.rejected, conn.timed_out};
}

void end_metrics(node& nd, scratch& s) {
  metrics_snapshot& snap = *s.snapshot;
  snap.memory_max = nd.memory.max();
  snap.memory_used = nd.memory.used();
  snap.refused_ranks = nd.memory.refused_ranks.load(std::memory_order_relaxed);
  snap.refused_bodies = nd.memory.refused_bodies.load(std::memory_order_relaxed);
  snap.refused_allocations = nd.memory.refused_allocations.load(std::memory_order_relaxed);
  snap.refused_cuts = nd.memory.refused_cuts.load(std::memory_order_relaxed);
  snap.cut_charge = nd.memory.cut_charge();
  const api::rank_pool& pool = s.rank_rows.pool();
  const pool_pages& named = snap.named_pages;
  snap.pages = {pool.pages + named.total, pool.free + named.free, pool.reserved + named.reserved,
                pool.bound + named.bound};
  snap.rank_series_omitted = s.rank_rows.omitted();
  // The unnamed vLLM state belongs to the `vllm` tenant, else to the default tenant. With
  // vLLM in use, that tenant has series even before its first request here.
  const std::shared_ptr<const tenant_table> table = nd.tenants.current();
  const tenant* owner = table != nullptr ? table->vllm_tenant() : nullptr;
  const std::string_view vllm = owner != nullptr ? std::string_view(owner->name) : "";
  const std::uint64_t unnamed_keys = snap.unnamed_keys;
  auto it = snap.tenants.find(vllm);
  if (it == snap.tenants.end() && (unnamed_keys > 0 || pool.ranks > 0))
    it = snap.tenants.try_emplace(std::string(vllm)).first;
  if (it != snap.tenants.end()) {
    it->second.keys += unnamed_keys;
    it->second.pages_reserved += pool.reserved;
    it->second.pages_bound += pool.bound;
  }
}

endpoint_task run_metrics(connection& x) {
  node& nd = x.shared();
  scratch& s = x.work();
  begin_metrics(nd, s);
  co_await smp::for_each_core(nd.mailbox, x.home().index, smp::every_core,
                              [&](int c) { collect_metrics(nd, *nd.core[c], s); });
  end_metrics(nd, s);
  s.body.clear();
  render_metrics(s.body, *s.snapshot);
  render_rank_headers(s.body);
  for (const api::rank_info_row& r : s.rank_rows.sorted())
    render_rank(s.body, r.rank, r.num_pages, r.free, r.reserved, r.bound);
  render_sg_metrics(s.body, s);
  render_tenant_metrics(s.body, *s.snapshot);
  render_ha_metrics(s.body, nd);
  co_return answer::metrics(s.body);
}

endpoint_task run_delete(connection& x) {
  node& nd = x.shared();
  const int home = x.home().index;
  scratch& s = x.work();
  if (nd.clock() < nd.removal_floor) {
    co_return answer::error(503, kRestarting);
  }
  bool stored = true;
  const std::size_t deleted = co_await delete_keys(nd, home, s, stored);
  if (!stored) {
    co_return answer::error(503, kDeleteStorageFailed);
  }
  s.body.clear();
  api::encode_deleted(s.body, deleted);
  co_return answer::json(200, s.body);
}

endpoint_task run_stats(connection& x) {
  node& nd = x.shared();
  scratch& s = x.work();
  s.rank_rows.clear();
  s.totals = api::stats_totals{};
  s.sg_rows.clear();
  s.sg_sum = {};
  const std::uint64_t now = nd.clock();
  // One vLLM state: the request's tenant's (a tenant's token, or X-Metad-Tenant with an
  // operator's token), else the unnamed one. SGLang's pools for the operator only.
  const int space = s.space;
  const bool operator_view = s.quota_tenant.empty();
  auto collect = [&s, now, space, operator_view](const core_state& core) {
    if (operator_view) collect_sg_pools(core, s);
    api::stats_totals& t = s.totals;
    if (space == 0) {  // removals are counted per core, not per tenant: the operator's
      t.evicted_keys += core.evicted_keys;
      t.deleted_keys += core.deleted_keys;
      t.stale_keys += core.stale_keys;
    }
    const vllm_space* sp = core.find_space(space);
    if (sp == nullptr) return;
    t.keys += sp->directory.size();
    t.leased_keys += sp->directory.leased_count(now);
    t.incomplete_keys += sp->directory.incomplete_count();
    t.incomplete_pages += sp->directory.incomplete_bindings();
    t.expired_reservations += sp->ranks.expired_reservations();
    t.refused_releases += sp->ranks.refused_releases();
    sp->ranks.for_each_rank([&s](std::int64_t rank, const shard::rank_stats& st) {
      s.rank_rows.add({rank, st.num_pages, st.free, st.reserved, st.bound});
    });
  };
  co_await smp::for_each_core(nd.mailbox, x.home().index, smp::every_core,
                              [&](int c) { collect(*nd.core[c]); });
  s.body.clear();
  api::encode_stats(s.body, s.rank_rows.sorted(), s.rank_rows.pool(), s.totals);
  if (s.sg_rows.pools > 0) {  // without SGLang pools, /stats is what it always was
    s.body.back() = ',';
    append_sg_stats(s.body, s);
    s.body.push_back('}');
  }
  co_return answer::json(200, s.body);
}

}  // namespace metad::pipeline
