// A one-member etcd for the integration tests: Debian's /usr/bin/etcd on free loopback
// ports with a temporary data directory, tuned as docs/replication.md describes
// ("Fencing and lease timing": heartbeat 50 ms, election 500 ms, a 1 s lease TTL).
// kill() is a kill -9; start() again restarts it on the same ports and data.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ha/etcd.hpp"

using namespace metad;

namespace ha_test {

inline constexpr const char* kEtcdBinary = "/usr/bin/etcd";

inline bool etcd_available() { return ::access(kEtcdBinary, X_OK) == 0; }

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

class etcd_process {
 public:
  etcd_process() : client_port_(free_port()), peer_port_(free_port()) {
    char dir[] = "/tmp/metad-ha-etcd-XXXXXX";
    dir_ = ::mkdtemp(dir);
  }
  ~etcd_process() {
    kill();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(client_port_); }

  // Starts etcd and waits until it answers (false after 10 s).
  bool start() {
    const std::string client = url();
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    const std::vector<std::string> args{kEtcdBinary,    "--name",
                                        "n1",           "--data-dir",
                                        dir_ + "/data", "--listen-client-urls",
                                        client,         "--advertise-client-urls",
                                        client,         "--listen-peer-urls",
                                        peer,           "--initial-advertise-peer-urls",
                                        peer,           "--initial-cluster",
                                        "n1=" + peer,   "--heartbeat-interval",
                                        "50",           "--election-timeout",
                                        "500"};
    // Everything the child needs is built before fork: it only opens, dups and execs.
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const std::string log_path = dir_ + "/etcd.log";
    pid_ = ::fork();
    if (pid_ == 0) {
      const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(log, 1);
      ::dup2(log, 2);
      ::execv(kEtcdBinary, argv.data());
      ::_exit(127);
    }
    ha::etcd_client probe(*ha::parse_endpoints(client), std::chrono::milliseconds(100));
    const auto give_up = ha::steady::now() + std::chrono::seconds(10);
    while (ha::steady::now() < give_up) {
      if (probe.read({"/probe"}, ha::steady::now() + std::chrono::milliseconds(200))) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  int client_port_;
  int peer_port_;
  std::string dir_;
  pid_t pid_ = -1;
};

}  // namespace ha_test
