#include "load/event_loop.hpp"

#include <sys/epoll.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <system_error>
#include <utility>

namespace bench {

async_connection::async_connection(event_loop& loop, std::string host, std::uint16_t port)
    : loop_(loop), http_(std::move(host), port) {
  loop_.connections_.push_back(this);
}

async_connection::~async_connection() {
  auto& all = loop_.connections_;
  all.erase(std::find(all.begin(), all.end(), this));
}

async_connection::request_awaiter async_connection::request(std::string_view method,
                                                            std::string_view path,
                                                            std::string_view body) {
  if (http_.fd() < 0 && http_.connect() && !loop_.watch(http_.fd(), this)) http_.close();
  http_.begin(method, path, body);
  return {*this};
}

bool async_connection::request_awaiter::await_ready() {
  const http_connection::progress p = c.http_.advance();
  if (p == http_connection::progress::done) status = c.http_.status();
  return p == http_connection::progress::done || p == http_connection::progress::failed;
}

void async_connection::on_ready() {
  if (!waiter_) return;  // an edge between requests
  const http_connection::progress p = http_.advance();
  if (p == http_connection::progress::done) finish(http_.status());
  if (p == http_connection::progress::failed) finish(-1);
}

void async_connection::finish(int status) {
  pending_->status = status;
  pending_ = nullptr;
  std::exchange(waiter_, {}).resume();
}

void async_connection::expire(clock_type::time_point now) {
  if (!waiter_ || now - since_ < event_loop::timeout) return;
  http_.close();
  finish(-1);
}

event_loop::event_loop(bool spin) : spin_(spin), epoll_fd_(::epoll_create1(EPOLL_CLOEXEC)) {
  if (epoll_fd_ < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
}

event_loop::~event_loop() { ::close(epoll_fd_); }

bool event_loop::watch(int fd, async_connection* c) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.ptr = c;
  return ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) == 0;
}

void event_loop::spawn(stream_task t) {
  t.handle.promise().live = &live_;
  ++live_;
  starting_.push_back(t.handle);
}

void event_loop::run() {
  // Paced calls sleep until their start; the default 50 µs of timer slack (a per-thread
  // setting) would be counted in every latency.
  ::prctl(PR_SET_TIMERSLACK, 1UL);
  for (std::coroutine_handle<> h : std::exchange(starting_, {})) h.resume();
  epoll_event events[256];
  clock_type::time_point next_check = clock_type::now();
  while (live_ > 0) {
    const clock_type::time_point now = clock_type::now();
    if (now >= next_check) {
      next_check = now + std::chrono::milliseconds(100);
      // A copy: a stream resumed here may end, and its connection with it.
      for (async_connection* c : std::vector<async_connection*>(connections_)) {
        if (std::find(connections_.begin(), connections_.end(), c) != connections_.end())
          c->expire(now);
      }
    }
    while (!timers_.empty() && timers_.top().at <= now) {
      const std::coroutine_handle<> h = timers_.top().h;
      timers_.pop();
      h.resume();
    }
    timespec wait{0, 0};
    if (!spin_) {
      // Sleep until the next timer (or an event); a stream always waits on one of them.
      const auto ns = timers_.empty() ? std::chrono::nanoseconds(100'000'000)
                                      : std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            timers_.top().at - clock_type::now());
      if (ns.count() > 0)
        wait = {static_cast<time_t>(ns.count() / 1'000'000'000),
                static_cast<long>(ns.count() % 1'000'000'000)};
    }
    const int n = ::epoll_pwait2(epoll_fd_, events, 256, &wait, nullptr);
    if (n < 0 && errno != EINTR)
      throw std::system_error(errno, std::generic_category(), "epoll_pwait2");
    for (int i = 0; i < n; ++i) static_cast<async_connection*>(events[i].data.ptr)->on_ready();
  }
}

}  // namespace bench
