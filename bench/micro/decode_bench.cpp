// api::decoder on realistic bodies: 128-key batch_allocate / confirm_write /
// get_locations and the 1,250-key (~44 KB) batch_exists. Bodies sit in buffers with
// simdjson::SIMDJSON_PADDING spare bytes, as the HTTP parser leaves them.
#include <benchmark/benchmark.h>
#include <simdjson.h>

#include <cstring>
#include <memory>

#include "api/decode.hpp"
#include "api/encode.hpp"
#include "micro/bodies.hpp"

using namespace metad;

namespace {

// A body with the padding simdjson reads past its end.
struct padded {
  explicit padded(const std::string& text)
      : bytes(std::make_unique<char[]>(text.size() + simdjson::SIMDJSON_PADDING)),
        size(text.size()) {
    std::memcpy(bytes.get(), text.data(), text.size());
    std::memset(bytes.get() + size, 0, simdjson::SIMDJSON_PADDING);
  }
  std::string_view view() const { return {bytes.get(), size}; }
  std::unique_ptr<char[]> bytes;
  std::size_t size;
};

void report(benchmark::State& state, const padded& body, std::size_t keys) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * body.size));
  state.counters["keys"] = static_cast<double>(keys);
}

void BM_decode_allocate(benchmark::State& state) {
  const int keys = static_cast<int>(state.range(0));
  const padded body(bench::keys_body(keys, true, 3));
  api::decoder d;
  api::allocate_cmd cmd;
  for (auto _ : state) {
    if (d.decode_allocate(body.view(), cmd)) state.SkipWithError("decode failed");
    benchmark::DoNotOptimize(cmd.keys.size());
  }
  report(state, body, cmd.keys.size());
}
BENCHMARK(BM_decode_allocate)->Arg(128)->Arg(1250);

void BM_decode_confirm(benchmark::State& state) {
  const padded body(bench::confirm_body(static_cast<int>(state.range(0)), 3));
  api::decoder d;
  api::confirm_cmd cmd;
  for (auto _ : state) {
    if (d.decode_confirm(body.view(), cmd)) state.SkipWithError("decode failed");
    benchmark::DoNotOptimize(cmd.pages.size());
  }
  report(state, body, cmd.keys.size());
}
BENCHMARK(BM_decode_confirm)->Arg(128);

void BM_decode_exists(benchmark::State& state) {
  const padded body(bench::keys_body(static_cast<int>(state.range(0)), false, -1));
  api::decoder d;
  api::exists_cmd cmd;
  for (auto _ : state) {
    if (d.decode_exists(body.view(), cmd)) state.SkipWithError("decode failed");
    benchmark::DoNotOptimize(cmd.keys.size());
  }
  report(state, body, cmd.keys.size());
}
BENCHMARK(BM_decode_exists)->Arg(128)->Arg(1250);

void BM_decode_locations(benchmark::State& state) {
  const padded body(bench::keys_body(static_cast<int>(state.range(0)), false, 3));
  api::decoder d;
  api::locations_cmd cmd;
  for (auto _ : state) {
    if (d.decode_locations(body.view(), cmd)) state.SkipWithError("decode failed");
    benchmark::DoNotOptimize(cmd.keys.size());
  }
  report(state, body, cmd.keys.size());
}
BENCHMARK(BM_decode_locations)->Arg(128);

void BM_decode_initialize(benchmark::State& state) {
  const padded body(std::string(R"({"num_pages":1024,"role":"worker"})"));
  api::decoder d;
  api::initialize_cmd cmd;
  for (auto _ : state) {
    if (d.decode_initialize("0", body.view(), std::int64_t{1} << 28, cmd))
      state.SkipWithError("decode failed");
    benchmark::DoNotOptimize(cmd.num_pages);
  }
}
BENCHMARK(BM_decode_initialize);

}  // namespace

BENCHMARK_MAIN();
