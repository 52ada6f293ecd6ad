// The tenants table swapped under readers (pipeline/tenants.hpp): one thread publishes
// table after table, as SIGHUP does, while core-like threads each take the current one
// through their own reference, as connection::current_tenants does per request. Each
// reader always sees a whole table, versions never go back, and a tenant's usage record
// stays one across every table. In the server's unit binary, which the ThreadSanitizer
// stage runs (its races) and ASan (a table freed while a reader holds it).
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/routes.hpp"
#include "pipeline/tenants.hpp"

namespace metad::pipeline {
namespace {

std::string swap_hex(const token_digest& d) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char b : d) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

// Table i: the tenant "stable" (token "s") and "v<i>" (token "tok<i>").
std::shared_ptr<tenant_table> swap_table(int i) {
  auto table = std::make_shared<tenant_table>();
  const std::string text = "stable " + swap_hex(token_sha256("s")) + " ranks=7\nv" +
                           std::to_string(i) + " " +
                           swap_hex(token_sha256("tok" + std::to_string(i))) + " vllm\n";
  EXPECT_EQ(parse_tenants(text, kPatterns, *table), "");
  return table;
}

TEST(TenantsSwap, ReadersAlwaysSeeAWholeTableWhileItIsReplaced) {
  constexpr int kTables = 2000;
  constexpr int kReaders = 3;
  tenant_registry registry;
  registry.publish(swap_table(1));
  tenant_usage* const stable = &registry.usage("stable");
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::atomic<std::int64_t> reads{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&] {
      std::shared_ptr<const tenant_table> held;  // a core's own reference
      std::uint64_t last = 0;
      const token_digest s = token_sha256("s");
      std::int64_t n = 0;
      while (!done.load(std::memory_order_acquire) || n == 0) {
        const tenant_table& t = registry.take(held);
        const tenant* st = t.find(s);
        const tenant* v = t.find(token_sha256("tok" + std::to_string(t.version)));
        const bool whole = t.tenants.size() == 2 && st != nullptr && st->usage == stable &&
                           st->ranks == 7 && v != nullptr &&
                           v->name == "v" + std::to_string(t.version) && t.vllm_tenant() == v &&
                           t.version >= last;
        if (!whole) failures.fetch_add(1);
        last = t.version;
        st->usage->sg_ranks.fetch_add(1, std::memory_order_relaxed);
        ++n;
      }
      reads.fetch_add(n);
    });
  }
  for (int i = 2; i <= kTables; ++i) registry.publish(swap_table(i));
  done.store(true, std::memory_order_release);
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(registry.version(), static_cast<std::uint64_t>(kTables));
  EXPECT_EQ(registry.current()->tenants[1].name, "v" + std::to_string(kTables));
  // Every reader's count landed in the one usage record, whichever table it read.
  EXPECT_EQ(stable->sg_ranks.load(), reads.load());
}

}  // namespace
}  // namespace metad::pipeline
