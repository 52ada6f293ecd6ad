// The on-disk framing of log and snapshot records, and the records themselves. A frame
// is [u32 payload length][u32 crc32c of the payload][payload]; a payload starts with a
// record kind. Pure functions over bytes: no files here.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace metad::store {

std::uint32_t crc32c(std::string_view bytes, std::uint32_t seed = 0);

enum class record_kind : std::uint8_t {
  initialize = 1,      // rank, num_pages
  allocate = 2,        // rank, keys: a batch_allocate that changed the rank (replayed as is)
  confirm = 3,         // rank, tp_world_size, keys + pages, releases: a confirm_write that did
  clear = 4,           // this core's state was dropped (/clear)
  snapshot_rank = 5,   // rank, num_pages (a snapshot's rank header)
  snapshot_entry = 6,  // rank, page, confirmed, key: a reserved or bound page of a rank
  directory_key = 7,   // tp_world_size, key: a key entered the directory (its count is derived)
  remove = 8,   // rank, keys: bound keys removed from the rank (/keys/delete, eviction); replay
                // unbinds each key on that rank
  release = 9,  // rank, releases: expired reservations of the rank went back to its pool
  directory_remove = 10,  // key: a key left the directory (replay forgets its tp_world_size)
  // A confirm whose releases go to the rank's quarantine (see rank_table) instead of the
  // free pool; kind 3's releases are free at once (quarantine off, and older logs).
  confirm_quarantined = 11,
  quarantine_end = 12,       // rank, releases: the oldest quarantined pages became free
  snapshot_quarantine = 13,  // rank, releases: a snapshot's quarantined pages, oldest first
  // Compact snapshots (additive: snapshot_entry and directory_key still load). Keys of 32
  // lowercase hex characters as their 16 decoded bytes, in chunks of at most
  // kPackedItemsMax items of kPackedItemBytes: [16 key bytes][u32 value]. (11-19 are
  // log records.)
  snapshot_rank_keys = 20,       // rank, total, items: value = page | confirmed << 31
  snapshot_directory_keys = 21,  // total, items: value = tp_world_size (as u32)
  // A rank's key table as it was laid out (issue 35: a restart loads it at memory speed,
  // with no lookup a key): rank, layout (packed_map::image_layout: the hash and bucket
  // mapping it was laid out with), total (the table's buckets), first_bucket, count (at
  // most kSlotBucketsMax buckets), items (the bound keys of buckets [first_bucket,
  // first_bucket + count) in slot order, value = page | 1 << 31), then one mask a bucket
  // (bit j: slot j holds the next item). A rank's records come in bucket order after its
  // snapshot_rank; buckets with no bound key may have none. Its reserved keys follow as
  // snapshot_rank_keys. Additive: older snapshots hold none (and older servers cannot
  // read a directory that holds one).
  snapshot_rank_slots = 22,

  // SGLang pools (docs/sglang-api.md), each naming its pool by tenant, rank and namespace.
  // A pool's calls are deterministic given their `now` (the SGLang clock), so the calls
  // that changed it are the records, replayed with the same `now`.
  sg_initialize = 32,     // num_pages: a pool created or grown
  sg_reserve = 33,        // now, keys: reserve_and_allocate_page_indices
  sg_confirm = 34,        // now, keys + pages, releases: a confirm_write that applied
  sg_delete = 35,         // keys: delete_keys that dropped some
  sg_clear = 36,          // clear of one pool
  sg_get = 37,            // now, keys: get_page_indices that found some (recency, leases)
  sg_expire = 38,         // now: the pool's reservations due at now expired
  sg_snapshot_pool = 39,  // now, the pool's image (num_pages, epoch, free, bound, in flight)
  // The SGLang release quarantine (as kinds 11-13 for vLLM's ranks; additive: older
  // directories hold none of them, and their sg_confirm's releases are free at once).
  sg_confirm_quarantined = 40,  // as sg_confirm; its releases go to the pool's quarantine
  sg_quarantine_end = 41,       // now, releases: the pool's oldest quarantined pages, now free
  // releases: the quarantined pages of the pool whose sg_snapshot_pool precedes it, oldest
  // first (pages that image lists nowhere)
  sg_snapshot_quarantine = 42,
  // Pools of any size (additive: older directories hold none of them). As
  // sg_snapshot_pool, but `releases` holds the free stack as runs [lo, hi), two numbers
  // each, bottom first: a pool of 2^40 free pages is one run, not 2^40 numbers.
  sg_snapshot_pool_runs = 43,
  // As sg_reserve, made while the memory budget was spent: replayed as by a full pool
  // (sglang_pool::reserve with fresh = false: evictions only).
  sg_reserve_full = 44,
  // As sg_reserve, made with at most `total` keys allowed a free or quarantined page (a
  // tenant's pages=N nearly spent; --tenants-file): replayed with the same cap
  // (sglang_pool::reserve_capped). Additive: only a quota that cut a reserve writes one.
  sg_reserve_capped = 45,

  // A vLLM record (kinds 1-22) of one tenant's own vLLM state (--tenants-file: each tenant
  // has its own ranks and keys; docs/operations.md, "Tenants"): [in_tenant][u32 length]
  // [the tenant's name][the record's kind][its fields]. Decoded as that record, with
  // `scoped` set and `tenant` the name ("" names the unnamed state, that of the server
  // without --tenants-file and of the `vllm` tenant). A scoped clear drops that tenant's
  // vLLM state on the core where it is replayed and nothing else; a bare clear (before
  // tenants had state of their own) voids everything the core logged before it.
  // Additive: a vLLM record without a tenant is the unnamed state's, as ever.
  in_tenant = 63,
};
// vLLM's kinds (1-22): those a record may scope to a tenant.
inline constexpr bool is_vllm_kind(record_kind k) {
  return static_cast<std::uint8_t>(k) >= 1 &&
         static_cast<std::uint8_t>(k) <=
             static_cast<std::uint8_t>(record_kind::snapshot_rank_slots);
}
// The longest tenant name a scoped record holds (--tenants-file's bound).
inline constexpr std::size_t kTenantNameMax = 64;

// An item of snapshot_rank_keys / snapshot_directory_keys.
inline constexpr std::size_t kPackedItemBytes = 20;
inline constexpr std::uint32_t kPackedItemsMax = 65536;
// Buckets of one snapshot_rank_slots record (of 4 slots: at most kPackedItemsMax items).
inline constexpr std::uint32_t kSlotBucketsMax = 16384;
struct packed_item {
  std::uint64_t lo = 0, hi = 0;  // the key's bytes 0..7 and 8..15, little-endian
  std::uint32_t value = 0;
};
// Item i of a decoded record's `items`.
packed_item packed_item_at(std::string_view items, std::size_t i);

// A decoded record; views point into the buffer it was decoded from.
struct record {
  record_kind kind{};
  // Fields a kind does not use keep whatever an earlier decode left in them.
  std::int64_t rank = 0;           // every kind but clear, directory_key, directory_remove
  std::int64_t num_pages = 0;      // initialize, snapshot_rank
  std::int32_t tp_world_size = 0;  // confirm, directory_key
  std::int64_t page = -1;          // snapshot_entry
  bool confirmed = false;          // snapshot_entry
  // allocate, confirm, remove; snapshot_entry, directory_key, directory_remove: exactly one
  std::vector<std::string_view> keys;
  std::vector<std::int64_t> pages;  // confirm: pages[i] for keys[i]
  // confirm, release, quarantine_end, snapshot_quarantine: pages returned to the pool
  std::vector<std::int64_t> releases;
  // snapshot_rank_keys: the rank's entries in the whole snapshot; snapshot_directory_keys:
  // the core's directory keys in the whole snapshot (to size tables before filling them);
  // sg_reserve_capped: the keys that may take a free or quarantined page.
  std::uint64_t total = 0;
  std::string_view items;  // snapshot_rank_keys, snapshot_directory_keys: count x 20 bytes
  // snapshot_rank_slots (with rank, total: the table's buckets, and items): the image's
  // layout, the chunk's first bucket, and its masks (one byte a bucket, bits 0-3).
  std::uint32_t layout = 0;
  std::uint64_t first_bucket = 0;
  std::string_view masks;
  std::size_t item_count() const { return items.size() / kPackedItemBytes; }
  // sg_*: the pool (with `rank`) and the SGLang clock's time of the call. sg_initialize
  // uses num_pages; sg_confirm(_quarantined) keys, pages and releases; sg_quarantine_end
  // and sg_snapshot_quarantine releases (the latter has no time); sg_snapshot_pool num_pages,
  // sg_epoch, releases (the free stack, bottom first; sg_snapshot_pool_runs: as runs lo,
  // hi, lo, hi, ...), keys + pages (bound, LRU first)
  // and the sg_flight_* lists (in-flight pages, in reservation order).
  // vLLM kinds: `tenant` is the state's tenant ("" unnamed) and `scoped` whether the record
  // was in_tenant (only a clear reads it).
  std::string_view tenant, ns;
  bool scoped = false;
  std::uint64_t now = 0;
  std::uint32_t sg_epoch = 0;
  std::vector<std::string_view> sg_flight_keys;
  std::vector<std::int64_t> sg_flight_pages;
  std::vector<std::uint32_t> sg_flight_epochs;
  std::vector<std::uint64_t> sg_flight_deadlines;
};

// An SGLang pool's name in a record.
struct sg_pool_name {
  std::string_view tenant;
  std::int64_t rank;
  std::string_view ns;
};
// An in-flight page of an SGLang snapshot.
struct sg_flight {
  std::int64_t page;
  std::string_view key;
  std::uint32_t epoch;
  std::uint64_t deadline;
};

// The vLLM record whose frame starts at `frame` (the last one in `out`) becomes one of
// `tenant`'s state (in_tenant). Nothing changes for "" unless `always` (a clear of the
// unnamed state, which a bare clear would void everything before).
void scope_to_tenant(std::string& out, std::size_t frame, std::string_view tenant,
                     bool always = false);

// Appenders write one whole frame at the end of `out`.
void append_initialize(std::string& out, std::int64_t rank, std::int64_t num_pages);
void append_allocate(std::string& out, std::int64_t rank, std::span<const std::string_view> keys);
void append_confirm(std::string& out, std::int64_t rank, std::int32_t tp_world_size,
                    std::span<const std::string_view> keys, std::span<const std::int64_t> pages,
                    std::span<const std::int64_t> releases, bool quarantined = false);
void append_clear(std::string& out);
void append_snapshot_rank(std::string& out, std::int64_t rank, std::int64_t num_pages);
void append_snapshot_entry(std::string& out, std::int64_t rank, std::int64_t page, bool confirmed,
                           std::string_view key);
void append_directory_key(std::string& out, std::int32_t tp_world_size, std::string_view key);
void append_remove(std::string& out, std::int64_t rank, std::span<const std::string_view> keys);
void append_release(std::string& out, std::int64_t rank, std::span<const std::int64_t> pages);
void append_directory_remove(std::string& out, std::string_view key);
void append_quarantine_end(std::string& out, std::int64_t rank,
                           std::span<const std::int64_t> pages);
void append_snapshot_quarantine(std::string& out, std::int64_t rank,
                                std::span<const std::int64_t> pages);
// A snapshot_rank_keys / snapshot_directory_keys record in pieces: begin_*, then
// add_packed_item for each of at most kPackedItemsMax items, then end_packed.
std::size_t begin_rank_keys(std::string& out, std::int64_t rank, std::uint64_t total);
std::size_t begin_directory_keys(std::string& out, std::uint64_t total);
void add_packed_item(std::string& out, const packed_item& item);
void end_packed(std::string& out, std::size_t frame);
// A snapshot_rank_slots record in pieces: begin_rank_slots for `count` buckets from
// first_bucket, add_packed_item for each item in slot order, then end_rank_slots with
// the count masks.
std::size_t begin_rank_slots(std::string& out, std::int64_t rank, std::uint32_t layout,
                             std::uint64_t buckets, std::uint64_t first_bucket,
                             std::uint32_t count);
void end_rank_slots(std::string& out, std::size_t frame, std::span<const std::uint8_t> masks);

void append_sg_initialize(std::string& out, const sg_pool_name& pool, std::int64_t num_pages);
// sg_reserve, sg_get (kind says which): now, keys.
void append_sg_keys_at(std::string& out, record_kind kind, const sg_pool_name& pool,
                       std::uint64_t now, std::span<const std::string_view> keys);
// sg_reserve_capped: now, the cap (keys that may take a free or quarantined page), keys.
void append_sg_reserve_capped(std::string& out, const sg_pool_name& pool, std::uint64_t now,
                              std::uint64_t fresh_max, std::span<const std::string_view> keys);
// sg_confirm, or sg_confirm_quarantined when `quarantined`.
void append_sg_confirm(std::string& out, const sg_pool_name& pool, std::uint64_t now,
                       std::span<const std::string_view> keys, std::span<const std::int64_t> pages,
                       std::span<const std::int64_t> releases, bool quarantined = false);
void append_sg_quarantine_end(std::string& out, const sg_pool_name& pool, std::uint64_t now,
                              std::span<const std::int64_t> pages);
void append_sg_snapshot_quarantine(std::string& out, const sg_pool_name& pool,
                                   std::span<const std::int64_t> pages);
void append_sg_delete(std::string& out, const sg_pool_name& pool,
                      std::span<const std::string_view> keys);
void append_sg_clear(std::string& out, const sg_pool_name& pool);
void append_sg_expire(std::string& out, const sg_pool_name& pool, std::uint64_t now);
void append_sg_snapshot_pool(std::string& out, const sg_pool_name& pool, std::uint64_t now,
                             std::int64_t num_pages, std::uint32_t epoch,
                             std::span<const std::int64_t> free,
                             std::span<const std::string_view> bound_keys,
                             std::span<const std::int64_t> bound_pages,
                             std::span<const sg_flight> in_flight);

enum class scan_status : std::uint8_t {
  ok,  // every frame was whole and valid
  // A frame is incomplete or fails its checksum and no valid frame follows it: a write
  // cut short by a crash (the caller decides whether one may be there).
  torn_tail,
  // A frame does not decode, or fails its checksum (or its length field is damaged)
  // with valid frames after it: damage, never to be taken for a shorter past.
  corrupt,
};

struct scan_result {
  scan_status status = scan_status::ok;
  std::size_t valid_bytes = 0;  // the prefix of whole, valid frames
  std::size_t bad_offset = 0;   // where the torn or corrupt frame starts
};

// Decodes every frame of `bytes` in order, calling visit(const record&, offset).
template <typename Visit>
scan_result scan(std::string_view bytes, Visit&& visit);

// Decodes one frame's payload. False if it is malformed.
bool decode_payload(std::string_view payload, record& out);
// Splits off the frame at `offset`: its payload, or why not.
enum class frame_status : std::uint8_t { whole, short_read, bad_checksum };
frame_status next_frame(std::string_view bytes, std::size_t offset, std::string_view& payload,
                        std::size_t& frame_bytes);
// Whether a whole frame with a valid checksum and a decodable payload starts at any
// offset after `from`: what tells a damaged record from a torn tail. Every offset is
// tried (a damaged length says nothing about where the next frame is); a torn tail is
// at most one group commit long, so its search is short.
bool valid_frame_after(std::string_view bytes, std::size_t from);

// scan() over bytes that scan() already found whole and valid (no checksums are
// computed again). False if a frame does not decode after all (the bytes changed).
template <typename Visit>
bool scan_checked(std::string_view bytes, Visit&& visit) {
  record rec;
  std::size_t offset = 0;
  while (bytes.size() - offset >= 8) {
    std::uint32_t length = 0;
    std::memcpy(&length, bytes.data() + offset, 4);
    if (bytes.size() - offset - 8 < length ||
        !decode_payload(bytes.substr(offset + 8, length), rec))
      return false;
    visit(static_cast<const record&>(rec), offset);
    offset += 8 + std::size_t{length};
  }
  return offset == bytes.size();
}

// Calls visit(payload) for each frame, by the length fields alone (no checksum, no
// decoding; stops where a length runs past the end): for estimates only.
template <typename Visit>
void walk_frames(std::string_view bytes, Visit&& visit) {
  std::size_t offset = 0;
  while (bytes.size() - offset >= 8) {
    std::uint32_t length = 0;
    std::memcpy(&length, bytes.data() + offset, 4);
    if (length == 0 || bytes.size() - offset - 8 < length) return;
    visit(bytes.substr(offset + 8, length));
    offset += 8 + std::size_t{length};
  }
}

template <typename Visit>
scan_result scan(std::string_view bytes, Visit&& visit) {
  scan_result result;
  record rec;
  std::size_t offset = 0;
  while (offset < bytes.size()) {
    std::string_view payload;
    std::size_t frame_bytes = 0;
    const frame_status fs = next_frame(bytes, offset, payload, frame_bytes);
    if (fs == frame_status::short_read || fs == frame_status::bad_checksum) {
      result.status =
          valid_frame_after(bytes, offset) ? scan_status::corrupt : scan_status::torn_tail;
      result.bad_offset = offset;
      return result;
    }
    if (!decode_payload(payload, rec)) {
      result.status = scan_status::corrupt;
      result.bad_offset = offset;
      return result;
    }
    visit(static_cast<const record&>(rec), offset);
    offset += frame_bytes;
    result.valid_bytes = offset;
  }
  return result;
}

}  // namespace metad::store
