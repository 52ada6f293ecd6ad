// Log record framing: round trips, torn tails dropped, corruption in the middle caught.
#include "store/record.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

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

TEST(Record, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(store::crc32c("123456789"), 0xE3069283u);
}
