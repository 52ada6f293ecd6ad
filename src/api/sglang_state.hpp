// The persistence file of SGLang's own metadata server (mini_3fs_metadata_server.py,
// save_to_disk: json.dump with indent=4), decoded and validated into plain pool
// descriptions for --import-sglang-state. Sans-IO: handed the file's bytes, touches no
// server state. Used once, at start-up, by the thread that recovers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace metad::api {

// The server's limits a pool must fit.
struct sg_state_limits {
  std::int64_t pages_max = 0;     // largest num_pages (--pages-per-rank-max)
  std::size_t key_bytes_max = 0;  // longest key (--key-bytes-max)
  std::size_t pools_max = 0;      // pools in the file (--ranks-max)
  // What the decoded pools may hold, at sg_state_bytes_per_page a declared page (the
  // pages' marks while a pool is read, then its free list), summed over the pools in
  // the file's order: a pool that takes the sum past it is refused before its tables
  // are made (--memory-max; a 10 KB file may declare 300 pools of 2^28 pages).
  std::uint64_t bytes_max = UINT64_MAX;
};
inline constexpr std::uint64_t sg_state_bytes_per_page = 5;

// One pool of the file: `"<rank>:<namespace>"` (or a bare `"<rank>"`, namespace "kv") →
// {"num_pages": N, "free_pages": [page, ...], "key_to_index": [[key, page], ...]}.
struct sg_state_pool {
  std::string name;  // the file's key, for messages
  std::int64_t rank = 0;
  std::string ns;
  std::uint32_t num_pages = 0;
  // Every page not bound, bottom → top (the last is handed out next): first the pages
  // the file lists nowhere (in flight when it was saved, leaked by the reference: B10),
  // ascending, so that they go out last; then the file's free_pages in the file's order,
  // so that the stack continues where the reference left it.
  std::vector<std::uint32_t> free;
  std::vector<std::pair<std::string, std::uint32_t>> bound;  // key_to_index: LRU first
  std::uint32_t reclaimed = 0;                               // pages listed nowhere, now free
  std::uint32_t free_and_bound = 0;  // pages listed free and bound both (B12): kept bound
};

// Decodes `bytes` (any buffer: it is copied for parsing) into `pools`, in the file's
// order. Returns "" or what is wrong and where (the pool's key and the list index);
// then `pools` is unspecified. Refused: invalid JSON, a top level or pool that is not
// an object, a rank that is not an int64, a namespace that the API would refuse (1 to
// 128 characters), a pool named twice (e.g. "0" and "0:kv"), more pools than
// pools_max, a missing or non-integer num_pages or one outside 0..pages_max, free_pages
// or key_to_index that are not lists of the right shape, a page outside
// 0..num_pages-1, a page listed free twice or bound to two keys, a key twice or longer
// than key_bytes_max, pools that declare more pages than bytes_max allows. Other fields are
// ignored, as the reference ignores them.
std::string decode_sglang_state(std::string_view bytes, const sg_state_limits& limits,
                                std::vector<sg_state_pool>& pools);

}  // namespace metad::api
