// Both ends' decisions: the leader's answer to a hello, the standby's verdict on batches
// (new, duplicate, overlapping, gap, wrong epoch, damaged) and the acks either side keeps.
#include "repl/session.hpp"

#include <gtest/gtest.h>

#include <string>

#include "store/record.hpp"

using namespace metad;

namespace {

using repl::answer_status;
using repl::follower;
using verdict = repl::follower::verdict;

repl::leader_view leader() {
  return {"prod",      /*epoch*/ 7, /*generation*/ 2, /*cores*/ 4, /*retained_from*/ 100,
          /*end*/ 1000};
}

repl::hello hello(std::uint64_t epoch, std::uint64_t generation, std::uint64_t lsn) {
  return {repl::kProtocolVersion, "prod", "b", epoch, generation, 4, 3, lsn};
}

TEST(ReplHandshake, AStandbyWithinTheRetainedLogStreamsFromItsPosition) {
  for (std::uint64_t lsn : {100u, 500u, 1000u}) {
    const repl::answer a = repl::answer_hello(hello(7, 2, lsn), leader());
    EXPECT_EQ(a.status, answer_status::stream);
    EXPECT_EQ(a.lsn, lsn);
    EXPECT_EQ(a.epoch, 7u);
    EXPECT_EQ(a.core, 3u);
  }
}

TEST(ReplHandshake, APositionTheLeaderDoesNotHoldNeedsASnapshot) {
  EXPECT_EQ(repl::answer_hello(hello(7, 2, 99), leader()).status, answer_status::need_snapshot);
  EXPECT_EQ(repl::answer_hello(hello(7, 2, 1001), leader()).status, answer_status::need_snapshot);
  EXPECT_EQ(repl::answer_hello(hello(7, 1, 500), leader()).status, answer_status::need_snapshot);
  // An older leadership's position may have forked from this one's log.
  EXPECT_EQ(repl::answer_hello(hello(6, 2, 500), leader()).status, answer_status::need_snapshot);
  // An empty standby follows nobody yet.
  EXPECT_EQ(repl::answer_hello(hello(0, 0, 0), leader()).status, answer_status::need_snapshot);
}

TEST(ReplHandshake, AStandbyOfANewerEpochDeposesTheLeader) {
  const repl::answer a = repl::answer_hello(hello(8, 2, 500), leader());
  EXPECT_EQ(a.status, answer_status::wrong_epoch);
  EXPECT_EQ(a.epoch, 7u);
}

TEST(ReplHandshake, AnotherClusterVersionOrCoreCountIsRefused) {
  repl::hello h = hello(7, 2, 500);
  h.cluster = "staging";
  EXPECT_EQ(repl::answer_hello(h, leader()).status, answer_status::refused);
  h = hello(7, 2, 500);
  h.cores = 8;
  EXPECT_EQ(repl::answer_hello(h, leader()).status, answer_status::refused);
  h = hello(7, 2, 500);
  h.core = 4;
  h.cores = 4;
  EXPECT_EQ(repl::answer_hello(h, leader()).status, answer_status::refused);
  for (const std::uint16_t version : {0, 4}) {
    h = hello(7, 2, 500);
    h.version = version;
    EXPECT_EQ(repl::answer_hello(h, leader()).status, answer_status::refused) << version;
  }
  // Standbys of versions 1 (no rank images in its snapshots) and 2 (no tenant's scoped
  // records) are served by a leader that has none of the latter ...
  for (const std::uint16_t version : {1, 2, 3}) {
    h = hello(7, 2, 500);
    h.version = version;
    EXPECT_EQ(repl::answer_hello(h, leader()).status, answer_status::stream) << version;
  }
  // ... and refused by one that has (--tenants-file): they fall back no further.
  repl::leader_view scoped = leader();
  scoped.min_version = repl::kScopedRecordsVersion;
  for (const std::uint16_t version : {1, 2}) {
    h = hello(7, 2, 500);
    h.version = version;
    EXPECT_EQ(repl::answer_hello(h, scoped).status, answer_status::refused) << version;
  }
  h = hello(7, 2, 500);
  EXPECT_EQ(repl::answer_hello(h, scoped).status, answer_status::stream);
}

// Frames of n records, as a log would hold them.
std::string frames(int n, int from = 0) {
  std::string out;
  for (int i = 0; i < n; ++i) store::append_initialize(out, from + i, 8);
  return out;
}

repl::batch batch(std::uint64_t epoch, std::uint64_t start, std::string_view bytes) {
  return {epoch, 2, 3, start, bytes};
}

TEST(ReplFollower, TakesTheLeadersEpochFromAStreamAnswer) {
  follower f(0, 2, 3, 0);
  EXPECT_FALSE(f.on_answer({answer_status::need_snapshot, 7, 2, 3, 0}));
  EXPECT_FALSE(f.on_answer({answer_status::stream, 7, 2, 3, 5}));  // not where we are
  EXPECT_FALSE(f.on_answer({answer_status::stream, 7, 1, 3, 0}));  // another generation
  EXPECT_TRUE(f.on_answer({answer_status::stream, 7, 2, 3, 0}));
  EXPECT_EQ(f.epoch(), 7u);
  EXPECT_FALSE(f.on_answer({answer_status::stream, 6, 2, 3, 0}));  // never back
}

TEST(ReplFollower, AnEmptyStandbyTakesASnapshotThenBatchesFromItsPosition) {
  follower f(0, 0, 3, 0);
  const std::string piece = frames(2);
  EXPECT_FALSE(f.on_snapshot({7, 2, 3, 900, true, piece}));  // not asked for
  EXPECT_FALSE(f.on_snapshot_answer({answer_status::stream, 7, 2, 3, 900}));
  EXPECT_FALSE(f.on_snapshot_answer({answer_status::need_snapshot, 7, 2, 4, 900}));  // core
  ASSERT_TRUE(f.on_snapshot_answer({answer_status::need_snapshot, 7, 2, 3, 900}));
  EXPECT_TRUE(f.awaiting_snapshot());
  EXPECT_EQ(f.on_batch(batch(7, 900, piece)).v, verdict::wrong_stream);  // snapshot first
  EXPECT_FALSE(f.on_snapshot({7, 2, 3, 901, false, piece}));             // another position
  EXPECT_FALSE(f.on_snapshot({7, 1, 3, 900, false, piece}));             // another generation
  EXPECT_TRUE(f.on_snapshot({7, 2, 3, 900, false, piece}));
  EXPECT_EQ(f.received(), 0u);
  EXPECT_TRUE(f.on_snapshot({7, 2, 3, 900, true, piece}));
  EXPECT_FALSE(f.awaiting_snapshot());
  EXPECT_EQ(f.received(), 900u);
  EXPECT_EQ(f.durable(900).lsn, 900u);  // the snapshot is acked at its position
  const std::string more = frames(1, 5);
  const follower::result r = f.on_batch(batch(7, 900, more));
  ASSERT_EQ(r.v, verdict::apply);
  EXPECT_EQ(r.start_lsn, 900u);
  EXPECT_FALSE(f.on_snapshot_answer({answer_status::need_snapshot, 8, 2, 3, 0}));  // not empty
}

TEST(ReplFollower, AppliesNewBatchesInOrderAndAcksWhatIsDurable) {
  const std::string a = frames(2), b = frames(3, 2);
  follower f(7, 2, 3, 0);
  follower::result r = f.on_batch(batch(7, 0, a));
  ASSERT_EQ(r.v, verdict::apply);
  EXPECT_EQ(r.bytes, a);
  EXPECT_EQ(r.start_lsn, 0u);
  r = f.on_batch(batch(7, a.size(), b));  // before the first is durable: pipelined
  ASSERT_EQ(r.v, verdict::apply);
  EXPECT_EQ(r.start_lsn, a.size());
  EXPECT_EQ(f.received(), a.size() + b.size());
  EXPECT_EQ(f.acked(), 0u);
  const repl::ack k = f.durable(a.size());
  EXPECT_EQ(k.lsn, a.size());
  EXPECT_EQ(k.epoch, 7u);
  EXPECT_EQ(k.generation, 2u);
  EXPECT_EQ(k.core, 3u);
  EXPECT_EQ(f.durable(a.size() + b.size()).lsn, a.size() + b.size());
}

TEST(ReplFollower, ABatchItHasIsAckedNotAppliedTwice) {
  const std::string a = frames(2);
  follower f(7, 2, 3, 0);
  ASSERT_EQ(f.on_batch(batch(7, 0, a)).v, verdict::apply);
  f.durable(a.size());
  const follower::result r = f.on_batch(batch(7, 0, a));
  EXPECT_EQ(r.v, verdict::duplicate);
  EXPECT_TRUE(r.bytes.empty());
  EXPECT_EQ(f.received(), a.size());
  EXPECT_EQ(f.current_ack().lsn, a.size());
  EXPECT_EQ(f.on_batch(batch(7, 0, "")).v, verdict::duplicate);
}

TEST(ReplFollower, AnOverlappingBatchAppliesOnlyItsNewFrames) {
  const std::string a = frames(2), b = frames(3, 2);
  follower f(7, 2, 3, 0);
  ASSERT_EQ(f.on_batch(batch(7, 0, a)).v, verdict::apply);
  const std::string resent = a + b;  // resent from the start
  const follower::result r = f.on_batch(batch(7, 0, resent));
  ASSERT_EQ(r.v, verdict::apply);
  EXPECT_EQ(r.bytes, b);
  EXPECT_EQ(r.start_lsn, a.size());
}

// A stream broke after the standby received a and b but made only a durable: its next
// hello names (epoch, generation, a's end); the leader resends from there, and only what
// the standby does not hold yet is applied.
TEST(ReplFollower, AfterABrokenStreamItResumesFromWhatItAckedAndSkipsTheResentBytes) {
  const std::string a = frames(2), b = frames(3, 2), c = frames(1, 5);
  follower f(7, 2, 3, 0);
  ASSERT_EQ(f.on_batch(batch(7, 0, a)).v, verdict::apply);
  f.durable(a.size());
  ASSERT_EQ(f.on_batch(batch(7, a.size(), b)).v, verdict::apply);
  const repl::hello h = hello(f.epoch(), f.generation(), f.acked());
  repl::leader_view view = leader();
  view.retained_from = 0;
  view.end = a.size() + b.size() + c.size();
  const repl::answer answer = repl::answer_hello(h, view);
  ASSERT_EQ(answer.status, answer_status::stream);
  EXPECT_EQ(answer.lsn, a.size());
  ASSERT_TRUE(f.on_answer(answer));
  const std::string resent = b + c;  // r.bytes views it
  const follower::result r = f.on_batch(batch(7, a.size(), resent));
  ASSERT_EQ(r.v, verdict::apply);
  EXPECT_EQ(r.bytes, c);
  EXPECT_EQ(r.start_lsn, a.size() + b.size());
  // A position the leader no longer keeps, or another leadership: no resuming.
  view.retained_from = a.size() + 1;
  EXPECT_EQ(repl::answer_hello(h, view).status, answer_status::need_snapshot);
  EXPECT_EQ(repl::answer_hello(hello(6, 2, a.size()), leader()).status,
            answer_status::need_snapshot);
}

TEST(ReplFollower, ABatchBeyondWhatItHasIsAGap) {
  const std::string a = frames(2), b = frames(1, 2);
  follower f(7, 2, 3, 0);
  EXPECT_EQ(f.on_batch(batch(7, a.size(), b)).v, verdict::gap);
  EXPECT_EQ(f.received(), 0u);
  ASSERT_EQ(f.on_batch(batch(7, 0, a)).v, verdict::apply);
  EXPECT_EQ(f.on_batch(batch(7, a.size() + 1, b)).v, verdict::gap);
  EXPECT_EQ(f.on_batch(batch(7, a.size(), b)).v, verdict::apply);
}

TEST(ReplFollower, AnotherEpochsBatchIsRefusedAndNotAcked) {
  const std::string a = frames(2);
  follower f(7, 2, 3, 0);
  EXPECT_EQ(f.on_batch(batch(6, 0, a)).v, verdict::wrong_epoch);  // a deposed leader
  EXPECT_EQ(f.on_batch(batch(8, 0, a)).v, verdict::wrong_epoch);  // not without a handshake
  EXPECT_EQ(f.received(), 0u);
  EXPECT_EQ(f.current_ack().lsn, 0u);
}

TEST(ReplFollower, AnotherGenerationOrCoreIsAProtocolError) {
  const std::string a = frames(1);
  follower f(7, 2, 3, 0);
  EXPECT_EQ(f.on_batch({7, 1, 3, 0, a}).v, verdict::wrong_stream);
  EXPECT_EQ(f.on_batch({7, 2, 2, 0, a}).v, verdict::wrong_stream);
}

TEST(ReplFollower, BytesThatAreNotWholeFramesAreRefused) {
  const std::string a = frames(2);
  follower f(7, 2, 3, 0);
  EXPECT_EQ(f.on_batch(batch(7, 0, a.substr(0, a.size() - 1))).v, verdict::bad_frames);
  std::string damaged = a;
  damaged[10] ^= 1;
  EXPECT_EQ(f.on_batch(batch(7, 0, damaged)).v, verdict::bad_frames);
  EXPECT_EQ(f.received(), 0u);
  // An overlap that does not end on one of our frame boundaries.
  ASSERT_EQ(f.on_batch(batch(7, 0, a)).v, verdict::apply);
  EXPECT_EQ(f.on_batch(batch(7, 1, a)).v, verdict::bad_frames);
}

TEST(ReplLeaderStream, SendsContiguousBatchesAndTakesOnlyPlausibleAcks) {
  repl::leader_stream s(7, 2, 3, 100);
  std::string out;
  s.send(out, frames(2));
  const std::uint64_t sent = s.sent();
  EXPECT_EQ(sent, 100 + frames(2).size());
  repl::decoder d;
  d.feed(out);
  ASSERT_EQ(d.next(), repl::decoder::status::message);
  EXPECT_EQ(d.batch.start_lsn, 100u);
  EXPECT_FALSE(s.on_ack({7, 2, 3, sent + 1}));  // never sent
  EXPECT_FALSE(s.on_ack({6, 2, 3, sent}));      // another epoch
  EXPECT_FALSE(s.on_ack({7, 1, 3, sent}));
  EXPECT_FALSE(s.on_ack({7, 2, 0, sent}));
  EXPECT_TRUE(s.on_ack({7, 2, 3, 110}));
  EXPECT_FALSE(s.on_ack({7, 2, 3, 105}));  // backwards
  EXPECT_TRUE(s.on_ack({7, 2, 3, sent}));
  EXPECT_EQ(s.acked(), sent);
}

}  // namespace
