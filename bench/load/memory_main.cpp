// metad-memory: measures the server's resident memory per page and per (key, rank)
// binding. Initialises R ranks of P pages, then allocates and confirms K keys on every
// rank (all keys end complete: R bindings each, plus one directory entry), reading the
// server's VmRSS from /proc/PID/status before and after each phase. --shape picks the
// keys' shape (each shape is stored in its own form: see src/shard/dual_key_map.hpp), and
// --order batch saves each batch on every rank before the next (as TP engines do).
// --api sglang drives SGLang's API instead (docs/sglang-api.md): R pools (one per rank,
// namespace "kv"), each key reserved and confirmed on every one.
#include <algorithm>
#include <cctype>
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
  --shape S        hex32 (32 lowercase hex, default), HEX32 (uppercase), hex64 (64
                   lowercase hex: SHA-256), HEX64 (uppercase), other (33 characters:
                   'k' and 32 hex) or other65 ('k' and 64 hex: a 64-hex key's bytes)
  --order O        rank: all keys on rank 0, then rank 1, ... (default); batch: each
                   batch on every rank before the next
  --api A          vllm (default): /rank/{r}/initialize, /keys/batch_allocate,
                   /keys/confirm_write; sglang: /{r}/initialize,
                   /{r}/reserve_and_allocate_page_indices, /{r}/confirm_write
The server should be fresh (a vLLM run starts with POST /clear; an SGLang run needs
pools not yet initialised).
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

std::string_view flag_text(int argc, char** argv, std::string_view name,
                           std::string_view fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}

std::string_view shape = "hex32";
bool sglang = false;

// Key `id` in the chosen shape.
void append_shaped_key(std::string& out, std::uint64_t id) {
  const std::size_t at = out.size();
  if (shape == "other" || shape == "other65") out.push_back('k');
  bench::append_key(out, id);
  if (shape == "hex64" || shape == "HEX64" || shape == "other65")
    bench::append_key(out, id ^ 0x2545F4914F6CDD1Dull);
  if (shape == "HEX32" || shape == "HEX64")
    for (std::size_t i = at; i < out.size(); ++i)
      out[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[i])));
}

// SGLang's API: reserves then confirms keys [first, first + count) in pool `rank`.
bool save_sglang_batch(bench::http_client& c, long rank, long first, long count, std::string& body,
                       std::vector<long>& pages) {
  body.assign("{\"keys\":[");
  for (long k = first; k < first + count; ++k) {
    body.append(k == first ? "[\"" : ",[\"");
    append_shaped_key(body, static_cast<std::uint64_t>(k));
    body.append("\",\"\"]");
  }
  body.append("]}");
  const std::string prefix = "/" + std::to_string(rank);
  if (c.post(prefix + "/reserve_and_allocate_page_indices", body) != 200) return false;
  pages.clear();
  const std::string_view reply = c.body();
  for (std::size_t at = reply.find("[false,"); at != std::string_view::npos;
       at = reply.find("[false,", at + 7)) {
    long page = -1;
    std::from_chars(reply.data() + at + 7, reply.data() + reply.size(), page);
    if (page < 0) return false;
    pages.push_back(page);
  }
  if (static_cast<long>(pages.size()) != count) return false;
  body.assign("{\"written_keys_to_confirm\":[");
  for (long i = 0; i < count; ++i) {
    body.append(i == 0 ? "[\"" : ",[\"");
    append_shaped_key(body, static_cast<std::uint64_t>(first + i));
    body.append("\",").append(std::to_string(pages[static_cast<std::size_t>(i)])).append("]");
  }
  body.append("],\"pages_to_release\":[]}");
  return c.post(prefix + "/confirm_write", body) == 204;
}

// Allocates then confirms keys [first, first + count) on `rank`. False on any error.
bool save_batch(bench::http_client& c, long rank, long first, long count, std::string& body,
                std::vector<long>& pages) {
  if (sglang) return save_sglang_batch(c, rank, first, count, body, pages);
  body.assign("{\"rank\":").append(std::to_string(rank)).append(",\"keys\":[");
  for (long k = first; k < first + count; ++k) {
    body.append(k == first ? "[\"" : ",[\"");
    append_shaped_key(body, static_cast<std::uint64_t>(k));
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
    append_shaped_key(body, static_cast<std::uint64_t>(first + i));
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
  shape = flag_text(argc, argv, "--shape", "hex32");
  const std::string_view order = flag_text(argc, argv, "--order", "rank");
  const std::string_view api = flag_text(argc, argv, "--api", "vllm");
  sglang = api == "sglang";
  const bool shape_ok = shape == "hex32" || shape == "HEX32" || shape == "hex64" ||
                        shape == "HEX64" || shape == "other" || shape == "other65";
  if (pid <= 0 || rss_kib(pid) < 0 || ranks < 1 || pages < keys || keys < 1 || batch < 1 ||
      !shape_ok || (order != "rank" && order != "batch") || (api != "vllm" && !sglang)) {
    std::fprintf(stderr,
                 "metad-memory: bad flags (need --pid of a running server, pages >= keys)\n");
    return 2;
  }
  bench::http_client c("127.0.0.1", static_cast<std::uint16_t>(port), 60'000);
  if (!sglang && c.post("/clear", "{}") != 204) {
    std::fprintf(stderr, "metad-memory: POST /clear failed\n");
    return 1;
  }
  const long rss_empty = rss_kib(pid);
  const std::string init =
      "{\"num_pages\":" + std::to_string(pages) + (sglang ? "}" : ",\"role\":\"worker\"}");
  for (long r = 0; r < ranks; ++r)
    if (sglang ? c.post("/" + std::to_string(r) + "/initialize", init) != 204
               : c.post("/rank/" + std::to_string(r) + "/initialize", init) != 200) {
      std::fprintf(stderr, "metad-memory: initialize failed\n");
      return 1;
    }
  const long rss_pools = rss_kib(pid);
  std::string body;
  std::vector<long> got;
  const bool by_batch = order == "batch";
  for (long outer = 0; outer < (by_batch ? keys : ranks); outer += by_batch ? batch : 1)
    for (long inner = 0; inner < (by_batch ? ranks : keys); inner += by_batch ? 1 : batch) {
      const long r = by_batch ? inner : outer, k = by_batch ? outer : inner;
      if (!save_batch(c, r, k, std::min(batch, keys - k), body, got)) {
        std::fprintf(stderr, "metad-memory: save failed on rank %ld at key %ld\n", r, k);
        return 1;
      }
    }
  const long rss_keys = rss_kib(pid);
  // Spot check: every key is complete and bound on every rank (SGLang: the first and the
  // last key bound in the first and the last pool).
  body.assign("{\"keys\":[\"");
  append_shaped_key(body, 0);
  body.append("\",\"");
  append_shaped_key(body, static_cast<std::uint64_t>(keys - 1));
  body.append("\"]}");
  auto both_exist = [&](const std::string& path) {
    return c.post(path, body) == 200 && c.body() == std::string_view(R"({"exists":[true,true]})");
  };
  const bool complete =
      sglang ? both_exist("/0/exists") && both_exist("/" + std::to_string(ranks - 1) + "/exists")
             : both_exist("/keys/batch_exists");
  const double bindings = static_cast<double>(ranks) * static_cast<double>(keys);
  const double all_pages = static_cast<double>(ranks) * static_cast<double>(pages);
  std::printf(
      "memory: %s API, %ld ranks x %ld pages, %ld %s keys confirmed on every rank, order %s "
      "(%s)\n\n",
      sglang ? "SGLang" : "vLLM", ranks, pages, keys, std::string(shape).c_str(),
      std::string(order).c_str(), complete ? "all complete" : "NOT COMPLETE: check the server");
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
