#include "smp/mailbox.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <stdexcept>
#include <system_error>

#include "metad/assert.hpp"

namespace metad::smp {

spsc_ring::spsc_ring(std::size_t slots_pow2)
    : slots_(std::bit_ceil(slots_pow2 < 2 ? std::size_t{2} : slots_pow2)),
      mask_(slots_.size() - 1) {}

bool spsc_ring::push(std::coroutine_handle<> h) {
  const std::size_t tail = tail_.load(std::memory_order_relaxed);
  if (tail - head_cache_ == slots_.size()) {
    head_cache_ = head_.load(std::memory_order_acquire);
    if (tail - head_cache_ == slots_.size()) return false;
  }
  slots_[tail & mask_] = h;
  // seq_cst, not just release: the store is one half of the sleep handshake (see
  // mailbox::notify). On x86 it is one xchg, the full barrier a fence would cost.
  tail_.store(tail + 1, std::memory_order_seq_cst);
  return true;
}

std::coroutine_handle<> spsc_ring::pop() {
  const std::size_t head = head_.load(std::memory_order_relaxed);
  if (head == tail_cache_) {
    tail_cache_ = tail_.load(std::memory_order_acquire);
    if (head == tail_cache_) return {};
  }
  std::coroutine_handle<> h = slots_[head & mask_];
  head_.store(head + 1, std::memory_order_release);
  return h;
}

bool spsc_ring::empty() const {
  // seq_cst: the sleeper's half of the handshake (see mailbox::notify).
  return head_.load(std::memory_order_relaxed) == tail_.load(std::memory_order_seq_cst);
}

// Per-core wake-up state and the overflow lists this core (as producer) owns.
struct mailbox::core_slot {
  alignas(64) std::atomic<bool> sleeping{false};
  int event_fd = -1;
  std::vector<std::vector<std::coroutine_handle<>>> overflow;  // [to]
  bool has_overflow = false;
  std::uint64_t posted = 0;
};

mailbox::mailbox(int cores, std::size_t slots_per_ring)
    : cores_(cores), slots_(new core_slot[cores]) {
  METAD_ASSERT(cores > 0);
  rings_.reserve(static_cast<std::size_t>(cores) * cores);
  for (int i = 0; i < cores * cores; ++i)
    rings_.push_back(std::make_unique<spsc_ring>(slots_per_ring));
  for (int c = 0; c < cores; ++c) {
    slots_[c].event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (slots_[c].event_fd < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
    slots_[c].overflow.resize(cores);
  }
}

mailbox::~mailbox() {
  for (int c = 0; c < cores_; ++c) ::close(slots_[c].event_fd);
}

spsc_ring& mailbox::ring(int from, int to) { return *rings_[from * cores_ + to]; }

void mailbox::post(int from, int to, std::coroutine_handle<> h) {
  METAD_ASSERT(from >= 0 && from < cores_ && to >= 0 && to < cores_ && from != to);
  // Only core `from` may push into its rings (single producer): a coroutine that lost
  // track of where it runs would corrupt them. Core threads know their index.
  METAD_ASSERT(this_core() < 0 || this_core() == from);
  METAD_ASSERT(h);
  core_slot& me = slots_[from];
  ++me.posted;
  if (!me.overflow[to].empty() || !ring(from, to).push(h)) {
    me.overflow[to].push_back(h);  // keeps order behind what is already spilled
    me.has_overflow = true;
    return;
  }
  notify(to);
}

void mailbox::notify(int to) {
  // The sleep handshake (Dekker's): the producer stores the ring's tail, then loads the
  // target's sleeping flag; the sleeper stores its flag, then loads the rings' tails
  // (prepare_sleep). All four are seq_cst, so in their single total order one side's
  // store comes first and the other side's load sees it: either the sleeper sees our
  // push, or we see its flag and wake it. Atomic operations rather than fences, so
  // that ThreadSanitizer checks the ordering too (it does not model fences).
  if (slots_[to].sleeping.load(std::memory_order_seq_cst)) wake(to);
}

void mailbox::wake(int core) {
  const std::uint64_t one = 1;
  // EAGAIN means the counter is already non-zero: the core wakes anyway.
  [[maybe_unused]] ssize_t n = ::write(slots_[core].event_fd, &one, sizeof one);
}

std::size_t mailbox::drain(int self) {
  METAD_ASSERT(self >= 0 && self < cores_);
  METAD_ASSERT(this_core() < 0 || this_core() == self);
  const core_scope as_self(self);  // a thread that drains simulated cores runs each in turn
  core_slot& me = slots_[self];
  if (me.has_overflow) {
    me.has_overflow = false;
    for (int to = 0; to < cores_; ++to) {
      auto& spill = me.overflow[to];
      std::size_t moved = 0;
      while (moved < spill.size() && ring(self, to).push(spill[moved])) ++moved;
      spill.erase(spill.begin(), spill.begin() + static_cast<std::ptrdiff_t>(moved));
      if (moved) notify(to);
      if (!spill.empty()) me.has_overflow = true;
    }
  }
  std::size_t resumed = 0;
  for (int from = 0; from < cores_; ++from) {
    spsc_ring& r = ring(from, self);
    // Bounded per ring and call, so one busy peer cannot starve the others.
    for (int i = 0; i < 256; ++i) {
      std::coroutine_handle<> h = r.pop();
      if (!h) break;
      h.resume();
      ++resumed;
    }
  }
  return resumed;
}

bool mailbox::prepare_sleep(int self) {
  core_slot& me = slots_[self];
  if (me.has_overflow) return false;
  me.sleeping.store(true, std::memory_order_seq_cst);  // see notify
  for (int from = 0; from < cores_; ++from) {
    if (!ring(from, self).empty()) {
      me.sleeping.store(false, std::memory_order_relaxed);
      return false;
    }
  }
  return true;
}

void mailbox::woke(int self) { slots_[self].sleeping.store(false, std::memory_order_relaxed); }

std::uint64_t mailbox::posted(int core) const { return slots_[core].posted; }

int mailbox::wake_fd(int self) const { return slots_[self].event_fd; }

}  // namespace metad::smp
