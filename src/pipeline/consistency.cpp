#include "pipeline/consistency.hpp"

#include <fmt/format.h>

#include <unordered_map>

namespace metad::pipeline {

std::string check_consistency(const node& nd) {
  std::unordered_map<std::string, std::int32_t> bound;
  std::int64_t sg_pools = 0;
  for (const auto& core : nd.core) {
    for (const auto& entry : core->sg_tenants) {
      const std::string_view tenant = entry.first;  // lambdas cannot capture bindings in C++20
      const auto& pools = entry.second;
      std::string e;
      pools.for_each([&](std::int64_t rank, std::string_view ns, const shard::sglang_pool& pool) {
        ++sg_pools;
        if (e.empty() && shard::owner_of_rank(rank, nd.cores) != core->index)
          e = fmt::format("SGLang rank {} is on core {}, not its owner", rank, core->index);
        if (std::string p = pool.verify(); e.empty() && !p.empty())
          e = fmt::format("SGLang pool '{}' {} '{}': {}", tenant, rank, ns, p);
      });
      if (!e.empty()) return e;
      if (std::string p = pools.verify(); !p.empty())
        return fmt::format("SGLang tenant '{}': {}", tenant, p);
    }
    if (std::string e = core->ranks.verify(); !e.empty()) return e;
    if (std::string e = core->directory.verify(); !e.empty())
      return fmt::format("core {}: {}", core->index, e);
    core->ranks.for_each_entry(
        [&bound](std::int64_t, std::string_view key, std::int64_t, bool confirmed) {
          if (confirmed) ++bound[std::string(key)];
        });
  }
  if (sg_pools != nd.sglang_pools.load())
    return fmt::format("{} SGLang pools exist, {} are counted", sg_pools, nd.sglang_pools.load());
  std::string error;
  std::size_t counted = 0;
  for (const auto& core : nd.core) {
    std::size_t incomplete = 0;
    std::uint64_t incomplete_pages = 0;
    core->directory.for_each_key([&](std::string_view key, std::int32_t tp, std::int32_t count) {
      ++counted;
      const auto it = bound.find(std::string(key));
      const std::int32_t ranks = it == bound.end() ? 0 : it->second;
      if (error.empty() && ranks != count)
        error = fmt::format("key {} counts {} confirmations, {} ranks hold it", key, count, ranks);
      if (count < tp) {
        ++incomplete;
        incomplete_pages += static_cast<std::uint64_t>(count);
      }
    });
    if (error.empty() && (incomplete != core->directory.incomplete_count() ||
                          incomplete_pages != core->directory.incomplete_bindings()))
      error = fmt::format("core {} tracks {} incomplete keys holding {} pages, it has {} ({})",
                          core->index, core->directory.incomplete_count(),
                          core->directory.incomplete_bindings(), incomplete, incomplete_pages);
  }
  if (error.empty() && counted != bound.size())
    error = fmt::format("{} keys are bound on ranks, {} in the directory", bound.size(), counted);
  return error;
}

}  // namespace metad::pipeline
