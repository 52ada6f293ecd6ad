#include "pipeline/ha_gate.hpp"

#include <fmt/format.h>

#include <iterator>

#include "smp/clock.hpp"

namespace metad::pipeline {
namespace {

// This core's detail, rebuilt when the control's leader changes.
struct detail_cache {
  const ha::control* control = nullptr;
  std::uint64_t changes = 0;
  std::string detail;
};
thread_local detail_cache cached;

void build_detail(const node& nd, std::string& out) {
  const auto leader = nd.ha->leader();
  out.clear();
  if (!leader || leader->node.empty()) {
    out = "not the leader; no leader is known (an election, or no node that may lead is up)";
  } else if (leader->node == nd.ha->settings().node) {
    out = fmt::format(
        "not serving: this node ({}) holds the leader key but its lease is not confirmed; no "
        "leader until it is",
        leader->node);
  } else if (leader->http.empty()) {
    out = fmt::format("not the leader; the leader is node {}", leader->node);
  } else {
    out = fmt::format("not the leader; the leader is node {} at {}", leader->node, leader->http);
  }
}

std::string_view health_body(ha::role r) {
  switch (r) {
    case ha::role::leader:
      return R"({"status":"ok","role":"leader"})";
    case ha::role::standby:
      return R"({"status":"ok","role":"standby"})";
    case ha::role::fenced:
      return R"({"status":"ok","role":"fenced"})";
    case ha::role::candidate:
      break;
  }
  return R"({"status":"ok","role":"candidate"})";
}

}  // namespace

std::string_view not_leader_detail(const node& nd) {
  const std::uint64_t changes = nd.ha->leader_changes();
  if (nd.ha != cached.control || changes != cached.changes) {
    build_detail(nd, cached.detail);
    cached.control = nd.ha;
    cached.changes = changes;
  }
  return cached.detail;
}

answer health_answer(const node& nd) {
  if (nd.ha == nullptr) return answer::canned(http::canned::health_ok);
  return answer::json(200, health_body(nd.ha->current()));
}

answer ready_answer(const node& nd) {
  if (nd.stopping.load(std::memory_order_relaxed)) return answer::canned(http::canned::not_ready);
  if (!ha_serving(nd, smp::monotonic_ns())) return answer::error(503, not_leader_detail(nd));
  return answer::canned(http::canned::ready_ok);
}

void render_ha_metrics(std::string& out, const node& nd) {
  if (nd.ha == nullptr) return;
  auto it = std::back_inserter(out);
  const ha::role now = nd.ha->current();
  fmt::format_to(it,
                 "# HELP hf3fs_metad_ha_role This node's high-availability role: 1 for the "
                 "current one.\n# TYPE hf3fs_metad_ha_role gauge\n");
  for (const ha::role r :
       {ha::role::candidate, ha::role::leader, ha::role::standby, ha::role::fenced})
    fmt::format_to(it, "hf3fs_metad_ha_role{{role=\"{}\"}} {}\n", ha::to_string(r),
                   r == now ? 1 : 0);
  fmt::format_to(it,
                 "# HELP hf3fs_metad_ha_serving 1 while this node answers the API (it leads "
                 "and its lease deadline has not passed).\n# TYPE hf3fs_metad_ha_serving "
                 "gauge\nhf3fs_metad_ha_serving {}\n",
                 ha_serving(nd, smp::monotonic_ns()) ? 1 : 0);
  fmt::format_to(it,
                 "# HELP hf3fs_metad_ha_epoch The epoch this node leads at (the leader key's "
                 "etcd create_revision); 0 when it does not lead.\n# TYPE hf3fs_metad_ha_epoch "
                 "gauge\nhf3fs_metad_ha_epoch {}\n",
                 nd.ha->epoch());
  fmt::format_to(it,
                 "# HELP hf3fs_metad_ha_leader_changes_total Changes of the leader this node "
                 "knows of (including none).\n# TYPE hf3fs_metad_ha_leader_changes_total "
                 "counter\nhf3fs_metad_ha_leader_changes_total {}\n",
                 nd.ha->leader_changes());
  fmt::format_to(it,
                 "# HELP hf3fs_metad_ha_foreign_leader_key 1 while etcd's leader key is one no "
                 "node of this cluster wrote (no lease, or a value no node writes): no node "
                 "leads meanwhile; the log says how to remove it.\n# TYPE "
                 "hf3fs_metad_ha_foreign_leader_key gauge\nhf3fs_metad_ha_foreign_leader_key {}\n",
                 nd.ha->foreign_leader_key() ? 1 : 0);
  fmt::format_to(it,
                 "# HELP hf3fs_metad_ha_foreign_leader_keys_total Foreign leader keys (writes) "
                 "this node has seen in etcd.\n# TYPE hf3fs_metad_ha_foreign_leader_keys_total "
                 "counter\nhf3fs_metad_ha_foreign_leader_keys_total {}\n",
                 nd.ha->foreign_leader_keys_seen());
  if (!nd.repl.enabled.load()) return;
  const auto& r = nd.repl;
  const auto metric = [&](const char* name, const char* help, const char* type,
                          std::uint64_t value) {
    fmt::format_to(it, "# HELP {0} {1}\n# TYPE {0} {2}\n{0} {3}\n", name, help, type, value);
  };
  metric("hf3fs_metad_repl_in_sync",
         "1 while a standby is in etcd's /sync and every write waits for its acknowledgement "
         "(leader).",
         "gauge", r.in_sync.load() ? 1 : 0);
  metric("hf3fs_metad_repl_caught_up", "1 once this standby holds the leader's whole state.",
         "gauge", r.caught_up.load() ? 1 : 0);
  metric("hf3fs_metad_repl_lag_bytes",
         "Log bytes sent to the standby and not yet acknowledged, all cores (leader).", "gauge",
         r.lag_bytes.load());
  metric("hf3fs_metad_repl_snapshots_sent_total", "Core states sent to a standby that joined.",
         "counter", r.snapshots_sent.load());
  metric("hf3fs_metad_repl_standby_drops_total", "Times the standby was taken off /sync.",
         "counter", r.drops.load());
  metric("hf3fs_metad_repl_promotions_total", "Times this standby took over.", "counter",
         r.promotions.load());
  fmt::format_to(it,
                 "# HELP hf3fs_metad_repl_refused_connections_total Connections to --repl-listen "
                 "refused: handshake (TLS: none, no certificate, another CA's), name (the "
                 "certificate does not name the node the hello claims), taken (another node's "
                 "streams are live), core (a core this node lacks), rate (over 64 TLS handshakes a "
                 "second).\n# TYPE "
                 "hf3fs_metad_repl_refused_connections_total counter\n");
  static constexpr const char* reasons[] = {"handshake", "name", "taken", "core", "rate"};
  for (std::size_t i = 0; i < std::size(reasons); ++i)
    fmt::format_to(it, "hf3fs_metad_repl_refused_connections_total{{reason=\"{}\"}} {}\n",
                   reasons[i], r.refused[i].load());
}

}  // namespace metad::pipeline
