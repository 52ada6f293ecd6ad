// The leadership state machine (sans-IO): fed what etcd answered and the time, it says
// what to do next and whether this node may serve. Fencing rule (docs/replication.md,
// "Fencing and lease timing"): a leader serves only while now < send time of its last
// successful keepalive + TTL − margin, so it stops before etcd can expire its key.
// Owned by the ha thread; other threads read the published deadline, never this object.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace metad::ha {

using std::chrono::milliseconds;
using time_point = std::chrono::steady_clock::time_point;

enum class role {
  candidate,  // starting, or campaigning after the leader key went away
  leader,     // holds the leader key; serving while before its deadline
  standby,    // someone else leads (or nobody, and this node may not campaign)
  fenced,     // was leader, passed its deadline without a renewal: must not answer
};
const char* to_string(role r);

struct timing {
  milliseconds ttl{1000};               // lease TTL asked for (etcd may grant more)
  milliseconds renew_interval{200};     // keepalive period while leading
  milliseconds margin{150};             // the deadline ends this long before the lease
  milliseconds retry_interval{50};      // after a failed etcd call
  milliseconds recheck_interval{1000};  // standby: re-read the keys even if the watch is quiet
};

// The leader key as read from etcd: its create_revision is the epoch.
struct holder {
  std::int64_t epoch = 0;
  std::int64_t lease = 0;
  std::string value;
  std::int64_t mod_revision = 0;  // its last write (a compare-and-delete names it)
};

// A leader key that no node holds: every node campaigns with a lease, so a key with
// none (lease 0) was written by hand or by a foreign writer. It names no leader, never
// expires by itself, and a node removes it (compare-and-delete on its mod_revision)
// once it has been there, unchanged, for foreign_grace(): by then every node that held
// the key before it was overwritten has passed its deadline (leaders confirm their key
// after each renewal, see on_renewed), so removing it cannot make two leaders.
inline bool foreign(const holder& key) { return key.lease == 0; }

enum class action_kind {
  wait,            // nothing to do before `at`
  observe,         // read the leader and /sync keys → on_observed
  grant,           // grant a lease of timing.ttl → on_granted
  campaign,        // create-if-absent of the leader key with lease() → on_campaign
  keepalive,       // renew lease() → on_keepalive
  claim_sync,      // leader: write /sync {"epoch":key_epoch(),"leader":<this node>,"sync":[]},
                   // fenced by the leader key's create_revision → on_sync_claimed
  watch,           // standby: wait for changes of the leader key until `at` (every role
                   // follows the key's watch while it waits for its next action)
  remove_foreign,  // delete the leader key if its mod_revision is still
                   // foreign_key()->mod_revision → on_foreign_removed
};
const char* to_string(action_kind k);

struct action {
  action_kind kind = action_kind::wait;
  time_point at{};  // when to do it; for watch: how long to wait for events
};

class leadership {
 public:
  // Decides, from the /sync key's value (nullopt: no such key), whether this node may
  // campaign when no one leads.
  using may_campaign_fn = std::function<bool(const std::optional<std::string>& sync)>;

  // claim_sync: a new leader serves only once it has written /sync naming itself, with
  // no standby in sync (claim_sync action), so that only it may campaign afterwards.
  leadership(timing t, may_campaign_fn may_campaign, time_point now, bool claim_sync = false);

  // What to do next; first moves a leader past its deadline to fenced.
  action next(time_point now);

  // Answers. `sent_at` is when the request was sent (the fencing rule counts from it).
  void on_observed(time_point now, const std::optional<holder>& leader,
                   const std::optional<std::string>& sync, std::int64_t revision);
  void on_granted(time_point now, time_point sent_at, std::int64_t lease, milliseconds ttl);
  // `key` is the leader key after the txn (won iff it carries our lease).
  void on_campaign(time_point now, const std::optional<holder>& key, std::int64_t revision);
  // ttl == 0: the lease no longer exists.
  void on_keepalive(time_point now, time_point sent_at, milliseconds ttl);
  // A keepalive's answer and the keys read after it (at `revision`): the renewal
  // extends the deadline only if the leader key is still this node's (its lease, its
  // epoch); else the node stops as on_observed says. What the ha thread calls, so a
  // leader's deadline never outlives its key by more than a lease: a leader whose key
  // was overwritten, with a watch that lags, still stops within a TTL.
  void on_renewed(time_point now, time_point sent_at, milliseconds ttl,
                  const std::optional<holder>& key, const std::optional<std::string>& sync,
                  std::int64_t revision);
  // removed: the foreign key was deleted; false: it had changed (someone wrote it).
  void on_foreign_removed(time_point now, bool removed);
  // written: /sync now names this node for key_epoch(); false: the fence did not hold
  // (the leader key is no longer the one this node created).
  void on_sync_claimed(time_point now, bool written);
  // Watch events, at their mod_revision; older than watch_revision() are ignored. A
  // leader whose key is deleted stops serving at once.
  void on_leader_deleted(time_point now, std::int64_t revision);
  void on_leader_put(time_point now, const holder& key, std::int64_t revision);
  // The watch broke (member gone, cancelled): re-read, then watch again.
  void on_watch_broken(time_point now);
  // etcd did not answer the last action (unreachable, timeout, error answer).
  void on_etcd_failed(time_point now);

  role current() const { return role_; }
  bool serving(time_point now) const {
    return role_ == role::leader && sync_claimed() && now < deadline_;
  }
  // The instant up to which this node may serve (time_point::min() when it may not).
  time_point serving_until() const {
    return role_ == role::leader && sync_claimed() ? deadline_ : time_point::min();
  }
  std::int64_t epoch() const { return role_ == role::leader ? epoch_ : 0; }
  // The epoch of the leader key this node holds, leader or fenced (0: none).
  std::int64_t key_epoch() const { return epoch_; }
  // Whether /sync names this node for its epoch (always, without claim_sync).
  bool sync_claimed() const { return !claim_sync_ || synced_epoch_ == epoch_; }
  std::int64_t lease() const { return lease_; }
  // The first revision not yet seen (0: none read yet); a watch (re)opens from it.
  std::int64_t watch_revision() const { return watch_revision_; }
  const std::optional<holder>& known_leader() const { return known_; }
  // The foreign leader key (see foreign()) last read, while it is there (nullopt: none).
  const std::optional<holder>& foreign_key() const { return foreign_; }
  // Foreign leader keys seen so far (each write of one counts once).
  std::uint64_t foreign_keys_seen() const { return foreign_seen_; }
  // When a foreign key is removed: it was first seen at foreign_since(), plus
  // foreign_grace(), twice the longest lease TTL asked or granted (etcd may grant more
  // than asked: its minimum). Nodes of one cluster ask for the same TTL.
  time_point foreign_since() const { return foreign_since_; }
  milliseconds foreign_grace() const { return 2 * std::max(timing_.ttl, longest_ttl_); }
  time_point last_renewal_sent() const { return renewed_sent_; }
  const timing& config() const { return timing_; }

 private:
  void become_standby(time_point now, std::int64_t revision);
  // A foreign key read by a node that holds no key: wait it out, then remove it.
  void on_foreign(time_point now, const holder& key, const std::optional<std::string>& sync,
                  std::int64_t revision);
  void become_leader(time_point now, std::int64_t epoch, time_point deadline,
                     std::int64_t revision);
  // A leader's (or fenced leader's) next step: claim /sync first, then keep renewing.
  void schedule_holder_step(time_point now);
  void schedule(action_kind kind, time_point at);
  time_point deadline_from(time_point sent_at, milliseconds ttl) const;

  timing timing_;
  may_campaign_fn may_campaign_;
  role role_ = role::candidate;
  action step_;
  std::int64_t lease_ = 0;
  std::int64_t epoch_ = 0;
  time_point deadline_ = time_point::min();
  time_point grant_deadline_ = time_point::min();  // deadline the granted lease allows
  time_point renewed_sent_ = time_point::min();
  std::int64_t watch_revision_ = 0;
  std::optional<holder> known_;
  bool claim_sync_ = false;
  std::int64_t synced_epoch_ = 0;  // the epoch /sync was last claimed for
  std::optional<holder> foreign_;
  time_point foreign_since_{};
  std::uint64_t foreign_seen_ = 0;
  milliseconds longest_ttl_{0};  // the longest TTL etcd granted or renewed
  // A node that may not lead met a foreign key: it waits as a candidate (no leader to
  // follow) until a real leader is seen, so that becoming its standby is a role change.
  bool awaiting_leader_ = false;
};

}  // namespace metad::ha
