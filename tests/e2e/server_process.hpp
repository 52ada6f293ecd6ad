// Starts the real hf3fs-metad binary ($METAD_BIN, transport $METAD_IO) on an ephemeral
// port, keeps draining its stderr on a thread, and stops it with SIGTERM, expecting a
// clean exit. One object = one server process; owned by the test thread that made it.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace e2e {

inline constexpr std::chrono::seconds kStartTimeout{10};
inline constexpr std::chrono::seconds kStopTimeout{10};
inline constexpr std::size_t kStderrLinesKept = 200;

class server_process {
 public:
  explicit server_process(int threads, const std::vector<std::string>& extra_args = {}) {
    const std::vector<std::string> args = command_line(threads, extra_args);
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::vector<char*> argv;
    for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();

    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      // Child: only async-signal-safe calls until exec. Die with the test process.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(pipe_fds[1], STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(pipe_fds[1]);
    stderr_fd_ = pipe_fds[0];
    try {
      port_ = wait_for_listening_line();
    } catch (...) {
      kill_and_reap();
      ::close(stderr_fd_);
      throw;
    }
    drainer_ = std::thread([this] { drain_stderr(); });
  }

  ~server_process() {
    ::kill(pid_, SIGTERM);
    const int status = wait_for_exit(kStopTimeout);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "hf3fs-metad did not exit cleanly after SIGTERM (wait status " << status << ")";
    drainer_.join();
    ::close(stderr_fd_);
    if (::testing::Test::HasFailure()) {
      std::cerr << "---- last hf3fs-metad stderr lines ----\n" << stderr_tail() << "----\n";
    }
  }

  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;

  std::uint16_t port() const { return port_; }

  std::string stderr_tail() const {
    std::lock_guard lock(stderr_mutex_);
    std::string out;
    for (const auto& line : stderr_lines_) out.append(line).append("\n");
    return out;
  }

 private:
  static std::string required_env(const char* name) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') {
      throw std::runtime_error(std::string("environment variable ") + name +
                               " is not set (ctest sets METAD_BIN and METAD_IO)");
    }
    return value;
  }

  static std::vector<std::string> command_line(int threads,
                                               const std::vector<std::string>& extra_args) {
    std::vector<std::string> args{
        required_env("METAD_BIN"), "--port", "0", "--threads", std::to_string(threads), "--io",
        required_env("METAD_IO")};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    return args;
  }

  void remember_line(std::string line) {
    std::lock_guard lock(stderr_mutex_);
    stderr_lines_.push_back(std::move(line));
    if (stderr_lines_.size() > kStderrLinesKept) stderr_lines_.pop_front();
  }

  // Reads stderr lines until "listening on 127.0.0.1:PORT"; returns PORT.
  std::uint16_t wait_for_listening_line() {
    static constexpr std::string_view kMarker = "listening on 127.0.0.1:";
    const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
    std::string pending;
    while (std::chrono::steady_clock::now() < deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd pfd{stderr_fd_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(std::max<long>(left.count(), 1))) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(stderr_fd_, chunk, sizeof chunk);
      if (n <= 0) break;  // the server exited before listening
      pending.append(chunk, static_cast<std::size_t>(n));
      for (std::size_t eol; (eol = pending.find('\n')) != std::string::npos;) {
        std::string line = pending.substr(0, eol);
        pending.erase(0, eol + 1);
        const std::size_t at = line.find(kMarker);
        remember_line(line);
        if (at != std::string::npos) {
          carried_over_ = pending;
          return static_cast<std::uint16_t>(std::stoul(line.substr(at + kMarker.size())));
        }
      }
    }
    throw std::runtime_error("hf3fs-metad did not print \"" + std::string(kMarker) +
                             "PORT\" within 10 s; stderr:\n" + stderr_tail() + pending);
  }

  void drain_stderr() {
    std::string pending = std::move(carried_over_);
    char chunk[4096];
    while (true) {
      const ssize_t n = ::read(stderr_fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      pending.append(chunk, static_cast<std::size_t>(n));
      for (std::size_t eol; (eol = pending.find('\n')) != std::string::npos;) {
        remember_line(pending.substr(0, eol));
        pending.erase(0, eol + 1);
      }
    }
    if (!pending.empty()) remember_line(pending);
  }

  // Wait status of the child; SIGKILLs it if it outlives `timeout`.
  int wait_for_exit(std::chrono::milliseconds timeout) {
    const auto poll_interval = std::chrono::milliseconds(10);
    for (auto waited = std::chrono::milliseconds(0); waited < timeout; waited += poll_interval) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) return status;
      std::this_thread::sleep_for(poll_interval);
    }
    return kill_and_reap();
  }

  int kill_and_reap() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
  }

  pid_t pid_ = -1;
  int stderr_fd_ = -1;
  std::uint16_t port_ = 0;
  std::string carried_over_;  // stderr bytes read past the listening line
  std::thread drainer_;
  mutable std::mutex stderr_mutex_;
  std::deque<std::string> stderr_lines_;
};

}  // namespace e2e
