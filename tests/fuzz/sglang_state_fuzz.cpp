// libFuzzer harness for api::decode_sglang_state (the reference SGLang server's state
// file, imported at start-up): the whole input is the file. Checks that an accepted
// file describes consistent pools (every page free or bound, exactly once, the file's
// keys once each) and that decoding is repeatable; then drives each accepted pool as the
// import does (shard::sglang_pool::restore) and through a few operations on its keys
// (reserve, confirm, get, delete, expire, clear), checking the pool's verify() after
// every step.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "api/sglang_state.hpp"
#include "fuzz_input.hpp"
#include "shard/sglang_pool.hpp"

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

// The pool an accepted file describes, as the import builds it, then operations on its
// keys (each step chosen by a byte of the input): verify() after every step.
void drive_pool(const api::sg_state_pool& decoded, std::string_view text) {
  shard::sglang_image image;
  image.num_pages = decoded.num_pages;
  for (const std::uint32_t p : decoded.free) image.push_free(p);
  for (const auto& [key, page] : decoded.bound) image.bound.emplace_back(key, page);
  shard::sglang_pool pool(0);
  std::string error;
  const shard::sglang_config config{.reservation_ttl = 5, .read_lease = 3};
  if (!shard::sglang_pool::restore(image, config, pool, error)) return;
  fuzz::require(pool.verify().empty(), "a restored pool keeps its invariants", pool.verify());
  std::vector<std::string> keys;
  for (const auto& [key, page] : decoded.bound) keys.push_back(key);
  keys.push_back("fresh-a");
  keys.push_back("fresh-b");
  std::uint64_t now = 1;
  std::vector<shard::sglang_slot> slots;
  for (std::size_t i = 0; i < text.size() && i < 64; ++i) {
    const auto byte = static_cast<std::uint8_t>(text[i]);
    now += byte & 3u;
    const std::vector<std::string_view> some{keys[byte % keys.size()],
                                             keys[(byte / 7u) % keys.size()]};
    switch ((byte >> 2) % 6) {
      case 0:
        pool.reserve(some, now, slots);
        break;
      case 1: {
        pool.reserve(some, now, slots);
        std::vector<std::string_view> ks;
        std::vector<std::int64_t> pages;
        for (std::size_t k = 0; k < slots.size(); ++k) {
          if (slots[k].page >= 0 && !slots[k].exists) {
            ks.push_back(some[k]);
            pages.push_back(slots[k].page);
          }
        }
        std::string detail;
        shard::sglang_confirm_stats stats;
        const std::vector<std::int64_t> releases{static_cast<std::int64_t>(byte % 8)};
        pool.confirm(ks, pages, releases, now, detail, stats, byte & 1u ? now + 4 : 0);
        break;
      }
      case 2: {
        std::vector<std::int64_t> out(some.size());
        pool.get_page_indices(some, now, out);
        break;
      }
      case 3:
        pool.delete_keys(some);
        break;
      case 4:
        pool.expire(now);
        pool.end_quarantines(now);
        break;
      default:
        if (byte > 250) pool.clear();
        break;
    }
    fuzz::require(pool.verify().empty(), "a pool keeps its invariants", pool.verify());
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
  for (const api::sg_state_pool& pool : a) drive_pool(pool, text);
  return 0;
}
