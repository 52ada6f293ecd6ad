// Shard state costs on one core: the page pool (allocate/release at 1k, 100k and 2M
// pages: the cost must not grow with the pool), a rank's key map and the completion
// directory at 1M keys. Keys are the same 32-hex keys the server sees.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "common/keys.hpp"
#include "shard/directory.hpp"
#include "shard/page_pool.hpp"
#include "shard/rank_table.hpp"

using namespace metad;

namespace {

constexpr std::int64_t kRank = 3;
constexpr std::uint64_t kFillIds = std::uint64_t{1} << 40;  // ids of pre-filled keys

struct key_set {
  key_set(std::uint64_t first_id, std::size_t count, std::size_t stride = 1) {
    strings.reserve(count);
    for (std::size_t i = 0; i < count; ++i)
      strings.push_back(bench::make_key(first_id + i * stride));
    views.assign(strings.begin(), strings.end());
  }
  std::span<const std::string_view> span(std::size_t first = 0,
                                         std::size_t count = SIZE_MAX) const {
    return std::span<const std::string_view>(views).subspan(first,
                                                            std::min(count, views.size() - first));
  }
  std::vector<std::string> strings;
  std::vector<std::string_view> views;
};

// Allocates and confirms `keys` on the rank in batches; aborts the benchmark on failure.
bool bind_all(shard::rank_table& t, const key_set& keys, benchmark::State& state) {
  std::vector<std::uint32_t> distinct, fresh;
  std::vector<std::int64_t> pages;
  std::string detail;
  for (std::size_t at = 0; at < keys.views.size(); at += 4096) {
    const auto batch = keys.span(at, 4096);
    distinct.clear();
    pages.clear();
    fresh.clear();
    t.allocate(kRank, batch, 0, distinct, pages);
    if (t.confirm(kRank, batch, pages, {}, 0, detail, fresh) != shard::confirm_outcome::ok) {
      state.SkipWithError(("prefill failed: " + detail).c_str());
      return false;
    }
  }
  return true;
}

// One save task taking the failure path: batch_allocate of 128 fresh keys, then
// confirm_write with no confirmations and all 128 pages released. Args: pool pages,
// percent of the pool bound beforehand (allocation then searches past bound pages),
// whether reservations expire (the server's default TTL: their deadlines are queued).
void BM_allocate_release(benchmark::State& state) {
  const auto pool = static_cast<std::int64_t>(state.range(0));
  shard::rank_table t;
  if (state.range(2) != 0) t.set_reservation_ttl(600'000'000'000);
  t.initialize(kRank, pool);
  const key_set fill(kFillIds, static_cast<std::size_t>(pool * state.range(1) / 100));
  if (!bind_all(t, fill, state)) return;
  const key_set task(0, 128);
  std::vector<std::uint32_t> distinct, fresh;
  std::vector<std::int64_t> pages;
  std::string detail;
  std::uint64_t now = 0;
  for (auto _ : state) {
    distinct.clear();
    pages.clear();
    t.allocate(kRank, task.span(), ++now, distinct, pages);
    if (pages.back() < 0) state.SkipWithError("pool exhausted");
    t.confirm(kRank, {}, {}, pages, 0, detail, fresh);
  }
  state.SetItemsProcessed(state.iterations() * 128);
}
BENCHMARK(BM_allocate_release)
    ->ArgNames({"pages", "fill%", "ttl"})
    ->Args({1024, 0, 0})
    ->Args({100'000, 0, 0})
    ->Args({2'097'152, 0, 0})
    ->Args({1024, 50, 0})
    ->Args({100'000, 50, 0})
    ->Args({2'097'152, 50, 0})
    ->Args({1024, 0, 1})
    ->Args({2'097'152, 50, 1});

// The page pool alone: take the 128 lowest free pages, then release them.
void BM_page_pool_take_release(benchmark::State& state) {
  shard::page_pool p(static_cast<std::uint32_t>(state.range(0)));
  std::uint32_t taken[128];
  for (auto _ : state) {
    for (std::uint32_t& page : taken) page = p.take_lowest();
    for (std::uint32_t page : taken) p.release(page);
    benchmark::DoNotOptimize(taken);
  }
  state.SetItemsProcessed(state.iterations() * 128);
}
BENCHMARK(BM_page_pool_take_release)->Arg(1024)->Arg(100'000)->Arg(2'097'152);

// A rank holding 1M confirmed keys (pool of 2M pages), as the steady-state endpoints see it.
struct loaded_rank {
  explicit loaded_rank(benchmark::State& state) : keys(0, 1'000'000) {
    t.initialize(kRank, 2'097'152);
    ok = bind_all(t, keys, state);
  }
  shard::rank_table t;
  key_set keys;
  bool ok;
};

// get_locations' rank half: 128 keys spread over the 1M.
void BM_rank_confirmed_pages_1M(benchmark::State& state) {
  loaded_rank r(state);
  const key_set ask(0, 128, 7919);
  std::vector<std::int64_t> pages(128);
  for (auto _ : state) {
    r.t.confirmed_pages(kRank, ask.span(), pages);
    benchmark::DoNotOptimize(pages.data());
  }
  if (pages[0] < 0) state.SkipWithError("key not found");
  state.SetItemsProcessed(state.iterations() * 128);
}
BENCHMARK(BM_rank_confirmed_pages_1M)->Unit(benchmark::kMicrosecond);

// batch_allocate of 128 keys the rank already confirmed (cache hits), then the no-op
// confirm_write of the same (key, page) pairs: the steady-state save pair.
void BM_rank_hit_pair_1M(benchmark::State& state) {
  loaded_rank r(state);
  const key_set task(0, 128, 7919);
  std::vector<std::uint32_t> distinct, fresh;
  std::vector<std::int64_t> pages;
  std::string detail;
  for (auto _ : state) {
    distinct.clear();
    pages.clear();
    r.t.allocate(kRank, task.span(), 0, distinct, pages);
    fresh.clear();
    if (r.t.confirm(kRank, task.span(), pages, {}, 0, detail, fresh) != shard::confirm_outcome::ok)
      state.SkipWithError(detail.c_str());
  }
  state.SetItemsProcessed(state.iterations() * 128);
}
BENCHMARK(BM_rank_hit_pair_1M)->Unit(benchmark::kMicrosecond);

// 128 fresh keys reserved then released, in a key map of 1M keys (insert + erase).
void BM_rank_allocate_release_1M(benchmark::State& state) {
  loaded_rank r(state);
  const key_set task(kFillIds, 128);
  std::vector<std::uint32_t> distinct, fresh;
  std::vector<std::int64_t> pages;
  std::string detail;
  for (auto _ : state) {
    distinct.clear();
    pages.clear();
    r.t.allocate(kRank, task.span(), 0, distinct, pages);
    r.t.confirm(kRank, {}, {}, pages, 0, detail, fresh);
  }
  state.SetItemsProcessed(state.iterations() * 128);
}
BENCHMARK(BM_rank_allocate_release_1M)->Unit(benchmark::kMicrosecond);

// batch_exists' directory half: 1,250 lookups in a directory of 1M complete keys.
void BM_directory_complete_1M(benchmark::State& state) {
  shard::directory d;
  const key_set all(0, 1'000'000);
  for (std::string_view k : all.views) d.add_confirmation(k, 1, 0);
  const key_set ask(0, 1250, 797);
  std::size_t found = 0;
  for (auto _ : state) {
    found = 0;
    for (std::string_view k : ask.views) found += d.complete(k);
    benchmark::DoNotOptimize(found);
  }
  if (found != 1250) state.SkipWithError("keys missing");
  state.SetItemsProcessed(state.iterations() * 1250);
}
BENCHMARK(BM_directory_complete_1M)->Unit(benchmark::kMicrosecond);

// batch_exists' directory half as the connector replay sees it: every request asks
// other keys of a directory of 4M, so its lookups miss the cache. Arg 0: one use() per
// key; 1: use_each, which prefetches 16 keys' lines at a time.
void BM_directory_use_cold_4M(benchmark::State& state) {
  constexpr std::size_t keys = 4'000'000, asked = 1250, requests = 256;
  shard::directory d;
  {
    const key_set all(0, keys);
    for (std::string_view k : all.views) d.add_confirmation(k, 1, 0);
  }
  for (int tick = 0; tick < 10'000; ++tick) d.advance_growth();  // finish a growth under way
  // 256 requests of 1,250 keys each, spread over the whole directory: request r asks
  // keys r, r + 256, r + 512, ... (neighbours in no cache line). Each request's keys lie
  // side by side, as in a request body.
  const key_set ask(0, asked * requests, keys / (asked * requests));
  std::vector<std::string> texts(requests);
  std::vector<std::vector<std::string_view>> bodies(requests);
  for (std::size_t r = 0; r < requests; ++r) {
    for (std::size_t i = 0; i < asked; ++i) texts[r] += ask.views[i * requests + r];
    const std::size_t size = ask.views[r].size();
    for (std::size_t i = 0; i < asked; ++i)
      bodies[r].push_back(std::string_view(texts[r]).substr(i * size, size));
  }
  std::vector<std::uint32_t> at(asked);
  for (std::uint32_t i = 0; i < asked; ++i) at[i] = i;
  std::vector<std::uint8_t> used(asked);
  const bool grouped = state.range(0) != 0;
  std::size_t request = 0, found = 0;
  for (auto _ : state) {
    const std::vector<std::string_view>& body = bodies[request];
    request = (request + 1) % requests;
    found = 0;
    if (grouped) {
      d.use_each(body, at, 1, 0, used);
      for (const std::uint8_t u : used) found += u;
    } else {
      for (std::string_view k : body) found += d.use(k, 1, 0);
    }
    benchmark::DoNotOptimize(found);
  }
  if (found != asked) state.SkipWithError("keys missing");
  state.SetItemsProcessed(state.iterations() * asked);
}
BENCHMARK(BM_directory_use_cold_4M)
    ->ArgName("grouped")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond);

// Building the directory: 1M new keys confirmed (insert, rehash growth included).
void BM_directory_insert_1M(benchmark::State& state) {
  const key_set all(0, 1'000'000);
  for (auto _ : state) {
    shard::directory d;
    for (std::string_view k : all.views) d.add_confirmation(k, 8, 0);
    benchmark::DoNotOptimize(d.size());
  }
  state.SetItemsProcessed(state.iterations() * 1'000'000);
}
BENCHMARK(BM_directory_insert_1M)->Unit(benchmark::kMillisecond);

// A save into a full pool with eviction, the shard work alone: the directory gives up
// its 128 least recently used keys, the rank drops them, the directory settles, then
// 128 new keys are allocated, confirmed and counted. Arg: keys held (= pool pages). The
// cost per key must not grow with the number of keys (no scan).
void BM_evict_and_save(benchmark::State& state) {
  const auto held = static_cast<std::size_t>(state.range(0));
  shard::rank_table t;
  t.initialize(kRank, static_cast<std::int64_t>(held));
  shard::directory d;
  d.set_lru(true);
  const key_set fill(kFillIds, held);
  if (!bind_all(t, fill, state)) return;
  for (std::size_t i = 0; i < held; ++i) d.add_confirmation(fill.views[i], 1, i);
  std::vector<std::string> victims;
  std::vector<std::string_view> views;
  std::vector<std::uint32_t> removed, distinct, fresh;
  std::vector<std::int64_t> pages;
  std::string detail;
  std::uint64_t next = 0, now = held;
  for (auto _ : state) {
    victims.clear();
    d.take_least_recent(now, 128,
                        [&](std::string_view k, std::uint64_t) { victims.emplace_back(k); });
    views.assign(victims.begin(), victims.end());
    removed.clear();
    t.remove_confirmed(kRank, views, removed);
    for (std::string_view k : views) d.finish_removal(k, 1, now);
    const key_set task(next, 128);
    next += 128;
    distinct.clear();
    pages.clear();
    fresh.clear();
    t.allocate(kRank, task.span(), now, distinct, pages);
    t.confirm(kRank, task.span(), pages, {}, 0, detail, fresh);
    for (std::string_view k : task.views) d.add_confirmation(k, 1, now);
    ++now;
  }
  if (removed.size() != 128 || fresh.size() != 128) state.SkipWithError("eviction fell short");
  state.SetItemsProcessed(state.iterations() * 128);
}
BENCHMARK(BM_evict_and_save)
    ->Arg(16384)
    ->Arg(1 << 18)
    ->Arg(1 << 20)
    ->Arg(1 << 22)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
