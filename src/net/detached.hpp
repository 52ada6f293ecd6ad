// The coroutine shapes the transports use: a fire-and-forget coroutine (each connection's
// serve loop) and an awaiter that parks a coroutine until someone resumes it.
#pragma once

#include <coroutine>

#include "smp/request_task.hpp"

namespace metad::net {

// Each connection's serve loop: lives as long as its connection, its frame on the heap.
using detached = smp::detached_task<smp::heap_frames>;

// co_await parked_awaiter{slot}: suspends and leaves the handle in `slot`.
struct parked_awaiter {
  std::coroutine_handle<>& slot;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) noexcept { slot = h; }
  void await_resume() const noexcept {}
};

}  // namespace metad::net
