// ha::control's lease deadline under a slow etcd: etcd starts a lease's TTL when it
// handles the grant or keepalive, which may be just after the request was sent, so a
// leader may serve only until send time + TTL - margin, never from the time the answer
// came back. A scripted gateway (fake_gateway.hpp) plays etcd and holds the grant's and
// the first keepalive's answers until the test lets them go, then answers them `delay`
// after they arrived; the test reads the deadline control publishes (serving(at)).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fake_gateway.hpp"
#include "ha/base64.hpp"
#include "ha/control.hpp"

using namespace metad;

namespace {

using lease_ms = std::chrono::milliseconds;

constexpr std::int64_t kSlowLease = 7;
constexpr std::int64_t kSlowEpoch = 5;  // the leader key's create_revision
constexpr const char* kSlowHeader =
    R"("header":{"cluster_id":"1","member_id":"2","revision":"5","raft_term":"2"})";

// etcd with one key (the leader key once campaigned for) whose grant and first keepalive
// are held at a gate, then answered `delay` after they arrived.
class slow_etcd {
 public:
  explicit slow_etcd(lease_ms delay, std::string leader)
      : delay_(delay),
        election_(std::move(leader), R"({"node":"n1"})", kSlowHeader, kSlowEpoch, kSlowLease) {}

  gateway_answer answer(const gateway_request& request) {
    if (request.path == "/v3/lease/grant") {
      hold(grant_);
      return {200, fmt::format(R"({{{},"ID":"{}","TTL":"10"}})", kSlowHeader, kSlowLease)};
    }
    if (request.path == "/v3/lease/keepalive") {
      hold(keepalives_++ == 0 ? first_keepalive_ : later_keepalives_);
      return {200,
              fmt::format(R"({{"result":{{{},"ID":"{}","TTL":"10"}}}})", kSlowHeader, kSlowLease)};
    }
    if (request.path == "/v3/watch") {
      return {200, fmt::format(R"({{"result":{{{},"created":true}}}})", kSlowHeader), true};
    }
    if (request.path == "/v3/kv/txn") return election_.txn(request);
    return {404, R"({"error":"not scripted","code":5})"};
  }

  // When the grant (or the first keepalive) arrived, once it has; nullopt after 10 s.
  std::optional<ha::time_point> grant_arrived() { return arrived(grant_); }
  std::optional<ha::time_point> keepalive_arrived() { return arrived(first_keepalive_); }
  void release_grant() { release(grant_); }
  void release_keepalive() { release(first_keepalive_); }
  // Lets everything go (the later keepalives are held until then).
  void close() {
    release(grant_);
    release(first_keepalive_);
    release(later_keepalives_);
  }

 private:
  struct gate {
    std::optional<ha::time_point> arrived;
    bool open = false;
  };

  // The request arrived: wait for the gate (10 s at most), then until `delay` after it
  // arrived, the slow etcd's answer time.
  void hold(gate& g) {
    std::unique_lock lock(mutex_);
    const ha::time_point arrival = ha::steady::now();
    if (!g.arrived) g.arrived = arrival;
    changed_.notify_all();
    changed_.wait_for(lock, std::chrono::seconds(10), [&] { return g.open; });
    lock.unlock();
    std::this_thread::sleep_until(arrival + delay_);
  }
  std::optional<ha::time_point> arrived(gate& g) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(10), [&] { return g.arrived.has_value(); });
    return g.arrived;
  }
  void release(gate& g) {
    std::lock_guard lock(mutex_);
    g.open = true;
    changed_.notify_all();
  }

  const lease_ms delay_;
  scripted_election election_;
  std::mutex mutex_;
  std::condition_variable changed_;
  gate grant_, first_keepalive_, later_keepalives_;
  std::atomic<int> keepalives_{0};
};

// A time point readable in a failure message (steady clock nanoseconds).
std::int64_t lease_ns(ha::time_point at) { return at.time_since_epoch().count(); }

// Polls `done` (the ha thread publishes through atomics) for up to 10 s.
template <typename Done>
bool lease_eventually(Done&& done) {
  const auto until = ha::steady::now() + std::chrono::seconds(10);
  while (!done()) {
    if (ha::steady::now() >= until) return false;
    std::this_thread::sleep_for(lease_ms(1));
  }
  return true;
}

TEST(ControlLease, ASlowEtcdsAnswerCountsTheLeaseFromTheSendTime) {
  const lease_ms delay(300);
  const lease_ms ttl(10000), margin(1000);
  slow_etcd etcd(delay, ha::leader_key("c1"));
  fake_gateway gateway([&](const gateway_request& r) { return etcd.answer(r); });

  ha::config config;
  config.etcd = ha::etcd_access(*ha::parse_endpoints(gateway.url()));
  config.cluster = "c1";
  config.node = "n1";
  config.claim_sync = false;
  config.timings.ttl = ttl;
  config.timings.margin = margin;
  config.timings.renew_interval = lease_ms(1000);  // bounds the keepalive: > delay
  config.connect_timeout = lease_ms(1000);
  config.request_timeout = lease_ms(3000);  // bounds the grant: > delay
  ASSERT_EQ(ha::validate(config), "");
  ha::control control(config);
  control.start();
  struct closer {
    slow_etcd& etcd;
    ha::control& control;
    ~closer() {
      etcd.close();
      control.stop();
    }
  } close_at_end{etcd, control};

  // The grant: sent at or before it arrived, answered `delay` later.
  const auto granted = etcd.grant_arrived();
  ASSERT_TRUE(granted);
  etcd.release_grant();
  ASSERT_TRUE(lease_eventually([&] { return control.current() == ha::role::leader; }));
  const ha::time_point grant_sent = control.last_renewal_sent();
  EXPECT_LE(lease_ns(grant_sent), lease_ns(*granted));
  EXPECT_TRUE(control.serving(grant_sent + ttl - margin - lease_ms(1)));
  // From the answer's time it would serve `delay` longer than the lease may last.
  EXPECT_FALSE(control.serving(*granted + ttl - margin))
      << "the grant's deadline counts from its answer, not its send time";

  // The first keepalive, held until now, then answered `delay` after it arrived.
  const auto renewal = etcd.keepalive_arrived();
  ASSERT_TRUE(renewal);
  EXPECT_TRUE(control.serving());  // held at the gate: still on the grant's deadline
  etcd.release_keepalive();
  ASSERT_TRUE(lease_eventually([&] { return control.last_renewal_sent() != grant_sent; }));
  const ha::time_point renewal_sent = control.last_renewal_sent();
  EXPECT_GT(lease_ns(renewal_sent), lease_ns(grant_sent));
  EXPECT_LE(lease_ns(renewal_sent), lease_ns(*renewal));
  EXPECT_TRUE(control.serving(renewal_sent + ttl - margin - lease_ms(1)));
  EXPECT_FALSE(control.serving(*renewal + ttl - margin))
      << "the keepalive's deadline counts from its answer, not its send time";
}

}  // namespace
