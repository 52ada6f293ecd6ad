// The coroutine shapes the transports use: a fire-and-forget coroutine (each connection's
// serve loop) and an awaiter that parks a coroutine until someone resumes it.
#pragma once

#include <coroutine>
#include <exception>

namespace metad::net {

// Starts eagerly, destroys itself at the end; exceptions are fatal.
struct detached {
  struct promise_type {
    detached get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};

// co_await parked_awaiter{slot}: suspends and leaves the handle in `slot`.
struct parked_awaiter {
  std::coroutine_handle<>& slot;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) noexcept { slot = h; }
  void await_resume() const noexcept {}
};

}  // namespace metad::net
