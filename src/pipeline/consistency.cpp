#include "pipeline/consistency.hpp"

#include <fmt/format.h>

#include <unordered_map>

namespace metad::pipeline {
namespace {

// --tenants-file's pages=N counts (tenant_usage::pages) at rest: each counter holds
// exactly the pages of the registries that count in it (SGLang) and of the cores whose
// vLLM ranks count in it, and each core's vLLM share is what its ranks hold.
std::string check_tenant_pages(const node& nd) {
  std::unordered_map<const std::atomic<std::int64_t>*, std::int64_t> held;
  for (const auto& core : nd.core) {
    for (const auto& [name, pools] : core->sg_tenants) {
      std::int64_t n = 0;
      pools.for_each([&](std::int64_t, std::string_view, const shard::sglang_pool& pool) {
        n += static_cast<std::int64_t>(pool.held());
      });
      if (pools.pages_counter != nullptr) {
        held[pools.pages_counter] += n;
      } else if (!name.empty() && n > 0) {
        return fmt::format("tenant {}'s pools on core {} hold {} pages counted nowhere", name,
                           core->index, n);
      }
    }
    std::string e;
    core->for_each_space([&](const vllm_space& sp) {
      if (sp.pages_usage == nullptr || !e.empty()) return;
      const std::int64_t n = sp.ranks.held_pages();
      if (n != sp.pages_added)
        e = fmt::format("core {}'s vLLM ranks of tenant '{}' hold {} pages, {} are counted",
                        core->index, sp.tenant, n, sp.pages_added);
      held[&sp.pages_usage->pages] += n;
    });
    if (!e.empty()) return e;
  }
  for (const auto& [counter, n] : held)
    if (counter->load() != n)
      return fmt::format("a tenant holds {} pages, its pages=N count says {}", n, counter->load());
  return "";
}

}  // namespace

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
    std::string e;
    core->for_each_space([&](const vllm_space& sp) {
      if (!e.empty()) return;
      if (std::string v = sp.ranks.verify(); !v.empty()) e = v;
      if (std::string v = sp.directory.verify(); e.empty() && !v.empty())
        e = fmt::format("core {}: {}", core->index, v);
      // A key of one tenant is not another's: counted under its space.
      const std::string prefix = std::to_string(sp.id) + "/";
      sp.ranks.for_each_entry(
          [&](std::int64_t, std::string_view key, std::int64_t, bool confirmed) {
            if (confirmed) ++bound[prefix + std::string(key)];
          });
    });
    if (!e.empty()) return e;
  }
  if (sg_pools != nd.sglang_pools.load())
    return fmt::format("{} SGLang pools exist, {} are counted", sg_pools, nd.sglang_pools.load());
  std::string error;
  std::size_t counted = 0;
  for (const auto& core : nd.core) {
    core->for_each_space([&](const vllm_space& sp) {
      std::size_t incomplete = 0;
      std::uint64_t incomplete_pages = 0;
      const std::string prefix = std::to_string(sp.id) + "/";
      sp.directory.for_each_key([&](std::string_view key, std::int32_t tp, std::int32_t count) {
        ++counted;
        const auto it = bound.find(prefix + std::string(key));
        const std::int32_t ranks = it == bound.end() ? 0 : it->second;
        if (error.empty() && ranks != count)
          error = fmt::format("key {} of tenant '{}' counts {} confirmations, {} ranks hold it",
                              key, sp.tenant, count, ranks);
        if (count < tp) {
          ++incomplete;
          incomplete_pages += static_cast<std::uint64_t>(count);
        }
      });
      if (error.empty() && (incomplete != sp.directory.incomplete_count() ||
                            incomplete_pages != sp.directory.incomplete_bindings()))
        error = fmt::format("core {} tracks {} incomplete keys holding {} pages, it has {} ({})",
                            core->index, sp.directory.incomplete_count(),
                            sp.directory.incomplete_bindings(), incomplete, incomplete_pages);
    });
  }
  if (error.empty() && counted != bound.size())
    error = fmt::format("{} keys are bound on ranks, {} in the directory", bound.size(), counted);
  if (error.empty() && nd.tenants.enabled()) error = check_tenant_pages(nd);
  return error;
}

}  // namespace metad::pipeline
