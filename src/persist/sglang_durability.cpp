#include "persist/sglang_durability.hpp"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "persist/replayer.hpp"
#include "pipeline/sglang_journal.hpp"

namespace metad::persist {

using pipeline::core_state;
using pipeline::node;

std::string apply_sg_record(node& nd, core_state& core, const store::record& r) {
  // The SGLang clock goes on from the latest time logged.
  const std::uint64_t clock = nd.clock();
  if (r.now >= clock) {
    const std::uint64_t want = r.now - clock + 1;
    std::uint64_t have = nd.sglang_clock_offset.load();
    while (have < want && !nd.sglang_clock_offset.compare_exchange_weak(have, want)) {
    }
  }
  core.sg_last_now = std::max(core.sg_last_now, r.now);
  auto where = [&r] { return fmt::format("SGLang pool '{}' {} '{}'", r.tenant, r.rank, r.ns); };
  if (r.kind == store::record_kind::sg_initialize) {
    if (r.num_pages < 0 || static_cast<std::uint64_t>(r.num_pages) > shard::sglang_pool::pages_max)
      return where() + ": bad page count";
    shard::sglang_pools& pools = *core.sg_pools(r.tenant, true);
    const bool created = pools.find(r.rank, r.ns) == nullptr;
    pools.initialize(r.rank, r.ns, static_cast<std::uint64_t>(r.num_pages));
    if (created) nd.sglang_pools.fetch_add(1);
    return {};
  }
  if (r.kind == store::record_kind::sg_snapshot_pool ||
      r.kind == store::record_kind::sg_snapshot_pool_runs) {
    if (r.num_pages < 0 || static_cast<std::uint64_t>(r.num_pages) > shard::sglang_pool::pages_max)
      return where() + ": bad page count";
    // Negative pages wrap past num_pages: restore() refuses them as out of range.
    auto page = [](std::int64_t p) { return static_cast<std::uint64_t>(p); };
    shard::sglang_image image;
    image.num_pages = static_cast<std::uint64_t>(r.num_pages);
    image.epoch = r.sg_epoch;
    if (r.kind == store::record_kind::sg_snapshot_pool) {  // page by page (older directories)
      for (const std::int64_t p : r.releases) image.push_free(page(p));
    } else {
      if (r.releases.size() % 2 != 0) return where() + ": its snapshot's free runs are cut";
      for (std::size_t i = 0; i < r.releases.size(); i += 2)
        image.free.emplace_back(page(r.releases[i]), page(r.releases[i + 1]));
    }
    for (std::size_t i = 0; i < r.keys.size(); ++i)
      image.bound.emplace_back(std::string(r.keys[i]), page(r.pages[i]));
    for (std::size_t i = 0; i < r.sg_flight_keys.size(); ++i)
      image.reserved.push_back({page(r.sg_flight_pages[i]), std::string(r.sg_flight_keys[i]),
                                r.sg_flight_epochs[i], r.sg_flight_deadlines[i]});
    std::string error;
    shard::sglang_pool pool(0, core.sg_config);
    if (!shard::sglang_pool::restore(image, core.sg_config, pool, error))
      return where() + ": its snapshot cannot be restored: " + error;
    shard::sglang_pools& pools = *core.sg_pools(r.tenant, true);
    if (shard::sglang_pool* existing = pools.find(r.rank, r.ns)) {
      *existing = std::move(pool);
    } else {
      pools.adopt(r.rank, r.ns, std::move(pool));
      nd.sglang_pools.fetch_add(1);
    }
    return {};
  }
  shard::sglang_pools* pools = core.sg_pools(r.tenant, false);
  shard::sglang_pool* pool = pools ? pools->find(r.rank, r.ns) : nullptr;
  if (!pool) return where() + ": a record for a pool that does not exist";
  switch (r.kind) {
    case store::record_kind::sg_reserve:
    case store::record_kind::sg_reserve_full:
    case store::record_kind::sg_reserve_capped: {
      std::vector<shard::sglang_slot> slots;
      pool->reserve_capped(r.keys, r.now, slots,
                           r.kind == store::record_kind::sg_reserve        ? UINT64_MAX
                           : r.kind == store::record_kind::sg_reserve_full ? 0
                                                                           : r.total);
      return {};
    }
    case store::record_kind::sg_confirm:
    case store::record_kind::sg_confirm_quarantined: {
      std::string detail;
      shard::sglang_confirm_stats st;
      // A quarantine's end is a record of its own: until then its time does not matter.
      const std::uint64_t until =
          r.kind == store::record_kind::sg_confirm ? 0 : kQuarantinedUntilLogged;
      if (pool->confirm(r.keys, r.pages, r.releases, r.now, detail, st, until) !=
          shard::sglang_confirm_outcome::ok)
        return where() + ": a logged confirm_write no longer applies: " + detail;
      return {};
    }
    case store::record_kind::sg_quarantine_end:
      if (!pool->end_quarantine(r.releases))
        return where() + ": the end of a quarantine no longer applies";
      return {};
    case store::record_kind::sg_snapshot_quarantine:
      if (!pool->restore_quarantine(r.releases, kQuarantinedUntilLogged))
        return where() + ": its snapshot's quarantined pages cannot be restored";
      return {};
    case store::record_kind::sg_delete:
      pool->delete_keys(r.keys);
      return {};
    case store::record_kind::sg_clear:
      pool->clear();
      return {};
    case store::record_kind::sg_get: {
      std::vector<std::int64_t> pages(r.keys.size(), -1);
      pool->get_page_indices(r.keys, r.now, pages);
      return {};
    }
    case store::record_kind::sg_expire:
      pool->expire(r.now);
      return {};
    default:
      return where() + ": not an SGLang record";
  }
}

}  // namespace metad::persist
