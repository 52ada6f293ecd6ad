#include "ha/leadership.hpp"

#include <algorithm>
#include <utility>

namespace metad::ha {

const char* to_string(role r) {
  switch (r) {
    case role::candidate:
      return "candidate";
    case role::leader:
      return "leader";
    case role::standby:
      return "standby";
    case role::fenced:
      return "fenced";
  }
  return "?";
}

const char* to_string(action_kind k) {
  switch (k) {
    case action_kind::wait:
      return "wait";
    case action_kind::observe:
      return "observe";
    case action_kind::grant:
      return "grant";
    case action_kind::campaign:
      return "campaign";
    case action_kind::keepalive:
      return "keepalive";
    case action_kind::watch:
      return "watch";
    case action_kind::claim_sync:
      return "claim_sync";
    case action_kind::remove_foreign:
      return "remove_foreign";
  }
  return "?";
}

leadership::leadership(timing t, may_campaign_fn may_campaign, time_point now, bool claim_sync)
    : timing_(t),
      may_campaign_(std::move(may_campaign)),
      step_{action_kind::observe, now},
      claim_sync_(claim_sync) {}

void leadership::schedule(action_kind kind, time_point at) { step_ = {kind, at}; }

time_point leadership::deadline_from(time_point sent_at, milliseconds ttl) const {
  return sent_at + ttl - timing_.margin;
}

action leadership::next(time_point now) {
  if (role_ == role::leader && now >= deadline_) role_ = role::fenced;
  if (step_.kind == action_kind::watch && now >= step_.at) {
    schedule(action_kind::observe, now);  // a quiet watch still re-reads now and then
  }
  if (role_ == role::leader && deadline_ < step_.at) return {action_kind::wait, deadline_};
  return step_;
}

void leadership::become_leader(time_point now, std::int64_t epoch, time_point deadline,
                               std::int64_t revision) {
  role_ = role::leader;
  epoch_ = epoch;
  deadline_ = deadline;
  watch_revision_ = std::max(watch_revision_, revision + 1);
  schedule_holder_step(now);
}

void leadership::schedule_holder_step(time_point now) {
  if (!sync_claimed()) {
    schedule(action_kind::claim_sync, now);
  } else if (role_ == role::fenced) {
    schedule(action_kind::keepalive, now);  // renew at once: the only way back to serving
  } else {
    schedule(action_kind::keepalive, renewed_sent_ + timing_.renew_interval);
  }
}

void leadership::become_standby(time_point now, std::int64_t revision) {
  role_ = role::standby;
  lease_ = 0;
  epoch_ = 0;
  deadline_ = time_point::min();
  watch_revision_ = std::max(watch_revision_, revision + 1);
  schedule(action_kind::watch, now + timing_.recheck_interval);
}

void leadership::on_observed(time_point now, const std::optional<holder>& leader,
                             const std::optional<std::string>& sync, std::int64_t revision) {
  known_ = leader;
  if (leader && foreign(*leader)) known_.reset();  // names no leader
  watch_revision_ = std::max(watch_revision_, revision + 1);
  if (role_ == role::leader || role_ == role::fenced) {
    // Verifying after a renewal that followed the deadline: resume only if the key is
    // still the one this node created, under this lease.
    if (leader && leader->lease == lease_ && leader->epoch == epoch_) {
      role_ = role::leader;
      watch_revision_ = std::max(watch_revision_, revision + 1);
      schedule_holder_step(now);
      return;
    }
    become_standby(now, revision);
    // Nobody leads (or a foreign key stands in the way): maybe campaign. Standby first,
    // for one step: a deposed leader says so before anything else.
    if (!leader || foreign(*leader)) schedule(action_kind::observe, now);
    return;
  }
  if (leader && foreign(*leader)) return on_foreign(now, *leader, sync, revision);
  foreign_.reset();
  if (leader) {
    awaiting_leader_ = false;
    // A campaign whose answer was lost may have won: the key then carries our lease.
    if (lease_ != 0 && leader->lease == lease_) {
      become_leader(now, leader->epoch, grant_deadline_, revision);
      return;
    }
    become_standby(now, revision);
    return;
  }
  if (may_campaign_(sync)) {
    awaiting_leader_ = false;
    role_ = role::candidate;
    schedule(action_kind::grant, now);
  } else {
    become_standby(now, revision);
    if (awaiting_leader_) role_ = role::candidate;  // still none since the foreign key
  }
}

void leadership::on_granted(time_point now, time_point sent_at, std::int64_t lease,
                            milliseconds ttl) {
  if (role_ != role::candidate) return;
  lease_ = lease;
  grant_deadline_ = deadline_from(sent_at, ttl);
  renewed_sent_ = sent_at;
  longest_ttl_ = std::max(longest_ttl_, ttl);
  if (foreign_) {
    // The grant told what TTL etcd gives: wait the foreign key out, then remove it.
    schedule(action_kind::remove_foreign, std::max(now, foreign_since_ + foreign_grace()));
    return;
  }
  schedule(action_kind::campaign, now);
}

void leadership::on_foreign(time_point now, const holder& key,
                            const std::optional<std::string>& sync, std::int64_t revision) {
  if (!foreign_ || foreign_->mod_revision != key.mod_revision || foreign_->epoch != key.epoch) {
    foreign_ = key;
    foreign_since_ = now;
    ++foreign_seen_;
  }
  // Only a node that may lead removes it: it campaigns next. The others wait as
  // candidates, not standbys (no leader to follow): they become standbys of whoever
  // leads next, a role change that a standby's replication follows.
  if (!may_campaign_(sync)) {
    become_standby(now, revision);
    role_ = role::candidate;
    awaiting_leader_ = true;
    return;
  }
  role_ = role::candidate;
  if (longest_ttl_.count() == 0) {
    schedule(action_kind::grant, now);  // learn the TTL etcd grants first
    return;
  }
  schedule(action_kind::remove_foreign, std::max(now, foreign_since_ + foreign_grace()));
}

void leadership::on_foreign_removed(time_point now, bool removed) {
  if (!foreign_ || role_ != role::candidate) return;
  (void)removed;  // either way: read what is there now (nothing, or someone's key)
  foreign_.reset();
  schedule(action_kind::observe, now);
}

void leadership::on_campaign(time_point now, const std::optional<holder>& key,
                             std::int64_t revision) {
  if (role_ != role::candidate) return;
  known_ = key;
  if (key && lease_ != 0 && key->lease == lease_) {
    become_leader(now, key->epoch, grant_deadline_, revision);
    return;
  }
  // Lost: the unused lease expires by itself within its TTL.
  become_standby(now, revision);
}

void leadership::on_keepalive(time_point now, time_point sent_at, milliseconds ttl) {
  if (role_ != role::leader && role_ != role::fenced) return;
  if (ttl.count() <= 0) {
    // The lease expired, and the key bound to it with it: someone else may lead now.
    role_ = role::standby;
    lease_ = 0;
    epoch_ = 0;
    deadline_ = time_point::min();
    schedule(action_kind::observe, now);
    return;
  }
  renewed_sent_ = std::max(renewed_sent_, sent_at);
  deadline_ = std::max(deadline_, deadline_from(sent_at, ttl));
  longest_ttl_ = std::max(longest_ttl_, ttl);
  if (role_ == role::leader) {
    schedule_holder_step(now);
  } else {
    schedule(action_kind::observe, now);
  }
}

void leadership::on_renewed(time_point now, time_point sent_at, milliseconds ttl,
                            const std::optional<holder>& key,
                            const std::optional<std::string>& sync, std::int64_t revision) {
  if (role_ != role::leader && role_ != role::fenced) return;
  if (ttl.count() > 0 && !(key && key->lease == lease_ && key->epoch == epoch_)) {
    // The lease lives but no longer holds the key (overwritten, deleted): the renewal
    // proves nothing, the deadline stays where it was and the node steps down.
    on_observed(now, key, sync, revision);
    return;
  }
  on_keepalive(now, sent_at, ttl);
}

void leadership::on_sync_claimed(time_point now, bool written) {
  if (role_ != role::leader && role_ != role::fenced) return;
  if (!written) {
    // The leader key is not (or no longer) the one of key_epoch(): find out whose it is.
    schedule(action_kind::observe, now);
    return;
  }
  synced_epoch_ = epoch_;
  schedule_holder_step(now);
}

void leadership::on_leader_deleted(time_point now, std::int64_t revision) {
  if (revision < watch_revision_) return;  // older than what a read already showed
  known_.reset();
  foreign_.reset();
  watch_revision_ = revision + 1;
  if (role_ == role::leader || role_ == role::fenced) {
    // Its own key is gone (its lease expired, or someone deleted the key): it stops
    // serving now, before another node can win the key.
    role_ = role::standby;
    lease_ = 0;
    epoch_ = 0;
    deadline_ = time_point::min();
  }
  // Re-read before campaigning: /sync decides whether this node may, and it may have
  // changed since the last read.
  schedule(action_kind::observe, now);
}

void leadership::on_leader_put(time_point now, const holder& key, std::int64_t revision) {
  if (revision < watch_revision_) return;
  known_ = key;
  watch_revision_ = revision + 1;
  if (foreign(key) || foreign_ || awaiting_leader_) {
    // A foreign key written, or the one being waited out replaced, or the leader a
    // waiting node waits for: read, then decide.
    if (foreign(key)) known_.reset();
    schedule(action_kind::observe, now);
    return;
  }
  if (role_ == role::leader || role_ == role::fenced) {
    if (key.lease != lease_ || key.epoch != epoch_) schedule(action_kind::observe, now);
  }
}

void leadership::on_watch_broken(time_point now) {
  schedule(action_kind::observe, now + timing_.retry_interval);
}

void leadership::on_etcd_failed(time_point now) {
  if (step_.kind == action_kind::keepalive) {
    schedule(action_kind::keepalive, now + timing_.retry_interval);
  } else if (step_.kind == action_kind::claim_sync) {
    // Retry, but keep the lease alive meanwhile: a renewal due first goes first (its
    // answer brings the claim back).
    const time_point renew = renewed_sent_ + timing_.renew_interval;
    const time_point retry = now + timing_.retry_interval;
    schedule(renew <= retry ? action_kind::keepalive : action_kind::claim_sync,
             std::max(now, std::min(renew, retry)));
  } else {
    schedule(action_kind::observe, now + timing_.retry_interval);
  }
}

}  // namespace metad::ha
