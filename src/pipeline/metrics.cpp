#include "pipeline/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

namespace metad::pipeline {
namespace {

std::size_t status_slot(int status) {
  const auto it = std::find(kMetricStatuses.begin(), kMetricStatuses.end(), status);
  return static_cast<std::size_t>(it - kMetricStatuses.begin());  // last slot: other
}

std::size_t bucket_of(std::uint64_t elapsed_ns) {
  const std::uint64_t us = elapsed_ns / 1000;
  const auto it = std::lower_bound(kLatencyBoundsUs.begin(), kLatencyBoundsUs.end(), us);
  return static_cast<std::size_t>(it - kLatencyBoundsUs.begin());
}

template <typename... Args>
void line(std::string& out, fmt::format_string<Args...> format, Args&&... args) {
  fmt::format_to(std::back_inserter(out), format, std::forward<Args>(args)...);
  out.push_back('\n');
}

}  // namespace

void request_metrics::record(route_label route, int status, std::uint64_t elapsed_ns) {
  const auto r = static_cast<std::size_t>(route);
  ++requests[r][status_slot(status)];
  ++latency[r][bucket_of(elapsed_ns)];
  latency_sum_ns[r] += elapsed_ns;
}

void request_metrics::add(const request_metrics& other) {
  for (std::size_t r = 0; r < kRoutes; ++r) {
    for (std::size_t s = 0; s < requests[r].size(); ++s) requests[r][s] += other.requests[r][s];
    for (std::size_t b = 0; b < kBuckets; ++b) latency[r][b] += other.latency[r][b];
    latency_sum_ns[r] += other.latency_sum_ns[r];
  }
}

void flush_metrics::record(std::uint64_t elapsed_ns, bool ok) {
  ++latency[bucket_of(elapsed_ns)];
  latency_sum_ns += elapsed_ns;
  if (!ok) ++failures;
}

void flush_metrics::add(const flush_metrics& other) {
  for (std::size_t b = 0; b < latency.size(); ++b) latency[b] += other.latency[b];
  latency_sum_ns += other.latency_sum_ns;
  failures += other.failures;
}

std::uint64_t request_metrics::total() const {
  std::uint64_t sum = 0;
  for (const auto& per_route : requests)
    for (std::uint64_t n : per_route) sum += n;
  return sum;
}

void render_metrics(std::string& out, const metrics_snapshot& snap) {
  const request_metrics& m = snap.requests;
  line(out, "# HELP hf3fs_metad_requests_total Requests answered, by endpoint and status.");
  line(out, "# TYPE hf3fs_metad_requests_total counter");
  for (std::size_t r = 0; r < request_metrics::kRoutes; ++r) {
    const std::string_view route = route_name(static_cast<route_label>(r));
    for (std::size_t s = 0; s < m.requests[r].size(); ++s) {
      if (m.requests[r][s] == 0) continue;
      if (s < kMetricStatuses.size()) {
        line(out, "hf3fs_metad_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}", route,
             kMetricStatuses[s], m.requests[r][s]);
      } else {
        line(out, "hf3fs_metad_requests_total{{endpoint=\"{}\",status=\"other\"}} {}", route,
             m.requests[r][s]);
      }
    }
  }
  line(out,
       "# HELP hf3fs_metad_request_duration_seconds Time from a complete request to its answer.");
  line(out, "# TYPE hf3fs_metad_request_duration_seconds histogram");
  for (std::size_t r = 0; r < request_metrics::kRoutes; ++r) {
    std::uint64_t count = 0;
    for (std::uint64_t n : m.latency[r]) count += n;
    if (count == 0) continue;
    const std::string_view route = route_name(static_cast<route_label>(r));
    std::uint64_t cumulative = 0;
    for (std::size_t b = 0; b < kLatencyBoundsUs.size(); ++b) {
      cumulative += m.latency[r][b];
      line(out, "hf3fs_metad_request_duration_seconds_bucket{{endpoint=\"{}\",le=\"{}\"}} {}",
           route, kLatencyBoundsUs[b] / 1e6, cumulative);
    }
    line(out, "hf3fs_metad_request_duration_seconds_bucket{{endpoint=\"{}\",le=\"+Inf\"}} {}",
         route, count);
    line(out, "hf3fs_metad_request_duration_seconds_sum{{endpoint=\"{}\"}} {}", route,
         static_cast<double>(m.latency_sum_ns[r]) / 1e9);
    line(out, "hf3fs_metad_request_duration_seconds_count{{endpoint=\"{}\"}} {}", route, count);
  }
  line(out, "# HELP hf3fs_metad_log_flush_seconds Group commits of the logs: write + fdatasync.");
  line(out, "# TYPE hf3fs_metad_log_flush_seconds histogram");
  {
    std::uint64_t cumulative = 0;
    for (std::size_t b = 0; b < kLatencyBoundsUs.size(); ++b) {
      cumulative += snap.flushes.latency[b];
      line(out, "hf3fs_metad_log_flush_seconds_bucket{{le=\"{}\"}} {}", kLatencyBoundsUs[b] / 1e6,
           cumulative);
    }
    cumulative += snap.flushes.latency.back();
    line(out, "hf3fs_metad_log_flush_seconds_bucket{{le=\"+Inf\"}} {}", cumulative);
    line(out, "hf3fs_metad_log_flush_seconds_sum {}",
         static_cast<double>(snap.flushes.latency_sum_ns) / 1e9);
    line(out, "hf3fs_metad_log_flush_seconds_count {}", cumulative);
  }
  line(
      out,
      "# HELP hf3fs_metad_log_flush_failures_total Log writes that failed (disk full, I/O error).");
  line(out, "# TYPE hf3fs_metad_log_flush_failures_total counter");
  line(out, "hf3fs_metad_log_flush_failures_total {}", snap.flushes.failures);
  // One sample without labels: HELP, TYPE, value.
  auto scalar = [&out](std::string_view name, std::string_view type, std::string_view help,
                       std::uint64_t value) {
    line(out, "# HELP {} {}", name, help);
    line(out, "# TYPE {} {}", name, type);
    line(out, "{} {}", name, value);
  };
  scalar("hf3fs_metad_keys", "gauge", "Keys in the completion directory (complete or not).",
         snap.keys);
  scalar("hf3fs_metad_incomplete_keys", "gauge",
         "Keys confirmed by fewer ranks than their tp_world_size (not readable yet).",
         snap.incomplete_keys);
  scalar("hf3fs_metad_incomplete_pages", "gauge",
         "Bound pages (all ranks) held by incomplete keys.", snap.incomplete_pages);
  scalar("hf3fs_metad_ranks", "gauge", "Initialised worker ranks.", snap.ranks);
  line(out, "# HELP hf3fs_metad_pool_pages Pages of all ranks together, by state.");
  line(out, "# TYPE hf3fs_metad_pool_pages gauge");
  line(out, "hf3fs_metad_pool_pages{{state=\"total\"}} {}", snap.pages.total);
  line(out, "hf3fs_metad_pool_pages{{state=\"free\"}} {}", snap.pages.free);
  line(out, "hf3fs_metad_pool_pages{{state=\"reserved\"}} {}", snap.pages.reserved);
  line(out, "hf3fs_metad_pool_pages{{state=\"bound\"}} {}", snap.pages.bound);
  scalar("hf3fs_metad_rank_series_omitted", "gauge",
         "Ranks left out of hf3fs_metad_pages (only the lowest-numbered ones get series; GET "
         "/rank/{rank} has any rank's pages).",
         snap.rank_series_omitted);
  scalar("hf3fs_metad_refused_releases_total", "counter",
         "Releases of pages bound to confirmed keys, refused.", snap.refused_releases);
  scalar("hf3fs_metad_expired_reservations_total", "counter",
         "Reserved pages returned to the pool after --reservation-ttl.", snap.expired_reservations);
  scalar("hf3fs_metad_evicted_keys_total", "counter",
         "Complete keys evicted (on every rank) to make room.", snap.evicted_keys);
  scalar("hf3fs_metad_deleted_keys_total", "counter", "Keys removed by /keys/delete.",
         snap.deleted_keys);
  scalar("hf3fs_metad_stale_keys_total", "counter",
         "Incomplete keys removed (on every rank) --incomplete-grace-ms after their last "
         "confirmation, with no reservation left.",
         snap.stale_keys);
  scalar("hf3fs_metad_cross_core_messages_total", "counter",
         "Requests handed from one core to another.", snap.hops);
  scalar("hf3fs_metad_memory_budget_bytes", "gauge",
         "--memory-max: what clients may make the server hold.", snap.memory_max);
  scalar("hf3fs_metad_memory_used_bytes", "gauge",
         "Memory counted against the budget: resident size plus what was charged since it was "
         "sampled.",
         snap.memory_used);
  scalar("hf3fs_metad_memory_snapshot_cut_bytes", "gauge",
         "Counted against the budget while a forked child cuts a standby's snapshot: the "
         "pages it may copy (the resident size at the fork; 0 when no cut runs).",
         snap.cut_charge);
  line(out,
       "# HELP hf3fs_metad_memory_refusals_total Rank and pool creations (507), request "
       "bodies (503), allocations (answered as by a full pool) and snapshot cuts (the "
       "standby waits) refused because they did not fit the budget.");
  line(out, "# TYPE hf3fs_metad_memory_refusals_total counter");
  line(out, "hf3fs_metad_memory_refusals_total{{what=\"rank\"}} {}", snap.refused_ranks);
  line(out, "hf3fs_metad_memory_refusals_total{{what=\"body\"}} {}", snap.refused_bodies);
  line(out, "hf3fs_metad_memory_refusals_total{{what=\"allocation\"}} {}",
       snap.refused_allocations);
  line(out, "hf3fs_metad_memory_refusals_total{{what=\"snapshot_cut\"}} {}", snap.refused_cuts);
  line(out,
       "# HELP hf3fs_metad_rank_reinitialized_total Worker initializations of an existing rank "
       "with another page count: grown or shrunk.");
  line(out, "# TYPE hf3fs_metad_rank_reinitialized_total counter");
  line(out, "hf3fs_metad_rank_reinitialized_total{{change=\"grown\"}} {}", snap.ranks_grown);
  line(out, "hf3fs_metad_rank_reinitialized_total{{change=\"shrunk\"}} {}", snap.ranks_shrunk);
  line(out,
       "# HELP hf3fs_metad_lookup_keys_total Keys looked up by batch_exists, get_locations and "
       "SGLang's exists and get_page_indices: found (hit) or not (miss); hit / (hit + miss) is "
       "the hit ratio.");
  line(out, "# TYPE hf3fs_metad_lookup_keys_total counter");
  auto lookups = [&out](const lookup_counts& c, std::string_view tenant) {
    for (std::size_t e = 0; e < kLookupEndpoints.size(); ++e) {
      if (!tenant.empty() && e < 2) continue;  // vLLM has no tenants
      for (const bool hit : {true, false}) {
        if (tenant.empty()) {
          line(out, "hf3fs_metad_lookup_keys_total{{endpoint=\"{}\",result=\"{}\"}} {}",
               kLookupEndpoints[e], hit ? "hit" : "miss", hit ? c.hit[e] : c.miss[e]);
        } else {
          line(out,
               "hf3fs_metad_lookup_keys_total{{endpoint=\"{}\",tenant=\"{}\",result=\"{}\"}} {}",
               kLookupEndpoints[e], tenant, hit ? "hit" : "miss", hit ? c.hit[e] : c.miss[e]);
        }
      }
    }
  };
  lookups(snap.lookups, "");
  for (const auto& [tenant, counts] : snap.tenant_lookups) lookups(counts, tenant);
  line(out,
       "# HELP hf3fs_metad_allocated_pages_total Pages handed out to new keys: from free pages, "
       "or freed for them by evicting least recently used keys.");
  line(out, "# TYPE hf3fs_metad_allocated_pages_total counter");
  line(out, "hf3fs_metad_allocated_pages_total{{api=\"vllm\",source=\"free\"}} {}",
       snap.allocations.vllm_free);
  line(out, "hf3fs_metad_allocated_pages_total{{api=\"vllm\",source=\"eviction\"}} {}",
       snap.allocations.vllm_eviction);
  line(out, "hf3fs_metad_allocated_pages_total{{api=\"sglang\",source=\"free\"}} {}",
       snap.allocations.sglang_free);
  line(out, "hf3fs_metad_allocated_pages_total{{api=\"sglang\",source=\"eviction\"}} {}",
       snap.allocations.sglang_eviction);
  struct family {
    std::string_view name, type, help;
    std::uint64_t connection_counts::*field;
  };
  static constexpr family families[] = {
      {"hf3fs_metad_connections_open", "gauge", "Open client connections.",
       &connection_counts::open},
      {"hf3fs_metad_connections_accepted_total", "counter", "Connections accepted.",
       &connection_counts::accepted},
      {"hf3fs_metad_connections_rejected_total", "counter",
       "Connections closed at once: over --connections-max or while stopping.",
       &connection_counts::rejected},
      {"hf3fs_metad_connections_timed_out_total", "counter",
       "Connections closed by the idle or header timeout.", &connection_counts::timed_out},
  };
  for (const family& f : families) {
    line(out, "# HELP {} {}", f.name, f.help);
    line(out, "# TYPE {} {}", f.name, f.type);
    for (std::size_t core = 0; core < snap.connections.size(); ++core)
      line(out, "{}{{core=\"{}\"}} {}", f.name, core, snap.connections[core].*f.field);
  }
}

void render_tenant_metrics(std::string& out, metrics_snapshot& snap) {
  static_assert(kTenantSeriesMax == 1000, "hf3fs_metad_tenant_keys' help says 1000");
  // SGLang's path tenant "_other" (without --tenants-file, which refuses the name) is
  // counted under the label it would otherwise repeat.
  if (const auto it = snap.tenants.find(kOtherTenants); it != snap.tenants.end()) {
    snap.tenants_other.add(it->second);
    snap.tenants.erase(it);
    snap.tenants_folded = true;
  }
  // The bound: the default tenant and the first kTenantSeriesMax others by name keep
  // their series, the rest are summed.
  const std::size_t kept = kTenantSeriesMax + (snap.tenants.contains("") ? 1 : 0);
  if (snap.tenants.size() > kept) {
    auto it = std::next(snap.tenants.begin(), static_cast<std::ptrdiff_t>(kept));
    for (auto rest = it; rest != snap.tenants.end(); ++rest) snap.tenants_other.add(rest->second);
    snap.tenants.erase(it, snap.tenants.end());
    snap.tenants_folded = true;
  }
  struct family {
    std::string_view name, type, help;
  };
  static constexpr family families[] = {
      {"hf3fs_metad_tenant_keys", "gauge",
       "Keys a tenant holds: the keys of its own vLLM state (the unnamed one: the vllm "
       "tenant's, else the default tenant's) and of its SGLang pools (the default tenant and the "
       "first 1000 others by name; tenant=\"_other\" sums the rest)."},
      {"hf3fs_metad_tenant_pages", "gauge",
       "Pages a tenant holds, reserved (SGLang: in flight) or bound, of vLLM's ranks and its "
       "SGLang pools."},
      {"hf3fs_metad_tenant_requests_total", "counter",
       "Requests of a tenant, by API (vLLM's or SGLang's): the token's tenant with "
       "--tenants-file, else the path's (vLLM's: the default tenant)."},
      {"hf3fs_metad_tenant_lookup_keys_total", "counter",
       "Keys a tenant's existence probes (batch_exists, SGLang's exists) asked for, found "
       "(hit) or not (miss): hit / (hit + miss) is the tenant's hit ratio."},
  };
  const auto rows = [&snap](auto&& each) {
    for (const auto& [tenant, f] : snap.tenants) each(std::string_view(tenant), f);
    if (snap.tenants_folded) each(kOtherTenants, snap.tenants_other);
  };
  for (std::size_t i = 0; i < std::size(families); ++i) {
    const family& f = families[i];
    line(out, "# HELP {} {}", f.name, f.help);
    line(out, "# TYPE {} {}", f.name, f.type);
    rows([&](std::string_view tenant, const tenant_figures& t) {
      switch (i) {
        case 0:
          line(out, "{}{{tenant=\"{}\"}} {}", f.name, tenant, t.keys);
          break;
        case 1:
          line(out, "{}{{tenant=\"{}\",state=\"reserved\"}} {}", f.name, tenant, t.pages_reserved);
          line(out, "{}{{tenant=\"{}\",state=\"bound\"}} {}", f.name, tenant, t.pages_bound);
          break;
        case 2:
          line(out, "{}{{tenant=\"{}\",api=\"vllm\"}} {}", f.name, tenant, t.counts.requests[0]);
          line(out, "{}{{tenant=\"{}\",api=\"sglang\"}} {}", f.name, tenant, t.counts.requests[1]);
          break;
        default:
          line(out, "{}{{tenant=\"{}\",result=\"hit\"}} {}", f.name, tenant, t.counts.hit);
          line(out, "{}{{tenant=\"{}\",result=\"miss\"}} {}", f.name, tenant, t.counts.miss);
      }
    });
  }
}

void render_rank_headers(std::string& out) {
  line(out,
       "# HELP hf3fs_metad_pages Pages of a rank's pool, by state (the lowest-numbered ranks; "
       "hf3fs_metad_rank_series_omitted counts the others).");
  line(out, "# TYPE hf3fs_metad_pages gauge");
}

void render_rank(std::string& out, std::int64_t rank, std::int64_t num_pages, std::int64_t free,
                 std::int64_t reserved, std::int64_t bound) {
  line(out, "hf3fs_metad_pages{{rank=\"{}\",state=\"total\"}} {}", rank, num_pages);
  line(out, "hf3fs_metad_pages{{rank=\"{}\",state=\"free\"}} {}", rank, free);
  line(out, "hf3fs_metad_pages{{rank=\"{}\",state=\"reserved\"}} {}", rank, reserved);
  line(out, "hf3fs_metad_pages{{rank=\"{}\",state=\"bound\"}} {}", rank, bound);
}

}  // namespace metad::pipeline
