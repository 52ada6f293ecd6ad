// A scripted etcd JSON gateway for the tests that run an ha::control: a
// one-thread-per-connection HTTP/1.1 server on loopback that answers each request with
// what the test's handler returns (tests/ha: etcd_auth_test.cpp, control_lease_test.cpp;
// tests/server/fencing_test.cpp).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ha/base64.hpp"

namespace {

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

// The etcd side of one node's election, as scripted gateways answer it: the node's
// campaign txn writes the leader key (`key` = `value`, created at revision `epoch` under
// lease `lease`) and wins; every other txn reads the leader key, absent until then.
// `header` is the response header every answer carries. Any thread.
class scripted_election {
 public:
  scripted_election(std::string key, std::string value, std::string header, std::int64_t epoch,
                    std::int64_t lease)
      : key_(std::move(key)),
        value_(std::move(value)),
        header_(std::move(header)),
        epoch_(epoch),
        lease_(lease) {}

  // The answer to a POST /v3/kv/txn.
  gateway_answer txn(const gateway_request& request) {
    std::lock_guard lock(mutex_);
    if (request.body.find("request_put") != std::string::npos) {  // the campaign
      key_written_ = true;
      return {200, fmt::format(R"({{{0},"succeeded":true,"responses":[{{"response_put":{{{0}}}}},)"
                               R"({{"response_range":{{{0},"kvs":[{1}],"count":"1"}}}}]}})",
                               header_, leader_kv())};
    }
    const std::string first = key_written_ ? fmt::format(R"("kvs":[{}],"count":"1")", leader_kv())
                                           : std::string(R"("count":"0")");
    return {200, fmt::format(R"({{{0},"succeeded":true,"responses":[)"
                             R"({{"response_range":{{{0},{1}}}}},{{"response_range":{{{0}}}}}]}})",
                             header_, first)};
  }

 private:
  std::string leader_kv() const {
    return fmt::format(
        R"({{"key":"{}","value":"{}","create_revision":"{}","mod_revision":"{}","version":"1","lease":"{}"}})",
        metad::ha::base64_encode(key_), metad::ha::base64_encode(value_), epoch_, epoch_, lease_);
  }

  const std::string key_, value_, header_;
  const std::int64_t epoch_, lease_;
  std::mutex mutex_;
  bool key_written_ = false;  // under mutex_
};

}  // namespace
