// etcd's password authentication through the JSON gateway (answers as captured from
// etcd 3.4.23 with auth enabled), against a scripted fake gateway on loopback: the
// authenticate request, the token in the Authorization header, a refused token
// ("invalid auth token", 401) fetched again and the request sent once more, a wrong
// password, a watch cancelled for its token; and the flags of TLS and authentication.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fake_gateway.hpp"
#include "ha/control.hpp"
#include "ha/etcd.hpp"
#include "temp_dir.hpp"

using namespace metad;

namespace {

// The answers etcd 3.4.23's gateway gave (captured with curl, auth enabled).
constexpr const char* kHeader =
    R"("header":{"cluster_id":"324952591200643719","member_id":"3319814642761637952","revision":"7","raft_term":"2"})";
constexpr const char* kWrongPassword =
    R"({"error":"etcdserver: authentication failed, invalid user ID or password","message":"etcdserver: authentication failed, invalid user ID or password","code":3})";
constexpr const char* kInvalidToken =
    R"({"error":"etcdserver: invalid auth token","message":"etcdserver: invalid auth token","code":16})";
constexpr const char* kCommonName =
    "CommonName of client sending a request against gateway will be ignored and not used as "
    "expected\n";

std::string read_answer(std::int64_t revision) {
  return fmt::format(R"({{{},"succeeded":true,"responses":[{{"response_range":{{{}}}}}]}})",
                     kHeader, R"("header":{"revision":")" + std::to_string(revision) + "\"}");
}

ha::etcd_access access_of(const std::string& url, const std::string& password = "s3cret\"\\") {
  ha::etcd_access access(*ha::parse_endpoints(url));
  access.user = "hf3fs-metad";
  access.password = password;
  return access;
}

ha::time_point soon() { return ha::steady::now() + std::chrono::seconds(2); }

TEST(EtcdAuth, AuthenticateRequestEscapesTheStrings) {
  simdjson::dom::parser parser;
  const std::string body = ha::json::authenticate("hf3fs-metad", "a\"b\\c\n\x01");
  const auto doc = parser.parse(body).value();
  EXPECT_EQ(std::string_view(doc["name"]), "hf3fs-metad");
  EXPECT_EQ(std::string_view(doc["password"]), "a\"b\\c\n\x01");
  EXPECT_EQ(ha::json::quote("x"), "\"x\"");
}

TEST(EtcdAuth, WhichAnswersRefuseTheToken) {
  EXPECT_TRUE(ha::json::token_refused(401, kInvalidToken));
  EXPECT_TRUE(ha::json::token_refused(0,
                                      "rpc error: code = Unauthenticated desc = etcdserver: "
                                      "invalid auth token"));
  EXPECT_TRUE(ha::json::token_refused(
      400, R"({"error":"etcdserver: revision of auth store is old","code":9})"));
  EXPECT_FALSE(ha::json::token_refused(400, kWrongPassword));
  EXPECT_FALSE(ha::json::token_refused(
      403,
      R"({"error":"etcdserver: permission denied","message":"etcdserver: permission denied","code":7})"));
  EXPECT_FALSE(ha::json::token_refused(200, "{}"));
}

TEST(EtcdAuth, EveryRequestCarriesTheTokenAndAnExpiredOneIsFetchedAgainOnce) {
  std::atomic<int> issued{0};
  std::atomic<bool> expire_first{false};
  fake_gateway gateway([&](const gateway_request& r) -> gateway_answer {
    if (r.path == "/v3/auth/authenticate") {
      simdjson::dom::parser parser;
      const auto doc = parser.parse(r.body).value();
      if (std::string_view(doc["password"]) != "s3cret\"\\") return {400, kWrongPassword};
      const int n = ++issued;
      return {200, fmt::format(R"({{{},"token":"tok{}.{}"}})", kHeader, n, n + 10)};
    }
    if (expire_first && r.authorization == "tok1.11") return {401, kInvalidToken};
    if (r.authorization.empty()) {
      return {400, R"({"error":"etcdserver: user name is empty","code":3})"};
    }
    return {200, read_answer(7)};
  });
  ha::etcd_client etcd(access_of(gateway.url()), std::chrono::milliseconds(500));
  auto first = etcd.read({"/hf3fs-metad/c/leader"}, soon());
  ASSERT_TRUE(first) << first.error;
  EXPECT_EQ(first->revision, 7);
  EXPECT_EQ(etcd.authentications(), 1u);
  ASSERT_TRUE(etcd.read({"/hf3fs-metad/c/leader"}, soon()));
  EXPECT_EQ(etcd.authentications(), 1u);  // the token is kept

  expire_first = true;  // etcd's --auth-token-ttl passed with the token unused
  auto again = etcd.read({"/hf3fs-metad/c/leader"}, soon());
  ASSERT_TRUE(again) << again.error;
  EXPECT_EQ(etcd.authentications(), 2u);
  auto revoked = etcd.revoke(5, soon());  // revoke goes through the same path
  EXPECT_TRUE(revoked) << revoked.error;

  const auto seen = gateway.requests();
  std::vector<std::pair<std::string, std::string>> calls;
  for (const auto& r : seen) calls.emplace_back(r.path, r.authorization);
  const std::vector<std::pair<std::string, std::string>> expected{
      {"/v3/auth/authenticate", ""},  {"/v3/kv/txn", "tok1.11"},     {"/v3/kv/txn", "tok1.11"},
      {"/v3/kv/txn", "tok1.11"},      {"/v3/auth/authenticate", ""}, {"/v3/kv/txn", "tok2.12"},
      {"/v3/lease/revoke", "tok2.12"}};
  EXPECT_EQ(calls, expected);
}

TEST(EtcdAuth, ATokenRefusedTwiceInARowFailsTheRequestWithoutLooping) {
  int authentications = 0;
  fake_gateway gateway([&](const gateway_request& r) -> gateway_answer {
    if (r.path == "/v3/auth/authenticate") {
      ++authentications;
      return {200, fmt::format(R"({{{},"token":"t{}"}})", kHeader, authentications)};
    }
    return {401, kInvalidToken};
  });
  ha::etcd_client etcd(access_of(gateway.url()), std::chrono::milliseconds(500));
  auto read = etcd.read({"/k"}, soon());
  EXPECT_FALSE(read);
  EXPECT_NE(read.error.find("invalid auth token"), std::string::npos) << read.error;
  EXPECT_EQ(gateway.requests().size(), 4u);  // authenticate, txn, authenticate, txn
}

TEST(EtcdAuth, AWrongPasswordIsRefusedAndNeverShown) {
  fake_gateway gateway([&](const gateway_request& r) -> gateway_answer {
    if (r.path == "/v3/auth/authenticate") return {400, kWrongPassword};
    return {400, R"({"error":"etcdserver: user name is empty","code":3})"};
  });
  ha::etcd_client etcd(access_of(gateway.url(), "hunter2"), std::chrono::milliseconds(500));
  std::string error;
  EXPECT_EQ(etcd.authenticate(soon(), error), ha::auth_outcome::refused);
  EXPECT_NE(error.find("refused the password of user hf3fs-metad"), std::string::npos) << error;
  EXPECT_EQ(error.find("hunter2"), std::string::npos);
  auto read = etcd.read({"/k"}, soon());  // requests fail without reaching the gateway
  EXPECT_FALSE(read);
  EXPECT_EQ(read.error.find("hunter2"), std::string::npos);
  for (const auto& r : gateway.requests()) EXPECT_EQ(r.path, "/v3/auth/authenticate");

  ha::config c;
  c.etcd = access_of(gateway.url(), "hunter2");
  const auto check = ha::check_etcd_access(c, soon());
  EXPECT_EQ(check.outcome, ha::access_check::verdict::refused);
  EXPECT_NE(check.message.find("refused the password"), std::string::npos) << check.message;
}

TEST(EtcdAuth, ACertificateWithACommonNameIsRefusedWithWhatToDo) {
  fake_gateway gateway([&](const gateway_request&) -> gateway_answer {
    return {400, kCommonName};  // plain text, as etcd --client-cert-auth answers
  });
  ha::etcd_client etcd(access_of(gateway.url()), std::chrono::milliseconds(500));
  std::string error;
  EXPECT_EQ(etcd.authenticate(soon(), error), ha::auth_outcome::refused);
  EXPECT_NE(error.find("without a CN"), std::string::npos) << error;
}

TEST(EtcdAuth, NoMemberAnsweringIsNotARefusal) {
  ha::config c;
  c.etcd = access_of("http://127.0.0.1:1");
  const auto check = ha::check_etcd_access(c, soon());
  EXPECT_EQ(check.outcome, ha::access_check::verdict::failed);
}

TEST(EtcdAuth, AWatchCancelledForItsTokenAuthenticatesAgainOnReopen) {
  std::atomic<int> issued{0};
  fake_gateway gateway([&](const gateway_request& r) -> gateway_answer {
    if (r.path == "/v3/auth/authenticate") {
      const int n = ++issued;
      return {200, fmt::format(R"({{{},"token":"w{}"}})", kHeader, n)};
    }
    if (r.authorization == "w1") {
      return {200,
              fmt::format(R"({{"result":{{{},"watch_id":"-1","created":true,"canceled":true,)"
                          R"("cancel_reason":"rpc error: code = Unauthenticated desc = )"
                          R"(etcdserver: invalid auth token"}}}})",
                          kHeader) +
                  "\n",
              true};
    }
    return {200, fmt::format(R"({{"result":{{{},"created":true}}}})", kHeader) + "\n", true};
  });
  ha::etcd_client etcd(access_of(gateway.url()), std::chrono::milliseconds(500));
  ha::etcd_watch watch;
  std::string error;
  ASSERT_TRUE(watch.open(etcd, "/k", 3, soon(), error)) << error;
  std::vector<ha::watch_event> events;
  EXPECT_EQ(watch.next(soon(), events, error), ha::etcd_watch::status::ended);
  EXPECT_NE(error.find("invalid auth token"), std::string::npos) << error;
  ASSERT_TRUE(watch.open(etcd, "/k", 3, soon(), error)) << error;
  EXPECT_EQ(watch.next(ha::steady::now() + std::chrono::milliseconds(200), events, error),
            ha::etcd_watch::status::timeout);
  EXPECT_EQ(etcd.authentications(), 2u);
  const auto seen = gateway.requests();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[1].authorization, "w1");
  EXPECT_EQ(seen[3].authorization, "w2");
}

TEST(EtcdEndpoints, HttpsUrls) {
  const auto list = ha::parse_endpoints("https://etcd-a:2379,https://10.0.1.2:2379/");
  ASSERT_TRUE(list);
  ASSERT_EQ(list->size(), 2u);
  EXPECT_TRUE((*list)[0].tls);
  EXPECT_EQ((*list)[0].host, "etcd-a");
  EXPECT_EQ((*list)[1].host, "10.0.1.2");
  EXPECT_EQ((*list)[1].port, 2379);
  EXPECT_FALSE(ha::parse_endpoint("http://a:1")->tls);
  for (const char* bad : {"https://a", "https://:1", "https//a:1", "httpss://a:1", "HTTPS://a:1",
                          "https://a:1/v3", "https://u@a:1"}) {
    EXPECT_FALSE(ha::parse_endpoints(bad)) << bad;
  }
}

std::string write_file(const std::string& dir, const std::string& name, const std::string& text,
                       mode_t mode) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(EtcdFlags, TlsAndAuthenticationSettings) {
  sim::temp_dir dir("metad-etcd-flags");
  const std::string good = write_file(dir.path(), "pw", "  s3cret \nsecond line\n", 0600);
  const std::string owner_only = write_file(dir.path(), "pw400", "x", 0400);
  const std::string open = write_file(dir.path(), "pw644", "s3cret\n", 0644);
  const std::string group = write_file(dir.path(), "pw640", "s3cret\n", 0640);
  const std::string empty = write_file(dir.path(), "empty", " \n", 0600);
  // The password read from `path`, or "" and why not in `error` (a fresh one each time).
  std::string error;
  auto password_of = [&error](const std::string& path) {
    error.clear();
    return ha::read_password_file(path, error).value_or("");
  };

  auto base = [](const char* urls = "https://127.0.0.1:2379,https://127.0.0.1:2380") {
    ha::config c;
    c.etcd.endpoints = ha::parse_endpoints(urls).value();
    c.cluster = "c";
    c.node = "a";
    return c;
  };
  ha::config c = base();
  EXPECT_EQ(ha::validate(c), "");
  EXPECT_TRUE(c.etcd.endpoints[0].tls);
  c.etcd.user = "hf3fs-metad";
  EXPECT_NE(ha::validate(c), "");  // a user needs the password
  c.etcd.password = password_of(good);
  EXPECT_EQ(error, "");
  EXPECT_EQ(c.etcd.password, "s3cret");
  EXPECT_EQ(ha::validate(c), "");
  EXPECT_TRUE(c.etcd.authenticates());
  EXPECT_EQ(password_of(owner_only), "x");
  EXPECT_EQ(error, "");

  for (const std::string& bad : {open, group}) {
    EXPECT_EQ(password_of(bad), "");
    EXPECT_NE(error.find("chmod 600"), std::string::npos) << error;
    EXPECT_EQ(error.find("s3cret"), std::string::npos) << error;
  }
  EXPECT_EQ(password_of(empty), "");
  EXPECT_NE(error.find("empty"), std::string::npos) << error;
  EXPECT_EQ(password_of(dir.path() + "/missing"), "");
  EXPECT_NE(error, "");
  EXPECT_EQ(password_of(dir.path()), "");  // a directory
  EXPECT_NE(error, "");
  EXPECT_FALSE(ha::valid_name("a b"));

  ha::config cert = base();
  cert.etcd.tls_paths.cert = "/x/c.pem";
  EXPECT_NE(ha::validate(cert), "");  // a certificate needs its key
  cert.etcd.tls_paths.key = "/x/c.key";
  EXPECT_EQ(ha::validate(cert), "");
  const std::string missing = ha::prepare_etcd(cert);  // the files are checked here
  EXPECT_NE(missing.find("--ha-etcd-cert /x/c.pem"), std::string::npos) << missing;

  ha::config ca = base();
  ca.etcd.tls_paths.ca = dir.path() + "/nope.pem";
  EXPECT_NE(ha::prepare_etcd(ca).find("--ha-etcd-ca"), std::string::npos);
  ha::config system_cas = base();
  EXPECT_EQ(ha::prepare_etcd(system_cas), "");
  EXPECT_NE(system_cas.etcd.tls, nullptr);

  ha::config plain = base("http://127.0.0.1:2379");
  EXPECT_EQ(ha::prepare_etcd(plain), "");
  EXPECT_EQ(plain.etcd.tls, nullptr);
  ha::config plain_ca = plain;
  plain_ca.etcd.tls_paths.ca = "/x/ca.pem";
  EXPECT_NE(ha::validate(plain_ca).find("https"), std::string::npos);
  ha::config plain_user = plain;
  plain_user.etcd.user = "u";
  plain_user.etcd.password = password_of(good);
  EXPECT_NE(ha::validate(plain_user).find("https"), std::string::npos);  // no password in clear
  ha::config mixed = base("http://a:1,https://b:2");
  EXPECT_NE(ha::validate(mixed), "");
}

}  // namespace
