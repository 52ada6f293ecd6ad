// Log record framing: round trips, torn tails dropped, corruption in the middle caught.
#include "store/record.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace metad;

namespace {

std::string three_records() {
  std::string log;
  store::append_initialize(log, -7, 1000);
  const std::vector<std::string_view> keys = {"k1", "k2"};
  store::append_allocate(log, -7, keys);
  const std::vector<std::int64_t> pages = {0, 1}, releases = {5};
  store::append_confirm(log, -7, 2, keys, pages, releases);
  return log;
}

std::vector<store::record_kind> kinds_of(std::string_view log, store::scan_result& result) {
  std::vector<store::record_kind> kinds;
  result = store::scan(log, [&](const store::record& r, std::size_t) { kinds.push_back(r.kind); });
  return kinds;
}

}  // namespace

TEST(Record, EveryKindRoundTrips) {
  std::string log = three_records();
  store::append_clear(log);
  store::append_snapshot_rank(log, 3, 42);
  store::append_snapshot_entry(log, 3, 41, true, "key-\x01\xff");
  store::append_directory_key(log, 8, "abc");
  std::vector<store::record> seen;
  const store::scan_result result =
      store::scan(log, [&](const store::record& r, std::size_t) { seen.push_back(r); });
  ASSERT_EQ(result.status, store::scan_status::ok);
  EXPECT_EQ(result.valid_bytes, log.size());
  ASSERT_EQ(seen.size(), 7u);
  EXPECT_EQ(seen[0].kind, store::record_kind::initialize);
  EXPECT_EQ(seen[0].rank, -7);
  EXPECT_EQ(seen[0].num_pages, 1000);
  EXPECT_EQ(seen[1].keys, (std::vector<std::string_view>{"k1", "k2"}));
  EXPECT_EQ(seen[2].tp_world_size, 2);
  EXPECT_EQ(seen[2].pages, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(seen[2].releases, (std::vector<std::int64_t>{5}));
  EXPECT_EQ(seen[3].kind, store::record_kind::clear);
  EXPECT_EQ(seen[4].num_pages, 42);
  EXPECT_EQ(seen[5].page, 41);
  EXPECT_TRUE(seen[5].confirmed);
  EXPECT_EQ(seen[5].keys[0], "key-\x01\xff");
  EXPECT_EQ(seen[6].tp_world_size, 8);
  EXPECT_EQ(seen[6].keys[0], "abc");
}

TEST(Record, QuarantineKindsRoundTrip) {
  std::string log;
  const std::vector<std::string_view> keys = {"k"};
  const std::vector<std::int64_t> pages = {3}, releases = {7, 2};
  store::append_confirm(log, 4, 2, keys, pages, releases, true);
  store::append_quarantine_end(log, 4, releases);
  store::append_snapshot_quarantine(log, 4, pages);
  std::vector<store::record> seen;
  ASSERT_EQ(
      store::scan(log, [&](const store::record& r, std::size_t) { seen.push_back(r); }).status,
      store::scan_status::ok);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].kind, store::record_kind::confirm_quarantined);
  EXPECT_EQ(seen[0].keys, keys);
  EXPECT_EQ(seen[0].pages, pages);
  EXPECT_EQ(seen[0].releases, releases);
  EXPECT_EQ(seen[1].kind, store::record_kind::quarantine_end);
  EXPECT_EQ(seen[1].rank, 4);
  EXPECT_EQ(seen[1].releases, releases);
  EXPECT_EQ(seen[2].kind, store::record_kind::snapshot_quarantine);
  EXPECT_EQ(seen[2].releases, pages);
}

TEST(Record, TornTailAtEveryCutIsDroppedAndTheRestKept) {
  const std::string log = three_records();
  std::size_t whole = 0;
  std::vector<std::size_t> ends;
  store::scan(log, [&](const store::record&, std::size_t) {});
  {
    std::size_t offset = 0;
    std::string_view payload;
    std::size_t frame = 0;
    while (offset < log.size()) {
      ASSERT_EQ(store::next_frame(log, offset, payload, frame), store::frame_status::whole);
      offset += frame;
      ends.push_back(offset);
    }
  }
  for (std::size_t cut = 1; cut < log.size(); ++cut) {
    store::scan_result result;
    const auto kinds = kinds_of(std::string_view(log).substr(0, cut), result);
    whole = 0;
    for (std::size_t end : ends) whole += end <= cut ? 1 : 0;
    EXPECT_EQ(kinds.size(), whole) << "cut at " << cut;
    const bool on_boundary = std::find(ends.begin(), ends.end(), cut) != ends.end();
    EXPECT_EQ(result.status, on_boundary ? store::scan_status::ok : store::scan_status::torn_tail)
        << "cut at " << cut;
  }
}

TEST(Record, FlippedByteInTheLastRecordIsATornTail) {
  std::string log = three_records();
  log[log.size() - 3] ^= 0x40;
  store::scan_result result;
  EXPECT_EQ(kinds_of(log, result).size(), 2u);
  EXPECT_EQ(result.status, store::scan_status::torn_tail);
}

TEST(Record, FlippedByteInAMiddleRecordIsCorruption) {
  std::string log = three_records();
  log[12] ^= 0x01;  // inside the first record's payload
  store::scan_result result;
  EXPECT_TRUE(kinds_of(log, result).empty());
  EXPECT_EQ(result.status, store::scan_status::corrupt);
  EXPECT_EQ(result.bad_offset, 0u);
}

TEST(Record, DamagedLengthInTheMiddleIsCorruptionNotATornTail) {
  const std::string log = three_records();
  std::string_view payload;
  std::size_t first = 0;
  ASSERT_EQ(store::next_frame(log, 0, payload, first), store::frame_status::whole);
  // The first record's length: huge, one past the end of the file, one byte off.
  for (const std::uint32_t length :
       {std::uint32_t{0x7fffffff}, static_cast<std::uint32_t>(log.size()),
        static_cast<std::uint32_t>(first - 8 + 1), static_cast<std::uint32_t>(first - 8 - 1)}) {
    std::string damaged = log;
    std::memcpy(damaged.data(), &length, 4);
    store::scan_result result;
    EXPECT_TRUE(kinds_of(damaged, result).empty()) << length;
    EXPECT_EQ(result.status, store::scan_status::corrupt) << length;
    EXPECT_EQ(result.bad_offset, 0u) << length;
  }
  // The last record's length damaged: nothing valid follows, so it reads as torn.
  std::string damaged = log;
  std::size_t offset = first, frame = 0;
  ASSERT_EQ(store::next_frame(log, offset, payload, frame), store::frame_status::whole);
  offset += frame;
  const std::uint32_t huge = 0x7fffffff;
  std::memcpy(damaged.data() + offset, &huge, 4);
  store::scan_result result;
  EXPECT_EQ(kinds_of(damaged, result).size(), 2u);
  EXPECT_EQ(result.status, store::scan_status::torn_tail);
  EXPECT_EQ(result.bad_offset, offset);
}

TEST(Record, ZeroedBlockInTheMiddleIsCorruption) {
  std::string log = three_records();
  store::append_clear(log);
  std::fill(log.begin() + 4, log.begin() + 20, '\0');  // the first record's checksum and payload
  store::scan_result result;
  EXPECT_TRUE(kinds_of(log, result).empty());
  EXPECT_EQ(result.status, store::scan_status::corrupt);
}

TEST(Record, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(store::crc32c("123456789"), 0xE3069283u);
}

namespace {

// The payload of the single frame in `frame`, copied so decoded views outlive `frame`.
std::string payload_of(std::string_view frame) {
  std::string_view payload;
  std::size_t frame_bytes = 0;
  EXPECT_EQ(store::next_frame(frame, 0, payload, frame_bytes), store::frame_status::whole);
  EXPECT_EQ(frame_bytes, frame.size());
  return std::string(payload);
}

const std::string kHexKey(64, 'f');
const std::string_view kOddKey("not hex\0\x01\xff/", 11);

}  // namespace

TEST(Record, RemoveRoundTripsItsRankAndKeys) {
  const std::vector<std::vector<std::string_view>> cases = {{}, {kHexKey}, {kHexKey, kOddKey, ""}};
  for (const auto& keys : cases) {
    for (const std::int64_t rank : {std::int64_t{0}, std::int64_t{-3}, INT64_MAX, INT64_MIN}) {
      std::string frame;
      store::append_remove(frame, rank, keys);
      const std::string payload = payload_of(frame);
      store::record r;
      ASSERT_TRUE(store::decode_payload(payload, r)) << keys.size() << " keys, rank " << rank;
      EXPECT_EQ(r.kind, store::record_kind::remove);
      EXPECT_EQ(r.rank, rank);
      EXPECT_EQ(r.keys, keys);
      EXPECT_TRUE(r.pages.empty());
      EXPECT_TRUE(r.releases.empty());
    }
  }
}

TEST(Record, RemoveHasTheLayoutOfAllocateUnderItsOwnKind) {
  const std::vector<std::string_view> keys = {kHexKey, kOddKey};
  std::string removed, allocated;
  store::append_remove(removed, -9, keys);
  store::append_allocate(allocated, -9, keys);
  const std::string removed_payload = payload_of(removed);
  const std::string allocated_payload = payload_of(allocated);
  EXPECT_EQ(removed_payload[0], static_cast<char>(store::record_kind::remove));
  EXPECT_EQ(removed_payload.substr(1), allocated_payload.substr(1));
}

TEST(Record, ReleaseRoundTripsItsRankAndPages) {
  const std::vector<std::vector<std::int64_t>> cases = {{}, {0}, {7, 0, 1 << 20, INT64_MAX}};
  for (const auto& pages : cases) {
    for (const std::int64_t rank : {std::int64_t{5}, std::int64_t{-1}}) {
      std::string frame;
      store::append_release(frame, rank, pages);
      const std::string payload = payload_of(frame);
      store::record r;
      ASSERT_TRUE(store::decode_payload(payload, r)) << pages.size() << " pages, rank " << rank;
      EXPECT_EQ(r.kind, store::record_kind::release);
      EXPECT_EQ(r.rank, rank);
      EXPECT_EQ(r.releases, pages);
      EXPECT_TRUE(r.keys.empty());
      EXPECT_TRUE(r.pages.empty());
    }
  }
}

TEST(Record, DirectoryRemoveRoundTripsItsKey) {
  for (const std::string_view key : {std::string_view(kHexKey), kOddKey, std::string_view()}) {
    std::string frame;
    store::append_directory_remove(frame, key);
    const std::string payload = payload_of(frame);
    store::record r;
    ASSERT_TRUE(store::decode_payload(payload, r)) << key.size() << "-byte key";
    EXPECT_EQ(r.kind, store::record_kind::directory_remove);
    ASSERT_EQ(r.keys.size(), 1u);
    EXPECT_EQ(r.keys[0], key);
  }
}

TEST(Record, NewKindsRejectEveryTruncationAndAnyTrailingByte) {
  const std::vector<std::string_view> keys = {kHexKey, kOddKey};
  const std::vector<std::int64_t> pages = {3, 4};
  std::string remove, empty_remove, release, empty_release, directory_remove;
  store::append_remove(remove, 2, keys);
  store::append_remove(empty_remove, 2, {});
  store::append_release(release, 2, pages);
  store::append_release(empty_release, 2, {});
  store::append_directory_remove(directory_remove, kHexKey);
  for (const std::string* frame :
       {&remove, &empty_remove, &release, &empty_release, &directory_remove}) {
    const std::string payload = payload_of(*frame);
    store::record r;
    for (std::size_t cut = 0; cut < payload.size(); ++cut)
      EXPECT_FALSE(store::decode_payload(std::string_view(payload).substr(0, cut), r))
          << "kind " << int(payload[0]) << " cut at " << cut;
    EXPECT_FALSE(store::decode_payload(payload + '\0', r)) << "kind " << int(payload[0]);
  }
}

TEST(Record, NewKindsRejectCountsAndLengthsThatDisagreeWithThePayload) {
  // Offsets inside the payload: kind (1), then rank (8) for remove and release.
  constexpr std::size_t kCountAt = 9, kFirstLengthAt = 13;
  const auto with_u32 = [](std::string payload, std::size_t at, std::uint32_t value) {
    std::memcpy(payload.data() + at, &value, 4);
    return payload;
  };
  const std::vector<std::string_view> keys = {"k1", "k2"};
  const std::vector<std::int64_t> pages = {3, 4};
  std::string remove, release, directory_remove;
  store::append_remove(remove, 1, keys);
  store::append_release(release, 1, pages);
  store::append_directory_remove(directory_remove, "k1");
  const std::string remove_payload = payload_of(remove);
  const std::string release_payload = payload_of(release);
  const std::string directory_payload = payload_of(directory_remove);
  const std::vector<std::string> bad = {
      with_u32(remove_payload, kCountAt, 3),           // a key more than written
      with_u32(remove_payload, kCountAt, 1),           // the second key left as trailing bytes
      with_u32(remove_payload, kCountAt, UINT32_MAX),  // a count no payload can hold
      with_u32(remove_payload, kFirstLengthAt, 1000),  // a key overrunning the payload
      with_u32(remove_payload, kFirstLengthAt, 1),     // a key shorter than written
      with_u32(release_payload, kCountAt, 3),
      with_u32(release_payload, kCountAt, 1),
      with_u32(release_payload, kCountAt, UINT32_MAX),
      with_u32(directory_payload, 1, 3),  // the key overruns the payload
      with_u32(directory_payload, 1, 1),  // the key leaves a trailing byte
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    store::record r;
    EXPECT_FALSE(store::decode_payload(bad[i], r)) << "case " << i;
  }
}

TEST(Record, MixedLogWithTheNewKindsScansInOrder) {
  std::string log = three_records();
  const std::vector<std::string_view> removed = {"k1", kHexKey};
  const std::vector<std::int64_t> expired = {9, 2};
  store::append_remove(log, -7, removed);
  store::append_directory_key(log, 4, kOddKey);
  store::append_release(log, -7, expired);
  store::append_directory_remove(log, kOddKey);
  store::append_remove(log, 11, {});
  store::append_release(log, 11, {});
  store::append_clear(log);
  std::vector<store::record> seen;
  std::vector<std::size_t> offsets;
  const store::scan_result result = store::scan(log, [&](const store::record& r, std::size_t at) {
    seen.push_back(r);
    offsets.push_back(at);
  });
  ASSERT_EQ(result.status, store::scan_status::ok);
  EXPECT_EQ(result.valid_bytes, log.size());
  using k = store::record_kind;
  std::vector<k> kinds;
  for (const store::record& r : seen) kinds.push_back(r.kind);
  ASSERT_EQ(kinds,
            (std::vector<k>{k::initialize, k::allocate, k::confirm, k::remove, k::directory_key,
                            k::release, k::directory_remove, k::remove, k::release, k::clear}));
  EXPECT_EQ(seen[3].rank, -7);
  EXPECT_EQ(seen[3].keys, removed);
  EXPECT_TRUE(seen[3].pages.empty());     // not the confirm's, decoded just before
  EXPECT_TRUE(seen[3].releases.empty());  // likewise
  EXPECT_EQ(seen[4].keys, (std::vector<std::string_view>{kOddKey}));
  EXPECT_EQ(seen[5].rank, -7);
  EXPECT_EQ(seen[5].releases, expired);
  EXPECT_TRUE(seen[5].keys.empty());
  EXPECT_EQ(seen[6].keys, (std::vector<std::string_view>{kOddKey}));
  EXPECT_EQ(seen[7].rank, 11);
  EXPECT_TRUE(seen[7].keys.empty());
  EXPECT_EQ(seen[8].rank, 11);
  EXPECT_TRUE(seen[8].releases.empty());

  // A flipped byte inside the first release (not the last frame) is corruption there.
  log[offsets[5] + 12] ^= 0x01;
  store::scan_result flipped;
  EXPECT_EQ(kinds_of(log, flipped).size(), 5u);
  EXPECT_EQ(flipped.status, store::scan_status::corrupt);
  EXPECT_EQ(flipped.bad_offset, offsets[5]);
}

TEST(Record, PackedChunksRoundTripAndRejectCountsThatDisagree) {
  std::string log;
  std::size_t frame = store::begin_rank_keys(log, -3, 7);
  store::add_packed_item(log, {1, 2, 5u | (1u << 31)});
  store::add_packed_item(log, {3, 4, 6});
  store::end_packed(log, frame);
  frame = store::begin_directory_keys(log, 9);
  store::add_packed_item(log, {7, 8, 8});
  store::end_packed(log, frame);
  frame = store::begin_directory_keys(log, 0);  // an empty chunk is valid
  store::end_packed(log, frame);
  std::vector<store::record> seen;
  ASSERT_EQ(
      store::scan(log, [&](const store::record& r, std::size_t) { seen.push_back(r); }).status,
      store::scan_status::ok);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].kind, store::record_kind::snapshot_rank_keys);
  EXPECT_EQ(seen[0].rank, -3);
  EXPECT_EQ(seen[0].total, 7u);
  ASSERT_EQ(seen[0].item_count(), 2u);
  const store::packed_item a = store::packed_item_at(seen[0].items, 0);
  const store::packed_item b = store::packed_item_at(seen[0].items, 1);
  EXPECT_EQ(a.lo, 1u);
  EXPECT_EQ(a.hi, 2u);
  EXPECT_EQ(a.value, 5u | (1u << 31));
  EXPECT_EQ(b.lo, 3u);
  EXPECT_EQ(b.value, 6u);
  EXPECT_EQ(seen[1].kind, store::record_kind::snapshot_directory_keys);
  EXPECT_EQ(seen[1].total, 9u);
  ASSERT_EQ(seen[1].item_count(), 1u);
  EXPECT_EQ(store::packed_item_at(seen[1].items, 0).value, 8u);
  EXPECT_EQ(seen[2].item_count(), 0u);

  // Payload offsets: kind (1), rank (8), total (8), count (4) / kind, total, count.
  std::string rank_keys, directory_keys;
  frame = store::begin_rank_keys(rank_keys, 1, 2);
  store::add_packed_item(rank_keys, {1, 2, 3});
  store::add_packed_item(rank_keys, {4, 5, 6});
  store::end_packed(rank_keys, frame);
  frame = store::begin_directory_keys(directory_keys, 1);
  store::add_packed_item(directory_keys, {1, 2, 3});
  store::end_packed(directory_keys, frame);
  const std::string rk = payload_of(rank_keys), dk = payload_of(directory_keys);
  const auto with_u32 = [](std::string payload, std::size_t at, std::uint32_t value) {
    std::memcpy(payload.data() + at, &value, 4);
    return payload;
  };
  const std::vector<std::string> bad = {
      with_u32(rk, 17, 3),
      with_u32(rk, 17, 1),
      with_u32(rk, 17, UINT32_MAX),
      with_u32(rk, 17, 65537),
      with_u32(dk, 9, 2),
      with_u32(dk, 9, 0),
      rk + '\0',
      dk.substr(0, dk.size() - 1),
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    store::record r;
    EXPECT_FALSE(store::decode_payload(bad[i], r)) << "case " << i;
  }
}

// snapshot_rank_slots: a chunk of a rank's table image. Its masks say which slots hold
// the items that precede them; any disagreement, or a chunk outside its table, does not
// decode.
TEST(Record, RankSlotChunksRoundTripAndRejectMasksThatDisagree) {
  std::string log;
  std::size_t frame = store::begin_rank_slots(log, -4, 1, 100, 96, 4);
  store::add_packed_item(log, {1, 2, 5u | (1u << 31)});
  store::add_packed_item(log, {3, 4, 6u | (1u << 31)});
  store::add_packed_item(log, {5, 6, 7u | (1u << 31)});
  const std::vector<std::uint8_t> masks = {0b0101, 0, 0b1000, 0};
  store::end_rank_slots(log, frame, masks);
  std::vector<store::record> seen;
  ASSERT_EQ(
      store::scan(log, [&](const store::record& r, std::size_t) { seen.push_back(r); }).status,
      store::scan_status::ok);
  ASSERT_EQ(seen.size(), 1u);
  const store::record& r = seen[0];
  EXPECT_EQ(r.kind, store::record_kind::snapshot_rank_slots);
  EXPECT_EQ(r.rank, -4);
  EXPECT_EQ(r.layout, 1u);
  EXPECT_EQ(r.total, 100u);
  EXPECT_EQ(r.first_bucket, 96u);
  ASSERT_EQ(r.masks.size(), 4u);
  EXPECT_EQ(static_cast<std::uint8_t>(r.masks[2]), 0b1000);
  ASSERT_EQ(r.item_count(), 3u);
  EXPECT_EQ(store::packed_item_at(r.items, 2).lo, 5u);

  // Payload offsets: kind (1), rank (8), layout (4), buckets (8), first bucket (8), count (4).
  const std::string p = payload_of(log);
  const auto with = [&](std::size_t at, auto value) {
    std::string payload = p;
    std::memcpy(payload.data() + at, &value, sizeof value);
    return payload;
  };
  std::string two_masks_short = p;
  two_masks_short.erase(two_masks_short.size() - 2);
  const std::vector<std::string> bad = {
      with(29, std::uint32_t{0}),                // no bucket
      with(29, std::uint32_t{5}),                // past the table's end (96 + 5 > 100)
      with(29, std::uint32_t{3}),                // masks and items disagree
      with(29, store::kSlotBucketsMax + 1),      // too many buckets
      with(21, std::uint64_t{100}),              // first bucket past the end
      with(21, std::uint64_t{UINT64_MAX - 1}),   // no overflow
      with(p.size() - 1, std::uint8_t{0x10}),    // a fifth slot
      with(p.size() - 4, std::uint8_t{0b0111}),  // a slot more than items
      with(p.size() - 2, std::uint8_t{0b0000}),  // a slot less
      p + '\0',
      two_masks_short,
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    store::record d;
    EXPECT_FALSE(store::decode_payload(bad[i], d)) << "case " << i;
  }
}

TEST(Record, SglangKindsRoundTrip) {
  using store::record_kind;
  const store::sg_pool_name pool{"llama", -3, "mamba"};
  const std::vector<std::string_view> keys = {"a", "bc"};
  const std::vector<std::int64_t> pages = {4, 5}, releases = {6}, free = {0, 2};
  const std::vector<store::sg_flight> flights = {{1, "f", 2, UINT64_MAX}, {3, "g", 3, 77}};
  std::string log;
  store::append_sg_initialize(log, pool, 9);
  store::append_sg_keys_at(log, record_kind::sg_reserve, pool, 11, keys);
  store::append_sg_confirm(log, pool, 12, keys, pages, releases);
  store::append_sg_delete(log, pool, keys);
  store::append_sg_clear(log, {"", 0, "kv"});
  store::append_sg_keys_at(log, record_kind::sg_get, pool, 13, keys);
  store::append_sg_expire(log, pool, 14);
  store::append_sg_snapshot_pool(log, pool, 15, 7, 2, free, keys, pages, flights);
  store::append_sg_keys_at(log, record_kind::sg_reserve_full, pool, 16, keys);
  store::append_sg_reserve_capped(log, pool, 17, 3, keys);
  std::vector<store::record> seen;
  std::vector<std::string> names;
  const store::scan_result result = store::scan(log, [&](const store::record& r, std::size_t) {
    seen.push_back(r);
    names.push_back(std::string(r.tenant) + "/" + std::to_string(r.rank) + "/" + std::string(r.ns));
  });
  ASSERT_EQ(result.status, store::scan_status::ok);
  ASSERT_EQ(seen.size(), 10u);
  EXPECT_EQ(names[0], "llama/-3/mamba");
  EXPECT_EQ(names[4], "/0/kv");
  EXPECT_EQ(seen[0].kind, record_kind::sg_initialize);
  EXPECT_EQ(seen[0].num_pages, 9);
  EXPECT_EQ(seen[1].kind, record_kind::sg_reserve);
  EXPECT_EQ(seen[1].now, 11u);
  EXPECT_EQ(seen[1].keys, keys);
  EXPECT_EQ(seen[2].kind, record_kind::sg_confirm);
  EXPECT_EQ(seen[2].now, 12u);
  EXPECT_EQ(seen[2].keys, keys);
  EXPECT_EQ(seen[2].pages, pages);
  EXPECT_EQ(seen[2].releases, releases);
  EXPECT_EQ(seen[3].kind, record_kind::sg_delete);
  EXPECT_EQ(seen[3].keys, keys);
  EXPECT_EQ(seen[4].kind, record_kind::sg_clear);
  EXPECT_EQ(seen[5].kind, record_kind::sg_get);
  EXPECT_EQ(seen[5].now, 13u);
  EXPECT_EQ(seen[6].kind, record_kind::sg_expire);
  EXPECT_EQ(seen[6].now, 14u);
  const store::record& snap = seen[7];
  EXPECT_EQ(snap.kind, record_kind::sg_snapshot_pool_runs);  // the free stack as runs
  EXPECT_EQ(snap.now, 15u);
  EXPECT_EQ(snap.num_pages, 7);
  EXPECT_EQ(snap.sg_epoch, 2u);
  EXPECT_EQ(snap.releases, free);
  EXPECT_EQ(snap.keys, keys);
  EXPECT_EQ(snap.pages, pages);
  EXPECT_EQ(snap.sg_flight_pages, (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(snap.sg_flight_keys, (std::vector<std::string_view>{"f", "g"}));
  EXPECT_EQ(snap.sg_flight_epochs, (std::vector<std::uint32_t>{2, 3}));
  EXPECT_EQ(snap.sg_flight_deadlines, (std::vector<std::uint64_t>{UINT64_MAX, 77}));
  EXPECT_EQ(seen[8].kind, record_kind::sg_reserve_full);
  EXPECT_EQ(seen[8].now, 16u);
  EXPECT_EQ(seen[8].keys, keys);
  EXPECT_EQ(seen[9].kind, record_kind::sg_reserve_capped);
  EXPECT_EQ(seen[9].now, 17u);
  EXPECT_EQ(seen[9].total, 3u);  // the keys that may take a free page
  EXPECT_EQ(seen[9].keys, keys);
  // Every kind's payload, cut short, does not decode.
  for (std::size_t at = 0, n = 0; at < log.size(); ++n) {
    std::string_view payload;
    std::size_t frame_bytes = 0;
    ASSERT_EQ(store::next_frame(log, at, payload, frame_bytes), store::frame_status::whole);
    store::record r;
    EXPECT_FALSE(store::decode_payload(payload.substr(0, payload.size() - 1), r)) << n;
    at += frame_bytes;
  }
}

// The SGLang release quarantine's records (kinds 40-42): a confirm whose releases are
// quarantined, a quarantine's end, a snapshot's quarantined pages. A plain sg_confirm
// (older directories, or the quarantine off) keeps its kind.
TEST(Record, SglangQuarantineKindsRoundTrip) {
  using store::record_kind;
  const store::sg_pool_name pool{"t", 7, "kv"};
  const std::vector<std::string_view> keys = {"a"};
  const std::vector<std::int64_t> pages = {4}, releases = {6, 2}, none;
  std::string log;
  store::append_sg_confirm(log, pool, 12, keys, pages, releases, true);
  store::append_sg_confirm(log, pool, 13, keys, pages, releases, false);
  store::append_sg_quarantine_end(log, pool, 14, releases);
  store::append_sg_snapshot_quarantine(log, pool, releases);
  store::append_sg_confirm(log, pool, 15, {}, {}, none, true);
  std::vector<store::record> seen;
  ASSERT_EQ(
      store::scan(log, [&](const store::record& r, std::size_t) { seen.push_back(r); }).status,
      store::scan_status::ok);
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(static_cast<int>(record_kind::sg_confirm_quarantined), 40);
  EXPECT_EQ(static_cast<int>(record_kind::sg_quarantine_end), 41);
  EXPECT_EQ(static_cast<int>(record_kind::sg_snapshot_quarantine), 42);
  EXPECT_EQ(seen[0].kind, record_kind::sg_confirm_quarantined);
  EXPECT_EQ(seen[0].now, 12u);
  EXPECT_EQ(seen[0].keys, keys);
  EXPECT_EQ(seen[0].pages, pages);
  EXPECT_EQ(seen[0].releases, releases);
  EXPECT_EQ(seen[1].kind, record_kind::sg_confirm);
  EXPECT_EQ(seen[2].kind, record_kind::sg_quarantine_end);
  EXPECT_EQ(seen[2].now, 14u);
  EXPECT_EQ(seen[2].releases, releases);
  EXPECT_EQ(seen[3].kind, record_kind::sg_snapshot_quarantine);
  EXPECT_EQ(std::string(seen[3].tenant) + "/" + std::to_string(seen[3].rank) + "/" +
                std::string(seen[3].ns),
            "t/7/kv");
  EXPECT_EQ(seen[3].releases, releases);
  EXPECT_EQ(seen[4].kind, record_kind::sg_confirm_quarantined);
  EXPECT_TRUE(seen[4].keys.empty());
  EXPECT_TRUE(seen[4].releases.empty());
  for (std::size_t at = 0, n = 0; at < log.size(); ++n) {
    std::string_view payload;
    std::size_t frame_bytes = 0;
    ASSERT_EQ(store::next_frame(log, at, payload, frame_bytes), store::frame_status::whole);
    store::record r;
    EXPECT_FALSE(store::decode_payload(payload.substr(0, payload.size() - 1), r)) << n;
    EXPECT_FALSE(store::decode_payload(std::string(payload) + "x", r)) << n;
    at += frame_bytes;
  }
}

// A tenant's own vLLM record (in_tenant): the name, then the record as ever. Scoping
// rewrites the frame in place (its length and checksum too); "" scopes nothing unless
// asked (a clear of the unnamed state); SGLang's kinds, a bad name, a prefix twice or a
// truncation anywhere are refused.
TEST(Record, TenantScopedRecordsRoundTripAndRejectWhatNoServerWrites) {
  const std::vector<std::string_view> keys = {kHexKey, kOddKey};
  const std::vector<std::int64_t> pages = {3, 4};
  std::string log;
  const auto scoped = [&](std::string_view tenant, auto append, bool always = false) {
    const std::size_t at = log.size();
    append(log);
    store::scope_to_tenant(log, at, tenant, always);
  };
  scoped("qwen-7b.v2", [&](std::string& out) { store::append_allocate(out, 5, keys); });
  scoped("qwen-7b.v2", [&](std::string& out) {
    store::append_confirm(out, 5, 2, keys, pages, pages, /*quarantined=*/true);
  });
  scoped("_t", [&](std::string& out) { store::append_directory_key(out, 2, kHexKey); });
  scoped("", [&](std::string& out) { store::append_initialize(out, 1, 8); });
  scoped(
      "", [&](std::string& out) { store::append_clear(out); }, /*always=*/true);
  scoped("_t", [&](std::string& out) { store::append_clear(out); });
  std::vector<store::record> seen;
  std::vector<std::string> tenants;
  const store::scan_result result = store::scan(log, [&](const store::record& r, std::size_t) {
    seen.push_back(r);
    tenants.emplace_back(std::string(r.tenant) + (r.scoped ? "+" : "-"));
  });
  ASSERT_EQ(result.status, store::scan_status::ok);
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(tenants,
            (std::vector<std::string>{"qwen-7b.v2+", "qwen-7b.v2+", "_t+", "-", "+", "_t+"}));
  EXPECT_EQ(seen[0].kind, store::record_kind::allocate);
  EXPECT_EQ(seen[0].rank, 5);
  EXPECT_EQ(seen[1].kind, store::record_kind::confirm_quarantined);
  EXPECT_EQ(seen[1].tp_world_size, 2);
  EXPECT_EQ(seen[2].kind, store::record_kind::directory_key);
  EXPECT_EQ(seen[2].keys[0], kHexKey);
  EXPECT_EQ(seen[3].kind, store::record_kind::initialize);
  EXPECT_EQ(seen[4].kind, store::record_kind::clear);
  EXPECT_EQ(seen[5].kind, store::record_kind::clear);

  std::string allocate;
  store::append_allocate(allocate, 5, keys);
  const std::string inner = payload_of(allocate);
  const auto prefix = [](std::string_view name) {
    std::string p(1, static_cast<char>(store::record_kind::in_tenant));
    const auto n = static_cast<std::uint32_t>(name.size());
    p.append(reinterpret_cast<const char*>(&n), 4);
    p.append(name);
    return p;
  };
  store::record r;
  const std::string of_a = prefix("a") + inner;
  ASSERT_TRUE(store::decode_payload(of_a, r));
  EXPECT_EQ(r.tenant, "a");
  std::string sg;
  store::append_sg_clear(sg, {"a", 0, "kv"});
  const std::vector<std::string> bad = {
      prefix("a") + payload_of(sg),       // SGLang's records name their tenant
      prefix("a") + prefix("b") + inner,  // scoped twice
      prefix("1a") + inner,               // not a tenant's name
      prefix("a b") + inner,
      prefix(std::string(65, 'a')) + inner,
      prefix("a"),  // nothing scoped
  };
  for (std::size_t i = 0; i < bad.size(); ++i)
    EXPECT_FALSE(store::decode_payload(bad[i], r)) << "case " << i;
  const std::string good = prefix("tenant") + inner;
  for (std::size_t cut = 0; cut < good.size(); ++cut)
    EXPECT_FALSE(store::decode_payload(std::string_view(good).substr(0, cut), r)) << cut;
  EXPECT_FALSE(store::decode_payload(good + '\0', r));
}
