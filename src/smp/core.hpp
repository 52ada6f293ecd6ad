// Which core the calling thread is working as. A core thread sets it for its whole life;
// mailbox::drain sets it while it resumes a core's coroutines, so that a test thread
// that drains simulated cores in turn is each of them in turn. Any thread may call these.
#pragma once

namespace metad::smp {

// The core the calling thread works as; -1 on a thread that is no core.
// Out of line on purpose: a coroutine that hops reads it again after each resumption,
// never a value (or a thread-local's address) kept from another thread.
int this_core() noexcept;

// Makes the calling thread core `core` until the scope ends (then what it was before).
class core_scope {
 public:
  explicit core_scope(int core) noexcept;
  ~core_scope();
  core_scope(const core_scope&) = delete;
  core_scope& operator=(const core_scope&) = delete;

 private:
  int outer_;
};

}  // namespace metad::smp
