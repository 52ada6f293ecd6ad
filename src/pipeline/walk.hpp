// The steps the endpoint coroutines share: which cores a key list needs, waiting for a
// core's log, sizing its records. Called on the core whose state they name.
#pragma once

#include <span>
#include <string_view>

#include "pipeline/connection.hpp"
#include "smp/for_each_core.hpp"
#include "store/record.hpp"

namespace metad::pipeline {

// Groups the keys (all of them, or those at only[0..only_count)) by the core that holds
// their directory slice: walk_of(s, c) lists the indices of core c's keys, in order.
inline void plan_directory_walk(const node& nd, std::span<const std::string_view> keys,
                                const std::uint32_t* only, std::size_t only_count, scratch& s) {
  const auto cores = static_cast<std::size_t>(nd.cores);
  const std::size_t n = only == nullptr ? keys.size() : only_count;
  auto index = [&](std::size_t j) {
    return only == nullptr ? static_cast<std::uint32_t>(j) : only[j];
  };
  s.walk.resize(n);
  s.walk_begin.assign(cores + 1, 0);
  s.walk_begin[cores] = static_cast<std::uint32_t>(n);
  if (nd.directory_cores == 1) {  // one slice: no hashing
    std::fill(s.walk_begin.begin() + 1, s.walk_begin.end(), static_cast<std::uint32_t>(n));
    for (std::size_t j = 0; j < n; ++j) s.walk[j] = index(j);
    return;
  }
  // A counting sort by owner: count, sum up to each core's end, fill backwards.
  s.key_owner.resize(n);
  for (std::size_t j = 0; j < n; ++j) {
    const auto owner = static_cast<std::uint16_t>(nd.key_owner(keys[index(j)]));
    s.key_owner[j] = owner;
    ++s.walk_begin[owner];
  }
  for (std::size_t c = 1; c < cores; ++c) s.walk_begin[c] += s.walk_begin[c - 1];
  for (std::size_t j = n; j-- > 0;) s.walk[--s.walk_begin[s.key_owner[j]]] = index(j);
}

// The indices plan_directory_walk gave core c.
inline std::span<const std::uint32_t> walk_of(const scratch& s, int c) {
  const auto at = static_cast<std::size_t>(c);
  return {s.walk.data() + s.walk_begin[at], s.walk_begin[at + 1] - s.walk_begin[at]};
}

// Sizes the walk for up to n keys (on the core that owns the scratch, before hopping).
inline void reserve_walk(const node& nd, std::size_t n, scratch& s) {
  s.walk.reserve(n);
  s.key_owner.reserve(n);
  s.walk_begin.reserve(static_cast<std::size_t>(nd.cores) + 1);
}

constexpr std::string_view kStorageFailed =
    "Storage unavailable: the data directory cannot be written (disk full or I/O error); "
    "nothing was changed or acknowledged, reads still work";

// What scoping a record to its tenant adds, at most (store::record_kind::in_tenant: kind,
// the name's length and the name).
constexpr std::size_t kScopeBytes = 1 + 4 + store::kTenantNameMax;
// What a record of one key costs beside the key's length-prefixed bytes, at most: frame
// header, kind, tp_world_size (directory_key; directory_remove has less), its tenant.
constexpr std::size_t kKeyRecordBytes = 8 + 1 + 4 + kScopeBytes;

// An upper bound of the log bytes a request over `keys` appends (make_room).
inline std::uint64_t record_bytes(std::span<const std::string_view> keys, std::size_t extra_per_key,
                                  std::size_t extra = 0) {
  std::uint64_t bytes = 64 + kScopeBytes + extra;
  for (std::string_view key : keys) bytes += key.size() + 4 + extra_per_key;
  return bytes;
}

// for_each_core's `wanted`: the cores plan_directory_walk gave keys.
inline auto needed_by(const scratch& s) {
  return [&s](int c) { return !walk_of(s, c).empty(); };
}

}  // namespace metad::pipeline
