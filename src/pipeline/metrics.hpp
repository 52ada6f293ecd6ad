// Request counters and latency histograms of one core. Only the owning core writes
// them; a scrape hops to each core and adds its counters into the scraper's sum, so the
// request path has no shared atomics.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pipeline/routes.hpp"

namespace metad::pipeline {

inline constexpr std::array<int, 14> kMetricStatuses = {200, 204, 400, 401, 404, 405, 409,
                                                        413, 431, 500, 501, 503, 505, 507};
// Upper bounds of the latency buckets, in microseconds (then +Inf).
inline constexpr std::array<std::uint32_t, 12> kLatencyBoundsUs = {
    10, 25, 50, 100, 250, 500, 1'000, 2'500, 5'000, 10'000, 25'000, 100'000};

struct request_metrics {
  static constexpr std::size_t kRoutes = kRouteLabels;
  static constexpr std::size_t kBuckets = kLatencyBoundsUs.size() + 1;

  std::array<std::array<std::uint64_t, kMetricStatuses.size() + 1>, kRoutes> requests{};
  std::array<std::array<std::uint64_t, kBuckets>, kRoutes> latency{};
  std::array<std::uint64_t, kRoutes> latency_sum_ns{};

  void record(route_label route, int status, std::uint64_t elapsed_ns);
  void add(const request_metrics& other);
  std::uint64_t total() const;
};

// Log group commits of one core: write + fdatasync latency, and failures.
struct flush_metrics {
  std::array<std::uint64_t, request_metrics::kBuckets> latency{};
  std::uint64_t latency_sum_ns = 0;
  std::uint64_t failures = 0;

  void record(std::uint64_t elapsed_ns, bool ok);
  void add(const flush_metrics& other);
};

// Keys looked up by the read endpoints, found (hit) or not (miss): the hit ratio. Each
// core counts the requests it is home to; a scrape sums them.
enum class lookup_endpoint : std::uint8_t {
  batch_exists,
  get_locations,
  sglang_exists,
  sglang_get_page_indices
};
inline constexpr std::array<std::string_view, 4> kLookupEndpoints = {
    "batch_exists", "get_locations", "sglang_exists", "sglang_get_page_indices"};
struct lookup_counts {
  std::array<std::uint64_t, kLookupEndpoints.size()> hit{}, miss{};
  void count(lookup_endpoint e, std::uint64_t hits, std::uint64_t misses) {
    hit[static_cast<std::size_t>(e)] += hits;
    miss[static_cast<std::size_t>(e)] += misses;
  }
  void add(const lookup_counts& other) {
    for (std::size_t i = 0; i < hit.size(); ++i) {
      hit[i] += other.hit[i];
      miss[i] += other.miss[i];
    }
  }
};
// SGLang's named tenants' lookups (the default tenant's are in lookup_counts).
struct tenant_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using tenant_lookups = std::unordered_map<std::string, lookup_counts, tenant_hash, std::equal_to<>>;

// Per-tenant figures (the hf3fs_metad_tenant_* families; docs/operations.md, "Tenants"):
// the default tenant "" and at most kTenantSeriesMax others get series of their own, the
// first by name; the others are summed under tenant="_other" (a name the tenants file
// refuses). The same bound holds each core's counters: a core counts its
// first kTenantSeriesMax tenants by name and the rest in one `other` row, so a client
// naming tenants in paths (without --tenants-file) cannot grow them.
inline constexpr std::size_t kTenantSeriesMax = 1000;
inline constexpr std::string_view kOtherTenants = "_other";
// The API a request used.
enum class tenant_api : std::uint8_t { vllm, sglang };
// What one core counted for a tenant: requests it was home to, by API, and the keys its
// existence probes (batch_exists, SGLang's exists) asked for, found (hit) or not (miss).
struct tenant_counts {
  std::array<std::uint64_t, 2> requests{};  // by tenant_api
  std::uint64_t hit = 0, miss = 0;
  void add(const tenant_counts& o) {
    requests[0] += o.requests[0];
    requests[1] += o.requests[1];
    hit += o.hit;
    miss += o.miss;
  }
};
// One core's tenant_counts by tenant. Only the owning core touches it; a tenant's row is
// made on its first request there (never freed: its address is stable, and a request
// keeps it from dispatch to completion), so counting is an addition. The default tenant
// "" always gets its row (at most kTenantSeriesMax + 1 rows).
struct tenant_counters {
  std::unordered_map<std::string, tenant_counts, tenant_hash, std::equal_to<>> named;
  tenant_counts other;  // named tenants past kTenantSeriesMax on this core
  tenant_counts& of(std::string_view tenant) {
    const auto it = named.find(tenant);
    if (it != named.end()) return it->second;
    if (named.size() >= kTenantSeriesMax && !tenant.empty()) return other;
    return named.try_emplace(std::string(tenant)).first->second;
  }
};
// A tenant's figures in a scrape: its counters summed over the cores, and what it holds
// (its own vLLM state; the unnamed one for the `vllm` tenant, else the default tenant's;
// its own SGLang pools): keys, and pages reserved (SGLang: in flight) and bound.
struct tenant_figures {
  tenant_counts counts;
  std::uint64_t keys = 0, pages_reserved = 0, pages_bound = 0;
  void add(const tenant_figures& o) {
    counts.add(o.counts);
    keys += o.keys;
    pages_reserved += o.pages_reserved;
    pages_bound += o.pages_bound;
  }
};

// Pages handed out for new keys: from free pages (the quarantine and expired
// reservations included) or freed by evicting keys for them.
struct allocation_counts {
  std::uint64_t vllm_free = 0, vllm_eviction = 0, sglang_free = 0, sglang_eviction = 0;
  void add(const allocation_counts& o) {
    vllm_free += o.vllm_free;
    vllm_eviction += o.vllm_eviction;
    sglang_free += o.sglang_free;
    sglang_eviction += o.sglang_eviction;
  }
};

struct connection_counts {
  std::uint64_t open = 0, accepted = 0, rejected = 0, timed_out = 0;
};

// Pages of every rank's pool together, by state.
struct pool_pages {
  std::uint64_t total = 0, free = 0, reserved = 0, bound = 0;
};

// Everything a scrape collects from all cores.
struct metrics_snapshot {
  std::vector<connection_counts> connections;  // per core, sized before the scrape hops
  request_metrics requests;
  flush_metrics flushes;
  std::uint64_t keys = 0;  // directory entries (complete or not)
  std::uint64_t refused_releases = 0;
  std::uint64_t expired_reservations = 0, evicted_keys = 0, deleted_keys = 0, stale_keys = 0;
  std::uint64_t incomplete_keys = 0, incomplete_pages = 0;
  // Ranks initialized again with another page count.
  std::uint64_t ranks_grown = 0, ranks_shrunk = 0;
  std::uint64_t hops = 0;  // cross-core hand-offs posted
  std::uint64_t ranks = 0;
  // --memory-max, the memory counted against it, and what it refused.
  std::uint64_t memory_max = 0, memory_used = 0, refused_ranks = 0, refused_bodies = 0;
  std::uint64_t refused_allocations = 0, refused_cuts = 0, cut_charge = 0;
  pool_pages pages;                                     // summed over every rank
  lookup_counts lookups;                                // vLLM's and SGLang's default tenant
  std::map<std::string, lookup_counts> tenant_lookups;  // SGLang's named tenants, sorted
  allocation_counts allocations;
  std::uint64_t rank_series_omitted = 0;  // ranks without per-rank series (kRankRowsMax)
  // Per tenant, sorted by name ("" first); render_tenant_metrics folds those past
  // kTenantSeriesMax into tenants_other.
  std::map<std::string, tenant_figures, std::less<>> tenants;
  tenant_figures tenants_other;
  bool tenants_folded = false;  // some tenant's figures are in tenants_other
  // Tenants' own vLLM states (not the unnamed one): their pages, summed (they have no
  // per-rank series: a rank label alone would name two tenants' rank 0 alike; each
  // tenant's keys and pages go into `tenants` as they are collected). The unnamed
  // state's keys, for its tenant's figures at the end of the scrape.
  pool_pages named_pages;
  std::uint64_t unnamed_keys = 0;
};

// Prometheus text exposition (format 0.0.4) of the summed request metrics and the
// snapshot's totals. The per-rank series follow.
void render_metrics(std::string& out, const metrics_snapshot& snapshot);
// The per-rank page gauges: the family's header, then a render_rank for each rank that
// gets series (the lowest-numbered ones: see rank_sample.hpp), all in one run, as the
// format wants a family's lines together.
void render_rank_headers(std::string& out);
// The hf3fs_metad_tenant_* families: the default tenant and the first kTenantSeriesMax
// others of `snapshot` by name, each with its own series, and tenant="_other" for the
// rest when there are more (their figures are moved into tenants_other first).
void render_tenant_metrics(std::string& out, metrics_snapshot& snapshot);
void render_rank(std::string& out, std::int64_t rank, std::int64_t num_pages, std::int64_t free,
                 std::int64_t reserved, std::int64_t bound);

}  // namespace metad::pipeline
