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

struct gateway_request {
  std::string path;
  std::string authorization;  // the header's value, "" if absent
  std::string body;
};

struct gateway_answer {
  int status = 200;
  std::string body;
  bool stream = false;  // a watch: the body is sent as one chunk, then the connection stays
};

// One-thread HTTP/1.1 server on 127.0.0.1 answering each request with `answer(request)`
// (keep-alive; a streamed answer holds its connection until the next accept).
class fake_gateway {
 public:
  using handler = std::function<gateway_answer(const gateway_request&)>;

  explicit fake_gateway(handler answer) : answer_(std::move(answer)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
    EXPECT_EQ(::listen(listener_, 16), 0);
    socklen_t len = sizeof at;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&at), &len);
    port_ = ntohs(at.sin_port);
    acceptor_ = std::thread([this] { serve(); });
  }
  ~fake_gateway() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    acceptor_.join();
    {
      std::lock_guard lock(mutex_);
      for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : conversations_) t.join();
    ::close(listener_);
    for (int fd : open_) ::close(fd);
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<gateway_request> requests() {
    std::lock_guard lock(mutex_);
    return seen_;
  }

 private:
  // A thread per connection: the client keeps its request connection alive while a
  // watch opens another.
  void serve() {
    while (!stopping_) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::lock_guard lock(mutex_);
      open_.push_back(fd);
      conversations_.emplace_back([this, fd] { converse(fd); });
    }
  }

  // Answers requests on fd until it closes (the destructor closes it); a streamed
  // answer ends the conversation with the connection left open.
  bool converse(int fd) {
    std::string in;
    char buffer[4096];
    for (;;) {
      const std::size_t end = in.find("\r\n\r\n");
      if (end == std::string::npos) {
        const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) return false;
        in.append(buffer, static_cast<std::size_t>(n));
        continue;
      }
      const std::string head = in.substr(0, end);
      std::size_t length = 0;
      gateway_request request;
      request.path = head.substr(5, head.find(' ', 5) - 5);  // "POST /path HTTP/1.1"
      std::size_t at = 0;
      while ((at = head.find("\r\n", at)) != std::string::npos) {
        at += 2;
        const std::string line = head.substr(at, head.find("\r\n", at) - at);
        if (line.rfind("Content-Length: ", 0) == 0) length = std::stoul(line.substr(16));
        if (line.rfind("Authorization: ", 0) == 0) request.authorization = line.substr(15);
      }
      while (in.size() < end + 4 + length) {
        const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) return false;
        in.append(buffer, static_cast<std::size_t>(n));
      }
      request.body = in.substr(end + 4, length);
      in.erase(0, end + 4 + length);
      {
        std::lock_guard lock(mutex_);
        seen_.push_back(request);
      }
      const gateway_answer answer = answer_(request);
      std::string out;
      if (answer.stream) {
        out = fmt::format(
            "HTTP/1.1 {} OK\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n",
            answer.status, answer.body.size(), answer.body);
      } else {
        out = fmt::format(
            "HTTP/1.1 {} X\r\nContent-Type: application/json\r\n"
            "Content-Length: {}\r\n\r\n{}",
            answer.status, answer.body.size(), answer.body);
      }
      ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
      if (answer.stream) return true;
    }
  }

  handler answer_;
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::vector<gateway_request> seen_;       // under mutex_
  std::vector<int> open_;                   // under mutex_
  std::vector<std::thread> conversations_;  // under mutex_ until the acceptor ends
};

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
