// Request decoding (simdjson DOM: the whole body is validated before anything is read)
// and response encoding (compact JSON like the reference's). No server state is touched
// here. One decoder per core; its parser is reused across requests.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <simdjson.h>

namespace metad::api {

// A decoding failure: always a 4xx with a JSON detail.
struct error {
  int status = 0;  // 0: no error
  std::string detail;
  explicit operator bool() const { return status != 0; }
};

// Keys copied out of the request (the parser's buffer is reused by the next request,
// while this one may still be travelling between cores).
class key_list {
 public:
  key_list() = default;
  // Copies and moves re-point the views at the new owner's bytes (a moved std::string
  // may keep short keys inline, so its data pointer can change).
  key_list(const key_list& other);
  key_list(key_list&& other) noexcept;
  key_list& operator=(const key_list& other);
  key_list& operator=(key_list&& other) noexcept;
  ~key_list() = default;

  void clear();
  // Replaces the contents with copies of `keys` (which may alias this list): the
  // storage is sized once, so the views never move.
  void assign(std::span<const std::string_view> keys);
  // The same, for keys that all point into one buffer (a parsed body's strings, as the
  // decoder's are): the range they span is copied at once when they are in order and
  // close together, else key by key.
  void assign_within_one_buffer(std::span<const std::string_view> keys);
  std::span<const std::string_view> views() const { return views_; }
  std::size_t size() const { return views_.size(); }
  // Heap bytes it holds.
  std::size_t capacity_bytes() const {
    return bytes_.capacity() + views_.capacity() * sizeof(std::string_view);
  }
  std::string_view operator[](std::size_t i) const { return views_[i]; }

 private:
  void take(key_list& other) noexcept;
  void rebase(const char* old_base) noexcept;

  std::string bytes_;
  std::vector<std::string_view> views_;
};

enum class init_kind : std::uint8_t { scheduler, worker, invalid_parameters };

struct initialize_cmd {
  std::int64_t rank = 0;
  init_kind kind = init_kind::invalid_parameters;
  std::int64_t num_pages = 0;
};
struct allocate_cmd {
  std::int64_t rank = 0;
  key_list keys;  // bare keys; prefix keys are accepted and dropped
};
struct confirm_cmd {
  std::int64_t rank = 0;
  key_list keys;                       // confirmation i binds keys[i] ...
  std::vector<std::int64_t> pages;     // ... to pages[i] (>= 0)
  std::vector<std::int64_t> releases;  // pages_to_release (>= 0)
};
struct exists_cmd {
  key_list keys;
};
struct delete_cmd {
  key_list keys;
};
struct locations_cmd {
  std::int64_t rank = 0;
  key_list keys;
};

// The {rank} path segment: an optional '-' or '+' then decimal digits, within int64.
bool parse_rank(std::string_view text, std::int64_t& rank);

class decoder {
 public:
  // Keys longer than this (bytes, decoded) are refused with a 400.
  void set_key_bytes_max(std::size_t bytes) { key_bytes_max_ = bytes; }

  // `body` must have SIMDJSON_PADDING readable bytes after its end.
  // initialize: a rank that does not parse → 400 "Invalid rank in path"; invalid
  // role/num_pages → kind == invalid_parameters (no error: the caller serves the
  // precomputed 400); num_pages over pages_max → 400 with the limit in the detail.
  error decode_initialize(std::string_view rank_text, std::string_view body, std::int64_t pages_max,
                          initialize_cmd& out);
  error decode_allocate(std::string_view body, allocate_cmd& out);
  error decode_confirm(std::string_view body, confirm_cmd& out);
  error decode_exists(std::string_view body, exists_cmd& out);
  // Same body and the same errors as batch_exists: {"keys": [string, ...]}.
  error decode_delete(std::string_view body, delete_cmd& out);
  error decode_locations(std::string_view body, locations_cmd& out);

 private:
  // An object whose optional `keys` is a list of strings (batch_exists, keys/delete).
  error decode_key_strings(std::string_view body, key_list& out);
  // Every element of `list` a string; collected into scratch_.
  error collect_string_keys(simdjson::dom::array list);

  // Appends a key to scratch_, or the 400 for one over key_bytes_max_.
  error add_key(std::string_view key, std::size_t index);

  simdjson::dom::parser parser_;
  std::vector<std::string_view> scratch_;
  std::size_t key_bytes_max_ = SIZE_MAX;
};

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
