#include "store/recovery.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

#include "metad/log.hpp"
#include "store/record.hpp"

namespace metad::store {
namespace {

// A key of 32 lowercase hex characters: stored packed by the compact snapshot form.
constexpr std::uint32_t kHexKeyChars = 32;

[[noreturn]] void corrupt(const std::string& path, std::size_t offset) {
  throw std::runtime_error("corrupt record in " + path + " at offset " + std::to_string(offset) +
                           ": refusing to start (move the file away to start without it)");
}

// What a file is: only the last log segment of a core may end in a torn write.
enum class file_kind { last_log, earlier_log, snapshot };

// Scans one file; returns the length of its whole, valid records. The last log
// segment's torn tail (a crash mid-write) is dropped with a warning. Anything else is
// damage, which stops start-up: a log segment is complete before the next one is
// created, and a snapshot is renamed into place only once whole.
template <typename Visit>
std::size_t scan_file(std::string_view bytes, const std::string& path, Visit&& visit,
                      file_kind kind) {
  const scan_result result = scan(bytes, visit);
  if (result.status == scan_status::corrupt ||
      (result.status == scan_status::torn_tail && kind != file_kind::last_log))
    corrupt(path, result.bad_offset);
  if (result.status == scan_status::torn_tail)
    metad::log::warn("{}: dropping a torn record at offset {} ({} bytes)", path, result.bad_offset,
                     bytes.size() - result.bad_offset);
  return result.valid_bytes;
}

file_kind log_kind(const core_files& files, std::size_t segment) {
  return segment + 1 == files.logs.size() ? file_kind::last_log : file_kind::earlier_log;
}

}  // namespace

bool checked_group::voided(const record& r, const log_position* at) const {
  if (tenant_cleared.empty() || !is_vllm_kind(r.kind)) return false;
  const auto it = tenant_cleared.find(std::string(r.tenant));
  return it != tenant_cleared.end() && (at == nullptr || !(it->second < *at));
}

checked_group check_group(const core_files& f) {
  checked_group g;
  g.files = &f;
  for (std::size_t s = 0; s < f.logs.size(); ++s) {
    const std::size_t valid = scan_file(
        f.logs[s], f.log_paths[s],
        [&](const record& r, std::size_t offset) {
          if (r.kind != record_kind::clear) return;
          if (r.scoped) {
            g.tenant_cleared[std::string(r.tenant)] = {s, offset};
            return;
          }
          g.cleared = true;
          g.clear_at = {s, offset};
          g.tenant_cleared.clear();  // everything before a bare clear is void anyway
        },
        log_kind(f, s));
    g.logs.push_back(f.logs[s].substr(0, valid));
  }
  if (!g.cleared && !f.snapshot.empty()) {
    scan_file(
        f.snapshot, f.snapshot_path, [](const record&, std::size_t) {}, file_kind::snapshot);
    g.snapshot = f.snapshot;
  }
  return g;
}

file_sizes estimate_sizes(const std::vector<core_files>& files) {
  file_sizes sizes;
  auto visit = [&](std::string_view payload) {
    // A tenant's own record: its name, then the record (recovery checks both later).
    std::string_view tenant;
    if (static_cast<record_kind>(payload[0]) == record_kind::in_tenant) {
      std::uint32_t length = 0;
      if (payload.size() < 5) return;
      std::memcpy(&length, payload.data() + 1, 4);
      if (length > kTenantNameMax || payload.size() < 6 + std::size_t{length}) return;
      tenant = payload.substr(5, length);
      payload.remove_prefix(5 + std::size_t{length});
    }
    const auto kind = static_cast<record_kind>(payload[0]);
    auto field = [&](std::size_t at, auto& value) {
      if (payload.size() < at + sizeof value) return false;
      std::memcpy(&value, payload.data() + at, sizeof value);
      return true;
    };
    std::int64_t rank = 0;
    std::uint64_t total = 0;
    std::uint32_t count = 0;
    switch (kind) {
      case record_kind::allocate:
        if (field(1, rank) && field(9, count))
          sizes.rank_keys[{std::string(tenant), rank}] += count;
        break;
      case record_kind::snapshot_entry:
        if (field(1, rank)) ++sizes.rank_keys[{std::string(tenant), rank}];
        break;
      case record_kind::snapshot_rank_keys:
        if (field(1, rank) && field(9, total) && field(17, count))
          sizes.rank_keys[{std::string(tenant), rank}] += count;
        break;
      case record_kind::directory_key:
        if (tenant.empty()) ++sizes.directory_keys;
        break;
      case record_kind::snapshot_directory_keys:
        if (tenant.empty() && field(1, total) && field(9, count)) sizes.directory_keys += count;
        break;
      case record_kind::snapshot_rank_slots: {
        // rank, layout, buckets, first bucket, count; then the items and count masks.
        constexpr std::size_t items_at = 1 + 8 + 4 + 8 + 8 + 4;
        if (field(1, rank) && field(13, total) && field(29, count) &&
            payload.size() >= items_at + count) {
          const file_sizes::rank_of of{std::string(tenant), rank};
          sizes.rank_keys[of] += (payload.size() - items_at - count) / kPackedItemBytes;
          sizes.image_buckets[of] = static_cast<std::size_t>(total);
        }
        break;
      }
      default:
        break;
    }
  };
  for (const core_files& f : files) {
    bool compact = !f.snapshot.empty();
    walk_frames(f.snapshot, [&](std::string_view payload) {
      visit(payload);
      // A 32-byte key as snapshot_entry / directory_key: the form before the compact one.
      const auto kind = static_cast<record_kind>(payload[0]);
      std::uint32_t length = 0;
      const std::size_t at = kind == record_kind::snapshot_entry ? 18 : 5;
      if ((kind == record_kind::snapshot_entry || kind == record_kind::directory_key) &&
          payload.size() >= at + 4) {
        std::memcpy(&length, payload.data() + at, 4);
        if (length == kHexKeyChars) compact = false;
      }
    });
    for (std::string_view log : f.logs) {
      walk_frames(log, visit);
      if (!log.empty()) compact = false;
    }
    sizes.reusable.push_back(compact);
  }
  return sizes;
}

}  // namespace metad::store
