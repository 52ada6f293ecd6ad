// A randomised two-node simulation of the leadership state machine against a model of
// etcd (lease expiry at exactly the TTL after the last renewal it processed, the worst
// case), with message delays, partitions, frozen threads, watches that lag, and keys
// forged without a lease (written over the leader's key, or into an empty one): no node
// ever serves unless etcd still holds its leader key (under its lease, or overwritten
// by a forged one the node has not noticed yet), never while another node holds the key,
// never two at once; and forged keys never stop the cluster for good.
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
  struct event {
    std::int64_t revision;
    bool deleted;
    ha::holder key;  // a put's key
  };
  std::vector<event> history;

  void expire(ha::time_point now) {
    for (auto it = leases.begin(); it != leases.end();) {
      if (now >= it->second.expires) {
        if (key && key->lease == it->first) {
          key.reset();
          history.push_back({++revision, true, {}});
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
    bool processed = false;  // etcd has seen it (a request of latency 0 or 1 too)
    std::int64_t lease = 0, ttl = 0, revision = 0, mod_revision = 0;
    bool removed = false;
    std::optional<ha::holder> key;
  };
  std::optional<request> pending;
  ha::time_point cut_until{};         // partitioned from etcd until then
  ha::time_point frozen_until{};      // its thread does nothing until then
  ha::time_point watch_late_until{};  // its watch delivers nothing until then
};

void run_simulation(unsigned seed, bool forge) {
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
  bool served_late = false;  // some node served well after the last forged key
  const ha::time_point forging_ends = at(forge ? 20'000 : 0);
  for (ha::time_point now = t0; now < at(30'000); now += ms(1)) {
    // etcd checks expiry every 500 ms, so a key goes TTL..TTL+0.5 s after the renewal
    // it processed last; the model takes the worst case, exactly TTL.
    etcd.expire(now);
    // A writer with access to etcd puts the leader key without a lease: over the
    // holder's key (create_revision kept) or into an empty one.
    if (now < forging_ends && chance(0.0003)) {
      ++etcd.revision;
      const std::int64_t epoch = etcd.key ? etcd.key->epoch : etcd.revision;
      etcd.key = ha::holder{epoch, 0, "forged", etcd.revision};
      etcd.history.push_back({etcd.revision, false, *etcd.key});
    }
    for (sim_node& n : nodes) {
      if (chance(0.0005)) n.cut_until = now + ms(pick(100, 3000));
      if (chance(0.0002)) n.frozen_until = now + ms(pick(100, 2000));
      if (forge && chance(0.0005)) n.watch_late_until = now + ms(pick(100, 5000));
      auto& p = n.pending;
      if (p && !p->processed && now >= p->process_at) {
        p->processed = true;
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
          p->key = etcd.key;  // the read after the renewal
          p->revision = etcd.revision;
        } else if (p->kind == action_kind::remove_foreign) {
          p->removed = etcd.key && etcd.key->mod_revision == p->mod_revision;
          if (p->removed) {
            etcd.key.reset();
            etcd.history.push_back({++etcd.revision, true, {}});
          }
        } else if (p->kind == action_kind::grant) {
          p->lease = etcd.next_lease++;
          p->ttl = 1000;
          etcd.leases[p->lease] = {now + ms(1000), ms(1000)};
        } else if (p->kind == action_kind::campaign) {
          if (!etcd.key && etcd.leases.count(p->lease)) {
            ++etcd.revision;
            etcd.key = ha::holder{etcd.revision, p->lease, std::to_string(n.id), etcd.revision};
            etcd.history.push_back({etcd.revision, false, *etcd.key});
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
          n.machine.on_renewed(now, r.sent, ms(r.ttl), r.key, std::nullopt, r.revision);
        } else if (r.kind == action_kind::remove_foreign) {
          n.machine.on_foreign_removed(now, r.removed);
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
      if (now >= n.cut_until && now >= n.watch_late_until && n.machine.watch_revision() > 0) {
        for (const auto& e : etcd.history) {
          if (e.revision < n.machine.watch_revision()) continue;
          if (e.deleted) {
            n.machine.on_leader_deleted(now, e.revision);
          } else {
            n.machine.on_leader_put(now, e.key, e.revision);
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
      if (n.machine.foreign_key()) p->mod_revision = n.machine.foreign_key()->mod_revision;
    }
    // The property: a serving node's lease is alive in etcd and holds the key, or the
    // key is its own overwritten by a forged one (which no node may remove before the
    // node has stopped).
    int serving = 0;
    for (const sim_node& n : nodes) {
      if (!n.machine.serving(now)) continue;
      ++serving;
      ASSERT_TRUE(etcd.key.has_value()) << "seed " << seed << " t " << (now - t0).count();
      const bool own = etcd.key->lease == n.machine.lease();
      const bool overwritten = etcd.key->lease == 0 && etcd.key->epoch == n.machine.epoch();
      ASSERT_TRUE(own || overwritten) << "seed " << seed << " t " << (now - t0).count();
      ASSERT_TRUE(etcd.leases.count(n.machine.lease())) << "seed " << seed;
    }
    ASSERT_LE(serving, 1) << "seed " << seed;
    if (serving == 1 && now >= forging_ends + ms(5000)) served_late = true;
  }
  // Partitions and freezes move leadership around: it must have been won at least once,
  // and again after the last forged key (no forged key stops the cluster for good).
  EXPECT_GE(leaderships, 1) << "seed " << seed;
  EXPECT_TRUE(served_late) << "seed " << seed;
}

TEST(LeadershipSimulation, NoNodeEverServesWithoutHoldingTheKey) {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    run_simulation(seed, false);
    if (HasFatalFailure()) return;
  }
}

TEST(LeadershipSimulation, ForgedKeysWithoutALeaseNeverMakeTwoLeadersNorStopTheCluster) {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    run_simulation(seed, true);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
