// The coroutine type of one request's execution. It starts on the connection's core,
// may hop to the cores that own its rank and keys (shard::mailbox::hop) and always ends
// back home, where its frame is freed into that core's free list: frames are reused,
// and memory is freed on the core that allocated it.
#pragma once

#include <coroutine>
#include <cstddef>
#include <exception>
#include <new>

namespace server {

class frame_pool {
 public:
  static void* allocate(std::size_t bytes);
  static void release(void* frame, std::size_t bytes) noexcept;
};

struct request_task {
  struct promise_type {
    request_task get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
    static void* operator new(std::size_t bytes) { return frame_pool::allocate(bytes); }
    static void operator delete(void* frame, std::size_t bytes) noexcept {
      frame_pool::release(frame, bytes);
    }
  };
};

}  // namespace server
