// The on-disk framing of log and snapshot records, and the records themselves. A frame
// is [u32 payload length][u32 crc32c of the payload][payload]; a payload starts with a
// record kind. Pure functions over bytes: no files here.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace store {

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
};

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
};

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

}  // namespace store
