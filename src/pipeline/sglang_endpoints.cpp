// SGLang's HiCache metadata API (docs/sglang-api.md): one coroutine for its seven
// operations. A pool lives on the core that owns its rank, in its tenant's registry;
// the request hops there, runs the operation on the pool (shard::sglang_pool does the
// work and the contract's checks), hops back and answers. Nothing here touches vLLM's
// ranks or directory.
#include <fmt/format.h>

#include <algorithm>

#include "metad/log.hpp"
#include "pipeline/endpoints.hpp"
#include "pipeline/sglang_journal.hpp"
#include "pipeline/walk.hpp"

namespace metad::pipeline {

namespace {

enum class sg_answer : std::uint8_t {
  no_content,       // 204
  body,             // 200 with s.body
  not_initialized,  // 404
  bad_request,      // 400 with s.detail
  conflict,         // 409 (--strict-reinit)
  too_many_pools,   // 400: --ranks-max pools exist
  over_quota,       // 403: the tenant's ranks=N (--tenants-file)
  over_budget,      // 507: --memory-max
  storage_failed,   // 503: the data directory refused the records
};

const std::string& sg_namespace(const scratch& s) {
  switch (s.sg) {
    case sg_op::initialize:
      return s.sg_init.ns;
    case sg_op::confirm:
      return s.sg_confirm.ns;
    case sg_op::clear:
      return s.sg_clear.ns;
    default:
      return s.sg_keys.ns;
  }
}

// On the owner core: creates or grows a pool, within --ranks-max pools and the memory
// budget.
sg_answer sg_initialize(node& nd, core_state& core, scratch& s, std::uint64_t& old_pages,
                        std::uint64_t& needed) {
  const api::sg_initialize_cmd& cmd = s.sg_init;
  shard::sglang_pools* pools = core.sg_pools(s.tenant, false);
  const shard::sglang_pool* pool = pools ? pools->find(s.sg_rank, cmd.ns) : nullptr;
  const auto before = static_cast<std::int64_t>(pool ? pool->num_pages() : 0);
  const auto pages = static_cast<std::uint64_t>(cmd.num_pages);
  // --tenants-file: the tenant's first pool of this rank counts one rank against its
  // ranks=N. Every pool of a rank lives on this core, and this runs without a suspension
  // from the check to the pool's creation, so a rank is counted once.
  bool new_rank = false;
  if (!pool && s.usage != nullptr) {
    new_rank = true;
    if (pools != nullptr)
      pools->for_each([&](std::int64_t rank, std::string_view, const shard::sglang_pool&) {
        new_rank = new_rank && rank != s.sg_rank;
      });
  }
  if (new_rank) {
    std::int64_t held = s.usage->sg_ranks.load(std::memory_order_relaxed);
    do {
      if (s.rank_quota >= 0 && held >= s.rank_quota) return sg_answer::over_quota;
    } while (!s.usage->sg_ranks.compare_exchange_weak(held, held + 1, std::memory_order_relaxed));
  }
  const auto unquota = [&] {
    if (new_rank) s.usage->sg_ranks.fetch_sub(1, std::memory_order_relaxed);
  };
  if (!pool) {
    std::int64_t count = nd.sglang_pools.load(std::memory_order_relaxed);
    do {
      if (count >= nd.cfg.ranks_max) {
        unquota();
        return sg_answer::too_many_pools;
      }
    } while (!nd.sglang_pools.compare_exchange_weak(count, count + 1, std::memory_order_relaxed));
  }
  if (cmd.num_pages > before) {
    // A pool costs what it holds: creating one a constant, growing it nothing.
    needed = shard::rank_table::pool_bytes(cmd.num_pages) - shard::rank_table::pool_bytes(before);
    if (needed != 0 && !nd.memory.charge_kept(needed)) {
      unquota();
      if (!pool) nd.sglang_pools.fetch_sub(1, std::memory_order_relaxed);
      nd.memory.refused_ranks.fetch_add(1, std::memory_order_relaxed);
      return sg_answer::over_budget;
    }
  }
  shard::sglang_pools* registry = core.sg_pools(s.tenant, true);
  if (s.usage != nullptr && registry->pages_counter == nullptr)
    registry->pages_counter = &s.usage->pages;  // tenants.hpp, tenant_usage::pages
  const shard::sglang_init_result r = registry->initialize(s.sg_rank, cmd.ns, pages);
  old_pages = r.old_pages;
  if (r.outcome == shard::sglang_init::created || r.outcome == shard::sglang_init::grown)
    core.journal.sg_initialize({s.tenant, s.sg_rank, cmd.ns}, pages);
  switch (r.outcome) {
    case shard::sglang_init::created:
    case shard::sglang_init::unchanged:
      return sg_answer::no_content;
    case shard::sglang_init::grown:
      metad::log::info("SGLang rank {} namespace '{}'{}{}: grown from {} to {} pages", s.sg_rank,
                       cmd.ns, s.tenant.empty() ? "" : " tenant ", s.tenant, r.old_pages, pages);
      return sg_answer::no_content;
    case shard::sglang_init::smaller_ignored:
    case shard::sglang_init::smaller_refused:
      ++core.sg_counters.reinit_smaller;
      metad::log::warn(
          "SGLang rank {} namespace '{}'{}{} initialized with different num_pages. Existing: {}, "
          "New: {} (kept{})",
          s.sg_rank, cmd.ns, s.tenant.empty() ? "" : " tenant ", s.tenant, r.old_pages, pages,
          r.outcome == shard::sglang_init::smaller_refused ? "; 409 with --strict-reinit" : "");
      return r.outcome == shard::sglang_init::smaller_refused ? sg_answer::conflict
                                                              : sg_answer::no_content;
  }
  return sg_answer::no_content;
}

// What a key given a page by a reserve may add to the server, for the memory budget: its
// bytes (its reservation's copy, then its binding's), its node, its entries, its page's
// bits, allocator slack. An estimate made before the fact; the resident size measured
// at the next sample replaces it.
std::uint64_t sg_reserve_bytes(std::span<const std::string_view> keys) {
  constexpr std::uint64_t kBindingBytes = 160;
  std::uint64_t bytes = keys.size() * kBindingBytes;
  for (const std::string_view key : keys) bytes += key.size();
  return bytes;
}

// On the owner core, before a reserve that may take free pages: charges the tenant's
// page count (`counter`, against s.page_quota) with what the reserve may add, at most its
// keys not bound in the pool (hits take none; a repeated key or one in flight is counted
// though it may take none) and at most what the quota leaves. Returns the reserve's cap
// (sglang_pool::reserve_capped): UINT64_MAX when every such key fits, else the keys that
// may take a free page (0: the pool answers as a full one). `charged`: what was added.
std::uint64_t sg_charge_quota(const shard::sglang_pool& pool,
                              std::span<const std::string_view> keys, scratch& s,
                              std::atomic<std::int64_t>& counter, std::int64_t& charged) {
  pool.exists(keys, s.flags);  // s.flags sized home (run_sglang)
  std::int64_t need = 0;
  for (const std::uint8_t bound : s.flags) need += bound ? 0 : 1;
  if (need == 0) return UINT64_MAX;
  std::int64_t held = counter.load(std::memory_order_relaxed);
  std::int64_t take = 0;
  do {
    take = std::clamp<std::int64_t>(s.page_quota - held, 0, need);
    if (take == 0) return 0;
  } while (!counter.compare_exchange_weak(held, held + take, std::memory_order_relaxed));
  charged = take;
  return take == need ? UINT64_MAX : static_cast<std::uint64_t>(take);
}

// On the owner core: the operation on an existing pool. `counter`: the tenant's page
// count (null: none); `charged`: what a reserve added to it before taking pages.
sg_answer sg_apply(node& nd, core_state& core, shard::sglang_pool& pool, scratch& s,
                   std::atomic<std::int64_t>* counter, std::int64_t& charged) {
  const std::uint64_t now = sg_now(nd, core);
  const store::sg_pool_name name{s.tenant, s.sg_rank, sg_namespace(s)};
  store::journal& journal = core.journal;
  switch (s.sg) {
    case sg_op::initialize:
      break;
    case sg_op::exists:
      pool.exists(s.sg_keys.keys.views(), s.flags);
      s.body.clear();
      api::encode_exists(s.body, s.flags);
      return sg_answer::body;
    case sg_op::reserve: {
      // The memory budget: past it the pool answers as a full one (evictions only), and
      // the record says so for the replay.
      const auto keys = s.sg_keys.keys.views();
      const std::uint64_t bytes = sg_reserve_bytes(keys);
      const bool fits = core.credit.take(nd.memory, bytes);
      // --tenants-file's pages=N (the tenant's pages, all its pools on all cores): the
      // keys past what it leaves are answered as by a full pool, from the pool's own
      // least recently used keys (this tenant's), never a free page; the record says how
      // many keys could take one, for the replay.
      std::uint64_t fresh_max = fits ? UINT64_MAX : 0;
      if (fits && counter != nullptr && s.page_quota >= 0) {
        fresh_max = sg_charge_quota(pool, keys, s, *counter, charged);
        if (fresh_max == 0) core.credit.give_back(bytes);
      }
      const shard::sglang_reserve_stats st = pool.reserve_capped(keys, now, s.slots, fresh_max);
      // Hits, repeats and evictions hold nothing new.
      if (fresh_max != 0 && st.allocated < keys.size())
        core.credit.give_back(bytes - bytes / keys.size() * st.allocated);
      if (keys.size() != 0) journal.sg_reserve(name, now, keys, fresh_max);
      core.sg_counters.evicted += st.evicted;
      core.allocations.sglang_eviction += st.evicted;
      core.allocations.sglang_free += st.allocated - std::min(st.allocated, st.evicted);
      core.sg_counters.no_page += st.no_page;
      core.sg_counters.expired += st.expired;
      s.body.clear();
      api::encode_sglang_reserved(s.body, s.slots);
      return sg_answer::body;
    }
    case sg_op::confirm: {
      const api::sg_confirm_cmd& cmd = s.sg_confirm;
      shard::sglang_confirm_stats st;
      // Released pages sit out --release-quarantine-ms (0: free at once, the reference's
      // order), so that a replay of this request cannot free another writer's page.
      const std::uint64_t quarantine_until =
          nd.cfg.release_quarantine_ms == 0 || cmd.releases.empty()
              ? 0
              : now + std::uint64_t{nd.cfg.release_quarantine_ms} * smp::kNsPerMs;
      if (pool.confirm(cmd.keys.views(), cmd.pages, cmd.releases, now, s.detail, st,
                       quarantine_until) == shard::sglang_confirm_outcome::bad_request)
        return sg_answer::bad_request;
      journal.sg_confirm(name, now, cmd.keys.views(), cmd.pages, cmd.releases,
                         quarantine_until != 0);
      core.sg_counters.skipped += st.skipped + st.stale;
      core.sg_counters.release_refused += st.release_refused;
      core.sg_counters.expired += st.expired;
      return sg_answer::no_content;
    }
    case sg_op::delete_keys:
      if (const std::size_t deleted = pool.delete_keys(s.sg_keys.keys.views()); deleted > 0) {
        core.sg_counters.deleted += deleted;
        journal.sg_delete(name, s.sg_keys.keys.views());
      }
      return sg_answer::no_content;
    case sg_op::clear:
      pool.clear();
      journal.sg_clear(name);
      return sg_answer::no_content;
    case sg_op::inspect:
      pool.inspect(s.sg_keys.keys.views(), s.sg_inspect_reports);
      return sg_answer::body;  // encoded home (times in wall-clock ms)
    case sg_op::get_page_indices:
      pool.get_page_indices(s.sg_keys.keys.views(), now, s.pages);
      if (std::any_of(s.pages.begin(), s.pages.end(), [](std::int64_t p) { return p >= 0; }))
        journal.sg_get(name, now, s.sg_keys.keys.views());
      s.body.clear();
      api::encode_sglang_page_indices(s.body, s.pages);
      return sg_answer::body;
  }
  return sg_answer::no_content;
}

// An upper bound of the bytes the request's record takes in the log.
std::uint64_t sg_record_bytes(const scratch& s) {
  std::uint64_t bytes = 128 + s.tenant.size() + sg_namespace(s).size();
  const api::key_list& keys = s.sg == sg_op::confirm ? s.sg_confirm.keys : s.sg_keys.keys;
  if (s.sg != sg_op::initialize && s.sg != sg_op::clear && s.sg != sg_op::exists &&
      s.sg != sg_op::inspect) {
    for (const std::string_view key : keys.views()) bytes += key.size() + 12;
    bytes += 8 * s.sg_confirm.releases.size();
  }
  return bytes;
}

// Home, after exists or get_page_indices: the keys found and not, on the home core's
// counters (a named tenant's in its own row).
void count_sg_lookups(core_state& home, const scratch& s) {
  lookup_endpoint endpoint;
  std::uint64_t hits = 0, n = 0;
  if (s.sg == sg_op::exists) {
    endpoint = lookup_endpoint::sglang_exists;
    for (const std::uint8_t f : s.flags) hits += f;
    n = s.flags.size();
  } else if (s.sg == sg_op::get_page_indices) {
    endpoint = lookup_endpoint::sglang_get_page_indices;
    for (const std::int64_t p : s.pages) hits += p >= 0 ? 1 : 0;
    n = s.pages.size();
  } else {
    return;
  }
  if (endpoint == lookup_endpoint::sglang_exists && s.tenant_row != nullptr) {
    s.tenant_row->hit += hits;
    s.tenant_row->miss += n - hits;
  }
  if (s.tenant.empty()) {
    home.lookups.count(endpoint, hits, n - hits);
    return;
  }
  auto it = home.sg_tenant_lookups.find(std::string_view(s.tenant));
  if (it == home.sg_tenant_lookups.end()) it = home.sg_tenant_lookups.try_emplace(s.tenant).first;
  it->second.count(endpoint, hits, n - hits);
}

// Home: the inspection's answer; `clock` is the SGLang clock's reading at the pool.
void encode_sg_inspect(scratch& s, std::uint64_t clock) {
  const std::int64_t wall = unix_ms_now();
  auto to_ms = [&](std::uint64_t t) -> std::int64_t {
    if (t == 0 || t == shard::sglang_pool::no_deadline) return -1;
    return wall + (static_cast<std::int64_t>(t) - static_cast<std::int64_t>(clock)) /
                      static_cast<std::int64_t>(smp::kNsPerMs);
  };
  s.sg_inspect_rows.clear();
  const api::key_list& keys = s.sg_keys.keys;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const shard::sglang_key_report& r = s.sg_inspect_reports[i];
    s.sg_inspect_rows.push_back(
        {keys[i], r.page, r.lease_until > clock ? to_ms(r.lease_until) : -1, r.reserved_page,
         r.reserved_page >= 0 ? to_ms(r.reserved_until) : -1, r.reserved_stale});
  }
  s.body.clear();
  api::encode_sglang_inspect(s.body, s.sg_inspect_rows);
}

}  // namespace

endpoint_task run_sglang(connection& x) {
  node& nd = x.shared();
  const int home = x.home().index;
  scratch& s = x.work();
  const int owner = shard::owner_of_rank(s.sg_rank, nd.cores);
  // Sized here, so that the owner core allocates nothing this core frees.
  const std::size_t n = s.sg_keys.keys.size();
  if (s.sg == sg_op::exists || (s.sg == sg_op::reserve && s.page_quota >= 0)) s.flags.assign(n, 0);
  if (s.sg == sg_op::get_page_indices) s.pages.assign(n, -1);
  if (s.sg == sg_op::inspect) s.sg_inspect_reports.assign(n, {});
  if (s.sg == sg_op::reserve) {
    s.slots.clear();
    s.slots.reserve(n);
  }
  s.body.reserve(64 + 24 * n);
  s.detail.reserve(256);
  std::uint64_t old_pages = 0;
  std::uint64_t needed = 0;
  co_await nd.mailbox.hop_to(owner);
  core_state& core = *nd.core[owner];
  const std::uint64_t sg_clock = sg_now(nd, core);  // inspect's times, in wall-clock ms
  sg_answer outcome = sg_answer::not_initialized;
  bool stored = true;
  if (!core.journal.reserve(sg_record_bytes(s))) {
    outcome = sg_answer::storage_failed;  // nothing changed
  } else if (s.sg == sg_op::initialize) {
    outcome = sg_initialize(nd, core, s, old_pages, needed);
  } else if (shard::sglang_pools* pools = core.sg_pools(s.tenant, false)) {
    if (shard::sglang_pool* pool = pools->find(s.sg_rank, sg_namespace(s))) {
      if (s.sg_error) {
        s.detail = s.sg_error.detail;
        outcome = sg_answer::bad_request;
      } else {
        // --tenants-file: the tenant's page count takes the pool's change of held pages
        // (releases, expiry, deletes, evictions, clear, reserves: tenants.hpp). An admin's
        // request (no usage) on a tenant's pool counts there too.
        if (s.usage != nullptr && pools->pages_counter == nullptr)
          pools->pages_counter = &s.usage->pages;
        std::atomic<std::int64_t>* counter = pools->pages_counter;
        const auto held = static_cast<std::int64_t>(pool->held());
        std::int64_t charged = 0;
        outcome = sg_apply(nd, core, *pool, s, counter, charged);
        if (counter != nullptr) {
          if (const std::int64_t change = static_cast<std::int64_t>(pool->held()) - held - charged;
              change != 0)
            counter->fetch_add(change, std::memory_order_relaxed);
        }
      }
    }
  }
  if (outcome != sg_answer::storage_failed) stored = co_await core.journal.durable();
  co_await nd.mailbox.hop_to(home);
  if (!stored) outcome = sg_answer::storage_failed;
  if (outcome == sg_answer::body) count_sg_lookups(x.home(), s);
  switch (outcome) {
    case sg_answer::no_content:
      co_return answer::canned(http::canned::no_content);
    case sg_answer::body:
      if (s.sg == sg_op::inspect) encode_sg_inspect(s, sg_clock);
      co_return answer::json(200, s.body);
    case sg_answer::not_initialized:
      s.body.clear();
      api::encode_sglang_not_initialized(s.body, s.sg_rank, sg_namespace(s));
      co_return answer::json(404, s.body);
    case sg_answer::bad_request:
      co_return answer::error(s.sg_error ? s.sg_error.status : 400, s.detail);
    case sg_answer::conflict:
      s.body.clear();
      api::encode_sglang_already_initialized(s.body, s.sg_rank, s.sg_init.ns, old_pages);
      co_return answer::json(409, s.body);
    case sg_answer::too_many_pools:
      s.detail = fmt::format(
          "Rank {} namespace '{}' not initialized: {} SGLang pools exist already, the limit set "
          "by --ranks-max",
          s.sg_rank, s.sg_init.ns, nd.cfg.ranks_max);
      co_return answer::error(400, s.detail);
    case sg_answer::over_quota:
      s.detail = fmt::format(
          "Rank {} namespace '{}' not initialized: tenant {} has SGLang pools on as many ranks "
          "as its quota allows (ranks={} in --tenants-file)",
          s.sg_rank, s.sg_init.ns, s.tenant, s.rank_quota);
      co_return answer::error(403, s.detail);
    case sg_answer::over_budget:
      s.detail = fmt::format(
          "Rank {} namespace '{}' not initialized: its {} pages need {} bytes more, over the "
          "memory budget (--memory-max {} bytes, {} in use)",
          s.sg_rank, s.sg_init.ns, s.sg_init.num_pages, needed, nd.memory.max(), nd.memory.used());
      co_return answer::error(507, s.detail);
    case sg_answer::storage_failed:
      break;
  }
  co_return answer::error(503, kStorageFailed);
}

std::size_t expire_sg_due(node& nd, core_state& core) {
  if (core.sg_tenants.empty()) return 0;
  std::size_t pools = 0, quarantined = 0;
  for (const auto& entry : core.sg_tenants) {
    entry.second.for_each([&](std::int64_t, std::string_view, const shard::sglang_pool& pool) {
      ++pools;
      quarantined += pool.quarantined();
    });
  }
  const bool expiring = nd.cfg.reservation_ttl_ms != 0;
  if (!expiring && quarantined == 0) return 0;
  // One record of each kind per pool at most (8 bytes per page ending its quarantine);
  // without room, nothing changes this tick.
  if (!core.journal.reserve(512 * pools + 8 * quarantined + 64 * core.sg_tenants.size())) return 0;
  const std::uint64_t now = sg_now(nd, core);
  std::size_t expired = 0, ended = 0;
  std::vector<std::int64_t> pages;
  for (auto& [tenant, registry] : core.sg_tenants) {
    const std::string_view name = tenant;
    shard::sglang_pools& pools_of = registry;
    registry.for_each([&](std::int64_t rank, std::string_view ns, const shard::sglang_pool&) {
      shard::sglang_pool* pool = pools_of.find(rank, ns);
      if (pool->quarantined() > 0) {
        pages.clear();
        if (const std::size_t n = pool->end_quarantines(now, &pages); n > 0) {
          ended += n;
          core.journal.sg_quarantine_end({name, rank, ns}, now, pages);
        }
      }
      if (!expiring) return;
      const std::uint64_t held = pool->held();
      if (const std::size_t n = pool->expire(now); n > 0) {
        expired += n;
        core.journal.sg_expire({name, rank, ns}, now);
        if (pools_of.pages_counter != nullptr)  // the tenant's pages (tenants.hpp)
          pools_of.pages_counter->fetch_sub(static_cast<std::int64_t>(held - pool->held()),
                                            std::memory_order_relaxed);
      }
    });
  }
  core.sg_counters.expired += expired;
  return expired + ended;
}

void restart_sg_quarantines(node& nd, core_state& core) {
  const std::uint64_t until =
      sg_now(nd, core) + std::uint64_t{nd.cfg.release_quarantine_ms} * smp::kNsPerMs;
  for (auto& entry : core.sg_tenants) {
    shard::sglang_pools& pools_of = entry.second;
    entry.second.for_each([&](std::int64_t rank, std::string_view ns, const shard::sglang_pool&) {
      pools_of.find(rank, ns)->restart_quarantines(until);
    });
  }
}

std::uint64_t sg_now(node& nd, core_state& core) {
  const std::uint64_t now = nd.clock() + nd.sglang_clock_offset.load(std::memory_order_relaxed);
  core.sg_last_now = std::max(core.sg_last_now, now);
  return now;
}

namespace {

// Writes an sg_snapshot_pool record per pool of the core into sink(), each followed by
// an sg_snapshot_quarantine record when the pool has quarantined pages.
template <class Sink>
void write_sg_pools(const core_state& core, Sink&& sink) {
  std::vector<std::int64_t> free, bound_pages, quarantined;
  std::vector<std::string_view> bound_keys;
  std::vector<store::sg_flight> flights;
  for (const auto& entry : core.sg_tenants) {
    const std::string_view name = entry.first;  // lambdas cannot capture bindings in C++20
    entry.second.for_each([&](std::int64_t rank, std::string_view ns,
                              const shard::sglang_pool& pool) {
      const shard::sglang_image image = pool.image();
      free.clear();  // as runs: lo, hi, lo, hi, ...
      for (const auto& [lo, hi] : image.free) {
        free.push_back(static_cast<std::int64_t>(lo));
        free.push_back(static_cast<std::int64_t>(hi));
      }
      bound_keys.clear();
      bound_pages.clear();
      for (const auto& [key, page] : image.bound) {
        bound_keys.push_back(key);
        bound_pages.push_back(page);
      }
      flights.clear();
      for (const auto& f : image.reserved)
        flights.push_back({static_cast<std::int64_t>(f.page), f.key, f.epoch, f.deadline});
      store::append_sg_snapshot_pool(sink(), {name, rank, ns}, core.sg_last_now, image.num_pages,
                                     image.epoch, free, bound_keys, bound_pages, flights);
      if (image.quarantined.empty()) return;
      quarantined.assign(image.quarantined.begin(), image.quarantined.end());
      store::append_sg_snapshot_quarantine(sink(), {name, rank, ns}, quarantined);
    });
  }
}

}  // namespace

void append_sg_snapshot(std::string& bytes, const core_state& core) {
  write_sg_pools(core, [&bytes]() -> std::string& { return bytes; });
}

void log_sg_pools(core_state& core) {
  core.journal.sg_snapshot([&core](std::string& pending) {
    write_sg_pools(core, [&pending]() -> std::string& { return pending; });
  });
}

}  // namespace metad::pipeline
