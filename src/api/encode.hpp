// Response encoding: compact JSON like the reference server's, appended to a string.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace metad::api {

// Encoders append a compact JSON body to `out`.
void encode_initialized(std::string& out, std::int64_t rank, std::int64_t num_pages);
// results: keys[i] → pages[i] (-1 = no page), in order.
void encode_allocation(std::string& out, std::int64_t rank, std::span<const std::string_view> keys,
                       std::span<const std::int64_t> pages);
void encode_exists(std::string& out, std::span<const std::uint8_t> exists);
// -1 → null
void encode_locations(std::string& out, std::span<const std::int64_t> pages);
// GET /rank/{rank}: the counters of a /stats row, then how many of the bound pages hold
// incomplete keys.
void encode_rank_info(std::string& out, std::int64_t num_pages, std::int64_t free,
                      std::int64_t reserved, std::int64_t bound, std::uint64_t incomplete);
void encode_deleted(std::string& out, std::uint64_t deleted);

// One rank's counters in a /stats answer.
struct rank_info_row {
  std::int64_t rank = 0, num_pages = 0, free = 0, reserved = 0, bound = 0;
};
// Server-wide counters in a /stats answer.
struct stats_totals {
  std::uint64_t keys = 0, leased_keys = 0, evicted_keys = 0, expired_reservations = 0,
                deleted_keys = 0, refused_releases = 0, incomplete_keys = 0, incomplete_pages = 0,
                stale_keys = 0;
};
// Sums over every rank of a /stats answer, the ranks its list leaves out included.
struct rank_pool {
  std::uint64_t ranks = 0, pages = 0, free = 0, reserved = 0, bound = 0;
  void add(const rank_info_row& r) {
    ++ranks;
    pages += static_cast<std::uint64_t>(r.num_pages);
    free += static_cast<std::uint64_t>(r.free);
    reserved += static_cast<std::uint64_t>(r.reserved);
    bound += static_cast<std::uint64_t>(r.bound);
  }
};
// Ranks in the order given: the caller sorts them and may list fewer than pool.ranks
// (then "ranks_truncated" is true).
void encode_stats(std::string& out, std::span<const rank_info_row> ranks, const rank_pool& pool,
                  const stats_totals& t);

// {"detail":"..."} with the detail escaped.
void encode_error(std::string& out, std::string_view detail);
// Escapes like Python's json.dumps(ensure_ascii=False): '"', '\\', control characters.
void append_escaped(std::string& out, std::string_view text);

}  // namespace metad::api
