// POST /keys/inspect: what every core holds of each key of the request. One walk over
// every core, as /stats walks them: each core reports its ranks' holds on the keys (a
// lookup per rank it owns) and, on the directory's cores, the keys whose slice is there.
// Read-only: no recency, lease or log record changes. Times go out as Unix epoch
// milliseconds, converted home from the server's monotonic clock.
#include <algorithm>

#include "pipeline/endpoints.hpp"
#include "smp/for_each_core.hpp"

namespace metad::pipeline {

endpoint_task run_inspect(connection& x) {
  node& nd = x.shared();
  scratch& s = x.work();
  const api::key_list& keys = s.inspect.keys;
  const std::size_t n = keys.size();
  // Sized here (n is at most api::kInspectKeysMax); the holds grow on the cores only
  // when a key is held by more ranks than this guess.
  s.inspect_reports.assign(n, shard::key_report{});
  s.inspect_holds.clear();
  s.inspect_holds.reserve(4 * n + 16);
  co_await smp::for_each_core(nd.mailbox, x.home().index, smp::every_core, [&](int c) {
    const vllm_space* sp = nd.core[c]->find_space(s.space);  // the tenant's own keys
    if (sp == nullptr) return;
    for (std::uint32_t i = 0; i < n; ++i) {
      if (sp->ranks.rank_count() != 0) {
        sp->ranks.inspect_key(keys[i], [&](std::int64_t rank, std::int64_t page, bool confirmed,
                                           std::uint64_t deadline) {
          s.inspect_holds.push_back({i, {rank, page, confirmed, -1}, deadline});
        });
      }
      if (c < nd.directory_cores && nd.key_owner(keys[i]) == c)
        s.inspect_reports[i] = sp->directory.inspect(keys[i]);
    }
  });
  const std::uint64_t now = nd.clock();
  const std::int64_t wall = unix_ms_now();
  auto to_ms = [&](std::uint64_t t) -> std::int64_t {
    if (t == 0 || t == UINT64_MAX) return -1;
    return wall + (static_cast<std::int64_t>(t) - static_cast<std::int64_t>(now)) /
                      static_cast<std::int64_t>(smp::kNsPerMs);
  };
  std::sort(s.inspect_holds.begin(), s.inspect_holds.end(), [](const auto& a, const auto& b) {
    return a.key != b.key ? a.key < b.key : a.hold.rank < b.hold.rank;
  });
  for (auto& h : s.inspect_holds)
    if (!h.hold.confirmed) h.hold.reserved_until_ms = to_ms(h.deadline);
  // The holds, back to back in key order, as spans of api::inspect_hold.
  std::vector<api::inspect_hold>& holds = s.inspect_hold_rows;
  holds.clear();
  holds.reserve(s.inspect_holds.size());
  for (const auto& h : s.inspect_holds) holds.push_back(h.hold);
  s.inspect_rows.clear();
  s.inspect_rows.reserve(n);
  std::size_t at = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    std::size_t end = at;
    while (end < s.inspect_holds.size() && s.inspect_holds[end].key == i) ++end;
    const shard::key_report& r = s.inspect_reports[i];
    api::inspect_row row;
    row.key = keys[i];
    row.present = r.present;
    row.complete = r.complete;
    row.removing = r.removing;
    row.tp_world_size = r.tp_world_size;
    row.confirmations = r.confirmations;
    row.incomplete_since_ms =
        r.present && !r.complete && !r.removing ? to_ms(r.last_confirmed) : -1;
    row.last_used_ms = to_ms(r.last_used);
    row.leased_until_ms = r.lease_until > now ? to_ms(r.lease_until) : -1;
    row.holds = std::span<const api::inspect_hold>(holds.data() + at, end - at);
    s.inspect_rows.push_back(row);
    at = end;
  }
  s.body.clear();
  api::encode_inspect(s.body, s.inspect_rows);
  co_return answer::json(200, s.body);
}

}  // namespace metad::pipeline
