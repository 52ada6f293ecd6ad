// --memory-max: how much memory clients may make the server hold. What grows with
// clients' requests beyond a connection's steady buffers is charged here before it is
// taken: a rank or pool when it is created (a constant: pools cost what they hold, not
// their num_pages), the pages, bindings and key bytes an allocation adds to a pool
// (through each core's memory_credit, in chunks), a request body beyond 64 KiB when its
// size is announced, and, while a child forked for a standby's snapshot runs, the pages
// it may cost (begin_cut). A charge that would take the server past the budget is
// refused (an initialization gets a 507, a body a 503, an allocation is answered as by
// a full pool, a snapshot cut waits), and everything else goes on.
//
// What counts as used is the process's resident memory, sampled on core 0's tick (and
// again before refusing), plus the charges made since that sample (a burst of
// initializations between two samples must not all pass on a stale figure) and the
// bodies charged and not yet received. Measuring instead of adding up every table keeps
// the budget honest about what it cannot foresee: key tables, logs, allocator slack.
//
// Any core may call every member.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>

#include "metad/assert.hpp"

namespace metad::pipeline {

class memory_budget {
 public:
  explicit memory_budget(std::uint64_t max_bytes) : max_(max_bytes) {
    statm_ = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    sample();
  }
  ~memory_budget() {
    if (statm_ >= 0) ::close(statm_);
  }
  memory_budget(const memory_budget&) = delete;
  memory_budget& operator=(const memory_budget&) = delete;

  // The default budget: half of what this process may use, physical memory or its
  // cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes) when that is lower.
  static std::uint64_t default_max() {
    std::uint64_t limit = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                          static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    for (const char* path :
         {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
      if (std::FILE* f = std::fopen(path, "re")) {
        unsigned long long bytes = 0;
        if (std::fscanf(f, "%llu", &bytes) == 1 && bytes > 0 && bytes < limit) limit = bytes;
        std::fclose(f);  // "max" (no limit) does not scan
      }
    }
    return limit / 2;
  }

  std::uint64_t max() const { return max_; }
  std::uint64_t used() const {
    return resident_.load(std::memory_order_relaxed) + recent_.load(std::memory_order_relaxed) +
           bodies_.load(std::memory_order_relaxed) + cuts_.load(std::memory_order_relaxed);
  }

  // Memory a rank's pool will keep (created or grown): false, and nothing charged, if
  // it does not fit. It stays charged until the next sample sees it resident.
  bool charge_kept(std::uint64_t bytes) { return charge(recent_, bytes); }
  // What an allocation adds to a pool (memory_credit's chunks), kept as charge_kept is,
  // but stopping headroom() short of the budget: that much stays for what is never
  // charged (request bodies under 64 KiB, answers being written, allocator slack), so
  // that clients filling their pools never take the resident size past the budget.
  bool charge_allocation(std::uint64_t bytes) { return charge(recent_, bytes, headroom()); }
  std::uint64_t headroom() const {
    return max_ / 64 < (std::uint64_t{16} << 20) ? max_ / 64 : std::uint64_t{16} << 20;
  }
  // A request body about to be buffered: false if it does not fit. Charged until
  // release_body(), whatever the samples say (most of it has not arrived yet).
  bool charge_body(std::uint64_t bytes) { return charge(bodies_, bytes); }
  void release_body(std::uint64_t bytes) { bodies_.fetch_sub(bytes, std::memory_order_relaxed); }

  // A snapshot cut forked from the server (repl::snapshot_cut): the child shares every
  // page of the process copy-on-write, so each page the server writes while a child
  // runs is copied, and the copies are nobody's resident size (the server's stays the
  // same; the child's counts the originals). The worst case, every page written before
  // the cut ends, is the resident size at the fork: that is charged while any cut runs.
  // Cuts forked together (a standby's hello reaches every core within milliseconds)
  // share one charge, raised to the resident size at the latest fork (the pages they
  // share are copied once). False, and nothing charged, if it does not fit: the cut
  // waits (the standby is answered busy and connects again). Every true is ended by
  // one end_cut(), when that child has been reaped.
  bool begin_cut() {
    std::lock_guard lock(cuts_mutex_);
    sample();
    const std::uint64_t resident = resident_.load(std::memory_order_relaxed);
    const std::uint64_t held = cuts_.load(std::memory_order_relaxed);
    const std::uint64_t more = resident > held ? resident - held : 0;
    if (more > 0 && !try_charge(cuts_, more, 0)) {
      refused_cuts.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    ++cuts_running_;
    return true;
  }
  void end_cut() {
    std::lock_guard lock(cuts_mutex_);
    METAD_ASSERT(cuts_running_ > 0);
    if (--cuts_running_ == 0) cuts_.store(0, std::memory_order_relaxed);
  }
  // The resident size at the latest sample.
  std::uint64_t resident() const { return resident_.load(std::memory_order_relaxed); }
  // What running cuts hold of the budget (0 when none runs).
  std::uint64_t cut_charge() const { return cuts_.load(std::memory_order_relaxed); }

  // Reads the resident size; the charges made before the read are in it now. One
  // caller at a time (another's concurrent call returns at once).
  void sample() {
    if (sampling_.test_and_set(std::memory_order_acquire)) return;
    const std::uint64_t charged = recent_.load(std::memory_order_relaxed);
    const std::uint64_t resident = read_resident();
    if (resident != 0) {
      resident_.store(resident, std::memory_order_relaxed);
      recent_.fetch_sub(charged, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_relaxed);
    }
    sampling_.clear(std::memory_order_release);
  }
  // Counts the samples that took charges out of recent_ (memory_credit drops what it has
  // left of a chunk charged before one: that is no longer counted anywhere).
  std::uint64_t generation() const { return generation_.load(std::memory_order_relaxed); }

  // Refusals, by what was refused (metrics).
  std::atomic<std::uint64_t> refused_ranks{0}, refused_bodies{0}, refused_allocations{0};
  std::atomic<std::uint64_t> refused_cuts{0};

 private:
  bool charge(std::atomic<std::uint64_t>& counter, std::uint64_t bytes, std::uint64_t spared = 0) {
    if (try_charge(counter, bytes, spared)) return true;
    sample();  // the last sample may be stale (memory freed since): look again
    return try_charge(counter, bytes, spared);
  }
  bool try_charge(std::atomic<std::uint64_t>& counter, std::uint64_t bytes, std::uint64_t spared) {
    std::uint64_t seen = counter.load(std::memory_order_relaxed);
    do {
      if (used() + bytes + spared > max_) return false;
    } while (!counter.compare_exchange_weak(seen, seen + bytes, std::memory_order_relaxed));
    return true;
  }

  std::uint64_t read_resident() const {
    if (statm_ < 0) return 0;
    char text[128];
    const ssize_t n = ::pread(statm_, text, sizeof text - 1, 0);
    if (n <= 0) return 0;
    // "size resident shared ...", in pages.
    std::uint64_t pages = 0;
    ssize_t i = 0;
    while (i < n && text[i] != ' ') ++i;
    for (++i; i < n && text[i] >= '0' && text[i] <= '9'; ++i)
      pages = pages * 10 + static_cast<std::uint64_t>(text[i] - '0');
    return pages * page_bytes_;
  }

  const std::uint64_t max_;
  int statm_ = -1;
  const std::uint64_t page_bytes_ = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::atomic<std::uint64_t> resident_{0};
  std::atomic<std::uint64_t> recent_{0};
  std::atomic<std::uint64_t> bodies_{0};
  std::atomic<std::uint64_t> cuts_{0};  // written under cuts_mutex_
  std::mutex cuts_mutex_;
  int cuts_running_ = 0;  // guarded by cuts_mutex_
  std::atomic<std::uint64_t> generation_{0};
  std::atomic_flag sampling_ = ATOMIC_FLAG_INIT;
};

// One core's share of the budget for what allocations add to its pools (pages handed
// out, bindings, key bytes): taken from memory_budget in chunks of kChunk, so that an
// allocation costs no atomic operation, only a subtraction here. What a chunk has left
// when the next sample takes the charges into the resident figure is dropped (it is no
// longer counted anywhere), so each core is at most one chunk ahead of the budget.
// Owned by one core.
class memory_credit {
 public:
  static constexpr std::uint64_t kChunk = 1 << 20;

  // Takes `bytes` from the credit (charging a chunk when it runs short): false, and
  // nothing taken, if they do not fit the budget.
  bool take(memory_budget& budget, std::uint64_t bytes) {
    resync(budget);
    if (bytes <= credit_) {
      credit_ -= bytes;
      return true;
    }
    const std::uint64_t missing = bytes - credit_;
    std::uint64_t charged = missing < kChunk ? kChunk : missing;
    if (!budget.charge_allocation(charged)) {
      if (charged == missing || !budget.charge_allocation(missing)) {
        budget.refused_allocations.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      charged = missing;
    }
    // A refused try sampled before the charge that passed: what the credit had is gone.
    resync(budget);
    credit_ += charged;
    credit_ = credit_ > bytes ? credit_ - bytes : 0;
    return true;
  }
  // Bytes taken and not used after all (keys that were hits).
  void give_back(std::uint64_t bytes) { credit_ += bytes; }
  std::uint64_t left() const { return credit_; }

 private:
  void resync(const memory_budget& budget) {
    const std::uint64_t generation = budget.generation();
    if (generation == generation_) return;
    generation_ = generation;
    credit_ = 0;
  }

  std::uint64_t credit_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace metad::pipeline
