// GET /status.json: the status page's summary (docs/api.md). One walk over every core,
// the same as /metrics' (the counters it sums), then JSON: the node's role, uptime and
// version, each endpoint's requests and latency buckets, the hit ratio's counts, memory,
// the ranks' and SGLang pools' fill (the first kStatusRowsMax rows and sums over all),
// and the last warnings. Nothing here runs on a request's path but its own.
#include <fmt/format.h>

#include <iterator>

#include "metad/log.hpp"
#include "pipeline/endpoints.hpp"
#include "pipeline/ha_gate.hpp"
#include "smp/for_each_core.hpp"

namespace metad::pipeline {
namespace {

// Rows of ranks and of SGLang pools the page draws, at most (the sums cover all).
constexpr std::size_t kStatusRowsMax = 64;
// Warning lines the page shows, at most.
constexpr std::size_t kStatusWarnings = 20;

template <typename... Args>
void put(std::string& out, fmt::format_string<Args...> format, Args&&... args) {
  fmt::format_to(std::back_inserter(out), format, std::forward<Args>(args)...);
}

void put_string(std::string& out, std::string_view text) {
  out.push_back('"');
  api::append_escaped(out, text);
  out.push_back('"');
}

// The 99th percentile of a latency histogram, in ms, interpolated within its bucket as
// Prometheus' histogram_quantile does; -1 without samples.
double p99_ms(const std::array<std::uint64_t, request_metrics::kBuckets>& buckets) {
  std::uint64_t count = 0;
  for (const std::uint64_t n : buckets) count += n;
  if (count == 0) return -1;
  const double rank = 0.99 * static_cast<double>(count);
  std::uint64_t cumulative = 0;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const std::uint64_t before = cumulative;
    cumulative += buckets[b];
    if (static_cast<double>(cumulative) < rank) continue;
    if (b == kLatencyBoundsUs.size()) return kLatencyBoundsUs.back() / 1000.0;  // +Inf
    const double lower = b == 0 ? 0 : kLatencyBoundsUs[b - 1];
    const double upper = kLatencyBoundsUs[b];
    const double within =
        buckets[b] == 0 ? 1.0
                        : (rank - static_cast<double>(before)) / static_cast<double>(buckets[b]);
    return (lower + (upper - lower) * within) / 1000.0;
  }
  return kLatencyBoundsUs.back() / 1000.0;
}

void put_node(std::string& out, const node& nd) {
  const bool serving = ha_serving(nd, smp::monotonic_ns());
  if (nd.ha == nullptr) {
    out.append(R"("node":{"role":"standalone","serving":true,"ha":false)");
  } else {
    out.append(R"("node":{"role":)");
    put_string(out, ha::to_string(nd.ha->current()));
    put(out, R"(,"serving":{},"ha":true,"id":)", serving);
    put_string(out, nd.ha->settings().node);
    put(out, R"(,"epoch":{},"leader_changes":{},"leader":)", nd.ha->epoch(),
        nd.ha->leader_changes());
    if (const auto leader = nd.ha->leader(); leader && !leader->node.empty()) {
      out.append(R"({"id":)");
      put_string(out, leader->node);
      out.append(R"(,"url":)");
      put_string(out, leader->http);
      out.push_back('}');
    } else {
      out.append("null");
    }
  }
  const auto& r = nd.repl;
  put(out,
      R"(,"replication":{{"enabled":{},"standby_in_sync":{},"caught_up":{},"lag_bytes":{},)"
      R"("drops":{},"promotions":{}}}}})",
      r.enabled.load(), r.in_sync.load(), r.caught_up.load(), r.lag_bytes.load(), r.drops.load(),
      r.promotions.load());
}

void put_lookups(std::string& out, const metrics_snapshot& snap) {
  std::uint64_t hit = 0, miss = 0;
  out.append(R"("lookups":{"endpoints":[)");
  bool first = true;
  auto row = [&](const lookup_counts& c, std::string_view tenant) {
    for (std::size_t e = 0; e < kLookupEndpoints.size(); ++e) {
      if (!tenant.empty() && e < 2) continue;
      hit += c.hit[e];
      miss += c.miss[e];
      if (!first) out.push_back(',');
      first = false;
      put(out, R"({{"endpoint":"{}","tenant":)", kLookupEndpoints[e]);
      put_string(out, tenant);
      put(out, R"(,"hit":{},"miss":{}}})", c.hit[e], c.miss[e]);
    }
  };
  row(snap.lookups, "");
  std::size_t tenants = 0;
  for (const auto& [tenant, counts] : snap.tenant_lookups) {
    if (++tenants > kStatusRowsMax) break;
    row(counts, tenant);
  }
  put(out, R"(],"hit":{},"miss":{}}})", hit, miss);
}

void put_endpoints(std::string& out, const request_metrics& m) {
  out.append(R"("latency_bounds_us":[)");
  for (std::size_t b = 0; b < kLatencyBoundsUs.size(); ++b)
    put(out, "{}{}", b == 0 ? "" : ",", kLatencyBoundsUs[b]);
  out.append(R"(],"endpoints":[)");
  bool first = true;
  for (std::size_t r = 0; r < request_metrics::kRoutes; ++r) {
    std::uint64_t requests = 0, errors = 0;
    for (std::size_t st = 0; st < m.requests[r].size(); ++st) {
      requests += m.requests[r][st];
      if (st >= kMetricStatuses.size() || kMetricStatuses[st] >= 500) errors += m.requests[r][st];
    }
    if (requests == 0) continue;
    if (!first) out.push_back(',');
    first = false;
    const double p99 = p99_ms(m.latency[r]);
    put(out, R"({{"endpoint":"{}","requests":{},"errors_5xx":{},"p99_ms":)",
        route_name(static_cast<route_label>(r)), requests, errors);
    if (p99 < 0) {
      out.append("null");
    } else {
      put(out, "{:.3f}", p99);
    }
    out.append(R"(,"buckets":[)");
    for (std::size_t b = 0; b < request_metrics::kBuckets; ++b)
      put(out, "{}{}", b == 0 ? "" : ",", m.latency[r][b]);
    out.append("]}");
  }
  out.push_back(']');
}

void put_ranks(std::string& out, scratch& s, const metrics_snapshot& snap) {
  const api::rank_pool& pool = s.rank_rows.pool();
  put(out,
      R"("ranks":{{"total":{},"pages":{},"free":{},"reserved":{},"bound":{},)"
      R"("incomplete":{},"keys":{},"incomplete_keys":{},"rows":[)",
      pool.ranks, pool.pages, pool.free, pool.reserved, pool.bound, snap.incomplete_pages,
      snap.keys, snap.incomplete_keys);
  std::size_t shown = 0;
  for (const api::rank_info_row& r : s.rank_rows.sorted()) {
    if (shown == kStatusRowsMax) break;
    put(out, R"({}{{"rank":{},"num_pages":{},"free":{},"reserved":{},"bound":{}}})",
        shown++ == 0 ? "" : ",", r.rank, r.num_pages, r.free, r.reserved, r.bound);
  }
  put(out, R"(],"truncated":{}}})", pool.ranks > shown);
}

void put_sglang(std::string& out, scratch& s) {
  sg_pool_sample& sample = s.sg_rows;
  put(out,
      R"("sglang":{{"pools":{},"pages":{},"free":{},"in_flight":{},"bound":{},"evicted":{},)"
      R"("rows":[)",
      sample.pools, sample.pages, sample.free, sample.in_flight, sample.bound, s.sg_sum.evicted);
  std::size_t shown = 0;
  for (const sg_pool_row& r : sample.sorted()) {
    if (shown == kStatusRowsMax) break;
    out.append(shown++ == 0 ? R"({"tenant":)" : R"(,{"tenant":)");
    put_string(out, r.tenant);
    put(out, R"(,"rank":{},"namespace":)", r.rank);
    put_string(out, r.ns);
    put(out, R"(,"num_pages":{},"free":{},"in_flight":{},"bound":{}}})", r.stats.num_pages,
        r.stats.free, r.stats.in_flight, r.stats.bound);
  }
  put(out, R"(],"truncated":{}}})", sample.pools > shown);
}

void put_warnings(std::string& out) {
  static constexpr std::string_view levels[] = {"error", "warn", "info", "debug"};
  put(out, R"("warnings":{{"total":{},"lines":[)", metad::log::recent_warnings.total());
  bool first = true;
  metad::log::recent_warnings.newest(kStatusWarnings, [&](const metad::log::recent_line& l) {
    if (!first) out.push_back(',');
    first = false;
    put(out, R"({{"time":{},"level":"{}","message":)", l.unix_ms,
        levels[static_cast<int>(l.level)]);
    put_string(out, l.message);
    out.push_back('}');
  });
  out.append("]}");
}

}  // namespace

endpoint_task run_status(connection& x) {
  node& nd = x.shared();
  scratch& s = x.work();
  begin_metrics(nd, s);
  co_await smp::for_each_core(nd.mailbox, x.home().index, smp::every_core,
                              [&](int c) { collect_metrics(nd, *nd.core[c], s); });
  end_metrics(nd, s);
  const metrics_snapshot& snap = *s.snapshot;
  std::string& out = s.body;
  out.clear();
  put(out, R"({{"version":"{}","now":{},"uptime_s":{:.3f},"cores":{},)", METAD_VERSION,
      unix_ms_now(), static_cast<double>(smp::monotonic_ns() - nd.started_ns) / 1e9, nd.cores);
  put_node(out, nd);
  put(out, R"(,"memory":{{"used":{},"max":{}}},)", snap.memory_used, snap.memory_max);
  put_lookups(out, snap);
  put(out,
      R"(,"allocations":{{"vllm":{{"free":{},"eviction":{}}},"sglang":{{"free":{},)"
      R"("eviction":{}}}}},)",
      snap.allocations.vllm_free, snap.allocations.vllm_eviction, snap.allocations.sglang_free,
      snap.allocations.sglang_eviction);
  put_endpoints(out, snap.requests);
  out.push_back(',');
  put_ranks(out, s, snap);
  out.push_back(',');
  put_sglang(out, s);
  out.push_back(',');
  put_warnings(out);
  out.push_back('}');
  co_return answer::json(200, out);
}

}  // namespace metad::pipeline
