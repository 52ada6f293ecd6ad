#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "shard/directory.hpp"
#include "shard/rank_table.hpp"

// Memory cost of the shard state at the reference size: 8 ranks of 2M pages, 1M
// 32-hex keys confirmed on every rank (8M bindings) plus the directory entry of each key.
// Measured as the process's resident memory before and after.
namespace metad::shard {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif
#else
constexpr bool sanitized = false;
#endif

// Resident memory of the process, what the targets count: malloc's heap and the
// big tables' own mappings (zeroed_array) alike. With the server's malloc setting.
std::size_t resident_bytes() {
  static const bool tuned = mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1;
  (void)tuned;
  unsigned long pages = 0, resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lu %lu", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Key i as 32 lowercase hex characters at `out`.
void write_key(char* out, std::uint64_t i) {
  static constexpr char digits[] = "0123456789abcdef";
  const std::uint64_t halves[2] = {splitmix64(i), splitmix64(i ^ 0x5851F42D4C957F2Dull)};
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 16; ++c) out[h * 16 + c] = digits[(halves[h] >> (60 - 4 * c)) & 0xF];
  }
}

TEST(ShardMemory, BindingsOfHexKeysCostAtMost32BytesAndPagesAtMost1Byte) {
  constexpr int ranks = 8;
  constexpr std::int64_t pages = 2'097'152;
  // Under sanitizers the allocator is not glibc's (its shadow memory is resident too) and the run
  // is ~20x slower: exercise a tenth of it, assert nothing about bytes.
  const std::uint64_t keys = sanitized ? 100'000 : 1'000'000;
  constexpr std::size_t batch = 128;

  // Every buffer the loop uses is allocated before the first measurement.
  std::string text(batch * 32, '\0');
  std::vector<std::string_view> views(batch);
  std::vector<std::uint32_t> distinct, fresh;
  std::vector<std::int64_t> got;
  distinct.reserve(batch);
  fresh.reserve(batch);
  got.reserve(batch);
  std::string detail;
  detail.reserve(256);
  rank_table table;
  directory dir;
  // Warm the tables' scratch vectors so their growth is not counted as pool bytes.
  ASSERT_EQ(table.initialize(99, 1).outcome, init_outcome::created);

  const std::size_t before_pools = resident_bytes();
  for (int r = 0; r < ranks; ++r) table.initialize(r, pages);
  const std::size_t before_keys = resident_bytes();

  // The worst point while loading: a table growth in flight holds both tables.
  double worst_per_binding = 0;
  for (std::uint64_t first = 0; first < keys; first += batch) {
    if (first >= keys / 10 && first % (batch * 64) == 0) {
      const double now = static_cast<double>(resident_bytes() - before_keys) /
                         (double{ranks} * static_cast<double>(first));
      worst_per_binding = std::max(worst_per_binding, now);
    }
    const std::size_t n = std::min<std::uint64_t>(batch, keys - first);
    for (std::size_t i = 0; i < n; ++i) {
      write_key(text.data() + i * 32, first + i);
      views[i] = std::string_view(text.data() + i * 32, 32);
    }
    const std::span<const std::string_view> batch_keys(views.data(), n);
    for (int r = 0; r < ranks; ++r) {
      distinct.clear();
      got.clear();
      fresh.clear();
      ASSERT_TRUE(table.allocate(r, batch_keys, 0, distinct, got));
      ASSERT_EQ(got.size(), n);
      ASSERT_EQ(table.confirm(r, batch_keys, got, {}, 0, detail, fresh), confirm_outcome::ok)
          << detail;
      ASSERT_EQ(fresh.size(), n);
      for (std::uint32_t i : fresh) dir.add_confirmation(batch_keys[i], ranks, 0);
    }
  }
  const std::size_t after_keys = resident_bytes();

  ASSERT_EQ(dir.size(), keys);
  for (std::uint64_t i = 0; i < keys; i += keys / 1000) {
    write_key(text.data(), i);
    const std::string_view k(text.data(), 32);
    ASSERT_TRUE(dir.complete(k));
    std::int64_t page = -1;
    ASSERT_TRUE(table.confirmed_pages(static_cast<std::int64_t>(i % ranks), {&k, 1}, {&page, 1}));
    ASSERT_GE(page, 0);
  }
  for (int r = 0; r < ranks; ++r) ASSERT_EQ(table.stats(r)->bound, static_cast<std::int64_t>(keys));

  const double per_page = static_cast<double>(before_keys - before_pools) /
                          (double{ranks} * static_cast<double>(pages));
  const double per_binding =
      static_cast<double>(after_keys - before_keys) / (double{ranks} * static_cast<double>(keys));
  std::printf("  %d ranks x %lld pages: %.3f bytes/page\n", ranks, static_cast<long long>(pages),
              per_page);
  std::printf(
      "  %llu keys x %d ranks + directory: %.2f bytes/binding (worst point while "
      "loading: %.2f)\n",
      static_cast<unsigned long long>(keys), ranks, per_binding, worst_per_binding);
  RecordProperty("bytes_per_page", std::to_string(per_page));
  RecordProperty("bytes_per_binding", std::to_string(per_binding));
  RecordProperty("worst_bytes_per_binding_while_loading", std::to_string(worst_per_binding));
  if (sanitized) return;
  EXPECT_LE(per_page, 1.0);
  EXPECT_LE(per_binding, 32.0);
}

// With --eviction lru every complete key also has a place in its directory slice's
// recency list (key_life): its cost per key, on top of the directory entry.
TEST(ShardMemory, RecencyTrackingCostsAtMost80BytesPerKey) {
  const std::uint64_t keys = sanitized ? 100'000 : 1'000'000;
  std::string text(32, '\0');
  auto fill = [&](directory& d) {
    for (std::uint64_t i = 0; i < keys; ++i) {
      write_key(text.data(), i);
      d.add_confirmation(std::string_view(text.data(), 32), 1, i);
    }
  };
  const std::size_t start = resident_bytes();
  directory plain;
  fill(plain);
  const std::size_t after_plain = resident_bytes();
  directory tracked;
  tracked.set_lru(true);
  fill(tracked);
  const std::size_t after_tracked = resident_bytes();
  const double entry = static_cast<double>(after_plain - start) / static_cast<double>(keys);
  const double recency =
      static_cast<double>(after_tracked - after_plain) / static_cast<double>(keys) - entry;
  std::printf("  %llu keys: directory %.1f bytes/key, recency +%.1f bytes/key\n",
              static_cast<unsigned long long>(keys), entry, recency);
  RecordProperty("recency_bytes_per_key", std::to_string(recency));
  std::vector<std::uint64_t> oldest;
  tracked.oldest_used(keys, 1, oldest);
  ASSERT_EQ(oldest, std::vector<std::uint64_t>{0});
  if (sanitized) return;
  EXPECT_LE(recency, 80.0);
}

// A peak of incomplete keys (every key confirmed on one rank of two, as a rank-by-rank
// fill makes) leaves nothing behind once the keys are complete: the periodic tick gives
// the incomplete list's nodes and map back (issue 31 item 5).
TEST(ShardMemory, APeakOfIncompleteKeysIsGivenBackOnceTheyComplete) {
  const std::uint64_t keys = sanitized ? 50'000 : 500'000;
  std::string text(32, '\0');
  directory d;
  auto confirm_all = [&](std::uint64_t at) {
    for (std::uint64_t i = 0; i < keys; ++i) {
      write_key(text.data(), i);
      d.add_confirmation(std::string_view(text.data(), 32), 2, at + i);
    }
  };
  confirm_all(0);
  ASSERT_EQ(d.incomplete_count(), keys);
  const std::size_t at_peak = resident_bytes();
  confirm_all(keys);
  ASSERT_EQ(d.incomplete_count(), 0u);
  d.advance_growth();
  const std::size_t after = resident_bytes();
  ASSERT_EQ(d.verify(), "");
  const double freed =
      (static_cast<double>(at_peak) - static_cast<double>(after)) / static_cast<double>(keys);
  std::printf("  %llu keys: %.1f bytes/key given back after the peak\n",
              static_cast<unsigned long long>(keys), freed);
  if (sanitized) return;
  // The list held a 48-byte node and a map slot per key; at least the nodes go back.
  EXPECT_GE(freed, 40.0);
}

}  // namespace
}  // namespace metad::shard
