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
  std::unordered_map<std::string, std::int64_t> sg_ranks;
  for (const auto& core : nd.core) {
    for (const auto& [name, pools] : core->sg_tenants) {
      std::set<std::int64_t> ranks;
      pools.for_each([&](std::int64_t rank, std::string_view, const shard::sglang_pool&) {
        ranks.insert(rank);
      });
      if (!ranks.empty()) sg_ranks[name] += static_cast<std::int64_t>(ranks.size());
    }
  }
  nd.tenants.recount(sg_ranks);
}

}  // namespace metad::pipeline
