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
    core.push_back(
        std::make_unique<core_state>(config.durable == metad::durability::sync, tenants));
    core.back()->index = i;
    core.back()->decoder.set_key_bytes_max(config.key_bytes_max);
    core.back()->reservation_ttl = config.reservation_ttl_ms * smp::kNsPerMs;
    core.back()->lru = config.evict == metad::eviction::lru;
    core.back()->unnamed().ranks.set_reservation_ttl(core.back()->reservation_ttl);
    core.back()->unnamed().directory.set_lru(core.back()->lru);
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
  // vLLM's spaces: each tenant's own, and the unnamed one the `vllm` tenant's.
  const std::shared_ptr<const tenant_table> table = nd.tenants.current();
  const tenant* vllm = table ? table->vllm_tenant() : nullptr;
  for (const auto& core : nd.core) {
    core->for_each_space([&](vllm_space& sp) {
      const std::string_view owner =
          sp.id == 0 ? (vllm ? std::string_view(vllm->name) : "") : sp.tenant;
      sp.pages_usage = owner.empty() ? nullptr : &nd.tenants.usage(owner);
      sp.pages_added = owner.empty() ? 0 : sp.ranks.held_pages();
      if (!owner.empty()) pages[std::string(owner)] += sp.pages_added;
    });
  }
  nd.tenants.recount(sg_ranks, pages);
}

void settle_vllm_pages(node& nd, core_state& core, vllm_space& sp) {
  if (!nd.tenants.enabled()) return;
  tenant_usage* to = nullptr;
  if (sp.id != 0) {
    to = sp.pages_usage;  // the space's own tenant's (core_state::space)
  } else if (const tenant* vllm = nd.tenants.take(core.tenants).vllm_tenant(); vllm != nullptr) {
    to = vllm->usage;
  }
  if (to != sp.pages_usage) {  // a reload moved the unnamed state (or took it away)
    if (sp.pages_usage != nullptr)
      sp.pages_usage->pages.fetch_sub(sp.pages_added, std::memory_order_relaxed);
    sp.pages_usage = to;
    sp.pages_added = 0;
  }
  if (to == nullptr) return;
  const std::int64_t held = sp.ranks.held_pages();
  if (held != sp.pages_added) {
    to->pages.fetch_add(held - sp.pages_added, std::memory_order_relaxed);
    sp.pages_added = held;
  }
}

}  // namespace metad::pipeline
