// The coroutine types of the cores' work: fire-and-forget tasks (detached_task, with the
// frame allocator as a parameter) and awaited steps (subtask). One request's execution
// (request_task) starts on the connection's core, may hop to the cores that own its rank
// and keys (smp::mailbox::hop_to) and always ends back home, where its frame is freed
// into that core's free list: frames are reused, and memory is freed on the core that
// allocated it.
#pragma once

#include <coroutine>
#include <cstddef>
#include <exception>
#include <new>
#include <utility>

namespace metad::smp {

class frame_pool {
 public:
  static void* allocate(std::size_t bytes);
  static void release(void* frame, std::size_t bytes) noexcept;
};

// Frames from the global heap: a coroutine that lives long or may end on another thread.
struct heap_frames {
  static void* allocate(std::size_t bytes) { return ::operator new(bytes); }
  // Unsized: clang (the fuzz build) has no sized deallocation unless asked for it.
  static void release(void* frame, std::size_t) noexcept { ::operator delete(frame); }
};

// A fire-and-forget coroutine: starts eagerly, destroys itself at its end; exceptions are
// fatal. Frames come from `Frames` (allocate/release).
template <typename Frames>
struct detached_task {
  struct promise_type {
    detached_task get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
    static void* operator new(std::size_t bytes) { return Frames::allocate(bytes); }
    static void operator delete(void* frame, std::size_t bytes) noexcept {
      Frames::release(frame, bytes);
    }
  };
};

// One request's execution: its frame is reused from its home core's free list.
using request_task = detached_task<frame_pool>;

}  // namespace metad::smp

namespace metad::smp {

// A step of a request that hops on its own (eviction inside an allocation, the removal
// walk of /keys/delete): `co_await`ed by the request's coroutine, it starts when
// awaited and resumes the awaiter when done. It must end on the core it started on, so
// its frame is freed where it was allocated.
template <typename T>
class subtask {
 public:
  struct promise_type {
    T value{};
    std::coroutine_handle<> awaiter;

    subtask get_return_object() noexcept {
      return subtask(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct resume_awaiter {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        return h.promise().awaiter;
      }
      void await_resume() noexcept {}
    };
    resume_awaiter final_suspend() noexcept { return {}; }
    void return_value(T v) noexcept { value = v; }
    void unhandled_exception() noexcept { std::terminate(); }
    static void* operator new(std::size_t bytes) { return frame_pool::allocate(bytes); }
    static void operator delete(void* frame, std::size_t bytes) noexcept {
      frame_pool::release(frame, bytes);
    }
  };

  subtask(subtask&& other) noexcept : h_(std::exchange(other.h_, {})) {}
  subtask(const subtask&) = delete;
  subtask& operator=(const subtask&) = delete;
  subtask& operator=(subtask&&) = delete;
  ~subtask() {
    if (h_) h_.destroy();
  }

  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiter) noexcept {
    h_.promise().awaiter = awaiter;
    return h_;
  }
  T await_resume() noexcept { return h_.promise().value; }

 private:
  explicit subtask(std::coroutine_handle<promise_type> h) : h_(h) {}
  std::coroutine_handle<promise_type> h_;
};

}  // namespace metad::smp
