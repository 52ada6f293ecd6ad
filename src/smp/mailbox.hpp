// Cross-core hand-off of coroutines: one lock-free single-producer/single-consumer ring
// per ordered pair of cores. A coroutine on core A that must run on core B posts its
// handle into ring A→B; core B resumes it when it drains its inbound rings. A full ring
// spills into an overflow list owned by the producer, flushed on its next drain (the
// number of coroutines in flight is bounded by the connection limit, so this is bounded).
// Wake-ups: a core about to sleep announces it; a producer writes the target's eventfd
// only then. A coroutine hops with hop_to(c); drain(self) runs what it resumes as core
// `self` (this_core()), so that one thread may drain simulated cores in turn (tests).
#pragma once

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "metad/assert.hpp"
#include "smp/core.hpp"

namespace metad::smp {

class spsc_ring {
 public:
  explicit spsc_ring(std::size_t slots_pow2);
  // Producer side. False when full.
  bool push(std::coroutine_handle<> h);
  // Consumer side. Empty handle when empty.
  std::coroutine_handle<> pop();
  bool empty() const;

 private:
  std::vector<std::coroutine_handle<>> slots_;
  std::size_t mask_;
  alignas(64) std::atomic<std::size_t> head_{0};  // consumer position
  std::size_t tail_cache_ = 0;                    // consumer's view of tail_
  alignas(64) std::atomic<std::size_t> tail_{0};  // producer position
  std::size_t head_cache_ = 0;                    // producer's view of head_
};

class mailbox {
 public:
  mailbox(int cores, std::size_t slots_per_ring);
  ~mailbox();
  mailbox(const mailbox&) = delete;
  mailbox& operator=(const mailbox&) = delete;

  int cores() const { return cores_; }
  // Called on core `from`: core `to` will resume h.
  void post(int from, int to, std::coroutine_handle<> h);
  // Called on core `self`: flushes its overflow, resumes every handle posted to it.
  // Returns how many were resumed.
  std::size_t drain(int self);
  // Called on core `self` before it blocks: false when work is already waiting.
  bool prepare_sleep(int self);
  void woke(int self);
  // The eventfd a sleeping core waits on (readable after a wake-up).
  int wake_fd(int self) const;
  // Wakes a core whether or not it sleeps (shutdown).
  void wake(int core);
  // Hand-offs posted by `core` so far (read on that core: metrics).
  std::uint64_t posted(int core) const;

  // co_await mb.hop_to(c): the coroutine goes on on core c, from wherever it runs
  // (this_core()); a no-op when that is c. Asserts that it then runs on core c.
  struct hop_awaiter {
    mailbox& mb;
    int to;
    bool await_ready() const noexcept { return this_core() == to; }
    void await_suspend(std::coroutine_handle<> h) { mb.post(this_core(), to, h); }
    void await_resume() const { METAD_ASSERT(this_core() == to); }
  };
  hop_awaiter hop_to(int to) { return {*this, to}; }

 private:
  struct core_slot;
  spsc_ring& ring(int from, int to);
  void notify(int to);

  int cores_;
  std::vector<std::unique_ptr<spsc_ring>> rings_;  // [from * cores + to]
  std::unique_ptr<core_slot[]> slots_;
};

}  // namespace metad::smp
