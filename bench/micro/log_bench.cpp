// The group-commit path of store::log_writer, without I/O: N requests append a record
// and wait for it; each iteration is one flush (begin_flush, end_flush) that resumes
// them all, each of which appends and waits again. With and without a synchronous
// standby (whose ack comes right after the local flush).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <coroutine>
#include <cstdlib>
#include <string>
#include <vector>

#include "store/log.hpp"

using namespace metad;

namespace {

struct looping {
  struct promise_type {
    looping get_return_object() {
      return {std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_never initial_suspend() { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::abort(); }
  };
  std::coroutine_handle<promise_type> handle;
};

// A request that logs 40 bytes and waits, for ever (destroyed while suspended).
looping request(store::log_writer& log, std::uint64_t& answered) {
  static const std::string record(40, 'r');
  for (;;) {
    log.pending() += record;
    if (co_await log.durable_until(log.end())) ++answered;
  }
}

void group_commit(benchmark::State& state, bool standby) {
  const int fd = ::open("/dev/null", O_WRONLY);
  store::log_writer log(fd, 0);
  log.require_standby(standby);
  std::uint64_t answered = 0;
  std::vector<looping> requests;
  for (std::int64_t i = 0; i < state.range(0); ++i) requests.push_back(request(log, answered));
  for (auto _ : state) {
    const store::log_writer::flush_job job = log.begin_flush();
    if (standby) log.replicated_until(job.lsn + job.bytes);
    log.end_flush(static_cast<long>(job.bytes), 0);
  }
  for (looping& r : requests) r.handle.destroy();
  state.counters["answered/flush"] =
      static_cast<double>(answered) / static_cast<double>(state.iterations());
}

void BM_GroupCommit(benchmark::State& state) { group_commit(state, false); }
void BM_GroupCommitSyncStandby(benchmark::State& state) { group_commit(state, true); }

}  // namespace

BENCHMARK(BM_GroupCommit)->Arg(1)->Arg(64);
BENCHMARK(BM_GroupCommitSyncStandby)->Arg(1)->Arg(64);
BENCHMARK_MAIN();
