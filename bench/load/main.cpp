// metad-load: replays the vLLM HF3FS connector's traffic against a running server (E
// engines × TP ranks, 1 + 2×TP sequential streams per engine) for --seconds and prints
// per-endpoint throughput and latency percentiles as a Markdown table.
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "load/http_client.hpp"
#include "load/workload.hpp"

namespace {

constexpr std::string_view kUsage = R"(Usage: metad-load [flags]
  --host ADDR         server address (default 127.0.0.1; loopback benchmarks only)
  --port N            server port (default 18000)
  --engines E         engines (default 4); each has 1 scheduler stream
  --tp N              TP ranks per engine (default 8); 1 save + 1 load stream each
  --seconds S         measured duration (default 10)
  --rate R            calls per second per stream, 0 = back to back (default 0)
  --prompt-blocks N   keys per batch_exists (default 1250)
  --task-keys N       keys per save/load task (default 128)
  --prompts N         distinct prompts per engine; saves cycle over them (default 400)
  --pages N           pages per rank (default 4194304)
  --fail-fraction F   save tasks taking the write-failure path (default 0.01)
  --no-clear          do not POST /clear before the run
  --saves-only        only the save streams (e.g. with --fail-fraction 1: fresh
                      allocate → release pairs, back to back)
  --spin              poll the sockets instead of sleeping (latency runs with a
                      core of its own: a sleeping generator is slow to wake in a VM)
  --threads T         event loops, one thread each (default 1); engine e's streams
                      all run on loop e mod T, so T > engines leaves loops idle
  --report-every W    also print a `window=N` line every W seconds and at the end:
                      this run's counters so far (key=value) and the server's
                      GET /stats body (stats=...). Needs --threads 1
Engines share ranks 0..TP-1 (one model, one 3FS file per rank), so a key is complete
once all TP ranks of its engine confirmed it. Exit status 1 if any call failed.
)";

double parse_number(std::string_view flag, std::string_view text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || v < 0)
    throw std::invalid_argument(std::string(flag) + ": bad number '" + std::string(text) + "'");
  return v;
}

bench::load_options parse_flags(int argc, char** argv) {
  bench::load_options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help") {
      std::fputs(kUsage.data(), stdout);
      std::exit(0);
    }
    if (flag == "--no-clear") {
      o.clear = false;
      continue;
    }
    if (flag == "--saves-only") {
      o.saves_only = true;
      continue;
    }
    if (flag == "--spin") {
      o.spin = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(std::string(flag) + ": missing value");
    const std::string_view v = argv[++i];
    if (flag == "--host")
      o.host = std::string(v);
    else if (flag == "--port")
      o.port = static_cast<std::uint16_t>(parse_number(flag, v));
    else if (flag == "--engines")
      o.engines = static_cast<int>(parse_number(flag, v));
    else if (flag == "--tp")
      o.tp = static_cast<int>(parse_number(flag, v));
    else if (flag == "--seconds")
      o.seconds = parse_number(flag, v);
    else if (flag == "--rate")
      o.rate = parse_number(flag, v);
    else if (flag == "--prompt-blocks")
      o.prompt_blocks = static_cast<int>(parse_number(flag, v));
    else if (flag == "--task-keys")
      o.task_keys = static_cast<int>(parse_number(flag, v));
    else if (flag == "--prompts")
      o.prompts = static_cast<int>(parse_number(flag, v));
    else if (flag == "--pages")
      o.pages = static_cast<std::int64_t>(parse_number(flag, v));
    else if (flag == "--fail-fraction")
      o.fail_fraction = parse_number(flag, v);
    else if (flag == "--threads")
      o.threads = static_cast<int>(parse_number(flag, v));
    else if (flag == "--report-every")
      o.report_every = parse_number(flag, v);
    else
      throw std::invalid_argument("unknown flag " + std::string(flag));
  }
  if (o.engines < 1 || o.tp < 1 || o.threads < 1 || o.threads > 256 || o.task_keys < 1 ||
      o.prompt_blocks < 1 || o.prompts < 1 || o.prompts >= (1 << 24) ||
      o.prompt_blocks >= (1 << 24) || o.seconds <= 0 || o.seconds > 3600 ||
      (o.report_every > 0 && (o.threads != 1 || o.report_every < 0.1)))
    throw std::invalid_argument("flag out of range (see --help)");
  return o;
}

double us(std::uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

// One window line: the counters summed over the streams so far (cumulative; a script
// takes differences) and the server's /stats body, or stats=- if it did not answer.
void print_window(int window, double at,
                  const std::vector<std::unique_ptr<bench::stream_stats>>& stats, int status,
                  std::string_view server_stats) {
  auto sum = std::make_unique<bench::stream_stats>();  // large: on the heap
  bench::stream_stats& all = *sum;
  for (const auto& st : stats) all.merge(*st);
  std::uint64_t requests = 0, errors = 0;
  for (int e = 0; e < bench::ep_count; ++e) {
    requests += all.latency[e].count();
    errors += all.errors[e];
  }
  std::printf(
      "window=%d t=%.1f requests=%llu errors=%llu alloc_results=%llu alloc_refused=%llu "
      "failed_tasks=%llu exists_asked=%llu exists_found=%llu locations_asked=%llu "
      "locations_found=%llu stats=%.*s\n",
      window, at, static_cast<unsigned long long>(requests),
      static_cast<unsigned long long>(errors), static_cast<unsigned long long>(all.alloc_results),
      static_cast<unsigned long long>(all.pages_refused),
      static_cast<unsigned long long>(all.failed_tasks),
      static_cast<unsigned long long>(all.keys_asked[bench::ep_exists]),
      static_cast<unsigned long long>(all.keys_found[bench::ep_exists]),
      static_cast<unsigned long long>(all.keys_asked[bench::ep_locations]),
      static_cast<unsigned long long>(all.keys_found[bench::ep_locations]),
      status == 200 ? static_cast<int>(server_stats.size()) : 1,
      status == 200 ? server_stats.data() : "-");
  std::fflush(stdout);
}

// The window lines due before the run ends, on the streams' loop (so the counters are
// read between requests); the last one is printed after every stream has finished.
bench::stream_task run_reporter(bench::event_loop& loop, const bench::load_options& o,
                                bench::clock_type::time_point start,
                                const std::vector<std::unique_ptr<bench::stream_stats>>& stats) {
  bench::async_connection c(loop, o.host, o.port);
  for (int w = 1; w * o.report_every < o.seconds - 1e-9; ++w) {
    co_await loop.sleep_until(start + std::chrono::duration_cast<bench::clock_type::duration>(
                                          std::chrono::duration<double>(w * o.report_every)));
    const int status = co_await c.request("GET", "/stats", "");
    print_window(w, w * o.report_every, stats, status, c.body());
  }
}

void print_report(const bench::load_options& o, const bench::stream_stats& all) {
  char rate[64] = "back to back";
  if (o.rate > 0) std::snprintf(rate, sizeof rate, "%g calls/s per stream", o.rate);
  std::printf("connector replay: %d engines x TP %d (%d streams), %.1f s, %s%s, %d thread%s\n\n",
              o.engines, o.tp, o.engines * (1 + 2 * o.tp), o.seconds, rate,
              o.spin ? ", spinning" : "", o.threads, o.threads == 1 ? "" : "s");
  std::printf("| endpoint | requests | req/s | errors | p50 us | p99 us | p99.9 us | max us |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  std::uint64_t total = 0, errors = 0;
  for (int e = 0; e < bench::ep_count; ++e) {
    const bench::histogram& h = all.latency[e];
    total += h.count();
    errors += all.errors[e];
    std::printf("| %s | %llu | %.0f | %llu | %.1f | %.1f | %.1f | %.1f |\n",
                bench::endpoint_names[e], static_cast<unsigned long long>(h.count()),
                static_cast<double>(h.count()) / o.seconds,
                static_cast<unsigned long long>(all.errors[e]), us(h.quantile(0.5)),
                us(h.quantile(0.99)), us(h.quantile(0.999)), us(h.max()));
  }
  auto ratio = [&](int e) {
    return all.keys_asked[e] ? 100.0 * static_cast<double>(all.keys_found[e]) /
                                   static_cast<double>(all.keys_asked[e])
                             : 0.0;
  };
  std::printf(
      "\nbatch_exists keys true: %.1f%%; get_locations keys found: %.1f%%; "
      "allocate -1 results: %llu; write-failure tasks: %llu; late paced calls: %llu\n",
      ratio(bench::ep_exists), ratio(bench::ep_locations),
      static_cast<unsigned long long>(all.pages_refused),
      static_cast<unsigned long long>(all.failed_tasks),
      static_cast<unsigned long long>(all.late_calls));
  // One line for scripts (bench.sh divides server CPU by total_requests).
  std::printf("total_requests=%llu errors=%llu\n", static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(errors));
}

}  // namespace

int main(int argc, char** argv) {
  bench::load_options opt;
  try {
    opt = parse_flags(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "metad-load: %s\n", e.what());
    return 2;
  }
  bench::workload w(opt);
  if (std::string err = w.setup(); !err.empty()) {
    std::fprintf(stderr, "metad-load: setup failed: %s\n", err.c_str());
    return 1;
  }
  if (static_cast<std::int64_t>(opt.engines) * opt.prompts * opt.prompt_blocks > opt.pages)
    std::fprintf(stderr, "metad-load: note: the working set exceeds --pages; pools will fill\n");

  const int streams = opt.engines * (1 + 2 * opt.tp);
  std::vector<std::unique_ptr<bench::stream_stats>> stats;
  for (int i = 0; i < streams; ++i) stats.push_back(std::make_unique<bench::stream_stats>());
  // Every stream starts at the same instant, after all have connected. An engine's
  // streams share its save progress (workload::saved), so they all run on one loop.
  const auto start = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  std::vector<std::unique_ptr<bench::event_loop>> loops;
  for (int t = 0; t < opt.threads; ++t)
    loops.push_back(std::make_unique<bench::event_loop>(opt.spin));
  if (opt.report_every > 0) loops[0]->spawn(run_reporter(*loops[0], opt, start, stats));
  int s = 0;
  for (int e = 0; e < opt.engines; ++e) {
    bench::event_loop& loop = *loops[static_cast<std::size_t>(e % opt.threads)];
    if (!opt.saves_only) loop.spawn(w.run_scheduler(loop, e, start, *stats[s++]));
    for (int r = 0; r < opt.tp; ++r) {
      loop.spawn(w.run_saver(loop, e, r, start, *stats[s++]));
      if (!opt.saves_only) loop.spawn(w.run_loader(loop, e, r, start, *stats[s++]));
    }
  }
  {
    std::vector<std::jthread> threads;
    for (std::size_t t = 1; t < loops.size(); ++t)
      threads.emplace_back([&loop = *loops[t]] { loop.run(); });
    loops[0]->run();
  }  // joins the other loops
  if (opt.report_every > 0) {
    bench::http_client c(opt.host, opt.port);
    const int status = c.request("GET", "/stats", "");
    int last = 1;
    while (last * opt.report_every < opt.seconds - 1e-9) ++last;
    print_window(last, opt.seconds, stats, status, c.body());
  }
  auto all = std::make_unique<bench::stream_stats>();
  for (const auto& st : stats) all->merge(*st);
  print_report(opt, *all);
  std::uint64_t errors = 0;
  for (std::uint64_t n : all->errors) errors += n;
  return errors == 0 ? 0 : 1;
}
