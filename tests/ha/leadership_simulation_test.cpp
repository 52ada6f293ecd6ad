// A randomised two-node simulation of the leadership state machine against a model of
// etcd (lease expiry at exactly the TTL after the last renewal it processed, the worst
// case), with message delays, partitions and frozen threads: no node ever serves
// unless etcd still holds the leader key under its lease, and never two at once.
#include "ha/leadership.hpp"

#include <gtest/gtest.h>

#include "fake_time.hpp"

#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace metad;

namespace {

using ha::action_kind;
using ha::role;
using ms = std::chrono::milliseconds;

using ha::fake_time::at;
using ha::fake_time::t0;

struct model_etcd {
  std::int64_t revision = 1;
  std::int64_t next_lease = 1;
  struct lease_state {
    ha::time_point expires;
    ms ttl;
  };
  std::map<std::int64_t, lease_state> leases;
  std::optional<ha::holder> key;
  std::vector<std::pair<std::int64_t, bool>> history;  // (revision, deleted)

  void expire(ha::time_point now) {
    for (auto it = leases.begin(); it != leases.end();) {
      if (now >= it->second.expires) {
        if (key && key->lease == it->first) {
          key.reset();
          history.push_back({++revision, true});
        }
        it = leases.erase(it);
      } else {
        ++it;
      }
    }
  }
};

struct sim_node {
  int id = 0;
  ha::leadership machine;
  struct request {
    action_kind kind;
    ha::time_point sent, process_at, answer_at;
    bool failed = false;
    std::int64_t lease = 0, ttl = 0, revision = 0;
    std::optional<ha::holder> key;
  };
  std::optional<request> pending;
  ha::time_point cut_until{};     // partitioned from etcd until then
  ha::time_point frozen_until{};  // its thread does nothing until then
};

void run_simulation(unsigned seed) {
  std::mt19937 rng(seed);
  auto chance = [&](double p) { return std::uniform_real_distribution<>(0, 1)(rng) < p; };
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<>(lo, hi)(rng); };
  model_etcd etcd;
  std::vector<sim_node> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back({i,
                     ha::leadership(
                         ha::timing{}, [](const auto&) { return true; }, t0),
                     std::nullopt,
                     {},
                     {}});
  }
  int leaderships = 0;
  for (ha::time_point now = t0; now < at(30'000); now += ms(1)) {
    // etcd checks expiry every 500 ms, so a key goes TTL..TTL+0.5 s after the renewal
    // it processed last; the model takes the worst case, exactly TTL.
    etcd.expire(now);
    for (sim_node& n : nodes) {
      if (chance(0.0005)) n.cut_until = now + ms(pick(100, 3000));
      if (chance(0.0002)) n.frozen_until = now + ms(pick(100, 2000));
      auto& p = n.pending;
      if (p && now == p->process_at) {
        if (now < n.cut_until) {
          p->failed = true;
          p->answer_at = std::max(p->answer_at, p->sent + ms(200));  // a timeout
        } else if (p->kind == action_kind::keepalive) {
          auto it = etcd.leases.find(p->lease);
          p->ttl = 0;
          if (it != etcd.leases.end()) {
            it->second.expires = now + it->second.ttl;
            p->ttl = it->second.ttl.count();
          }
        } else if (p->kind == action_kind::grant) {
          p->lease = etcd.next_lease++;
          p->ttl = 1000;
          etcd.leases[p->lease] = {now + ms(1000), ms(1000)};
        } else if (p->kind == action_kind::campaign) {
          if (!etcd.key && etcd.leases.count(p->lease)) {
            etcd.key = ha::holder{++etcd.revision, p->lease, std::to_string(n.id)};
            etcd.history.push_back({etcd.revision, false});
          }
          p->key = etcd.key;
          p->revision = etcd.revision;
        } else if (p->kind == action_kind::observe) {
          p->key = etcd.key;
          p->revision = etcd.revision;
        }
      }
      if (now < n.frozen_until) continue;
      if (p && now >= p->answer_at) {
        const sim_node::request r = *p;
        p.reset();
        if (r.failed) {
          n.machine.on_etcd_failed(now);
        } else if (r.kind == action_kind::keepalive) {
          n.machine.on_keepalive(now, r.sent, ms(r.ttl));
        } else if (r.kind == action_kind::grant) {
          n.machine.on_granted(now, r.sent, r.lease, ms(r.ttl));
        } else if (r.kind == action_kind::campaign) {
          const bool was_leader = n.machine.current() == role::leader;
          n.machine.on_campaign(now, r.key, r.revision);
          if (!was_leader && n.machine.current() == role::leader) ++leaderships;
        } else {
          n.machine.on_observed(now, r.key, std::nullopt, r.revision);
        }
      }
      // Every node follows the key's watch (events arrive while it waits or works).
      if (now >= n.cut_until && n.machine.watch_revision() > 0) {
        for (const auto& [rev, deleted] : etcd.history) {
          if (rev < n.machine.watch_revision()) continue;
          if (deleted) {
            n.machine.on_leader_deleted(now, rev);
          } else if (etcd.key && etcd.key->epoch == rev) {
            n.machine.on_leader_put(now, *etcd.key, rev);
          }
        }
      }
      if (p) continue;
      const ha::action a = n.machine.next(now);
      if (a.kind == action_kind::watch) continue;
      if (a.kind == action_kind::wait || a.at > now) continue;
      const int latency = chance(0.1) ? pick(50, 400) : pick(0, 8);
      p.emplace();
      p->kind = a.kind;
      p->sent = now;
      p->process_at = now + ms(latency / 2);
      p->answer_at = now + ms(latency);
      p->lease = n.machine.lease();
    }
    // The property: a serving node's lease is alive in etcd and holds the key.
    int serving = 0;
    for (const sim_node& n : nodes) {
      if (!n.machine.serving(now)) continue;
      ++serving;
      ASSERT_TRUE(etcd.key.has_value()) << "seed " << seed << " t " << (now - t0).count();
      ASSERT_EQ(etcd.key->lease, n.machine.lease()) << "seed " << seed;
      ASSERT_TRUE(etcd.leases.count(n.machine.lease())) << "seed " << seed;
    }
    ASSERT_LE(serving, 1) << "seed " << seed;
  }
  // Partitions and freezes move leadership around: it must have been won at least once.
  EXPECT_GE(leaderships, 1) << "seed " << seed;
}

TEST(LeadershipSimulation, NoNodeEverServesWithoutHoldingTheKey) {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    run_simulation(seed);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
