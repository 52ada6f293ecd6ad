// The vLLM HF3FS connector's traffic, replayed: per engine one scheduler stream
// (batch_exists over a prompt's blocks), per TP rank one save stream (batch_allocate →
// confirm_write, 1% write failures) and one load stream (get_locations). Each stream is
// a coroutine on the generator's event loop with its own keep-alive connection,
// strictly sequential like the client.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "load/event_loop.hpp"
#include "load/histogram.hpp"

namespace bench {

struct load_options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 18000;
  int engines = 4;
  int tp = 8;
  double seconds = 10;
  int prompt_blocks = 1250;      // keys per prompt (20k tokens / block size 16)
  int task_keys = 128;           // keys per save/load task
  int prompts = 400;             // distinct prompts per engine (the working set)
  std::int64_t pages = 4 << 20;  // pages per rank
  double fail_fraction = 0.01;   // save tasks taking the write-failure path
  double rate = 0;               // calls (tasks) per second per stream; 0 = back to back
  bool clear = true;             // POST /clear before the run
  bool saves_only = false;       // no scheduler or load streams
  bool spin = false;             // the event loop polls instead of sleeping
  double report_every = 0;       // > 0: a window line (counters + /stats) this often
  int threads = 1;               // event loops, one thread each
};

enum endpoint : int { ep_exists, ep_allocate, ep_confirm, ep_locations, ep_count };
inline constexpr const char* endpoint_names[ep_count] = {"batch_exists", "batch_allocate",
                                                         "confirm_write", "get_locations"};

// What one stream measured. Heap-allocated once per stream (the histograms are large).
struct stream_stats {
  histogram latency[ep_count];
  std::uint64_t errors[ep_count] = {};
  std::uint64_t keys_asked[ep_count] = {};  // batch_exists / get_locations keys asked
  std::uint64_t keys_found[ep_count] = {};  // ... answered true / with a page
  std::uint64_t alloc_results = 0;          // batch_allocate results, all of them
  std::uint64_t pages_refused = 0;          // ... of -1 (pool full)
  std::uint64_t failed_tasks = 0;           // save tasks that took the write-failure path
  std::uint64_t late_calls = 0;             // paced calls that started behind schedule
  void merge(const stream_stats& other);
};

// State the streams share: how far each (engine, rank) save stream got, so load and
// scheduler streams ask mostly for saved prompts, as a warm cache would see.
class workload {
 public:
  explicit workload(load_options opt);
  const load_options& options() const { return opt_; }

  // Clears the server (optional) and initialises the TP ranks and schedulers. Returns
  // an error message, or "" on success.
  std::string setup();

  // The streams, as coroutines for `loop`, measuring from `start` for opt.seconds.
  stream_task run_scheduler(event_loop& loop, int engine, clock_type::time_point start,
                            stream_stats& out);
  stream_task run_saver(event_loop& loop, int engine, int rank, clock_type::time_point start,
                        stream_stats& out);
  stream_task run_loader(event_loop& loop, int engine, int rank, clock_type::time_point start,
                         stream_stats& out);

 private:
  int& saved(int engine, int rank) { return saved_[engine * opt_.tp + rank]; }

  load_options opt_;
  std::vector<int> saved_;  // prompts fully saved, per (engine, rank)
};

}  // namespace bench
