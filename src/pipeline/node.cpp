#include "pipeline/node.hpp"

#include <algorithm>
#include <set>

namespace metad::pipeline {

node::node(const metad::config& config, int core_count)
    : cfg(config),
      cores(core_count),
      directory_cores(std::clamp(config.directory_cores, 1, core_count)),
      mailbox(core_count, 4096),
      memory(config.memory_max != 0 ? config.memory_max : memory_budget::default_max()),
      draining_cores(core_count) {
  for (int i = 0; i < core_count; ++i) {
    core.push_back(std::make_unique<core_state>(config.durable == metad::durability::sync));
    core.back()->index = i;
    core.back()->decoder.set_key_bytes_max(config.key_bytes_max);
    core.back()->ranks.set_reservation_ttl(config.reservation_ttl_ms * smp::kNsPerMs);
    core.back()->directory.set_lru(config.evict == metad::eviction::lru);
    core.back()->sg_decoder.set_key_bytes_max(config.key_bytes_max);
    core.back()->sg_config = {config.reservation_ttl_ms * smp::kNsPerMs,
                              std::uint64_t{config.sglang_read_lease_ms} * smp::kNsPerMs};
    core.back()->sg_strict_reinit = config.strict_reinit;
  }
}

void count_tenant_usage(node& nd) {
  // All pools of one (tenant, rank) live on the rank's owner core, so the cores' counts add
  // up.
  std::unordered_map<std::string, std::int64_t> sg_ranks, pages;
  for (const auto& core : nd.core) {
    for (auto& [name, pools] : core->sg_tenants) {
      std::set<std::int64_t> ranks;
      std::int64_t held = 0;
      pools.for_each([&](std::int64_t rank, std::string_view, const shard::sglang_pool& pool) {
        ranks.insert(rank);
        held += static_cast<std::int64_t>(pool.held());
      });
      if (!ranks.empty()) sg_ranks[name] += static_cast<std::int64_t>(ranks.size());
      if (name.empty()) continue;  // the default tenant: no usage, no quota
      pages[name] += held;
      pools.pages_counter = &nd.tenants.usage(name).pages;
    }
  }
  // vLLM's ranks are the pages of the tenant that holds vLLM's API.
  const std::shared_ptr<const tenant_table> table = nd.tenants.current();
  const tenant* vllm = table ? table->vllm_tenant() : nullptr;
  for (const auto& core : nd.core) {
    core->vllm_pages_usage = vllm ? &nd.tenants.usage(vllm->name) : nullptr;
    core->vllm_pages_added = vllm ? core->ranks.held_pages() : 0;
    if (vllm) pages[vllm->name] += core->vllm_pages_added;
  }
  nd.tenants.recount(sg_ranks, pages);
}

const tenant* settle_vllm_pages(node& nd, core_state& core) {
  if (!nd.tenants.enabled()) return nullptr;
  const tenant* vllm = nd.tenants.take(core.tenants).vllm_tenant();
  tenant_usage* to = vllm ? vllm->usage : nullptr;
  if (to != core.vllm_pages_usage) {  // a reload moved vLLM's API (or took it away)
    if (core.vllm_pages_usage != nullptr)
      core.vllm_pages_usage->pages.fetch_sub(core.vllm_pages_added, std::memory_order_relaxed);
    core.vllm_pages_usage = to;
    core.vllm_pages_added = 0;
  }
  if (to == nullptr) return nullptr;
  const std::int64_t held = core.ranks.held_pages();
  if (held != core.vllm_pages_added) {
    to->pages.fetch_add(held - core.vllm_pages_added, std::memory_order_relaxed);
    core.vllm_pages_added = held;
  }
  return vllm;
}

}  // namespace metad::pipeline
