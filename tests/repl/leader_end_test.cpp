// The node-free pieces of a leader core's end (src/repl/leader_end.hpp): the ack clock
// (when the standby is caught up, what stays unacked) and the retained bytes a resumed
// stream is sent.
#include "repl/leader_end.hpp"

#include <gtest/gtest.h>

#include <string>

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
