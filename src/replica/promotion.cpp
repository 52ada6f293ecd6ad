// Roles: what the ha thread tells replication (on_role, may_campaign), and promotion: a
// standby that won the lease parks its cores, finishes the replay off the ha thread and
// serves as a leader. A node that led and was deposed exits to resync (kExitResync).
#include <chrono>

#include "metad/assert.hpp"
#include "metad/log.hpp"
#include "persist/durability.hpp"
#include "replica/replication_impl.hpp"

namespace metad::replica {

// A core in poll() while promotion asked: it waits there until promotion is done.
void replication::impl::park() {
  std::unique_lock lock(park_mutex);
  ++parked;
  METAD_ASSERT(parked <= nd.cores);
  park_cv.notify_all();
  park_cv.wait(lock, [this] { return !park_asked.load(); });
  --parked;
}

// False if the node stopped first (it then never serves).
bool replication::impl::promote() {
  auto t = std::chrono::steady_clock::now();
  link->set_mode(repl::link::mode::idle);  // the old leader's streams end first
  {
    std::unique_lock lock(park_mutex);
    park_asked = true;
    wake_cores();
    // A core that stopped (SIGTERM) never parks: then the node stops without serving.
    while (!park_cv.wait_for(lock, std::chrono::milliseconds(50),
                             [this] { return parked == nd.cores; }))
      if (nd.stopping.load()) {
        park_asked = false;
        park_cv.notify_all();
        return false;
      }
  }
  // Every core is parked: their ends become a leader's (a standby's never come back).
  std::vector<std::unique_ptr<persist::standby_core>> appliers;
  for (core_end& e : ends) {
    following_end* f = e.standby();
    METAD_ASSERT(f != nullptr);
    appliers.push_back(std::move(f->applier));
    e.role.emplace<leading_end>();
  }
  persist::promote_standby(nd, appliers, *feed);
  // A leader now, with no standby of its own yet: its progress starts over.
  for (int c = 0; c < nd.cores; ++c) share(c).state = progress::none;
  mode = start_as::primary;
  nd.repl.following = false;
  nd.repl.caught_up = false;
  nd.repl.promotions.fetch_add(1);
  {
    std::lock_guard lock(park_mutex);
    park_asked = false;
  }
  park_cv.notify_all();
  link->set_mode(repl::link::mode::accept);
  log::info(
      "replication: promoted in {:.1f} ms",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
  return true;
}

void replication::on_role(ha::role from, ha::role to, std::int64_t) {
  impl& m = *impl_;
  const bool primary = m.mode.load() == start_as::primary;
  if (to == ha::role::leader) {
    if (primary) return m.link->set_mode(repl::link::mode::accept);
    // Off the ha thread, which must keep renewing the lease meanwhile; the API stays 503
    // until the replay is finished.
    if (!m.promotion.joinable()) {
      m.nd.repl.promoting = true;
      m.promotion = std::thread([&m] {
        if (m.promote()) m.nd.repl.promoting.store(false, std::memory_order_release);
      });
    }
    return;
  }
  if (to != ha::role::standby) return;
  if (m.nd.repl.promoting.load())
    exit_to_resync("this node lost the lease while it was taking over");
  if (primary)
    exit_to_resync(from == ha::role::candidate
                       ? "another node leads: this node's own state may have forked from it"
                       : "this node was deposed: its state may have forked from the new leader's");
  const auto leader = m.nd.ha->leader();
  if (!leader || leader->repl.empty()) {
    log::warn("replication: the leader names no replication address: waiting");
    m.link->set_mode(repl::link::mode::idle);
    return;
  }
  log::info("replication: following node {} at {}{}", leader->node, leader->repl,
            m.nd.cfg.repl_tls_cert.empty() ? "" : " (TLS: its certificate must name it)");
  m.link->set_mode(repl::link::mode::follow, leader->repl, leader->node);
}

bool replication::may_campaign(const std::optional<std::string>& sync) const {
  if (!ha::listed_in_sync(sync, impl_->nd.cfg.ha_node)) return false;
  // A standby leads only with the whole of the leader's state (promotion needs it).
  return !standby() || impl_->all(impl::progress::caught_up);
}

}  // namespace metad::replica
