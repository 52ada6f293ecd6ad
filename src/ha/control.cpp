#include "ha/control.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ha/etcd.hpp"
#include "metad/assert.hpp"
#include "metad/log.hpp"

namespace metad::ha {
namespace {

std::int64_t ticks(time_point t) { return t.time_since_epoch().count(); }

std::optional<holder> to_holder(const std::optional<key_value>& kv) {
  if (!kv) return std::nullopt;
  return holder{kv->create_revision, kv->lease, kv->value, kv->mod_revision};
}

using log::printable;  // an etcd value is whatever someone wrote into etcd

}  // namespace

std::string leader_key(std::string_view cluster) {
  return fmt::format("/hf3fs-metad/{}/leader", cluster);
}
std::string sync_key(std::string_view cluster) {
  return fmt::format("/hf3fs-metad/{}/sync", cluster);
}

std::optional<std::string> read_password_file(const std::string& path, std::string& error) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    error = fmt::format("--ha-etcd-password-file {}: cannot open: {}", path, std::strerror(errno));
    return std::nullopt;
  }
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    error = fmt::format("--ha-etcd-password-file {}: not a regular file", path);
  } else if ((st.st_mode & 077) != 0) {
    error = fmt::format(
        "--ha-etcd-password-file {}: readable or writable by group or others (mode {:04o}): "
        "chmod 600 it",
        path, st.st_mode & 07777);
  } else if (st.st_size > 4096) {
    error = fmt::format("--ha-etcd-password-file {}: over 4 KiB", path);
  } else {
    text.resize(static_cast<std::size_t>(st.st_size));
    const ssize_t n = ::read(fd, text.data(), text.size());
    if (n != static_cast<ssize_t>(text.size())) {
      error = fmt::format("--ha-etcd-password-file {}: cannot read it", path);
    }
  }
  ::close(fd);
  if (!error.empty()) return std::nullopt;
  text = text.substr(0, text.find('\n'));
  const auto first = text.find_first_not_of(" \t\r");
  const auto last = text.find_last_not_of(" \t\r");
  if (first == std::string::npos) {
    error = fmt::format("--ha-etcd-password-file {}: the password is empty", path);
    return std::nullopt;
  }
  return text.substr(first, last - first + 1);
}

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::string validate(const config& c) {
  if (c.etcd.empty()) return "--ha-etcd is required";
  const etcd_access& e = c.etcd;
  std::size_t secure = 0;
  for (const endpoint& at : e.endpoints) secure += at.tls ? 1 : 0;
  if (secure != 0 && secure != e.size()) return "--ha-etcd: all https:// or all http://";
  const bool tls_files =
      !e.tls_paths.ca.empty() || !e.tls_paths.cert.empty() || !e.tls_paths.key.empty();
  if (secure == 0 && tls_files) {
    return "--ha-etcd-ca, --ha-etcd-cert and --ha-etcd-key need https:// --ha-etcd URLs";
  }
  if (e.tls_paths.cert.empty() != e.tls_paths.key.empty()) {
    return "--ha-etcd-cert and --ha-etcd-key go together";
  }
  if (e.user.empty() != e.password.empty()) {
    return "--ha-etcd-user and --ha-etcd-password-file go together";
  }
  if (!e.user.empty() && secure == 0) {
    return "--ha-etcd-user needs https:// --ha-etcd URLs (the password and etcd's tokens "
           "must not cross the network in clear)";
  }
  if (c.cluster.empty()) return "--ha-cluster is required";
  if (c.node.empty()) return "--ha-node is required";
  const timing& t = c.timings;
  // etcd leases are whole seconds.
  if (t.ttl.count() % 1000 != 0) return "--ha-ttl-ms must be whole seconds";
  // At least one renewal must be able to land before the deadline.
  if (t.renew_interval + t.margin >= t.ttl) return "--ha-renew-ms + --ha-margin-ms must be < TTL";
  return {};
}

std::string prepare_etcd(config& c) {
  c.etcd.tls.reset();
  if (c.etcd.empty() || !c.etcd.endpoints.front().tls) return {};
  std::string error;
  c.etcd.tls = tls_context::make(c.etcd.tls_paths, error);
  return error;
}

namespace {

std::string checked_against(const etcd_access& e) {
  if (e.tls_paths.ca.empty()) return "checked against the system's CAs: give --ha-etcd-ca";
  return fmt::format("checked against --ha-etcd-ca {}", e.tls_paths.ca);
}

}  // namespace

access_check check_etcd_access(const config& c, time_point deadline) {
  access_check out;
  std::vector<std::string> failures;
  const etcd_access& e = c.etcd;
  for (const endpoint& at : e.endpoints) {
    if (steady::now() >= deadline) break;
    const auto by = std::min(deadline, steady::now() + kAuthenticateTimeout);
    std::string error;
    if (!e.authenticates()) {
      // TLS only: the handshake is the check (nothing to check over plain http).
      if (!at.tls) return {access_check::verdict::ok, {}};
      connection probe;
      if (probe.open(at, by, error, e.tls.get())) return {access_check::verdict::ok, {}};
      if (probe.certificate_refused()) {
        return {access_check::verdict::refused, fmt::format("{} ({})", error, checked_against(e))};
      }
      failures.push_back(error);
      continue;
    }
    // One member at a time, so that a refusal names the member that refused.
    etcd_access single = e;
    single.endpoints = {at};
    etcd_client one(std::move(single), c.connect_timeout);
    switch (one.authenticate(by, error)) {
      case auth_outcome::ok:
        return {access_check::verdict::ok, {}};
      case auth_outcome::refused:
        return {access_check::verdict::refused, error};
      case auth_outcome::failed:
        if (error.find("does not verify") != std::string::npos) {
          return {access_check::verdict::refused,
                  fmt::format("{} ({})", error, checked_against(e))};
        }
        failures.push_back(error);
        break;
    }
  }
  out.message = failures.empty() ? "no etcd member answered in time"
                                 : fmt::format("{}", fmt::join(failures, "; "));
  return out;
}

std::optional<leader_info> parse_leader_value(std::string_view value) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::dom::object object;
  if (parser.parse(value.data(), value.size()).get(doc) || doc.get(object)) return std::nullopt;
  leader_info out;
  std::string_view text;
  if (!object["node"].get(text)) out.node = text;
  if (!object["http"].get(text)) out.http = text;
  if (!object["repl"].get(text)) out.repl = text;
  return out;
}

std::string sync_value(std::int64_t epoch, std::string_view leader,
                       const std::vector<std::string>& members) {
  std::string list;
  for (const std::string& m : members) list += fmt::format(R"({}"{}")", list.empty() ? "" : ",", m);
  return fmt::format(R"({{"epoch":{},"leader":"{}","sync":[{}]}})", epoch, leader, list);
}

bool listed_in_sync(const std::optional<std::string>& sync, std::string_view node) {
  if (!sync) return true;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(*sync).get(doc)) return false;
  std::string_view leader;
  if (!doc["leader"].get(leader) && leader == node) return true;
  simdjson::dom::array members;
  if (doc["sync"].get(members)) return false;
  for (simdjson::dom::element member : members) {
    std::string_view name;
    if (!member.get(name) && name == node) return true;
  }
  return false;
}

control::control(config c, role_callback on_role, leadership::may_campaign_fn may_campaign)
    : config_(std::move(c)), on_role_(std::move(on_role)), may_campaign_(std::move(may_campaign)) {
  if (config_.advertise.empty())
    config_.advertise = fmt::format(R"({{"node":"{}"}})", config_.node);
  if (!may_campaign_) {
    may_campaign_ = [node = config_.node](const std::optional<std::string>& sync) {
      return listed_in_sync(sync, node);
    };
  }
}

control::~control() { stop(); }

void control::start() {
  METAD_ASSERT(!thread_.joinable());
  stopping_ = false;
  thread_ = std::thread([this] { run(); });
}

void control::stop(bool revoke_lease) {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  if (revoke_lease && lease_.load() != 0) {
    serving_until_.store(INT64_MIN, std::memory_order_release);  // stop serving first
    etcd_client etcd(config_.etcd, config_.connect_timeout);
    auto revoked = etcd.revoke(lease_.load(), steady::now() + config_.request_timeout);
    if (!revoked) metad::log::warn("ha: lease revoke failed: {}", revoked.error);
  }
}

void control::sleep_until(time_point at) {
  std::unique_lock lock(mutex_);
  wake_.wait_until(lock, at, [this] { return stopping_.load(); });
}

std::uint64_t control::request_sync(std::vector<std::string> members) {
  std::uint64_t asked = 0;
  {
    std::lock_guard lock(mutex_);
    sync_members_ = std::move(members);
    asked = ++sync_asked_;
  }
  wake_.notify_all();
  return asked;
}

std::optional<leader_info> control::leader() const {
  std::lock_guard lock(mutex_);
  return leader_;
}

void control::publish(const leadership& machine) {
  const std::optional<holder>& known = machine.known_leader();
  const bool same =
      known.has_value() == leader_seen_.has_value() &&
      (!known || (known->epoch == leader_seen_->epoch && known->value == leader_seen_->value));
  if (!same) {
    leader_seen_ = known;
    std::optional<leader_info> info;
    if (known) info = parse_leader_value(known->value);
    seen_unreadable_ = known && (!info || info->node.empty());
    {
      std::lock_guard lock(mutex_);
      leader_ = std::move(info);
    }
    leader_changes_.fetch_add(1, std::memory_order_acq_rel);
  }
  serving_until_.store(ticks(machine.serving_until()), std::memory_order_release);
  epoch_.store(machine.epoch(), std::memory_order_release);
  lease_.store(machine.lease(), std::memory_order_release);
  renewed_sent_.store(ticks(machine.last_renewal_sent()), std::memory_order_release);
  report_foreign(machine);
  const role was = role_.exchange(machine.current(), std::memory_order_acq_rel);
  if (was != machine.current()) {
    // The key's epoch: a fenced leader still holds its key (epoch() is 0 off leader).
    metad::log::info("ha: node {} {} -> {} (epoch {})", config_.node, to_string(was),
                     to_string(machine.current()), machine.key_epoch());
    if (on_role_) on_role_(was, machine.current(), machine.epoch());
  }
}

void control::report_foreign(const leadership& machine) {
  // A key without a lease (the machine waits it out), or one whose value no node of
  // this cluster writes (under a live lease: it is left to expire).
  std::optional<holder> odd = machine.foreign_key();
  const std::optional<holder>& known = machine.known_leader();
  if (!odd && known && seen_unreadable_) odd = known;
  foreign_present_.store(odd.has_value(), std::memory_order_release);
  if (!odd || odd->mod_revision == foreign_reported_) return;
  foreign_reported_ = odd->mod_revision;
  foreign_seen_.fetch_add(1, std::memory_order_acq_rel);
  std::string endpoints;
  for (const endpoint& e : config_.etcd.endpoints) {
    endpoints += (endpoints.empty() ? "" : ",") + e.url;
  }
  const etcd_access& access = config_.etcd;
  if (!access.tls_paths.ca.empty()) endpoints += " --cacert " + access.tls_paths.ca;
  if (!access.tls_paths.cert.empty()) {
    endpoints += fmt::format(" --cert {} --key {}", access.tls_paths.cert, access.tls_paths.key);
  }
  if (access.authenticates()) endpoints += " --user " + access.user;
  const std::string key = leader_key(config_.cluster);
  const std::string remove =
      fmt::format("ETCDCTL_API=3 etcdctl --endpoints={} del {}", endpoints, key);
  if (foreign(*odd)) {
    metad::log::error(
        "ha: FOREIGN LEADER KEY: {} has no lease (written at etcd revision {}, value \"{}\"): "
        "no hf3fs-metad node wrote it (they write it under a lease) and while it is there "
        "no node leads, so the API answers 503. A node that may lead removes it if it is "
        "still unchanged {} ms after it first saw it, then campaigns. To remove it now: "
        "{} (then find who can write to etcd under /hf3fs-metad/)",
        key, odd->mod_revision, printable(odd->value), machine.foreign_grace().count(), remove);
  } else {
    metad::log::error(
        "ha: FOREIGN LEADER KEY: {} holds a value no hf3fs-metad node writes (etcd revision "
        "{}, lease {:x}, value \"{}\"): no node knows where the leader is. It goes when "
        "that lease ends; if something keeps renewing it, stop that writer, or remove the "
        "key once every node's /metrics shows hf3fs_metad_ha_serving 0: {}",
        key, odd->mod_revision, odd->lease, printable(odd->value), remove);
  }
}

namespace {

// What the ha thread holds while it runs: the etcd client, the leader key's watch and
// the state machine; perform() does one action and feeds the answer back.
class session {
 public:
  session(const config& c, const leadership::may_campaign_fn& may_campaign)
      : config_(c),
        etcd_(c.etcd, c.connect_timeout),
        machine_(c.timings, may_campaign, steady::now(), c.claim_sync),
        leader_(leader_key(c.cluster)),
        keys_{leader_, sync_key(c.cluster)} {}

  leadership& machine() { return machine_; }
  // Waits until `until` (or less) on the watch, or sleeps through `sleep` if it has none.
  template <typename Sleep>
  void wait(const action& next, time_point now, time_point until, Sleep&& sleep);
  void perform(const action& next, time_point sent);
  // A leader's /sync with `members` in sync; false if etcd did not take it.
  bool write_sync(const std::vector<std::string>& members);

 private:
  bool follow_watch(time_point now, time_point until);
  void failed(std::string_view what, const std::string& why) {
    metad::log::debug("ha: {} failed: {}", what, why);
    machine_.on_etcd_failed(steady::now());
  }

  const config& config_;
  etcd_client etcd_;
  etcd_watch watch_;
  leadership machine_;
  const std::string leader_;
  const std::vector<std::string> keys_;
  std::string error_;
  std::vector<watch_event> events_;
  time_point watch_retry_at_{};
};

// The leader key's watch stays open across actions (every role follows it: a standby
// to see the key go, a leader to see its own key deleted); it is reopened from the
// machine's revision after it ends, at most once per retry interval.
bool session::follow_watch(time_point now, time_point until) {
  if (!watch_.is_open()) {
    if (machine_.watch_revision() == 0 || now < watch_retry_at_) return false;
    if (!watch_.open(etcd_, leader_, machine_.watch_revision(),
                     std::min(until, now + config_.connect_timeout), error_)) {
      metad::log::debug("ha: watch failed: {}", error_);
      watch_retry_at_ = now + config_.timings.retry_interval;
      return false;
    }
  }
  events_.clear();
  const auto status = watch_.next(until, events_, error_);
  now = steady::now();
  for (const watch_event& event : events_) {
    if (event.type == watch_event::kind::del) {
      machine_.on_leader_deleted(now, event.kv.mod_revision);
    } else {
      machine_.on_leader_put(now, *to_holder(event.kv), event.kv.mod_revision);
    }
  }
  if (status == etcd_watch::status::ended) {
    metad::log::debug("ha: watch ended: {}", error_);
    watch_retry_at_ = now + config_.timings.retry_interval;
    return false;
  }
  return true;
}

template <typename Sleep>
void session::wait(const action& next, time_point now, time_point until, Sleep&& sleep) {
  if (follow_watch(now, until)) return;
  if (next.kind == action_kind::watch && !watch_.is_open()) {
    machine_.on_watch_broken(steady::now());
    return;
  }
  const auto retry = watch_retry_at_ > steady::now() ? watch_retry_at_ : until;
  sleep(std::min(until, retry));
}

void session::perform(const action& next, time_point sent) {
  const time_point by = sent + config_.request_timeout;
  switch (next.kind) {
    case action_kind::wait:
    case action_kind::watch:
      return;
    case action_kind::observe: {
      auto read = etcd_.read(keys_, by);
      if (!read) return failed("read", read.error);
      std::optional<std::string> sync;
      if (read->keys[1]) sync = read->keys[1]->value;
      machine_.on_observed(steady::now(), to_holder(read->keys[0]), sync, read->revision);
      return;
    }
    case action_kind::grant: {
      auto granted = etcd_.grant(config_.timings.ttl.count() / 1000, by);
      if (!granted) return failed("grant", granted.error);
      machine_.on_granted(steady::now(), sent, granted->id, std::chrono::seconds(granted->ttl_s));
      return;
    }
    case action_kind::campaign: {
      auto outcome = etcd_.create_if_absent(leader_, config_.advertise, machine_.lease(), by);
      if (!outcome) return failed("campaign", outcome.error);
      machine_.on_campaign(steady::now(), to_holder(outcome->holder), outcome->revision);
      return;
    }
    case action_kind::claim_sync: {
      auto written = etcd_.fenced_put(leader_, machine_.key_epoch(), keys_[1],
                                      sync_value(machine_.key_epoch(), config_.node), by);
      if (!written) return failed("sync claim", written.error);
      machine_.on_sync_claimed(steady::now(), *written);
      return;
    }
    case action_kind::keepalive: {
      // Bounded by the renew interval so a hung member is left for the next one in time.
      const time_point renew_by = sent + config_.timings.renew_interval;
      auto ttl = etcd_.keepalive(machine_.lease(), renew_by);
      if (!ttl) return failed("keepalive", ttl.error);
      // Then the key: the renewal counts only if the key still carries this lease (a
      // key overwritten without a lease must not leave a leader serving on the watch's
      // word alone).
      std::optional<holder> key;
      std::optional<std::string> sync;
      std::int64_t revision = 0;
      if (*ttl > 0) {
        auto read = etcd_.read(keys_, renew_by);
        if (!read) return failed("read after keepalive", read.error);
        key = to_holder(read->keys[0]);
        if (read->keys[1]) sync = read->keys[1]->value;
        revision = read->revision;
      }
      machine_.on_renewed(steady::now(), sent, std::chrono::seconds(*ttl), key, sync, revision);
      return;
    }
    case action_kind::remove_foreign: {
      const auto& odd = machine_.foreign_key();
      if (!odd) return;
      auto removed = etcd_.delete_if_unchanged(leader_, odd->mod_revision, by);
      if (!removed) return failed("foreign key removal", removed.error);
      if (*removed) {
        metad::log::warn("ha: removed the foreign leader key {} (etcd revision {}); campaigning",
                         leader_, odd->mod_revision);
      } else {
        metad::log::warn("ha: the foreign leader key {} changed before its removal: re-reading",
                         leader_);
      }
      machine_.on_foreign_removed(steady::now(), *removed);
      return;
    }
  }
}

bool session::write_sync(const std::vector<std::string>& members) {
  const std::int64_t epoch = machine_.key_epoch();
  auto written =
      etcd_.fenced_put(leader_, epoch, keys_[1], sync_value(epoch, config_.node, members),
                       steady::now() + config_.request_timeout);
  if (!written) {
    metad::log::warn("ha: /sync update failed: {}", written.error);
    return false;
  }
  if (!*written) metad::log::warn("ha: /sync update refused: this node no longer leads");
  return *written;
}

}  // namespace

void control::run() {
  session s(config_, may_campaign_);
  std::int64_t sync_epoch = 0;  // the epoch the written sync_ requests belong to
  while (!stopping_.load()) {
    const time_point now = steady::now();
    const action next = s.machine().next(now);
    publish(s.machine());
    // A request for /sync: written while this node leads with /sync claimed, in order.
    std::uint64_t asked = 0;
    std::vector<std::string> members;
    {
      std::lock_guard lock(mutex_);
      asked = sync_asked_;
      members = sync_members_;
    }
    const leadership& m = s.machine();
    if (m.key_epoch() != sync_epoch) {
      // A new leadership claims /sync with no standby: earlier requests are void.
      sync_epoch = m.key_epoch();
      sync_written_.store(asked, std::memory_order_release);
    }
    if (asked > sync_written_.load() && m.current() == role::leader && m.sync_claimed() &&
        s.write_sync(members)) {
      sync_written_.store(asked, std::memory_order_release);
      metad::log::info("ha: /sync now lists [{}] in sync", fmt::join(members, ","));
      continue;
    }
    if (next.kind == action_kind::watch || next.at > now) {
      // Short waits, so that stop() is not held up by a quiet watch.
      const auto until = std::min(next.at, now + milliseconds(100));
      s.wait(next, now, until, [this](time_point at) { sleep_until(at); });
      continue;
    }
    s.perform(next, now);
  }
  publish(s.machine());
}

}  // namespace metad::ha
