// --memory-max: how much memory clients may make the server hold. What grows with
// clients' requests beyond a connection's steady buffers is charged here before it is
// taken: a rank's page bitmaps when it is created or grown, a request body beyond
// 64 KiB when its size is announced. A charge that would take the server past the
// budget is refused (the request gets a 507 or 503), and everything else goes on.
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
           bodies_.load(std::memory_order_relaxed);
  }

  // Memory a rank's pool will keep (created or grown): false, and nothing charged, if
  // it does not fit. It stays charged until the next sample sees it resident.
  bool charge_kept(std::uint64_t bytes) { return charge(recent_, bytes); }
  // A request body about to be buffered: false if it does not fit. Charged until
  // release_body(), whatever the samples say (most of it has not arrived yet).
  bool charge_body(std::uint64_t bytes) { return charge(bodies_, bytes); }
  void release_body(std::uint64_t bytes) { bodies_.fetch_sub(bytes, std::memory_order_relaxed); }

  // Reads the resident size; the charges made before the read are in it now. One
  // caller at a time (another's concurrent call returns at once).
  void sample() {
    if (sampling_.test_and_set(std::memory_order_acquire)) return;
    const std::uint64_t charged = recent_.load(std::memory_order_relaxed);
    const std::uint64_t resident = read_resident();
    if (resident != 0) {
      resident_.store(resident, std::memory_order_relaxed);
      recent_.fetch_sub(charged, std::memory_order_relaxed);
    }
    sampling_.clear(std::memory_order_release);
  }

  // Refusals, by what was refused (metrics).
  std::atomic<std::uint64_t> refused_ranks{0}, refused_bodies{0};

 private:
  bool charge(std::atomic<std::uint64_t>& counter, std::uint64_t bytes) {
    if (try_charge(counter, bytes)) return true;
    sample();  // the last sample may be stale (memory freed since): look again
    return try_charge(counter, bytes);
  }
  bool try_charge(std::atomic<std::uint64_t>& counter, std::uint64_t bytes) {
    std::uint64_t seen = counter.load(std::memory_order_relaxed);
    do {
      if (used() + bytes > max_) return false;
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
  std::atomic_flag sampling_ = ATOMIC_FLAG_INIT;
};

}  // namespace metad::pipeline
