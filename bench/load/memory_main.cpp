// metad-memory: measures the server's resident memory per page and per (key, rank)
// binding. Initialises R ranks of P pages, then allocates and confirms K keys on every
// rank (all keys end complete: R bindings each, plus one directory entry), reading the
// server's VmRSS from /proc/PID/status before and after each phase.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/keys.hpp"
#include "load/http_client.hpp"

namespace {

constexpr std::string_view kUsage = R"(Usage: metad-memory --pid PID [flags]
  --pid PID        the server's process id (its /proc/PID/status is read)
  --port N         server port (default 18000)
  --ranks R        worker ranks (default 8)
  --pages P        pages per rank (default 2097152)
  --keys K         keys, each confirmed on every rank (default 1000000)
  --batch N        keys per batch_allocate / confirm_write (default 128)
The server should be fresh (the run starts with POST /clear).
)";

long rss_kib(long pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  return -1;
}

long flag_value(int argc, char** argv, std::string_view name, long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return std::strtol(argv[i + 1], nullptr, 10);
  return fallback;
}

// Allocates then confirms keys [first, first + count) on `rank`. False on any error.
bool save_batch(bench::http_client& c, long rank, long first, long count, std::string& body,
                std::vector<long>& pages) {
  body.assign("{\"rank\":").append(std::to_string(rank)).append(",\"keys\":[");
  for (long k = first; k < first + count; ++k) {
    body.append(k == first ? "[\"" : ",[\"");
    bench::append_key(body, static_cast<std::uint64_t>(k));
    body.append("\",\"\"]");
  }
  body.append("]}");
  if (c.post("/keys/batch_allocate", body) != 200) return false;
  pages.clear();
  const std::string_view reply = c.body();
  for (std::size_t at = reply.find("\","); at != std::string_view::npos;
       at = reply.find("\",", at + 2)) {
    long page = -1;
    std::from_chars(reply.data() + at + 2, reply.data() + reply.size(), page);
    if (page < 0) return false;
    pages.push_back(page);
  }
  if (static_cast<long>(pages.size()) != count) return false;
  body.assign("{\"rank\":").append(std::to_string(rank)).append(",\"confirmations\":[");
  for (long i = 0; i < count; ++i) {
    body.append(i == 0 ? "[\"" : ",[\"");
    bench::append_key(body, static_cast<std::uint64_t>(first + i));
    body.append("\",").append(std::to_string(pages[static_cast<std::size_t>(i)])).append("]");
  }
  body.append("],\"pages_to_release\":[]}");
  return c.post("/keys/confirm_write", body) == 204;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--help") {
      std::fputs(kUsage.data(), stdout);
      return 0;
    }
  const long pid = flag_value(argc, argv, "--pid", 0);
  const long port = flag_value(argc, argv, "--port", 18000);
  const long ranks = flag_value(argc, argv, "--ranks", 8);
  const long pages = flag_value(argc, argv, "--pages", 2097152);
  const long keys = flag_value(argc, argv, "--keys", 1000000);
  const long batch = flag_value(argc, argv, "--batch", 128);
  if (pid <= 0 || rss_kib(pid) < 0 || ranks < 1 || pages < keys || keys < 1 || batch < 1) {
    std::fprintf(stderr,
                 "metad-memory: bad flags (need --pid of a running server, pages >= keys)\n");
    return 2;
  }
  bench::http_client c("127.0.0.1", static_cast<std::uint16_t>(port), 60'000);
  if (c.post("/clear", "{}") != 204) {
    std::fprintf(stderr, "metad-memory: POST /clear failed\n");
    return 1;
  }
  const long rss_empty = rss_kib(pid);
  const std::string init = "{\"num_pages\":" + std::to_string(pages) + ",\"role\":\"worker\"}";
  for (long r = 0; r < ranks; ++r)
    if (c.post("/rank/" + std::to_string(r) + "/initialize", init) != 200) {
      std::fprintf(stderr, "metad-memory: initialize failed\n");
      return 1;
    }
  const long rss_pools = rss_kib(pid);
  std::string body;
  std::vector<long> got;
  for (long r = 0; r < ranks; ++r)
    for (long k = 0; k < keys; k += batch)
      if (!save_batch(c, r, k, std::min(batch, keys - k), body, got)) {
        std::fprintf(stderr, "metad-memory: save failed on rank %ld at key %ld\n", r, k);
        return 1;
      }
  const long rss_keys = rss_kib(pid);
  // Spot check: every key is complete and bound on every rank.
  body.assign("{\"keys\":[\"").append(bench::make_key(0)).append("\",\"");
  body.append(bench::make_key(static_cast<std::uint64_t>(keys - 1))).append("\"]}");
  const bool complete = c.post("/keys/batch_exists", body) == 200 &&
                        c.body() == std::string_view(R"({"exists":[true,true]})");
  const double bindings = static_cast<double>(ranks) * static_cast<double>(keys);
  const double all_pages = static_cast<double>(ranks) * static_cast<double>(pages);
  std::printf("memory: %ld ranks x %ld pages, %ld keys confirmed on every rank (%s)\n\n", ranks,
              pages, keys, complete ? "all complete" : "NOT COMPLETE: check the server");
  std::printf("| phase | VmRSS MiB | delta MiB | per unit |\n|---|---:|---:|---:|\n");
  std::printf("| empty server | %.1f | | |\n", rss_empty / 1024.0);
  std::printf("| + %ld ranks x %ld pages | %.1f | %.1f | %.3f bytes/page |\n", ranks, pages,
              rss_pools / 1024.0, (rss_pools - rss_empty) / 1024.0,
              (rss_pools - rss_empty) * 1024.0 / all_pages);
  std::printf("| + %ld keys x %ld ranks | %.1f | %.1f | %.1f bytes/binding |\n", keys, ranks,
              rss_keys / 1024.0, (rss_keys - rss_pools) / 1024.0,
              (rss_keys - rss_pools) * 1024.0 / bindings);
  return complete ? 0 : 1;
}
