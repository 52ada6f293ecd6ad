// SGLang's pools in /stats and /metrics: each core adds its pools and counters to the
// request's sample (on that core); then, home, the sample becomes the /stats section
// ("sglang":{...}) or the Prometheus families.
#include <fmt/format.h>

#include <algorithm>

#include "pipeline/endpoints.hpp"

namespace metad::pipeline {

void sg_pool_sample::clear() {
  rows.clear();
  pools = pages = free = in_flight = bound = 0;
}

void sg_pool_sample::add(std::string_view tenant, std::int64_t rank, std::string_view ns,
                         const shard::sglang_pool_stats& stats) {
  ++pools;
  pages += stats.num_pages;
  free += stats.free;
  in_flight += stats.in_flight;
  bound += stats.bound;
  if (rows.size() == 2 * kRankRowsMax) {
    auto middle = rows.begin() + static_cast<std::ptrdiff_t>(kRankRowsMax);
    std::nth_element(
        rows.begin(), middle, rows.end(),
        [](const sg_pool_row& a, const sg_pool_row& b) { return a.order() < b.order(); });
    rows.erase(middle, rows.end());
  }
  rows.push_back({std::string(tenant), rank, std::string(ns), stats});
}

std::span<const sg_pool_row> sg_pool_sample::sorted() {
  std::sort(rows.begin(), rows.end(),
            [](const sg_pool_row& a, const sg_pool_row& b) { return a.order() < b.order(); });
  if (rows.size() > kRankRowsMax) rows.resize(kRankRowsMax);
  return rows;
}

void collect_sg_pools(const core_state& core, scratch& s) {
  const core_state::sglang_counters& c = core.sg_counters;
  core_state::sglang_counters& sum = s.sg_sum;
  sum.reinit_smaller += c.reinit_smaller;
  sum.evicted += c.evicted;
  sum.no_page += c.no_page;
  sum.expired += c.expired;
  sum.skipped += c.skipped;
  sum.release_refused += c.release_refused;
  sum.deleted += c.deleted;
  for (const auto& entry : core.sg_tenants) {
    const std::string_view tenant = entry.first;  // lambdas cannot capture bindings in C++20
    entry.second.for_each(
        [&](std::int64_t rank, std::string_view ns, const shard::sglang_pool& pool) {
          s.sg_rows.add(tenant, rank, ns, pool.stats());
        });
  }
}

void append_sg_stats(std::string& out, scratch& s) {
  sg_pool_sample& sample = s.sg_rows;
  out.append(R"("sglang":{"pools":[)");
  bool first = true;
  for (const sg_pool_row& r : sample.sorted()) {
    if (!first) out.push_back(',');
    first = false;
    out.append(R"({"tenant":")");
    api::append_escaped(out, r.tenant);
    out.append(R"(","rank":)");
    out.append(fmt::format_int(r.rank).str());
    out.append(R"(,"namespace":")");
    api::append_escaped(out, r.ns);
    fmt::format_to(std::back_inserter(out),
                   R"(","num_pages":{},"free":{},"in_flight":{},"bound":{}}})", r.stats.num_pages,
                   r.stats.free, r.stats.in_flight, r.stats.bound);
  }
  const core_state::sglang_counters& c = s.sg_sum;
  fmt::format_to(std::back_inserter(out),
                 R"(],"pools_total":{},"pools_truncated":{},"pages_total":{},"pages_free":{},)"
                 R"("pages_in_flight":{},"pages_bound":{},"evicted_keys":{},)"
                 R"("expired_reservations":{},"deleted_keys":{},"skipped_confirmations":{},)"
                 R"("refused_releases":{},"smaller_reinitializations":{}}})",
                 sample.pools, sample.pools > sample.rows.size(), sample.pages, sample.free,
                 sample.in_flight, sample.bound, c.evicted, c.expired, c.deleted, c.skipped,
                 c.release_refused, c.reinit_smaller);
}

namespace {

// A Prometheus label value: backslash, double quote and newline escaped.
void append_label(std::string& out, std::string_view text) {
  for (const char ch : text) {
    if (ch == '\\' || ch == '"') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (ch == '\n') {
      out.append("\\n");
    } else {
      out.push_back(ch);
    }
  }
}

}  // namespace

void render_sg_metrics(std::string& out, scratch& s) {
  sg_pool_sample& sample = s.sg_rows;
  const core_state::sglang_counters& c = s.sg_sum;
  auto to = std::back_inserter(out);
  fmt::format_to(
      to,
      "# HELP hf3fs_metad_sglang_pools SGLang pools, every tenant, rank and namespace.\n"
      "# TYPE hf3fs_metad_sglang_pools gauge\n"
      "hf3fs_metad_sglang_pools {}\n"
      "# HELP hf3fs_metad_sglang_pages_all Pages of every SGLang pool together, by state.\n"
      "# TYPE hf3fs_metad_sglang_pages_all gauge\n"
      "hf3fs_metad_sglang_pages_all{{state=\"total\"}} {}\n"
      "hf3fs_metad_sglang_pages_all{{state=\"free\"}} {}\n"
      "hf3fs_metad_sglang_pages_all{{state=\"in_flight\"}} {}\n"
      "hf3fs_metad_sglang_pages_all{{state=\"bound\"}} {}\n"
      "# HELP hf3fs_metad_sglang_events_total SGLang pool events: keys evicted by reserves, "
      "reservations expired, keys deleted, confirmations skipped, releases of bound pages "
      "refused, initializations with fewer pages than the pool has.\n"
      "# TYPE hf3fs_metad_sglang_events_total counter\n"
      "hf3fs_metad_sglang_events_total{{event=\"evicted\"}} {}\n"
      "hf3fs_metad_sglang_events_total{{event=\"expired\"}} {}\n"
      "hf3fs_metad_sglang_events_total{{event=\"deleted\"}} {}\n"
      "hf3fs_metad_sglang_events_total{{event=\"confirm_skipped\"}} {}\n"
      "hf3fs_metad_sglang_events_total{{event=\"release_refused\"}} {}\n"
      "hf3fs_metad_sglang_events_total{{event=\"reinit_smaller\"}} {}\n"
      "# HELP hf3fs_metad_sglang_pool_series_omitted SGLang pools without per-pool series.\n"
      "# TYPE hf3fs_metad_sglang_pool_series_omitted gauge\n",
      sample.pools, sample.pages, sample.free, sample.in_flight, sample.bound, c.evicted, c.expired,
      c.deleted, c.skipped, c.release_refused, c.reinit_smaller);
  const std::span<const sg_pool_row> rows = sample.sorted();
  fmt::format_to(to, "hf3fs_metad_sglang_pool_series_omitted {}\n", sample.pools - rows.size());
  out.append(
      "# HELP hf3fs_metad_sglang_pool_pages Pages of an SGLang pool, by state (the first "
      "pools by tenant, rank and namespace).\n"
      "# TYPE hf3fs_metad_sglang_pool_pages gauge\n");
  for (const sg_pool_row& r : rows) {
    const std::pair<std::string_view, std::uint64_t> states[] = {{"total", r.stats.num_pages},
                                                                 {"free", r.stats.free},
                                                                 {"in_flight", r.stats.in_flight},
                                                                 {"bound", r.stats.bound}};
    for (const auto& [state, value] : states) {
      out.append("hf3fs_metad_sglang_pool_pages{tenant=\"");
      append_label(out, r.tenant);
      fmt::format_to(to, "\",rank=\"{}\",namespace=\"", r.rank);
      append_label(out, r.ns);
      fmt::format_to(to, "\",state=\"{}\"}} {}\n", state, value);
    }
  }
}

}  // namespace metad::pipeline
