// The ha control thread: one std::thread that holds (or waits for) the leader lease in
// etcd, driving the leadership state machine with the etcd client. Any thread may read
// serving() (one atomic) and the leader it knows of; the callback runs on the ha thread.
// The server starts one with --ha-etcd (server/ha_setup.cpp).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ha/etcd_access.hpp"
#include "ha/http_client.hpp"
#include "ha/leadership.hpp"

namespace metad::ha {

struct config {
  // etcd's members, with the TLS files (tls_paths; the context is made by prepare_etcd)
  // and the user and password (server/ha_setup.cpp fills them from metad::config).
  etcd_access etcd;
  std::string cluster;    // the nodes that share one lease
  std::string node;       // this node, unique in the cluster
  std::string advertise;  // the leader key's value; empty: {"node":"<ID>"}
  // A new leader writes /sync {"epoch":E,"leader":"<ID>","sync":[]} (fenced by its
  // epoch) before it serves. With no replication no standby is in sync, so after the
  // first leader of a cluster only that node may ever campaign (the /sync rule). Tests
  // of takeover without replication turn it off.
  bool claim_sync = true;
  ha::timing timings;
  milliseconds connect_timeout{100};
  milliseconds request_timeout{500};  // reads, grants and campaigns
};

// A cluster, node or etcd user name: 1-64 of A-Za-z0-9._- (etcd keys, log lines and
// etcdctl show them as they are).
bool valid_name(std::string_view name);
// Checks the whole configuration; empty when usable.
std::string validate(const config& c);
// After validate: makes the TLS context of https endpoints from the files; why not,
// naming the flag, or empty.
std::string prepare_etcd(config& c);
// --ha-etcd-password-file's rules: a regular file of at most 4 KiB, not readable or
// writable by group or others (chmod 600, or a systemd credential), whose first line
// (without surrounding blanks) is the password. The password, or nullopt and why.
std::optional<std::string> read_password_file(const std::string& path, std::string& error);

// Start-up's check of etcd access (TLS and authentication) before anything depends on
// it: each member in turn until one answers. `refused`: a member refused this
// configuration (its certificate does not verify, or the user or password is wrong):
// the start must stop, with `message`. `failed`: none answered (the ha thread will keep
// trying, as without TLS). ok: a member took the TLS handshake and the password.
struct access_check {
  enum class verdict { ok, refused, failed } outcome = verdict::failed;
  std::string message;
};
access_check check_etcd_access(const config& c, time_point deadline);

std::string leader_key(std::string_view cluster);
std::string sync_key(std::string_view cluster);

// The leader key's value fields: {"node":"<ID>","http":"<URL>","repl":"<HOST:PORT>"}
// (any may be absent); nullopt when the value is not such an object.
struct leader_info {
  std::string node;
  std::string http;
  std::string repl;  // where its standbys connect (--repl-listen); empty: no replication
};
std::optional<leader_info> parse_leader_value(std::string_view value);
// /sync's value as a new leader writes it: no standby in sync; or with `members`.
std::string sync_value(std::int64_t epoch, std::string_view leader,
                       const std::vector<std::string>& members = {});

// The /sync rule (Patroni's): with no /sync key anyone may campaign (bootstrap); else
// only its "leader" and the nodes in its "sync" list. A malformed value allows no one.
bool listed_in_sync(const std::optional<std::string>& sync, std::string_view node);

class control {
 public:
  using role_callback = std::function<void(role from, role to, std::int64_t epoch)>;

  // `may_campaign` defaults to listed_in_sync(…, node).
  explicit control(config c, role_callback on_role = {},
                   leadership::may_campaign_fn may_campaign = {});
  ~control();
  control(const control&) = delete;
  control& operator=(const control&) = delete;

  void start();
  // Ends the thread. The lease is left to expire, as after a crash, unless
  // `revoke_lease`: then serving ends first and the lease is revoked, so that another
  // node can take over at once.
  void stop(bool revoke_lease = false);

  bool serving() const { return serving(std::chrono::steady_clock::now()); }
  bool serving(time_point at) const {
    return at.time_since_epoch().count() < serving_until_.load(std::memory_order_acquire);
  }
  role current() const { return role_.load(std::memory_order_acquire); }
  std::int64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  // The send time of the last successful renewal (the fencing rule counts from it).
  time_point last_renewal_sent() const {
    return time_point(time_point::duration(renewed_sent_.load(std::memory_order_acquire)));
  }
  const config& settings() const { return config_; }
  // The holder of the leader key as last seen (this node included; nullopt: none known
  // or its value unreadable), and a count that changes whenever it does, so that readers
  // can keep what they built from it until then. leader() locks; leader_changes() is one
  // atomic load.
  std::optional<leader_info> leader() const;
  std::uint64_t leader_changes() const { return leader_changes_.load(std::memory_order_acquire); }
  // A foreign leader key (one without a lease, or whose value no node writes) is in
  // etcd as last seen; how many such keys (writes) this node has seen. Logged at error
  // level with the command that removes it. Any thread.
  bool foreign_leader_key() const { return foreign_present_.load(std::memory_order_acquire); }
  std::uint64_t foreign_leader_keys_seen() const {
    return foreign_seen_.load(std::memory_order_acquire);
  }

  // The leader's standbys in sync (docs/replication.md, "The sync set"): asks the ha
  // thread to write /sync with these members (a txn fenced by this node's epoch), and
  // returns the request's number. sync_written(n) is true once /sync holds request n or a later
  // one for the epoch current now; a node that does not lead (or lost the fence) writes
  // nothing and never reports it written. Any thread.
  std::uint64_t request_sync(std::vector<std::string> members);
  bool sync_written(std::uint64_t request) const {
    return sync_written_.load(std::memory_order_acquire) >= request;
  }

 private:
  void run();
  void publish(const leadership& machine);
  void report_foreign(const leadership& machine);
  void sleep_until(time_point at);

  config config_;
  role_callback on_role_;
  leadership::may_campaign_fn may_campaign_;
  std::atomic<std::int64_t> serving_until_{INT64_MIN};
  std::atomic<role> role_{role::candidate};
  std::atomic<std::int64_t> epoch_{0};
  std::atomic<std::int64_t> renewed_sent_{INT64_MIN};
  std::atomic<std::int64_t> lease_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> leader_changes_{0};
  std::atomic<bool> foreign_present_{false};
  std::atomic<std::uint64_t> foreign_seen_{0};
  std::int64_t foreign_reported_ = 0;  // ha thread only: the last foreign key logged
  // request_sync's numbers: asked (under mutex_, with the members) and written.
  std::uint64_t sync_asked_ = 0;
  std::vector<std::string> sync_members_;
  std::atomic<std::uint64_t> sync_written_{0};
  std::optional<holder> leader_seen_;  // ha thread only
  bool seen_unreadable_ = false;       // ha thread only: its value names no node
  std::optional<leader_info> leader_;  // under mutex_
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
};

}  // namespace metad::ha
