// What the log writer's tests share: a coroutine that waits for an lsn to be durable
// and records the answer, and an unlinked temporary file to write the log to.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <coroutine>
#include <cstdint>
#include <exception>

#include "store/log.hpp"

namespace log_test {

// A fire-and-forget coroutine: starts at once, frees itself at its end.
struct fire {
  struct promise_type {
    fire get_return_object() { return {}; }
    std::suspend_never initial_suspend() { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

// Waits until `lsn` is durable (or failed): result 1 once durable, 0 on failure; it
// stays as it was while the wait goes on.
inline fire wait_for(metad::store::log_writer& log, std::uint64_t lsn, int& result) {
  result = (co_await log.durable_until(lsn)) ? 1 : 0;
}

// A file descriptor of an unlinked temporary file.
inline int temp_fd() {
  char path[] = "/tmp/metad-log-XXXXXX";
  const int fd = ::mkstemp(path);
  ::unlink(path);
  return fd;
}

}  // namespace log_test
