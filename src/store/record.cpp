#include "store/record.hpp"

#include <nmmintrin.h>

#include <cstring>

#include "store/byte_reader.hpp"

namespace metad::store {
namespace {

constexpr std::size_t kFrameHeaderBytes = 8;
// A payload larger than this is corruption, not a record (a confirm of 32 MiB of keys
// stays far below it).
constexpr std::uint32_t kPayloadBytesMax = 256u << 20;

template <typename T>
void put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (x86-64)
  out.append(bytes, sizeof(T));
}

void put_string(std::string& out, std::string_view s) {
  put<std::uint32_t>(out, static_cast<std::uint32_t>(s.size()));
  out.append(s);
}

void put_keys(std::string& out, std::span<const std::string_view> keys) {
  put<std::uint32_t>(out, static_cast<std::uint32_t>(keys.size()));
  for (std::string_view key : keys) put_string(out, key);
}

void put_pages(std::string& out, std::span<const std::int64_t> pages) {
  put<std::uint32_t>(out, static_cast<std::uint32_t>(pages.size()));
  for (std::int64_t page : pages) put(out, page);
}

// Reserves the frame header, returns its offset; close_frame fills it in.
std::size_t open_frame(std::string& out, record_kind kind) {
  const std::size_t start = out.size();
  out.append(kFrameHeaderBytes, '\0');
  out.push_back(static_cast<char>(kind));
  return start;
}

void close_frame(std::string& out, std::size_t start) {
  const std::string_view payload(out.data() + start + kFrameHeaderBytes,
                                 out.size() - start - kFrameHeaderBytes);
  const auto length = static_cast<std::uint32_t>(payload.size());
  const std::uint32_t crc = crc32c(payload);
  std::memcpy(out.data() + start, &length, 4);
  std::memcpy(out.data() + start + 4, &crc, 4);
}

// allocate and remove share one layout: rank, keys.
void append_rank_keys(std::string& out, record_kind kind, std::int64_t rank,
                      std::span<const std::string_view> keys) {
  const std::size_t frame = open_frame(out, kind);
  put(out, rank);
  put_keys(out, keys);
  close_frame(out, frame);
}

using reader = byte_reader;

bool decode_keys(reader& in, record& out, bool with_pages) {
  std::uint32_t count = 0;
  if (!in.get(count)) return false;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::string_view key;
    if (!in.get_prefixed<std::uint32_t>(key)) return false;
    out.keys.push_back(key);
    if (with_pages) {
      std::int64_t page = 0;
      if (!in.get(page)) return false;
      out.pages.push_back(page);
    }
  }
  return true;
}

bool decode_pages(reader& in, std::vector<std::int64_t>& pages) {
  std::uint32_t count = 0;
  if (!in.get(count)) return false;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::int64_t page = 0;
    if (!in.get(page)) return false;
    pages.push_back(page);
  }
  return true;
}

// count, then count packed items to the end of the payload.
bool decode_items(reader& in, record& out) {
  std::uint32_t count = 0;
  if (!in.get(count) || count > kPackedItemsMax) return false;
  out.items = in.rest();
  return out.items.size() == std::size_t{count} * kPackedItemBytes;
}

// snapshot_rank_slots after its rank: layout, buckets, first bucket, count, the items,
// then count masks of 4 bits whose set bits are as many as the items.
bool decode_slots(reader& in, record& out) {
  std::uint32_t count = 0;
  if (!in.get(out.layout) || !in.get(out.total) || !in.get(out.first_bucket) || !in.get(count) ||
      count == 0 || count > kSlotBucketsMax || out.first_bucket >= out.total ||
      count > out.total - out.first_bucket)
    return false;
  const std::string_view rest = in.rest();
  if (rest.size() < count) return false;
  out.items = rest.substr(0, rest.size() - count);
  out.masks = rest.substr(rest.size() - count);
  std::size_t slots = 0;
  for (const char m : out.masks) {
    const auto bits = static_cast<unsigned char>(m);
    if (bits > 0xF) return false;
    slots += static_cast<std::size_t>(__builtin_popcount(bits));
  }
  return out.items.size() == slots * kPackedItemBytes;
}

// The last field of snapshot_entry, directory_key and directory_remove: one key, then nothing.
bool decode_last_key(reader& in, record& out) {
  std::string_view key;
  if (!in.get_prefixed<std::uint32_t>(key) || !in.done()) return false;
  out.keys.push_back(key);
  return true;
}

}  // namespace

std::uint32_t crc32c(std::string_view bytes, std::uint32_t seed) {
  std::uint64_t crc = ~seed;
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    crc = _mm_crc32_u64(crc, word);
  }
  auto crc32 = static_cast<std::uint32_t>(crc);
  for (; i < bytes.size(); ++i) crc32 = _mm_crc32_u8(crc32, static_cast<std::uint8_t>(bytes[i]));
  return ~crc32;
}

void append_initialize(std::string& out, std::int64_t rank, std::int64_t num_pages) {
  const std::size_t frame = open_frame(out, record_kind::initialize);
  put(out, rank);
  put(out, num_pages);
  close_frame(out, frame);
}

void append_allocate(std::string& out, std::int64_t rank, std::span<const std::string_view> keys) {
  append_rank_keys(out, record_kind::allocate, rank, keys);
}

void append_confirm(std::string& out, std::int64_t rank, std::int32_t tp_world_size,
                    std::span<const std::string_view> keys, std::span<const std::int64_t> pages,
                    std::span<const std::int64_t> releases, bool quarantined) {
  const std::size_t frame =
      open_frame(out, quarantined ? record_kind::confirm_quarantined : record_kind::confirm);
  put(out, rank);
  put(out, tp_world_size);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(keys.size()));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    put_string(out, keys[i]);
    put(out, pages[i]);
  }
  put_pages(out, releases);
  close_frame(out, frame);
}

void append_clear(std::string& out) { close_frame(out, open_frame(out, record_kind::clear)); }

void append_snapshot_rank(std::string& out, std::int64_t rank, std::int64_t num_pages) {
  const std::size_t frame = open_frame(out, record_kind::snapshot_rank);
  put(out, rank);
  put(out, num_pages);
  close_frame(out, frame);
}

void append_snapshot_entry(std::string& out, std::int64_t rank, std::int64_t page, bool confirmed,
                           std::string_view key) {
  const std::size_t frame = open_frame(out, record_kind::snapshot_entry);
  put(out, rank);
  put(out, page);
  put<std::uint8_t>(out, confirmed ? 1 : 0);
  put_string(out, key);
  close_frame(out, frame);
}

void append_directory_key(std::string& out, std::int32_t tp_world_size, std::string_view key) {
  const std::size_t frame = open_frame(out, record_kind::directory_key);
  put(out, tp_world_size);
  put_string(out, key);
  close_frame(out, frame);
}

void append_remove(std::string& out, std::int64_t rank, std::span<const std::string_view> keys) {
  append_rank_keys(out, record_kind::remove, rank, keys);
}

namespace {
void append_rank_pages(std::string& out, record_kind kind, std::int64_t rank,
                       std::span<const std::int64_t> pages) {
  const std::size_t frame = open_frame(out, kind);
  put(out, rank);
  put_pages(out, pages);
  close_frame(out, frame);
}
}  // namespace

void append_release(std::string& out, std::int64_t rank, std::span<const std::int64_t> pages) {
  append_rank_pages(out, record_kind::release, rank, pages);
}
void append_quarantine_end(std::string& out, std::int64_t rank,
                           std::span<const std::int64_t> pages) {
  append_rank_pages(out, record_kind::quarantine_end, rank, pages);
}
void append_snapshot_quarantine(std::string& out, std::int64_t rank,
                                std::span<const std::int64_t> pages) {
  append_rank_pages(out, record_kind::snapshot_quarantine, rank, pages);
}

void append_directory_remove(std::string& out, std::string_view key) {
  const std::size_t frame = open_frame(out, record_kind::directory_remove);
  put_string(out, key);
  close_frame(out, frame);
}

packed_item packed_item_at(std::string_view items, std::size_t i) {
  packed_item item;
  const char* at = items.data() + i * kPackedItemBytes;
  std::memcpy(&item.lo, at, 8);
  std::memcpy(&item.hi, at + 8, 8);
  std::memcpy(&item.value, at + 16, 4);
  return item;
}

std::size_t begin_rank_keys(std::string& out, std::int64_t rank, std::uint64_t total) {
  const std::size_t frame = open_frame(out, record_kind::snapshot_rank_keys);
  put(out, rank);
  put(out, total);
  put<std::uint32_t>(out, 0);  // the count, filled in by end_packed
  return frame;
}

std::size_t begin_directory_keys(std::string& out, std::uint64_t total) {
  const std::size_t frame = open_frame(out, record_kind::snapshot_directory_keys);
  put(out, total);
  put<std::uint32_t>(out, 0);
  return frame;
}

std::size_t begin_rank_slots(std::string& out, std::int64_t rank, std::uint32_t layout,
                             std::uint64_t buckets, std::uint64_t first_bucket,
                             std::uint32_t count) {
  const std::size_t frame = open_frame(out, record_kind::snapshot_rank_slots);
  put(out, rank);
  put(out, layout);
  put(out, buckets);
  put(out, first_bucket);
  put(out, count);
  return frame;
}

void end_rank_slots(std::string& out, std::size_t frame, std::span<const std::uint8_t> masks) {
  out.append(reinterpret_cast<const char*>(masks.data()), masks.size());
  close_frame(out, frame);
}

void add_packed_item(std::string& out, const packed_item& item) {
  char bytes[kPackedItemBytes];
  std::memcpy(bytes, &item.lo, 8);
  std::memcpy(bytes + 8, &item.hi, 8);
  std::memcpy(bytes + 16, &item.value, 4);
  out.append(bytes, sizeof bytes);
}

void end_packed(std::string& out, std::size_t frame) {
  const std::size_t payload = frame + kFrameHeaderBytes;
  const auto kind = static_cast<record_kind>(out[payload]);
  const std::size_t count_at = payload + 1 + (kind == record_kind::snapshot_rank_keys ? 16 : 8);
  const std::size_t items = out.size() - count_at - 4;
  const auto count = static_cast<std::uint32_t>(items / kPackedItemBytes);
  std::memcpy(out.data() + count_at, &count, 4);
  close_frame(out, frame);
}

namespace {

std::size_t open_sg_frame(std::string& out, record_kind kind, const sg_pool_name& pool) {
  const std::size_t frame = open_frame(out, kind);
  put_string(out, pool.tenant);
  put(out, pool.rank);
  put_string(out, pool.ns);
  return frame;
}

void put_key_pages(std::string& out, std::span<const std::string_view> keys,
                   std::span<const std::int64_t> pages) {
  put<std::uint32_t>(out, static_cast<std::uint32_t>(keys.size()));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    put_string(out, keys[i]);
    put(out, pages[i]);
  }
}

}  // namespace

void append_sg_initialize(std::string& out, const sg_pool_name& pool, std::int64_t num_pages) {
  const std::size_t frame = open_sg_frame(out, record_kind::sg_initialize, pool);
  put(out, num_pages);
  close_frame(out, frame);
}

void append_sg_keys_at(std::string& out, record_kind kind, const sg_pool_name& pool,
                       std::uint64_t now, std::span<const std::string_view> keys) {
  const std::size_t frame = open_sg_frame(out, kind, pool);
  put(out, now);
  put_keys(out, keys);
  close_frame(out, frame);
}

void append_sg_reserve_capped(std::string& out, const sg_pool_name& pool, std::uint64_t now,
                              std::uint64_t fresh_max, std::span<const std::string_view> keys) {
  const std::size_t frame = open_sg_frame(out, record_kind::sg_reserve_capped, pool);
  put(out, now);
  put(out, fresh_max);
  put_keys(out, keys);
  close_frame(out, frame);
}

void append_sg_confirm(std::string& out, const sg_pool_name& pool, std::uint64_t now,
                       std::span<const std::string_view> keys, std::span<const std::int64_t> pages,
                       std::span<const std::int64_t> releases, bool quarantined) {
  const std::size_t frame = open_sg_frame(
      out, quarantined ? record_kind::sg_confirm_quarantined : record_kind::sg_confirm, pool);
  put(out, now);
  put_key_pages(out, keys, pages);
  put_pages(out, releases);
  close_frame(out, frame);
}

void append_sg_quarantine_end(std::string& out, const sg_pool_name& pool, std::uint64_t now,
                              std::span<const std::int64_t> pages) {
  const std::size_t frame = open_sg_frame(out, record_kind::sg_quarantine_end, pool);
  put(out, now);
  put_pages(out, pages);
  close_frame(out, frame);
}

void append_sg_snapshot_quarantine(std::string& out, const sg_pool_name& pool,
                                   std::span<const std::int64_t> pages) {
  const std::size_t frame = open_sg_frame(out, record_kind::sg_snapshot_quarantine, pool);
  put_pages(out, pages);
  close_frame(out, frame);
}

void append_sg_delete(std::string& out, const sg_pool_name& pool,
                      std::span<const std::string_view> keys) {
  const std::size_t frame = open_sg_frame(out, record_kind::sg_delete, pool);
  put_keys(out, keys);
  close_frame(out, frame);
}

void append_sg_clear(std::string& out, const sg_pool_name& pool) {
  close_frame(out, open_sg_frame(out, record_kind::sg_clear, pool));
}

void append_sg_expire(std::string& out, const sg_pool_name& pool, std::uint64_t now) {
  const std::size_t frame = open_sg_frame(out, record_kind::sg_expire, pool);
  put(out, now);
  close_frame(out, frame);
}

void append_sg_snapshot_pool(std::string& out, const sg_pool_name& pool, std::uint64_t now,
                             std::int64_t num_pages, std::uint32_t epoch,
                             std::span<const std::int64_t> free,
                             std::span<const std::string_view> bound_keys,
                             std::span<const std::int64_t> bound_pages,
                             std::span<const sg_flight> in_flight) {
  const std::size_t frame = open_sg_frame(out, record_kind::sg_snapshot_pool_runs, pool);
  put(out, now);
  put(out, num_pages);
  put(out, epoch);
  put_pages(out, free);
  put_key_pages(out, bound_keys, bound_pages);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(in_flight.size()));
  for (const sg_flight& f : in_flight) {
    put(out, f.page);
    put_string(out, f.key);
    put(out, f.epoch);
    put(out, f.deadline);
  }
  close_frame(out, frame);
}

frame_status next_frame(std::string_view bytes, std::size_t offset, std::string_view& payload,
                        std::size_t& frame_bytes) {
  if (bytes.size() - offset < kFrameHeaderBytes) return frame_status::short_read;
  std::uint32_t length = 0, crc = 0;
  std::memcpy(&length, bytes.data() + offset, 4);
  std::memcpy(&crc, bytes.data() + offset + 4, 4);
  if (length > kPayloadBytesMax) {
    frame_bytes = bytes.size() - offset;  // unknowable: treat the rest as this frame
    return frame_status::bad_checksum;
  }
  frame_bytes = kFrameHeaderBytes + length;
  if (bytes.size() - offset < frame_bytes) return frame_status::short_read;
  payload = bytes.substr(offset + kFrameHeaderBytes, length);
  return crc32c(payload) == crc ? frame_status::whole : frame_status::bad_checksum;
}

bool valid_frame_after(std::string_view bytes, std::size_t from) {
  record scratch;
  for (std::size_t at = from + 1; at + kFrameHeaderBytes <= bytes.size(); ++at) {
    std::string_view payload;
    std::size_t frame_bytes = 0;
    if (next_frame(bytes, at, payload, frame_bytes) == frame_status::whole &&
        decode_payload(payload, scratch))
      return true;
  }
  return false;
}

void scope_to_tenant(std::string& out, std::size_t frame, std::string_view tenant, bool always) {
  if (tenant.empty() && !always) return;
  std::string prefix;
  prefix.push_back(static_cast<char>(record_kind::in_tenant));
  put_string(prefix, tenant);
  out.insert(frame + kFrameHeaderBytes, prefix);
  close_frame(out, frame);
}

namespace {

// A tenant's name as --tenants-file allows it: a letter or '_', then [A-Za-z0-9_.-].
bool tenant_name_ok(std::string_view name) {
  if (name.size() > kTenantNameMax) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const bool other = (c >= '0' && c <= '9') || c == '.' || c == '-';
    if (!letter && (i == 0 || !other)) return false;
  }
  return true;
}

}  // namespace

bool decode_payload(std::string_view payload, record& out) {
  if (payload.empty()) return false;
  out.keys.clear();
  out.pages.clear();
  out.releases.clear();
  out.items = {};
  out.tenant = {};
  out.scoped = false;
  if (static_cast<record_kind>(payload[0]) == record_kind::in_tenant) {
    reader scope(payload.substr(1));
    std::string_view name;
    if (!scope.get_prefixed<std::uint32_t>(name) || !tenant_name_ok(name)) return false;
    payload = scope.rest();
    // vLLM's kinds only (SGLang's name their tenant themselves), once.
    if (payload.empty() || !is_vllm_kind(static_cast<record_kind>(payload[0]))) return false;
    out.tenant = name;
    out.scoped = true;
  }
  out.kind = static_cast<record_kind>(payload[0]);
  reader in(payload.substr(1));
  switch (out.kind) {
    case record_kind::initialize:
    case record_kind::snapshot_rank:
      return in.get(out.rank) && in.get(out.num_pages) && in.done();
    case record_kind::allocate:
    case record_kind::remove:
      return in.get(out.rank) && decode_keys(in, out, false) && in.done();
    case record_kind::confirm:
    case record_kind::confirm_quarantined:
      return in.get(out.rank) && in.get(out.tp_world_size) && decode_keys(in, out, true) &&
             decode_pages(in, out.releases) && in.done();
    case record_kind::release:
    case record_kind::quarantine_end:
    case record_kind::snapshot_quarantine:
      return in.get(out.rank) && decode_pages(in, out.releases) && in.done();
    case record_kind::clear:
      return in.done();
    case record_kind::snapshot_entry: {
      std::uint8_t confirmed = 0;
      if (!in.get(out.rank) || !in.get(out.page) || !in.get(confirmed)) return false;
      out.confirmed = confirmed != 0;
      return decode_last_key(in, out);
    }
    case record_kind::directory_key:
      return in.get(out.tp_world_size) && decode_last_key(in, out);
    case record_kind::directory_remove:
      return decode_last_key(in, out);
    case record_kind::snapshot_rank_keys:
      return in.get(out.rank) && in.get(out.total) && decode_items(in, out);
    case record_kind::snapshot_directory_keys:
      return in.get(out.total) && decode_items(in, out);
    case record_kind::snapshot_rank_slots:
      return in.get(out.rank) && decode_slots(in, out);
    default:
      if (out.scoped) return false;
      break;
  }
  // SGLang's records: the pool's name first.
  if (!in.get_prefixed<std::uint32_t>(out.tenant) || !in.get(out.rank) ||
      !in.get_prefixed<std::uint32_t>(out.ns))
    return false;
  switch (out.kind) {
    case record_kind::sg_initialize:
      return in.get(out.num_pages) && in.done();
    case record_kind::sg_reserve:
    case record_kind::sg_reserve_full:
    case record_kind::sg_get:
      return in.get(out.now) && decode_keys(in, out, false) && in.done();
    case record_kind::sg_reserve_capped:
      return in.get(out.now) && in.get(out.total) && decode_keys(in, out, false) && in.done();
    case record_kind::sg_confirm:
    case record_kind::sg_confirm_quarantined:
      return in.get(out.now) && decode_keys(in, out, true) && decode_pages(in, out.releases) &&
             in.done();
    case record_kind::sg_quarantine_end:
      return in.get(out.now) && decode_pages(in, out.releases) && in.done();
    case record_kind::sg_snapshot_quarantine:
      return decode_pages(in, out.releases) && in.done();
    case record_kind::sg_delete:
      return decode_keys(in, out, false) && in.done();
    case record_kind::sg_clear:
      return in.done();
    case record_kind::sg_expire:
      return in.get(out.now) && in.done();
    case record_kind::sg_snapshot_pool:
    case record_kind::sg_snapshot_pool_runs: {
      out.sg_flight_keys.clear();
      out.sg_flight_pages.clear();
      out.sg_flight_epochs.clear();
      out.sg_flight_deadlines.clear();
      std::uint32_t count = 0;
      if (!in.get(out.now) || !in.get(out.num_pages) || !in.get(out.sg_epoch) ||
          !decode_pages(in, out.releases) || !decode_keys(in, out, true) || !in.get(count))
        return false;
      for (std::uint32_t i = 0; i < count; ++i) {
        std::int64_t page = 0;
        std::string_view key;
        std::uint32_t epoch = 0;
        std::uint64_t deadline = 0;
        if (!in.get(page) || !in.get_prefixed<std::uint32_t>(key) || !in.get(epoch) ||
            !in.get(deadline))
          return false;
        out.sg_flight_pages.push_back(page);
        out.sg_flight_keys.push_back(key);
        out.sg_flight_epochs.push_back(epoch);
        out.sg_flight_deadlines.push_back(deadline);
      }
      return in.done();
    }
    default:
      return false;
  }
}

}  // namespace metad::store
