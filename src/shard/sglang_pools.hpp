// sglang_pools: the SGLang pools of one state space (a tenant), one per (rank, namespace),
// in creation order (the order the reference's persistence file lists them). Pools are
// never removed: clear keeps a pool registered. Separate from the vLLM ranks
// (rank_table): the two families share nothing. Owned by one core.
//
// Invariants (verify()): the index names each pool exactly once, by its own (rank,
// namespace), and nothing else; every pool's own (sglang_pool::verify).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "shard/sglang_pool.hpp"

namespace metad::shard {

enum class sglang_init : std::uint8_t {
  created,          // a new pool: 204
  unchanged,        // same num_pages: 204
  grown,            // larger num_pages: the new pages are free; 204
  smaller_ignored,  // smaller num_pages, kept as it was: 204, a warning and a metric
  smaller_refused,  // the same with strict_reinit: 409 (old_pages in the detail)
};

struct sglang_init_result {
  sglang_init outcome;
  std::uint64_t old_pages;  // the pool's size before the call (0 when created)
};

class sglang_pools {
 public:
  explicit sglang_pools(const sglang_config& config = {}, bool strict_reinit = false)
      : config_(config), strict_reinit_(strict_reinit) {}

  // num_pages already validated (0 <= n <= the configured ceiling <= sglang_pool::pages_max).
  sglang_init_result initialize(std::int64_t rank, std::string_view ns, std::uint64_t num_pages);

  // The pool, or nullptr (the caller answers 404).
  sglang_pool* find(std::int64_t rank, std::string_view ns);
  const sglang_pool* find(std::int64_t rank, std::string_view ns) const;

  std::size_t size() const { return pools_.size(); }
  // fn(rank, namespace, pool) in creation order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const auto& e : pools_) fn(e->rank, std::string_view(e->ns), e->pool);
  }
  // Expires due reservations in every pool; returns how many.
  std::size_t expire(std::uint64_t now);

  // Adds a restored pool (recovery); false if (rank, ns) already exists.
  bool adopt(std::int64_t rank, std::string_view ns, sglang_pool&& pool);

  // The invariants above, O(pools' sizes): "" when they hold, else the first broken one.
  std::string verify() const;

  // Where the caller counts the pages these pools hold (reserved + bound; null: nowhere):
  // --tenants-file's count of the tenant's pages, shared with other cores (tenants.hpp,
  // tenant_usage::pages). The pools never touch it: the caller adds each operation's
  // change of sglang_pool::held() to it.
  std::atomic<std::int64_t>* pages_counter = nullptr;

 private:
  struct entry {
    std::int64_t rank;
    std::string ns;
    sglang_pool pool;
  };
  // The map's key: the rank's 8 bytes, then the namespace.
  const std::string& key_of(std::int64_t rank, std::string_view ns) const;

  template <class>
  friend struct verify_access;  // tests: breaks an invariant to see verify() report it

  sglang_config config_;
  bool strict_reinit_;
  std::vector<std::unique_ptr<entry>> pools_;
  std::unordered_map<std::string, std::size_t> index_;
  mutable std::string key_;  // scratch for lookups
};

}  // namespace metad::shard
