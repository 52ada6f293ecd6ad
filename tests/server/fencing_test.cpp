// Fencing on the leader (docs/replication.md, "Fencing and lease timing"): a leader-only
// request that was admitted while the node served, and whose serving ended before its
// answer (here: during its group commit), is answered 503, not 200; what it changed is
// not acknowledged. connection::finish() checks again; the gate at dispatch
// (ha_gate_test.cpp) never sees this case. The node is a sim_node (no sockets, the
// group commit driven by hand); its ha control is elected, on its own thread, by a
// scripted etcd (fake_gateway.hpp), and steps down (stop(true): serving ends first) in
// the middle of the group commit, so nothing depends on how long anything takes.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "fake_gateway.hpp"
#include "ha/base64.hpp"
#include "ha/control.hpp"
#include "sim_node.hpp"
#include "temp_dir.hpp"

using namespace metad;

namespace {

using server_test::sim_node;

constexpr std::int64_t kFencingLease = 7;
constexpr std::int64_t kFencingEpoch = 5;  // the leader key's create_revision
constexpr const char* kFencingHeader =
    R"("header":{"cluster_id":"1","member_id":"2","revision":"5","raft_term":"2"})";

// etcd for one node that wins the election at once: the lease granted, the campaign
// won, keepalives and the revoke answered, the watch quiet. Any thread.
class electing_etcd {
 public:
  electing_etcd(std::string cluster, std::string node)
      : election_(ha::leader_key(cluster), fmt::format(R"({{"node":"{}"}})", node), kFencingHeader,
                  kFencingEpoch, kFencingLease) {}

  gateway_answer answer(const gateway_request& request) {
    if (request.path == "/v3/lease/grant" || request.path == "/v3/lease/keepalive") {
      const std::string lease =
          fmt::format(R"({},"ID":"{}","TTL":"60")", kFencingHeader, kFencingLease);
      return {200, request.path == "/v3/lease/grant" ? "{" + lease + "}"
                                                     : R"({"result":{)" + lease + "}}"};
    }
    if (request.path == "/v3/lease/revoke") return {200, fmt::format("{{{}}}", kFencingHeader)};
    if (request.path == "/v3/watch")
      return {200, fmt::format(R"({{"result":{{{},"created":true}}}})", kFencingHeader), true};
    if (request.path == "/v3/kv/txn") return election_.txn(request);
    return {404, R"({"error":"not scripted","code":5})"};
  }

 private:
  scripted_election election_;
};

// A sim_node whose ha control leads (a 60 s lease, renewed every second).
class Fencing : public ::testing::Test {
 protected:
  Fencing()
      : control_(elected_config(gateway_.url()), [this](ha::role, ha::role to, std::int64_t) {
          std::lock_guard lock(mutex_);
          role_ = to;
          changed_.notify_all();
        }) {
    node_.state().ha = &control_;
  }
  ~Fencing() override { control_.stop(); }

  static ha::config elected_config(const std::string& url) {
    ha::config c;
    c.etcd = ha::etcd_access(*ha::parse_endpoints(url));
    c.cluster = "fencing";
    c.node = "a";
    c.claim_sync = false;  // no /sync to write: no replication here
    c.timings.ttl = std::chrono::seconds(60);
    c.timings.renew_interval = std::chrono::seconds(1);
    c.timings.margin = std::chrono::seconds(1);
    c.connect_timeout = std::chrono::seconds(1);
    c.request_timeout = std::chrono::seconds(3);
    return c;
  }

  // Starts the control and waits (10 s at most) until it leads: it publishes its serving
  // deadline before it reports the role.
  bool lead() {
    control_.start();
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(10),
                             [&] { return role_ == ha::role::leader; });
  }

  static std::string post(const std::string& path, const std::string& body) {
    return "POST " + path + " HTTP/1.1\r\ncontent-length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body;
  }

  electing_etcd etcd_{"fencing", "a"};
  fake_gateway gateway_{[this](const gateway_request& r) { return etcd_.answer(r); }};
  std::mutex mutex_;
  std::condition_variable changed_;
  ha::role role_ = ha::role::candidate;  // under mutex_
  ha::control control_;
  sim::temp_dir dir_{"metad-fencing"};
  sim_node node_{dir_.path(), 1};
};

}  // namespace

TEST_F(Fencing, AWriteWhoseLeaseEndsDuringItsGroupCommitIsA503NotA200) {
  ASSERT_TRUE(lead()) << "the scripted etcd did not elect the control";
  ASSERT_TRUE(control_.serving());
  EXPECT_EQ(node_.send(post("/rank/0/initialize", R"({"num_pages":64})")).substr(0, 15),
            "HTTP/1.1 200 OK");
  // The next write is admitted (the node serves); its group commit is taken, and before
  // it is written the control steps down: serving ends, as when the lease's deadline
  // passes before a renewal lands.
  int commits = 0;
  node_.on_flush = [&](pipeline::core_state&, const store::log_writer::flush_job&) {
    if (commits++ == 0) control_.stop(true);
    EXPECT_FALSE(control_.serving());
  };
  const std::uint64_t logged = node_.state().core[0]->log.end();
  const std::string answer =
      node_.send(post("/keys/batch_allocate", R"({"rank":0,"keys":["k1","k2"]})"));
  EXPECT_EQ(commits, 1);
  EXPECT_GT(node_.state().core[0]->log.end(), logged);  // the change was made and logged
  EXPECT_EQ(answer.substr(0, 32), "HTTP/1.1 503 Service Unavailable") << answer;
  EXPECT_NE(answer.find(R"({"detail":"not serving: this node (a) holds the leader key)"),
            std::string::npos)
      << answer;
}
