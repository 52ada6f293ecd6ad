// libFuzzer harness for api::decode_sglang_state (the reference SGLang server's state
// file, imported at start-up): the whole input is the file. Checks that an accepted
// file describes consistent pools (every page free or bound, exactly once, the file's
// keys once each) and that decoding is repeatable.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "api/sglang_state.hpp"
#include "fuzz_input.hpp"

using namespace metad;

namespace {

// Small limits, so that the fuzzer reaches them.
constexpr api::sg_state_limits kLimits{.pages_max = 4096, .key_bytes_max = 64, .pools_max = 8};

void check_pool(const api::sg_state_pool& pool) {
  fuzz::require(!pool.ns.empty(), "a pool has a namespace");
  fuzz::require(pool.num_pages <= kLimits.pages_max, "num_pages within the limit");
  fuzz::require(pool.free.size() + pool.bound.size() == pool.num_pages,
                "every page is free or bound");
  fuzz::require(pool.reclaimed <= pool.free.size(), "reclaimed pages are free");
  std::vector<std::uint8_t> seen(pool.num_pages, 0);
  for (std::uint32_t page : pool.free) {
    fuzz::require(page < pool.num_pages, "free pages in range");
    fuzz::require(seen[page]++ == 0, "a page once");
  }
  for (std::size_t i = 1; i < pool.reclaimed; ++i)
    fuzz::require(pool.free[i - 1] < pool.free[i], "reclaimed pages ascending");
  std::unordered_set<std::string_view> keys;
  for (const auto& [key, page] : pool.bound) {
    fuzz::require(page < pool.num_pages, "bound pages in range");
    fuzz::require(seen[page]++ == 0, "a page once");
    fuzz::require(key.size() <= kLimits.key_bytes_max, "keys within the limit");
    fuzz::require(keys.insert(key).second, "a key once");
  }
}

std::string summary(const std::vector<api::sg_state_pool>& pools) {
  std::string out;
  for (const api::sg_state_pool& p : pools) {
    out += std::to_string(p.rank) + ":" + p.ns + "/" + std::to_string(p.num_pages) + "/";
    for (std::uint32_t page : p.free) out += std::to_string(page) + ",";
    for (const auto& [key, page] : p.bound) out += key + "=" + std::to_string(page) + ",";
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<api::sg_state_pool> a, b;
  const std::string e1 = api::decode_sglang_state(text, kLimits, a);
  const std::string e2 = api::decode_sglang_state(text, kLimits, b);
  fuzz::require(e1 == e2, "decoding is repeatable");
  if (!e1.empty()) return 0;
  fuzz::require(a.size() <= kLimits.pools_max, "pools within the limit");
  for (const api::sg_state_pool& pool : a) check_pool(pool);
  fuzz::require(summary(a) == summary(b), "decoded pools are repeatable");
  return 0;
}
