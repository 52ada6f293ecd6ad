#include "shard/sglang_pools.hpp"

#include <fmt/format.h>

#include <cstring>

#include "metad/assert.hpp"
#include "shard/verify.hpp"

namespace metad::shard {

const std::string& sglang_pools::key_of(std::int64_t rank, std::string_view ns) const {
  key_.resize(sizeof rank);
  std::memcpy(key_.data(), &rank, sizeof rank);
  key_.append(ns);
  return key_;
}

sglang_pool* sglang_pools::find(std::int64_t rank, std::string_view ns) {
  auto it = index_.find(key_of(rank, ns));
  return it == index_.end() ? nullptr : &pools_[it->second]->pool;
}

const sglang_pool* sglang_pools::find(std::int64_t rank, std::string_view ns) const {
  auto it = index_.find(key_of(rank, ns));
  return it == index_.end() ? nullptr : &pools_[it->second]->pool;
}

sglang_init_result sglang_pools::initialize(std::int64_t rank, std::string_view ns,
                                            std::uint64_t num_pages) {
  METAD_ASSERT(num_pages <= sglang_pool::pages_max);
  if (sglang_pool* pool = find(rank, ns)) {
    const std::uint64_t old = pool->num_pages();
    if (num_pages == old) return {sglang_init::unchanged, old};
    if (num_pages > old) {
      pool->grow(num_pages);
      return {sglang_init::grown, old};
    }
    return {strict_reinit_ ? sglang_init::smaller_refused : sglang_init::smaller_ignored, old};
  }
  const bool added = adopt(rank, ns, sglang_pool(num_pages, config_));
  METAD_ASSERT(added);
  return {sglang_init::created, 0};
}

bool sglang_pools::adopt(std::int64_t rank, std::string_view ns, sglang_pool&& pool) {
  auto [it, inserted] = index_.try_emplace(key_of(rank, ns), pools_.size());
  if (!inserted) return false;
  pools_.push_back(std::make_unique<entry>(entry{rank, std::string(ns), std::move(pool)}));
  return true;
}

std::size_t sglang_pools::expire(std::uint64_t now) {
  std::size_t expired = 0;
  for (auto& e : pools_) expired += e->pool.expire(now);
  if (expired != 0) METAD_VERIFY_AFTER("sglang_pools::expire", pools_.size(), verify());
  return expired;
}

std::string sglang_pools::verify() const {
  if (index_.size() != pools_.size())
    return fmt::format("sglang_pools: {} pools, {} index entries", pools_.size(), index_.size());
  for (const auto& [key, at] : index_) {
    if (at >= pools_.size()) return fmt::format("sglang_pools: an index entry names pool {}", at);
    const entry& e = *pools_[at];
    if (key != key_of(e.rank, e.ns))
      return fmt::format("sglang_pools: pool {} ({} '{}') is indexed by another name", at, e.rank,
                         e.ns);
  }
  for (const auto& e : pools_) {
    if (std::string p = e->pool.verify(); !p.empty())
      return fmt::format("sglang_pools: pool {} '{}': {}", e->rank, e->ns, p);
  }
  return {};
}

}  // namespace metad::shard
