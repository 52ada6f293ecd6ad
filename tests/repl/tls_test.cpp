// Replication's TLS wrapper (src/repl/tls.hpp) with certificates made at test time: the
// names a certificate carries and the exact match against a node id; the start-up
// checks of --repl-tls-* (unreadable files, a key others may read, a key of another
// certificate, another CA, a certificate naming another node or lacking the client
// purpose); and handshakes over a non-blocking socketpair driven step by step as the
// link drives them: mutual TLS with bytes both ways, a client of another CA or without a
// certificate refused, a leader whose certificate names another node refused by the
// standby, and plain bytes refused.
#include "repl/tls.hpp"

#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <string>

#include "repl/socket.hpp"
#include "tls_certs.hpp"

using namespace metad;
using status = repl::tls_stream::status;

namespace {

// A connected non-blocking pair: [0] the leader's (accepting) end, [1] the standby's.
struct socket_pair {
  repl::socket_fd ends[2];
  socket_pair() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0)
      throw std::runtime_error("socketpair");
    ends[0] = repl::socket_fd(fds[0]);
    ends[1] = repl::socket_fd(fds[1]);
  }
};

// Drives both handshakes until each is done or failed; returns both results.
std::pair<status, status> handshake(repl::tls_stream& server, repl::tls_stream& client) {
  status s = status::want_read, c = status::want_read;
  const auto done = [](status x) {
    return x == status::ok || x == status::failed || x == status::closed;
  };
  for (int turn = 0; turn < 200 && !(done(s) && done(c)); ++turn) {
    if (!done(c)) c = client.handshake();
    if (!done(s)) s = server.handshake();
  }
  // In TLS 1.3 the client is done before the server has judged its certificate: the
  // server's refusal (an alert) shows when the client reads.
  if (c == status::ok && s != status::ok) {
    std::string sink;
    const status after = client.read(sink, 1);
    c = after == status::ok ? status::ok : status::failed;
  }
  return {s, c};
}

// Moves `bytes` from `from` to `to` through both sessions; what `to` read.
std::string transfer(repl::tls_stream& from, repl::tls_stream& to, const std::string& bytes) {
  std::string got;
  std::size_t sent = 0;
  for (int turn = 0; turn < 100000 && got.size() < bytes.size(); ++turn) {
    if (sent < bytes.size()) {
      std::size_t n = 0;
      const status st = from.write(std::string_view(bytes).substr(sent), n);
      EXPECT_TRUE(st == status::ok || st == status::want_write) << static_cast<int>(st);
      sent += n;
    }
    const status st = to.read(got, static_cast<std::size_t>(-1));
    EXPECT_TRUE(st == status::want_read) << static_cast<int>(st) << " " << to.error();
  }
  return got;
}

struct ReplTls : ::testing::Test {
  static void SetUpTestSuite() { std::signal(SIGPIPE, SIG_IGN); }
  test::test_pki pki;
};

}  // namespace

TEST_F(ReplTls, ACertificateNamesItsSubjectAltNamesAndCommonNameExactly) {
  const test::issued both = test::issue("b", &pki.ca, "DNS:node-b,DNS:b.example,IP:10.0.0.1");
  EXPECT_EQ(repl::certificate_names(both.cert),
            (std::vector<std::string>{"node-b", "b.example", "b"}));
  EXPECT_TRUE(repl::certificate_names_node(both.cert, "node-b"));
  EXPECT_TRUE(repl::certificate_names_node(both.cert, "b"));        // the CN counts too
  EXPECT_FALSE(repl::certificate_names_node(both.cert, "NODE-B"));  // no case folding
  EXPECT_FALSE(repl::certificate_names_node(both.cert, "node"));
  EXPECT_FALSE(repl::certificate_names_node(both.cert, "10.0.0.1"));  // IP entries are no names
  EXPECT_FALSE(repl::certificate_names_node(both.cert, ""));
  const test::issued wildcard = test::issue("w", &pki.ca, "DNS:*.example");
  EXPECT_FALSE(repl::certificate_names_node(wildcard.cert, "b.example"));  // no wildcards
  EXPECT_TRUE(repl::certificate_names_node(wildcard.cert, "*.example"));
}

TEST_F(ReplTls, UsableFilesPassTheStartUpCheck) {
  EXPECT_EQ(repl::tls_files_error(pki.node("a"), "a"), "");
  repl::tls_files cn_only = pki.dir.write("cn", test::issue("cn", &pki.ca), pki.ca_file);
  EXPECT_EQ(repl::tls_files_error(cn_only, "cn"), "");
}

TEST_F(ReplTls, TheStartUpCheckRefusesWhatCannotWork) {
  const repl::tls_files a = pki.node("a");
  const auto error = [](const repl::tls_files& f, std::string_view node = "a") {
    return repl::tls_files_error(f, node);
  };
  repl::tls_files f = a;
  f.cert = pki.dir.path() + "/missing.crt";
  EXPECT_NE(error(f).find("--repl-tls-cert " + f.cert + ": cannot read"), std::string::npos)
      << error(f);
  f = a;
  f.ca = pki.dir.path();
  EXPECT_NE(error(f).find("not a regular file"), std::string::npos) << error(f);
  // A private key group or others may read.
  ASSERT_EQ(::chmod(a.key.c_str(), 0640), 0);
  EXPECT_NE(error(a).find("mode 0640"), std::string::npos) << error(a);
  EXPECT_NE(error(a).find("chmod 600"), std::string::npos) << error(a);
  ASSERT_EQ(::chmod(a.key.c_str(), 0604), 0);
  EXPECT_NE(error(a).find("mode 0604"), std::string::npos) << error(a);
  ASSERT_EQ(::chmod(a.key.c_str(), 0400), 0);
  EXPECT_EQ(error(a), "");
  // Another certificate's key.
  f = a;
  f.key = pki.node("b").key;
  EXPECT_NE(error(f).find("is not the key of"), std::string::npos) << error(f);
  // Not a PEM file at all.
  f = a;
  f.ca = a.key;
  EXPECT_NE(error(f).find("--repl-tls-ca"), std::string::npos) << error(f);
  // Signed by another CA.
  EXPECT_NE(error(pki.foreign("a")).find("not valid under --repl-tls-ca"), std::string::npos)
      << error(pki.foreign("a"));
  // Naming another node.
  EXPECT_NE(error(a, "b").find("names a, not this node's id b"), std::string::npos)
      << error(a, "b");
  // Good for a server only: a standby could not use it.
  f = pki.dir.write("server-only", test::issue("a", &pki.ca, "DNS:a", "serverAuth"), pki.ca_file);
  EXPECT_NE(error(f).find("for a standby (TLS client)"), std::string::npos) << error(f);
  // The key's contents never appear in a message.
  EXPECT_EQ(error(f).find("PRIVATE"), std::string::npos);
}

TEST_F(ReplTls, MutualTlsCarriesBytesBothWaysAndProvesThePeersName) {
  const repl::tls_context leader(pki.node("a")), standby(pki.node("b"));
  socket_pair p;
  repl::tls_stream server(leader, p.ends[0].get(), repl::tls_stream::role::accept);
  repl::tls_stream client(standby, p.ends[1].get(), repl::tls_stream::role::connect, "a");
  const auto [s, c] = handshake(server, client);
  ASSERT_EQ(s, status::ok) << server.error();
  ASSERT_EQ(c, status::ok) << client.error();
  EXPECT_TRUE(server.peer_names("b"));
  EXPECT_FALSE(server.peer_names("a"));
  EXPECT_FALSE(server.peer_names("c"));
  EXPECT_EQ(server.peer_names_text(), "b");
  EXPECT_TRUE(client.peer_names("a"));
  // Many records each way, through partial writes (a socketpair holds less than 1 MiB).
  std::string big;
  for (int i = 0; i < (1 << 20) + 3; ++i) big.push_back(static_cast<char>('a' + i % 26));
  EXPECT_EQ(transfer(server, client, big), big);
  EXPECT_EQ(transfer(client, server, "ack"), "ack");
  // The stream is encrypted: nothing of the plaintext shows on the wire.
  socket_pair q;
  repl::tls_stream s2(leader, q.ends[0].get(), repl::tls_stream::role::accept);
  repl::tls_stream c2(standby, q.ends[1].get(), repl::tls_stream::role::connect, "a");
  ASSERT_EQ(handshake(s2, c2), std::make_pair(status::ok, status::ok));
  std::size_t n = 0;
  ASSERT_EQ(c2.write("hello, cluster kvcache, node b", n), status::ok);
  char raw[4096];
  const ssize_t got = ::recv(q.ends[0].get(), raw, sizeof raw, 0);
  ASSERT_GT(got, 0);
  EXPECT_EQ(std::string(raw, static_cast<std::size_t>(got)).find("kvcache"), std::string::npos);
  // An end with close_notify, or without (kill -9), is an end, not an error.
  client.close_notify();
  std::string sink;
  EXPECT_EQ(server.read(sink, 100), status::closed);
  p.ends[0] = repl::socket_fd();
}

TEST_F(ReplTls, AClientOfAnotherCaIsRefused) {
  const repl::tls_context leader(pki.node("a")), intruder(pki.foreign("b"));
  socket_pair p;
  repl::tls_stream server(leader, p.ends[0].get(), repl::tls_stream::role::accept);
  repl::tls_stream client(intruder, p.ends[1].get(), repl::tls_stream::role::connect, "a");
  const auto [s, c] = handshake(server, client);
  EXPECT_EQ(s, status::failed);
  EXPECT_NE(server.error().find("certificate verify failed"), std::string::npos) << server.error();
  EXPECT_FALSE(server.peer_names("b"));
  EXPECT_NE(c, status::ok);
}

TEST_F(ReplTls, AClientWithoutACertificateIsRefused) {
  const repl::tls_context leader(pki.node("a"));
  // A context of the right CA, without a certificate of its own.
  SSL_CTX* bare = SSL_CTX_new(TLS_client_method());
  ASSERT_EQ(SSL_CTX_load_verify_locations(bare, pki.ca_file.c_str(), nullptr), 1);
  socket_pair p;
  repl::tls_stream server(leader, p.ends[0].get(), repl::tls_stream::role::accept);
  SSL* ssl = SSL_new(bare);
  SSL_set_fd(ssl, p.ends[1].get());
  SSL_set_connect_state(ssl);
  status s = status::want_read;
  for (int turn = 0; turn < 100 && (s == status::want_read || s == status::want_write); ++turn) {
    SSL_do_handshake(ssl);
    s = server.handshake();
  }
  EXPECT_EQ(s, status::failed);
  EXPECT_NE(server.error().find("did not return a certificate"), std::string::npos)
      << server.error();
  SSL_free(ssl);
  SSL_CTX_free(bare);
}

TEST_F(ReplTls, AStandbyRefusesALeaderWhoseCertificateNamesAnotherNode) {
  // c's certificate is the cluster CA's, but etcd names a as the leader.
  const repl::tls_context impostor(pki.node("c")), standby(pki.node("b"));
  socket_pair p;
  repl::tls_stream server(impostor, p.ends[0].get(), repl::tls_stream::role::accept);
  repl::tls_stream client(standby, p.ends[1].get(), repl::tls_stream::role::connect, "a");
  const auto [s, c] = handshake(server, client);
  EXPECT_EQ(c, status::failed);
  EXPECT_NE(client.error().find("names c, not node a"), std::string::npos) << client.error();
  EXPECT_NE(s, status::ok);
  // Nor a leader it was given no name for.
  socket_pair q;
  repl::tls_stream s2(impostor, q.ends[0].get(), repl::tls_stream::role::accept);
  repl::tls_stream c2(standby, q.ends[1].get(), repl::tls_stream::role::connect, "");
  EXPECT_EQ(handshake(s2, c2).second, status::failed);
}

TEST_F(ReplTls, PlainBytesAreNoHandshake) {
  const repl::tls_context leader(pki.node("a"));
  socket_pair p;
  repl::tls_stream server(leader, p.ends[0].get(), repl::tls_stream::role::accept);
  ASSERT_TRUE(repl::write_all(p.ends[1], std::string("\x28\0\0\0plain hello, no TLS at all", 31)));
  EXPECT_EQ(server.handshake(), status::failed);
  EXPECT_FALSE(server.error().empty());
  // A peer that ends the connection mid-handshake.
  socket_pair q;
  repl::tls_stream s2(leader, q.ends[0].get(), repl::tls_stream::role::accept);
  EXPECT_EQ(s2.handshake(), status::want_read);
  q.ends[1] = repl::socket_fd();
  const status st = s2.handshake();
  EXPECT_TRUE(st == status::closed || st == status::failed) << static_cast<int>(st);
}
