// One core's journal: the only way a mutating request logs its change. Three steps, in
// this order:
//   1. reserve(bytes) before anything changes: false means the disk cannot take the
//      records (full, failing), and the request is refused with nothing changed;
//   2. change the state, and append the change's records (the typed appenders);
//   3. co_await durable() before answering: false means the write or its fdatasync
//      failed (answer 503). The records stay queued at the same log offset and are
//      written once the disk recovers, so live state stays what the log will say.
// A change already made whose records must follow it (the directory's side of a
// confirmation whose rank side is queued) appends even when reserve() refused.
// Without a data directory every step succeeds at once and nothing is kept. Touched only
// by its core, like the log_writer it wraps (which the loop flushes; see log.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "store/log.hpp"
#include "store/record.hpp"

namespace metad::store {

class journal {
 public:
  // sync: durable() waits for the fdatasync of everything appended; otherwise it is
  // ready at once (--durability none: written, never waited for).
  journal(log_writer& log, bool sync) : log_(log), sync_(sync) {}

  bool enabled() const { return log_.enabled(); }
  bool reserve(std::uint64_t bytes) { return log_.make_room(bytes); }

  // vLLM's records, each of one tenant's vLLM state ("": the unnamed one; record.hpp,
  // in_tenant).
  void initialize(std::string_view tenant, std::int64_t rank, std::int64_t num_pages) {
    if (enabled())
      scoped(tenant, [&](std::string& out) { append_initialize(out, rank, num_pages); });
  }
  void allocate(std::string_view tenant, std::int64_t rank,
                std::span<const std::string_view> keys) {
    if (enabled()) scoped(tenant, [&](std::string& out) { append_allocate(out, rank, keys); });
  }
  void confirm(std::string_view tenant, std::int64_t rank, std::int32_t tp_world_size,
               std::span<const std::string_view> keys, std::span<const std::int64_t> pages,
               std::span<const std::int64_t> releases, bool quarantined) {
    if (enabled())
      scoped(tenant, [&](std::string& out) {
        append_confirm(out, rank, tp_world_size, keys, pages, releases, quarantined);
      });
  }
  // A bare clear voids everything the core logged before it (recovery starts after it);
  // a scoped one only the tenant's vLLM records before it (a core that holds other
  // tenants' states: "" scoped is the unnamed state's).
  void clear() {
    if (enabled()) append_clear(log_.pending());
  }
  void clear(std::string_view tenant) {
    if (!enabled()) return;
    const std::size_t frame = log_.pending().size();
    append_clear(log_.pending());
    scope_to_tenant(log_.pending(), frame, tenant, /*always=*/true);
  }
  void directory_key(std::string_view tenant, std::int32_t tp_world_size, std::string_view key) {
    if (enabled())
      scoped(tenant, [&](std::string& out) { append_directory_key(out, tp_world_size, key); });
  }
  void directory_remove(std::string_view tenant, std::string_view key) {
    if (enabled()) scoped(tenant, [&](std::string& out) { append_directory_remove(out, key); });
  }
  void remove(std::string_view tenant, std::int64_t rank, std::span<const std::string_view> keys) {
    if (enabled()) scoped(tenant, [&](std::string& out) { append_remove(out, rank, keys); });
  }
  void release(std::string_view tenant, std::int64_t rank, std::span<const std::int64_t> pages) {
    if (enabled()) scoped(tenant, [&](std::string& out) { append_release(out, rank, pages); });
  }
  void quarantine_end(std::string_view tenant, std::int64_t rank,
                      std::span<const std::int64_t> pages) {
    if (enabled())
      scoped(tenant, [&](std::string& out) { append_quarantine_end(out, rank, pages); });
  }

  void sg_initialize(const sg_pool_name& pool, std::int64_t num_pages) {
    if (enabled()) append_sg_initialize(log_.pending(), pool, num_pages);
  }
  // fresh_max: the keys that could take a free or quarantined page (sglang_pool::
  // reserve_capped): UINT64_MAX, all (sg_reserve); 0, none: the memory budget was spent or
  // a tenant's pages=N (sg_reserve_full, replayed as by a full pool); else sg_reserve_capped.
  void sg_reserve(const sg_pool_name& pool, std::uint64_t now,
                  std::span<const std::string_view> keys, std::uint64_t fresh_max = UINT64_MAX) {
    if (!enabled()) return;
    if (fresh_max == UINT64_MAX || fresh_max == 0) {
      append_sg_keys_at(log_.pending(),
                        fresh_max == 0 ? record_kind::sg_reserve_full : record_kind::sg_reserve,
                        pool, now, keys);
    } else {
      append_sg_reserve_capped(log_.pending(), pool, now, fresh_max, keys);
    }
  }
  // quarantined: its releases went to the pool's quarantine (sg_confirm_quarantined).
  void sg_confirm(const sg_pool_name& pool, std::uint64_t now,
                  std::span<const std::string_view> keys, std::span<const std::int64_t> pages,
                  std::span<const std::int64_t> releases, bool quarantined) {
    if (enabled()) append_sg_confirm(log_.pending(), pool, now, keys, pages, releases, quarantined);
  }
  void sg_quarantine_end(const sg_pool_name& pool, std::uint64_t now,
                         std::span<const std::int64_t> pages) {
    if (enabled()) append_sg_quarantine_end(log_.pending(), pool, now, pages);
  }
  void sg_delete(const sg_pool_name& pool, std::span<const std::string_view> keys) {
    if (enabled()) append_sg_delete(log_.pending(), pool, keys);
  }
  void sg_clear(const sg_pool_name& pool) {
    if (enabled()) append_sg_clear(log_.pending(), pool);
  }
  void sg_get(const sg_pool_name& pool, std::uint64_t now, std::span<const std::string_view> keys) {
    if (enabled()) append_sg_keys_at(log_.pending(), record_kind::sg_get, pool, now, keys);
  }
  void sg_expire(const sg_pool_name& pool, std::uint64_t now) {
    if (enabled()) append_sg_expire(log_.pending(), pool, now);
  }
  // The whole pool, as written by `write` (append_sg_snapshot_pool into the given string):
  // after a vLLM /clear, whose record voids everything before it in this core's log.
  template <class Write>
  void sg_snapshot(Write&& write) {
    if (enabled()) write(log_.pending());
  }

  // co_await: true once everything appended so far is durable (sync), false if a flush
  // failed first.
  log_writer::wait_awaiter durable() { return log_.durable_until(sync_ ? log_.end() : 0); }

 private:
  template <class Append>
  void scoped(std::string_view tenant, Append&& append) {
    std::string& out = log_.pending();
    const std::size_t frame = out.size();
    append(out);
    scope_to_tenant(out, frame, tenant);
  }

  log_writer& log_;
  bool sync_;
};

}  // namespace metad::store
