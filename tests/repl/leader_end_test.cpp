// The node-free pieces of a leader core's end (src/repl/leader_end.hpp): the ack clock
// (when the standby is caught up, what stays unacked) and the retained bytes a resumed
// stream is sent.
#include "repl/leader_end.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "store/record.hpp"
#include "temp_dir.hpp"

using namespace metad;

namespace {

constexpr std::uint64_t kLeaderEndMs = 1'000'000;

std::string retained_from(const repl::retained_log& r, std::uint64_t lsn) {
  std::string out;
  r.each_from(lsn, [&](std::string_view chunk) { out += chunk; });
  return out;
}

}  // namespace

TEST(ReplAckClock, CaughtUpOnceTheAckReachesTheHellosPositionAndOnlyOnce) {
  repl::ack_clock clock;
  clock.start(100, 1 * kLeaderEndMs, 500 * kLeaderEndMs);
  EXPECT_EQ(clock.oldest_unacked_ns(), 1 * kLeaderEndMs);  // the catch-up itself
  clock.sent(150, 2 * kLeaderEndMs);
  clock.sent(200, 3 * kLeaderEndMs);
  EXPECT_FALSE(clock.acked(99, 4 * kLeaderEndMs));
  EXPECT_EQ(clock.oldest_unacked_ns(), 1 * kLeaderEndMs);
  EXPECT_TRUE(clock.acked(150, 5 * kLeaderEndMs));
  EXPECT_EQ(clock.oldest_unacked_ns(), 3 * kLeaderEndMs);  // the write ending at 200
  EXPECT_FALSE(clock.acked(200, 6 * kLeaderEndMs));        // caught up already
  EXPECT_EQ(clock.oldest_unacked_ns(), 0u);
  clock.stop();
  EXPECT_EQ(clock.oldest_unacked_ns(), 0u);
  EXPECT_EQ(clock.slow_acks(), 0u);
}

TEST(ReplAckClock, OnlyWritesSentAfterTheCatchUpAreTimed) {
  repl::ack_clock clock;
  clock.start(10, 0, 100 * kLeaderEndMs);  // late: over 50 ms
  clock.sent(20, 1 * kLeaderEndMs);        // sent before the catch-up is acked
  EXPECT_TRUE(clock.acked(10, 1'000 * kLeaderEndMs));
  EXPECT_FALSE(clock.acked(20, 2'000 * kLeaderEndMs));  // late, but not timed
  EXPECT_EQ(clock.slow_since_ns(), 0u);
  for (std::uint64_t i = 0; i < 10; ++i) {  // each acked 90 ms after it was sent
    const std::uint64_t at = (3'000 + 100 * i) * kLeaderEndMs;
    clock.sent(30 + i, at);
    clock.acked(30 + i, at + 90 * kLeaderEndMs);
  }
  EXPECT_NE(clock.slow_since_ns(), 0u);
}

TEST(ReplRetainedLog, ResendsFromAnyPositionItStillHolds) {
  repl::retained_log r;
  EXPECT_FALSE(r.retaining());
  r.begin(10);
  const std::string a = "abcde", b = "fghij";
  r.keep(10, a.data(), a.size());
  r.keep(12, (a.substr(2) + b).data(), 8);  // overlaps what is held: only the new part
  EXPECT_EQ(r.from(), 10u);
  EXPECT_EQ(r.end(), 20u);
  EXPECT_EQ(retained_from(r, 10), "abcdefghij");
  EXPECT_EQ(retained_from(r, 13), "defghij");
  EXPECT_EQ(retained_from(r, 20), "");
}

TEST(ReplRetainedLog, KeepsAboutTheLastSixteenMebibytes) {
  repl::retained_log r;
  r.begin(0);
  const std::string chunk(std::size_t{1} << 20, 'x');
  for (std::uint64_t i = 0; i < 40; ++i) r.keep(i << 20, chunk.data(), chunk.size());
  EXPECT_EQ(r.end(), std::uint64_t{40} << 20);
  EXPECT_LE(r.end() - r.from(), repl::kRetainBytes + chunk.size());
  EXPECT_GE(r.end() - r.from(), repl::kRetainBytes);
  // A gap (never expected) starts the window again there.
  r.keep(std::uint64_t{50} << 20, chunk.data(), chunk.size());
  EXPECT_EQ(r.from(), std::uint64_t{50} << 20);
}

namespace {

// A log of `frames` initialize records of growing size (keys make them longer), cut into
// segment files at the given frame indices; returns the whole log.
std::string write_segments(const std::string& dir, const std::vector<std::size_t>& cuts,
                           std::size_t frames, std::vector<repl::log_file_pump::segment>& out,
                           std::vector<std::uint64_t>& boundaries) {
  std::string log;
  std::vector<std::string> files(1);
  std::size_t next_cut = 0;
  out.push_back({dir + "/core-0.log-1", 0});
  for (std::size_t i = 0; i < frames; ++i) {
    if (next_cut < cuts.size() && cuts[next_cut] == i) {
      ++next_cut;
      files.emplace_back();
      out.push_back({dir + "/core-0.log-" + std::to_string(out.size() + 1), log.size()});
    }
    boundaries.push_back(log.size());
    std::string frame;
    const std::string key(i * 37 % 3000, 'k');
    const std::string_view keys[] = {key};
    if (i % 2 == 0)
      store::append_initialize(frame, static_cast<std::int64_t>(i), 64);
    else
      store::append_allocate(frame, static_cast<std::int64_t>(i), keys);
    log += frame;
    files.back() += frame;
  }
  boundaries.push_back(log.size());
  for (std::size_t f = 0; f < files.size(); ++f) {
    std::ofstream o(out[f].path, std::ios::binary);
    o << files[f];
    // The file system may hold more than the log: a reservation past the written end.
    if (f + 1 == files.size()) o << std::string(4096, '\0');
  }
  return log;
}

}  // namespace

// From any frame boundary, in pieces of any size, across segment files, up to a bound that
// is a frame boundary: exactly the log's bytes, whole frames only.
TEST(ReplLogFilePump, StreamsTheLogFromAnyPositionAcrossSegmentsInWholeFrames) {
  sim::temp_dir dir("metad-pump");
  std::vector<repl::log_file_pump::segment> segments;
  std::vector<std::uint64_t> at;
  const std::string log = write_segments(dir.path(), {7, 8, 30}, 50, segments, at);
  for (std::size_t from = 0; from + 1 < at.size(); from += 3) {
    for (const std::size_t max : {1u, 200u, 5000u, 1u << 20}) {
      const std::uint64_t until = at[std::min(at.size() - 1, from + 20)];
      repl::log_file_pump pump;
      ASSERT_TRUE(pump.start(segments, at[from]));
      std::string got;
      while (pump.pos() < until) {
        const std::size_t before = got.size();
        ASSERT_TRUE(pump.read(got, max, until)) << pump.error();
        ASSERT_GT(got.size(), before);
        // Each piece ends on a frame boundary.
        EXPECT_NE(std::find(at.begin(), at.end(), pump.pos()), at.end());
      }
      EXPECT_EQ(pump.pos(), until);
      EXPECT_EQ(got, log.substr(at[from], until - at[from])) << "from " << from << " max " << max;
      std::string none;
      EXPECT_TRUE(pump.read(none, max, until));  // nothing more until more is written
      EXPECT_TRUE(none.empty());
    }
  }
}

TEST(ReplLogFilePump, AMissingSegmentOrADamagedLengthEndsTheStream) {
  sim::temp_dir dir("metad-pump");
  std::vector<repl::log_file_pump::segment> segments;
  std::vector<std::uint64_t> at;
  const std::string log = write_segments(dir.path(), {5}, 10, segments, at);
  {
    repl::log_file_pump pump;
    EXPECT_FALSE(pump.start({}, 0));  // no segment holds it
    ASSERT_TRUE(pump.start(segments, at[2]));
    std::filesystem::remove(segments[1].path);  // removed while the pump reads the first
    std::string got;
    while (pump.read(got, 1 << 20, log.size()) && pump.pos() < log.size()) {
    }
    EXPECT_EQ(pump.pos(), at[5]);
    EXPECT_NE(pump.error().find(segments[1].path), std::string::npos) << pump.error();
  }
  {
    // A length field that runs past the written end.
    std::string bad = log.substr(0, at[5]);
    const std::uint32_t huge = 1u << 30;
    std::memcpy(bad.data() + at[3], &huge, 4);
    std::ofstream(segments[0].path, std::ios::binary) << bad;
    repl::log_file_pump pump;
    ASSERT_TRUE(pump.start(segments, at[3]));
    std::string got;
    EXPECT_FALSE(pump.read(got, 1 << 20, at[5]));
    EXPECT_TRUE(got.empty());
    EXPECT_NE(pump.error().find("log position " + std::to_string(at[3])), std::string::npos)
        << pump.error();
  }
}

// The log switches to a new segment while the pump reads the one that was current when it
// started (a snapshot cut): once what it must send passes that segment's end, it reads on
// in the new one if told of it (extend); a pump that is not told reads the old file past
// its end and ends the stream.
TEST(ReplLogFilePump, ASegmentTheLogSwitchedToMeanwhileIsReadOn) {
  sim::temp_dir dir("metad-pump");
  std::vector<repl::log_file_pump::segment> segments;
  std::vector<std::uint64_t> at;
  const std::string log = write_segments(dir.path(), {6}, 12, segments, at);
  {
    repl::log_file_pump pump;
    ASSERT_TRUE(pump.start({segments[0]}, at[2]));  // the hello's list: segment 1 alone
    std::string got;
    EXPECT_FALSE(pump.read(got, 1 << 20, log.size()));  // past segment 1's end
    EXPECT_NE(pump.error().find("shorter"), std::string::npos) << pump.error();
  }
  repl::log_file_pump pump;
  ASSERT_TRUE(pump.start({segments[0]}, at[2]));
  pump.extend(segments[1]);
  pump.extend(segments[0]);  // known already: ignored
  std::string got;
  while (pump.pos() < log.size()) ASSERT_TRUE(pump.read(got, 1 << 20, log.size())) << pump.error();
  EXPECT_EQ(got, log.substr(at[2]));
}
