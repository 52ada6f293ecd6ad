// The leader-only gate (pipeline/ha_gate.hpp) byte-in/byte-out: with an ha control that
// has not been elected, every API row answers 503 naming no leader and changes nothing,
// while /health (with the role), /ready (503) and /metrics (with the role gauge) answer;
// without HA nothing changes. The elected side runs against etcd in tests/e2e/test_ha.py.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "ha/control.hpp"
#include "pipeline/connection.hpp"
#include "pipeline/node.hpp"
#include "pipeline/routes.hpp"
#include "smp/core.hpp"

using namespace metad;

namespace {

struct quiet_waker final : net::waker {
  void wake() override {}
  bool input_pending() override { return false; }
};

ha::config unelected() {
  ha::config c;
  c.etcd = *ha::parse_endpoints("http://127.0.0.1:1");
  c.cluster = "t";
  c.node = "a";
  return c;
}

class HaGate : public ::testing::Test {
 protected:
  HaGate() : node_(cfg_, 1), control_(unelected()), x_(node_, *node_.core[0], waker_) {
    node_.ha = &control_;  // never started: a node that is not (yet) the leader
  }
  std::string send(const std::string& bytes) {
    const smp::core_scope home(0);
    std::span<char> space = x_.read_space();
    EXPECT_GE(space.size(), bytes.size());
    std::copy(bytes.begin(), bytes.end(), space.begin());
    EXPECT_NE(x_.on_bytes(bytes.size()), net::flow::wait) << bytes;
    return std::exchange(x_.output(), {});
  }
  static std::string post(std::string_view path, std::string_view body) {
    return "POST " + std::string(path) +
           " HTTP/1.1\r\ncontent-length: " + std::to_string(body.size()) + "\r\n\r\n" +
           std::string(body);
  }
  static std::string get(std::string_view path) {
    return "GET " + std::string(path) + " HTTP/1.1\r\n\r\n";
  }

  metad::config cfg_;
  pipeline::node node_;
  ha::control control_;
  quiet_waker waker_;
  pipeline::connection x_;
};

constexpr std::string_view kNoLeader =
    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: ";

TEST_F(HaGate, EveryApiCallIsA503NamingNoLeaderAndChangesNothing) {
  for (const std::string& request :
       {post("/rank/0/initialize", R"({"num_pages":4,"role":"worker"})"),
        post("/keys/batch_allocate", R"({"rank":0,"keys":[["k",""]]})"),
        post("/keys/confirm_write", R"({"rank":0,"confirmations":[["k",0]]})"),
        post("/keys/batch_exists", R"({"keys":["k"]})"),
        post("/keys/get_locations", R"({"rank":0,"keys":["k"]})"), post("/clear", ""),
        post("/keys/delete", R"({"keys":["k"]})"), get("/rank/0"), get("/stats"),
        post("/0/initialize", R"({"num_pages":4})"), post("/0/exists", R"({"keys":["k"]})"),
        post("/llama/0/reserve_and_allocate_page_indices", R"({"keys":[["k",""]]})"),
        post("/7/get_page_indices", R"({"keys":["k"]})")}) {
    const std::string answer = send(request);
    EXPECT_EQ(answer.substr(0, kNoLeader.size()), kNoLeader) << request;
    EXPECT_NE(answer.find(R"({"detail":"not the leader; no leader is known)"), std::string::npos)
        << answer;
  }
  EXPECT_EQ(node_.core[0]->unnamed().ranks.rank_count(), 0u);
  EXPECT_TRUE(node_.core[0]->sg_tenants.empty());
  // Malformed bodies too: the gate answers before anything is decoded.
  EXPECT_EQ(send(post("/keys/batch_exists", "{")).substr(0, kNoLeader.size()), kNoLeader);
  // A path no row has is still a 404.
  EXPECT_EQ(send(get("/nothing")).substr(0, 22), "HTTP/1.1 404 Not Found");
}

TEST_F(HaGate, ProbesAndMetricsAnswerOnEveryNodeWithTheRole) {
  const std::string health = send(get("/health"));
  EXPECT_EQ(health.substr(0, 15), "HTTP/1.1 200 OK");
  EXPECT_NE(health.find(R"({"status":"ok","role":"candidate"})"), std::string::npos) << health;
  const std::string ready = send(get("/ready"));
  EXPECT_EQ(ready.substr(0, kNoLeader.size()), kNoLeader);
  EXPECT_NE(ready.find("no leader"), std::string::npos) << ready;
  const std::string metrics = send(get("/metrics"));
  EXPECT_EQ(metrics.substr(0, 15), "HTTP/1.1 200 OK");
  EXPECT_NE(metrics.find("hf3fs_metad_ha_role{role=\"candidate\"} 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("hf3fs_metad_ha_role{role=\"leader\"} 0\n"), std::string::npos);
  EXPECT_NE(metrics.find("hf3fs_metad_ha_serving 0\n"), std::string::npos);
  EXPECT_NE(metrics.find("hf3fs_metad_ha_epoch 0\n"), std::string::npos);
}

TEST_F(HaGate, WithoutHaNothingIsGated) {
  node_.ha = nullptr;
  EXPECT_EQ(send(post("/keys/batch_exists", R"({"keys":["k"]})")).substr(0, 15), "HTTP/1.1 200 OK");
  const std::string health = send(get("/health"));
  EXPECT_NE(health.find(R"({"status":"ok"})"), std::string::npos) << health;
  EXPECT_EQ(send(get("/ready")).substr(0, 15), "HTTP/1.1 200 OK");
  EXPECT_EQ(send(get("/metrics")).find("hf3fs_metad_ha_"), std::string::npos);
}

// The probes, /metrics and the status page (GET / and /status.json: a standby's operator
// sees its role and HA state there too).
TEST(HaGateRoutes, OnlyProbesMetricsAndTheStatusPageAnswerOffTheLeader) {
  for (const pipeline::endpoint_row& row : pipeline::kEndpoints) {
    const bool probe = row.label == "health" || row.label == "ready" || row.label == "metrics" ||
                       row.label == "status_page" || row.label == "status";
    EXPECT_EQ(row.on, probe ? pipeline::serves::any_node : pipeline::serves::leader) << row.label;
  }
}

}  // namespace
