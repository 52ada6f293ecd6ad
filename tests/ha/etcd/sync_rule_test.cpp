// The /sync rule against a real etcd, as the server runs it today (claim_sync on, no
// replication): the first leader of a fresh cluster writes /sync naming itself with no
// standby in sync, so when it stops (its lease expiring, or revoked) the other node
// never campaigns; the old leader leads again, at a new epoch, once it returns.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "etcd_process.hpp"
#include "ha/control.hpp"
#include "ha/etcd.hpp"

using namespace metad;

namespace {

using namespace std::chrono_literals;
using ha::steady;

class SyncRuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ha_test::etcd_available())
      GTEST_SKIP() << ha_test::kEtcdBinary << " not found (Debian package etcd-server)";
    ASSERT_TRUE(etcd_.start()) << "etcd did not start";
  }
  std::unique_ptr<ha::control> node(const char* id) {
    ha::config c;
    c.etcd = *ha::parse_endpoints(etcd_.url());
    c.cluster = "s";
    c.node = id;
    auto n = std::make_unique<ha::control>(c);
    n->start();
    return n;
  }
  static bool wait_serving(const ha::control& n, std::chrono::milliseconds limit) {
    const auto until = steady::now() + limit;
    while (steady::now() < until) {
      if (n.serving()) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }
  std::optional<std::string> sync() {
    ha::etcd_client etcd(*ha::parse_endpoints(etcd_.url()), 100ms);
    auto read = etcd.read({ha::sync_key("s")}, steady::now() + 1s);
    if (!read || !read->keys[0]) return std::nullopt;
    return read->keys[0]->value;
  }

  ha_test::etcd_process etcd_;
};

TEST_F(SyncRuleTest, OnlyTheFirstLeaderEverLeadsWithoutReplication) {
  auto a = node("a");
  ASSERT_TRUE(wait_serving(*a, 3s));
  auto b = node("b");
  const std::int64_t first = a->epoch();
  EXPECT_EQ(sync(), ha::sync_value(first, "a"));
  // b sees a as the leader, by name.
  const auto until = steady::now() + 2s;
  while (steady::now() < until && (!b->leader() || b->leader()->node != "a"))
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(b->leader());
  EXPECT_EQ(b->leader()->node, "a");
  EXPECT_EQ(b->current(), ha::role::standby);

  a->stop();  // a crash: the lease expires within ~1.5 s
  std::this_thread::sleep_for(2500ms);
  EXPECT_FALSE(b->serving());
  EXPECT_NE(b->current(), ha::role::leader) << "b took over without being in /sync";
  EXPECT_FALSE(b->leader()) << "the leader key should have expired";

  a = node("a");  // the old leader returns and leads again
  ASSERT_TRUE(wait_serving(*a, 3s));
  EXPECT_GT(a->epoch(), first);
  EXPECT_EQ(sync(), ha::sync_value(a->epoch(), "a"));

  a->stop(true);  // a graceful stop revokes the lease: still nobody else leads
  std::this_thread::sleep_for(500ms);
  EXPECT_FALSE(b->serving());
  EXPECT_NE(b->current(), ha::role::leader);
}

TEST_F(SyncRuleTest, AClaimFencedByAStaleEpochIsRefused) {
  auto a = node("a");
  ASSERT_TRUE(wait_serving(*a, 3s));
  // A claim is fenced by the leader key's create_revision: a deposed epoch cannot write.
  ha::etcd_client etcd(*ha::parse_endpoints(etcd_.url()), 100ms);
  auto stale = etcd.fenced_put(ha::leader_key("s"), a->epoch() - 1, ha::sync_key("s"),
                               ha::sync_value(a->epoch() - 1, "b"), steady::now() + 1s);
  ASSERT_TRUE(stale) << stale.error;
  EXPECT_FALSE(*stale);
  EXPECT_EQ(sync(), ha::sync_value(a->epoch(), "a"));
}

}  // namespace
