// One of the load generator's event loops (one per thread, `--threads`; one by
// default): every stream is a coroutine, every connection is watched by one epoll set,
// and paced calls wait on a timer heap. A loop instead of a thread per stream, so on a
// small machine the streams do not queue behind each other in the scheduler and the
// latency measured is the server's, not the generator's.
//
// `spin` polls (epoll_wait with no timeout) instead of sleeping: the load core then
// never has to be woken, which takes tens of microseconds in a VM. For latency runs on
// a core of its own; CPU-per-request runs should not spin (a real client sleeps, and
// waking it is part of what the server pays).
#pragma once

#include <chrono>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <queue>
#include <string_view>
#include <vector>

#include "load/http_client.hpp"

namespace bench {

using clock_type = std::chrono::steady_clock;

class event_loop;

// A stream: a coroutine the loop starts with spawn() and forgets when it returns.
struct stream_task {
  struct promise_type {
    int* live = nullptr;  // the loop's count of unfinished streams
    stream_task get_return_object() {
      return {std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() { --*live; }
    void unhandled_exception() { std::terminate(); }
  };
  std::coroutine_handle<promise_type> handle;
};

// One keep-alive connection driven by the loop.
class async_connection {
 public:
  async_connection(event_loop& loop, std::string host, std::uint16_t port);
  ~async_connection();
  async_connection(const async_connection&) = delete;
  async_connection& operator=(const async_connection&) = delete;

  struct request_awaiter {
    async_connection& c;
    int status = -1;
    bool await_ready();
    void await_suspend(std::coroutine_handle<> h) {
      c.waiter_ = h;
      c.pending_ = this;
      c.since_ = clock_type::now();
    }
    int await_resume() const { return status; }
  };
  // `co_await c.post(path, body)` answers the status, or -1 on a connection error or
  // after event_loop::timeout without an answer (the next call reconnects). body() holds
  // the response body until the next call.
  request_awaiter request(std::string_view method, std::string_view path, std::string_view body);
  request_awaiter post(std::string_view path, std::string_view body) {
    return request("POST", path, body);
  }
  std::string_view body() const { return http_.body(); }

 private:
  friend class event_loop;
  void on_ready();                          // the socket became readable or writable
  void finish(int status);                  // resumes the waiting stream with `status`
  void expire(clock_type::time_point now);  // fails a request waiting past the timeout

  event_loop& loop_;
  http_connection http_;
  std::coroutine_handle<> waiter_;
  request_awaiter* pending_ = nullptr;
  clock_type::time_point since_;  // when the waiting request was suspended
};

class event_loop {
 public:
  // A request without a complete answer after this fails (a hung server must not hang
  // the benchmark).
  static constexpr std::chrono::seconds timeout{10};

  explicit event_loop(bool spin);
  ~event_loop();
  event_loop(const event_loop&) = delete;
  event_loop& operator=(const event_loop&) = delete;

  void spawn(stream_task t);
  // Runs until every spawned stream has returned.
  void run();

  struct sleep_awaiter {
    event_loop& loop;
    clock_type::time_point at;
    bool await_ready() const { return clock_type::now() >= at; }
    void await_suspend(std::coroutine_handle<> h) { loop.timers_.push({at, h}); }
    void await_resume() const {}
  };
  sleep_awaiter sleep_until(clock_type::time_point at) { return {*this, at}; }

 private:
  friend class async_connection;
  bool watch(int fd, async_connection* c);  // adds a fresh socket to the epoll set

  struct timer {
    clock_type::time_point at;
    std::coroutine_handle<> h;
    bool operator>(const timer& o) const { return at > o.at; }
  };
  bool spin_;
  int epoll_fd_;
  std::vector<async_connection*> connections_;  // for the timeout check
  int live_ = 0;
  std::vector<std::coroutine_handle<>> starting_;
  std::priority_queue<timer, std::vector<timer>, std::greater<>> timers_;
};

}  // namespace bench
