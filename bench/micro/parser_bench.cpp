// http::parser throughput on the requests vLLM's client sends: a small initialize, a
// 128-key batch_allocate and a 1,250-key (~44 KB) batch_exists. Each iteration copies
// the bytes in as a recv would (in `segment`-byte reads), parses and consumes them.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>

#include "http/parser.hpp"
#include "micro/bodies.hpp"

using namespace metad;

namespace {

std::string request_for(int keys) {
  if (keys == 0)
    return bench::http_request("/rank/0/initialize", R"({"num_pages":1024,"role":"worker"})");
  if (keys == 128)
    return bench::http_request("/keys/batch_allocate", bench::keys_body(128, true, 0));
  return bench::http_request("/keys/batch_exists", bench::keys_body(keys, false, -1));
}

void BM_parse(benchmark::State& state) {
  const std::string wire = request_for(static_cast<int>(state.range(0)));
  const auto segment = static_cast<std::size_t>(state.range(1));
  http::parser p;
  for (auto _ : state) {
    std::size_t at = 0;
    http::parse_status st = http::parse_status::need_more;
    while (st == http::parse_status::need_more) {
      const std::size_t n = std::min(segment, wire.size() - at);
      std::span<char> space = p.read_space(n);
      std::memcpy(space.data(), wire.data() + at, n);
      p.commit(n);
      at += n;
      st = p.next();
    }
    if (st != http::parse_status::ready || at != wire.size()) state.SkipWithError("not parsed");
    benchmark::DoNotOptimize(p.current().body.data());
    p.consume();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * wire.size()));
  state.SetLabel(std::to_string(wire.size()) + " B request");
}

// Args: keys in the body (0 = initialize), bytes per read (64 KiB = all at once; 1448 =
// one TCP segment at a time, the worst case for an incremental parser).
BENCHMARK(BM_parse)
    ->ArgNames({"keys", "read"})
    ->Args({0, 65536})
    ->Args({128, 65536})
    ->Args({1250, 65536})
    ->Args({1250, 1448});

// Pipelined: 16 small requests arrive in one read.
void BM_parse_pipelined(benchmark::State& state) {
  std::string wire;
  for (int i = 0; i < 16; ++i) wire += request_for(0);
  http::parser p;
  for (auto _ : state) {
    std::span<char> space = p.read_space(wire.size());
    std::memcpy(space.data(), wire.data(), wire.size());
    p.commit(wire.size());
    for (int i = 0; i < 16; ++i) {
      if (p.next() != http::parse_status::ready) state.SkipWithError("not parsed");
      benchmark::DoNotOptimize(p.current().body.data());
      p.consume();
    }
  }
  state.SetItemsProcessed(state.iterations() * 16);
}
BENCHMARK(BM_parse_pipelined);

}  // namespace

BENCHMARK_MAIN();
