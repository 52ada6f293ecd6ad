// The replication link on loopback: a follower connects one stream per core, the
// leader routes each by its hello to that core's channel, bytes flow both ways in
// order, a stream that ends takes the follower's whole set with it (and it connects
// again), a mode change closes every stream before it returns, and a connection that
// does not start with a valid hello never reaches a channel.
#include "repl/link.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "repl/protocol.hpp"
#include "repl/socket.hpp"

using namespace metad;
using namespace std::chrono_literals;

namespace {

template <typename Predicate>
bool eventually(Predicate&& p, std::chrono::milliseconds within = 5s) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (p()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return p();
}

repl::link_config config(int cores, bool listen) {
  repl::link_config c;
  c.cores = cores;
  if (listen) c.listen_host = "127.0.0.1";
  c.wake_core = [](int) {};
  c.reconnect_pause_ms = 20;
  return c;
}

std::string hello_for(std::uint32_t core, std::uint32_t cores = 2) {
  std::string out;
  repl::hello h;
  h.cluster = "test";
  h.node = "b";
  h.cores = cores;
  h.core = core;
  repl::encode(out, h);
  return out;
}

// Everything channel `ch` receives until `want` bytes are in (or 5 s pass).
std::string receive(repl::channel& ch, std::size_t want) {
  std::string got;
  eventually([&] {
    ch.take(got);
    return got.size() >= want;
  });
  return got;
}

struct ReplLinkPair : ::testing::Test {
  repl::link leader{config(2, true)};
  repl::link follower{config(2, false)};
  void SetUp() override {
    leader.start();
    follower.start();
    leader.set_mode(repl::link::mode::accept);
    follower.set_mode(repl::link::mode::follow, "127.0.0.1:" + std::to_string(leader.port()));
  }
  // The follower's streams are up; each says hello for its core; the leader routes them.
  void connect() {
    ASSERT_TRUE(
        eventually([&] { return follower.at(0).current() != 0 && follower.at(1).current() != 0; }));
    for (std::uint32_t c = 0; c < 2; ++c)
      follower.at(static_cast<int>(c))
          .send(follower.at(static_cast<int>(c)).current(), hello_for(c));
    ASSERT_TRUE(
        eventually([&] { return leader.at(0).current() != 0 && leader.at(1).current() != 0; }));
  }
};

}  // namespace

TEST_F(ReplLinkPair, RoutesEachStreamByItsHelloAndCarriesBytesBothWays) {
  connect();
  for (std::uint32_t c = 0; c < 2; ++c) {
    repl::channel& ch = leader.at(static_cast<int>(c));
    repl::decoder d;
    d.feed(receive(ch, hello_for(c).size()));
    ASSERT_EQ(d.next(), repl::decoder::status::message);
    ASSERT_EQ(d.type, repl::message_type::hello);
    EXPECT_EQ(d.hello.core, c);  // the hello itself reaches the core it names
  }
  // A megabyte each way, in order, in many sends.
  std::string big;
  for (int i = 0; i < 1 << 20; ++i) big.push_back(static_cast<char>('a' + i % 26));
  for (std::size_t at = 0; at < big.size(); at += 4096)
    leader.at(1).send(leader.at(1).current(), std::string_view(big).substr(at, 4096));
  EXPECT_EQ(receive(follower.at(1), big.size()), big);
  follower.at(0).send(follower.at(0).current(), big);
  EXPECT_EQ(receive(leader.at(0), big.size()), big);
}

TEST_F(ReplLinkPair, AnEndedStreamTakesTheFollowersSetAndItConnectsAgain) {
  connect();
  const std::uint64_t before0 = follower.at(0).current(), before1 = follower.at(1).current();
  leader.at(1).close(leader.at(1).current());
  // Both of the follower's streams end and come back as new ones.
  EXPECT_TRUE(eventually([&] {
    const std::uint64_t s0 = follower.at(0).current(), s1 = follower.at(1).current();
    return s0 != 0 && s1 != 0 && s0 != before0 && s1 != before1;
  }));
  // Bytes sent on an ended stream's number go nowhere.
  follower.at(0).send(before0, "stale");
  EXPECT_EQ(follower.at(0).queued(), 0u);
}

TEST_F(ReplLinkPair, AModeChangeClosesEveryStreamBeforeItReturns) {
  connect();
  leader.set_mode(repl::link::mode::idle);
  EXPECT_EQ(leader.at(0).current(), 0u);
  EXPECT_EQ(leader.at(1).current(), 0u);
  follower.set_mode(repl::link::mode::idle);
  EXPECT_EQ(follower.at(0).current(), 0u);
  EXPECT_EQ(follower.at(1).current(), 0u);
  // An idle leader takes no stream: a connection is closed without reaching a channel.
  repl::socket_fd s = repl::connect_tcp("127.0.0.1", leader.port());
  ASSERT_TRUE(repl::write_all(s, hello_for(0)));
  std::string got;
  EXPECT_FALSE(repl::read_some(s, got));
  EXPECT_EQ(leader.at(0).current(), 0u);
}

TEST(ReplLink, AConnectionWithoutAValidHelloNeverReachesAChannel) {
  repl::link leader(config(2, true));
  leader.start();
  leader.set_mode(repl::link::mode::accept);
  const std::string bad_core = hello_for(2);  // of 2 cores: 0 and 1
  std::string ack;
  repl::encode(ack, repl::ack{1, 1, 0, 5});  // a whole message, but not a hello
  for (const std::string& first : {bad_core, ack, std::string(64, 'x')}) {
    repl::socket_fd s = repl::connect_tcp("127.0.0.1", leader.port());
    ASSERT_TRUE(repl::write_all(s, first));
    std::string got;
    EXPECT_FALSE(repl::read_some(s, got));  // closed by the leader
    EXPECT_EQ(leader.at(0).current(), 0u);
    EXPECT_EQ(leader.at(1).current(), 0u);
  }
  // A good one still gets through afterwards.
  repl::socket_fd s = repl::connect_tcp("127.0.0.1", leader.port());
  ASSERT_TRUE(repl::write_all(s, hello_for(1)));
  EXPECT_TRUE(eventually([&] { return leader.at(1).current() != 0; }));
}

TEST(ReplLink, SplitsHostAndPort) {
  std::string host;
  std::uint16_t port = 0;
  ASSERT_TRUE(repl::split_host_port("127.0.0.1:18200", host, port));
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 18200);
  for (const char* bad :
       {"", ":1", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "localhost:1", "127.0.0.1:1x"})
    EXPECT_FALSE(repl::split_host_port(bad, host, port)) << bad;
}
