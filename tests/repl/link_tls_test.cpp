// Who may take the leader's streams (issue 30, findings 1 and 2), on loopback through
// the link thread: over mutual TLS a follower of the cluster's CA streams both ways; a
// certificate of another CA, a plain TCP client, or a certificate naming another node
// than its hello claims gets no stream (and the plain client not a byte of an answer);
// a follower refuses a leader whose certificate names another node than etcd's; and,
// with or without TLS, a hello from another node does not displace the live streams
// (it gets an answer, busy for the server) while the same node's new hello replaces its
// own stream.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>

#include "repl/link.hpp"
#include "repl/protocol.hpp"
#include "repl/socket.hpp"
#include "repl/tls.hpp"
#include "tls_certs.hpp"

using namespace metad;
using namespace std::chrono_literals;

namespace {

template <typename Predicate>
bool tls_eventually(Predicate&& p, std::chrono::milliseconds within = 5s) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (p()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return p();
}

std::string hello_from(const std::string& node, std::uint32_t core, std::uint32_t cores = 2) {
  std::string out;
  repl::hello h;
  h.cluster = "test";
  h.node = node;
  h.cores = cores;
  h.core = core;
  repl::encode(out, h);
  return out;
}

// What the peer sends until its end (or `within`).
std::string bytes_to_end(const repl::socket_fd& s, std::chrono::milliseconds within = 3s) {
  const auto until = std::chrono::steady_clock::now() + within;
  timeval tv{0, 50'000};
  ::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string got;
  char buffer[4096];
  while (std::chrono::steady_clock::now() < until) {
    const ssize_t n = ::recv(s.get(), buffer, sizeof buffer, 0);
    if (n > 0)
      got.append(buffer, static_cast<std::size_t>(n));
    else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      break;
  }
  return got;
}

struct counts {
  std::atomic<int> by[repl::kRefusals] = {};
  int operator[](repl::refusal r) const { return by[static_cast<int>(r)].load(); }
};

repl::link_config tls_config(int cores, bool listen, const repl::tls_files* files,
                             counts* refused = nullptr) {
  repl::link_config c;
  c.cores = cores;
  if (listen) c.listen_host = "127.0.0.1";
  c.reconnect_pause_ms = 20;
  if (files != nullptr) c.tls = std::make_shared<repl::tls_context>(*files);
  if (refused != nullptr)
    c.refused = [refused](repl::refusal r) { refused->by[static_cast<int>(r)]++; };
  c.answer_refused = [](const repl::hello& h, repl::refusal r) {
    return std::string(r == repl::refusal::taken ? "taken " : "refused ") + h.node;
  };
  return c;
}

std::string pattern(std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s.push_back(static_cast<char>('a' + i % 26));
  return s;
}

std::string take_all(repl::channel& ch, std::size_t want) {
  std::string got;
  tls_eventually([&] {
    ch.take(got);
    return got.size() >= want;
  });
  return got;
}

struct ReplLinkTls : ::testing::Test {
  static void SetUpTestSuite() { std::signal(SIGPIPE, SIG_IGN); }
  test::test_pki pki;
  repl::tls_files a = pki.node("a");
  counts refused;
  repl::link leader{tls_config(2, true, &a, &refused)};
  void SetUp() override {
    leader.start();
    leader.set_mode(repl::link::mode::accept);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(leader.port()); }
  // A follower with `files`, following node `leader_node`, whose cores say hello as
  // `node` once their streams open (with `hello` false: started only, nothing awaited).
  std::unique_ptr<repl::link> follower(const repl::tls_files& files, const std::string& node,
                                       const std::string& leader_node = "a", bool hello = true) {
    auto f = std::make_unique<repl::link>(tls_config(2, false, &files));
    f->start();
    f->set_mode(repl::link::mode::follow, address(), leader_node);
    for (int c = 0; hello && c < 2; ++c) {
      std::uint64_t stream = 0;
      EXPECT_TRUE(tls_eventually([&] { return (stream = f->at(c).current()) != 0; }));
      f->at(c).send(stream, hello_from(node, static_cast<std::uint32_t>(c)));
    }
    return f;
  }
  // No leader channel got a stream for `within`.
  bool no_stream(std::chrono::milliseconds within = 500ms) {
    return !tls_eventually(
        [&] { return leader.at(0).current() != 0 || leader.at(1).current() != 0; }, within);
  }
};

}  // namespace

TEST_F(ReplLinkTls, AFollowerOfTheClusterStreamsBothWays) {
  const repl::tls_files b = pki.node("b");
  auto f = follower(b, "b");
  ASSERT_TRUE(
      tls_eventually([&] { return leader.at(0).current() != 0 && leader.at(1).current() != 0; }));
  for (int c = 0; c < 2; ++c) {
    repl::decoder d;
    d.feed(take_all(leader.at(c), hello_from("b", 0).size()));
    ASSERT_EQ(d.next(), repl::decoder::status::message);
    EXPECT_EQ(d.hello.node, "b");
    EXPECT_EQ(d.hello.core, static_cast<std::uint32_t>(c));
  }
  const std::string big = pattern((1 << 20) + 7);
  for (std::size_t at = 0; at < big.size(); at += 5000)
    leader.at(1).send(leader.at(1).current(), std::string_view(big).substr(at, 5000));
  EXPECT_EQ(take_all(f->at(1), big.size()), big);
  f->at(0).send(f->at(0).current(), big);
  EXPECT_EQ(take_all(leader.at(0), big.size()), big);
  EXPECT_EQ(refused[repl::refusal::handshake] + refused[repl::refusal::name], 0);
}

TEST_F(ReplLinkTls, ACertificateOfAnotherCaGetsNoStream) {
  const repl::tls_files foreign = pki.foreign("b");
  auto f = follower(foreign, "b");
  EXPECT_TRUE(no_stream());
  EXPECT_GT(refused[repl::refusal::handshake], 0);
}

TEST_F(ReplLinkTls, APlainClientGetsNoStreamAndNoAnswer) {
  repl::socket_fd s = repl::connect_tcp("127.0.0.1", leader.port());
  ASSERT_TRUE(repl::write_all(s, hello_from("b", 0)));
  const std::string got = bytes_to_end(s);
  // At most a TLS alert record (7 bytes); never a replication answer.
  EXPECT_LE(got.size(), 7u) << got;
  repl::decoder d;
  d.feed(got);
  EXPECT_NE(d.next(), repl::decoder::status::message);
  EXPECT_TRUE(no_stream(100ms));
  EXPECT_TRUE(tls_eventually([&] { return refused[repl::refusal::handshake] == 1; }));
}

TEST_F(ReplLinkTls, ACertificateForAnotherNodeCannotClaimTheStandbysName) {
  // x holds a certificate of the cluster's CA, for node x; it says hello as b.
  const repl::tls_files x = pki.node("x");
  auto f = follower(x, "b");
  EXPECT_TRUE(no_stream());
  EXPECT_TRUE(tls_eventually([&] { return refused[repl::refusal::name] >= 1; }));
}

TEST_F(ReplLinkTls, AFollowerRefusesALeaderNamedOtherwise) {
  // etcd names z as the leader; the node at the address holds a's certificate.
  // Its streams may open and end before the handshake is refused, or never be seen
  // open: nothing waits for them.
  const repl::tls_files b = pki.node("b");
  auto f = follower(b, "b", "z", /*hello=*/false);
  EXPECT_TRUE(no_stream());
  EXPECT_TRUE(tls_eventually([&] { return refused[repl::refusal::handshake] > 0; }));
}

TEST_F(ReplLinkTls, AnotherNodesHelloDoesNotDisplaceTheStandby) {
  const repl::tls_files b = pki.node("b"), c = pki.node("c");
  auto fb = follower(b, "b");
  ASSERT_TRUE(
      tls_eventually([&] { return leader.at(0).current() != 0 && leader.at(1).current() != 0; }));
  const std::uint64_t s0 = leader.at(0).current(), s1 = leader.at(1).current();
  // c, a node of the cluster with its own certificate, says hello on both cores.
  auto fc = follower(c, "c");
  EXPECT_TRUE(tls_eventually([&] { return refused[repl::refusal::taken] >= 1; }));
  EXPECT_EQ(leader.at(0).current(), s0);
  EXPECT_EQ(leader.at(1).current(), s1);
  // b's streams still carry bytes.
  leader.at(0).send(s0, "still b's");
  EXPECT_EQ(take_all(fb->at(0), 9), "still b's");
  // Once b's streams have ended, c gets in.
  fb->set_mode(repl::link::mode::idle);
  fc->set_mode(repl::link::mode::idle);
  ASSERT_TRUE(
      tls_eventually([&] { return leader.at(0).current() == 0 && leader.at(1).current() == 0; }));
  auto fc2 = follower(c, "c");
  EXPECT_TRUE(
      tls_eventually([&] { return leader.at(0).current() != 0 && leader.at(1).current() != 0; }));
}

// The same rule without TLS, where the node is the one the hello claims: a second
// node's hello gets the refusal's answer and displaces nothing; the same node's new
// hello for a core replaces its old stream (a standby reconnecting).
TEST(ReplLinkPlain, OnlyTheSameNodesHelloReplacesAStream) {
  counts refused;
  repl::link leader(tls_config(2, true, nullptr, &refused));
  leader.start();
  leader.set_mode(repl::link::mode::accept);
  repl::socket_fd b0 = repl::connect_tcp("127.0.0.1", leader.port());
  ASSERT_TRUE(repl::write_all(b0, hello_from("b", 0)));
  ASSERT_TRUE(tls_eventually([&] { return leader.at(0).current() != 0; }));
  const std::uint64_t first = leader.at(0).current();
  for (const std::uint32_t core : {0u, 1u}) {
    repl::socket_fd x = repl::connect_tcp("127.0.0.1", leader.port());
    ASSERT_TRUE(repl::write_all(x, hello_from("x", core)));
    EXPECT_EQ(bytes_to_end(x), "taken x");
  }
  EXPECT_EQ(refused[repl::refusal::taken], 2);
  EXPECT_EQ(leader.at(0).current(), first);
  EXPECT_EQ(leader.at(1).current(), 0u);
  repl::socket_fd b0_again = repl::connect_tcp("127.0.0.1", leader.port());
  ASSERT_TRUE(repl::write_all(b0_again, hello_from("b", 0)));
  EXPECT_TRUE(tls_eventually(
      [&] { return leader.at(0).current() != 0 && leader.at(0).current() != first; }));
  // A core this node lacks: the other refusal's answer.
  repl::socket_fd far = repl::connect_tcp("127.0.0.1", leader.port());
  ASSERT_TRUE(repl::write_all(far, hello_from("b", 2, 3)));
  EXPECT_EQ(bytes_to_end(far), "refused b");
  EXPECT_EQ(refused[repl::refusal::no_such_core], 1);
}

// Past link_config::handshakes_per_second (a burst of as many) connections are closed on
// accept, before any TLS work; a follower of the cluster gets in once the budget refills.
TEST_F(ReplLinkTls, HandshakesPastTheRateAreRefusedOnAccept) {
  repl::link_config c = tls_config(2, true, &a, &refused);
  c.handshakes_per_second = 4;
  repl::link limited(c);
  limited.start();
  limited.set_mode(repl::link::mode::accept);
  std::vector<repl::socket_fd> flood;
  for (int i = 0; i < 20; ++i) flood.push_back(repl::connect_tcp("127.0.0.1", limited.port()));
  EXPECT_TRUE(tls_eventually([&] { return refused[repl::refusal::rate] >= 10; }));
  flood.clear();
  std::this_thread::sleep_for(1200ms);
  const repl::tls_files b = pki.node("b");
  auto f = std::make_unique<repl::link>(tls_config(2, false, &b));
  f->start();
  f->set_mode(repl::link::mode::follow, "127.0.0.1:" + std::to_string(limited.port()), "a");
  EXPECT_TRUE(tls_eventually([&] {
    for (int core = 0; core < 2; ++core)
      if (const std::uint64_t s = f->at(core).current(); s != 0)
        f->at(core).send(s, hello_from("b", static_cast<std::uint32_t>(core)));
    return limited.at(0).current() != 0 && limited.at(1).current() != 0;
  }));
}
