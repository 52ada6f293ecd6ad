// The sync set's decisions, one transition at a time (src/repl/sync_set.hpp), and its two
// core-side pieces: the requirement's mark and the late-ack average.
#include "repl/sync_set.hpp"

#include <gtest/gtest.h>

#include <vector>

using namespace metad;

namespace {

using repl::progress;
using repl::sync_actions;
using state = repl::sync_set::state;

constexpr std::uint64_t kMs = 1'000'000;

// Two cores, both caught up and applied, acked, at t = 1000 s.
struct sync_table {
  repl::sync_set set{repl::sync_config{}};
  std::vector<repl::core_report> cores{2, {progress::caught_up, true, 0, 0, 0}};
  std::uint64_t now = 1'000'000 * kMs;
  std::int64_t epoch = 3;
  bool written = false;

  sync_actions step() { return set.step({epoch, now, cores, written}); }
  // alone → requiring → publishing → in_sync.
  void into_sync() {
    EXPECT_EQ(step().require, sync_actions::require_change::on);
    EXPECT_EQ(step().write, sync_actions::sync_write::standby);
    written = true;
    EXPECT_EQ(step().why, sync_actions::reason::published);
    written = false;
    ASSERT_TRUE(set.in_sync());
  }
};

TEST(SyncSet, JoinsOnlyWhenEveryCoreCaughtUpThenRequiresBeforePublishing) {
  sync_table t;
  t.cores[1].state = progress::catching_up;
  EXPECT_EQ(t.step().require, sync_actions::require_change::none);
  EXPECT_EQ(t.set.current(), state::alone);
  t.cores[1].state = progress::caught_up;
  t.cores[1].require_applied = false;
  sync_actions a = t.step();
  EXPECT_EQ(a.require, sync_actions::require_change::on);
  EXPECT_EQ(a.write, sync_actions::sync_write::none);  // not before every core requires it
  EXPECT_EQ(t.set.current(), state::requiring);
  EXPECT_EQ(t.step().write, sync_actions::sync_write::none);
  t.cores[1].require_applied = true;
  EXPECT_EQ(t.step().write, sync_actions::sync_write::standby);
  EXPECT_EQ(t.set.current(), state::publishing);
  EXPECT_FALSE(t.set.in_sync());  // until etcd has it
  EXPECT_EQ(t.step().why, sync_actions::reason::none);
  t.written = true;
  EXPECT_EQ(t.step().why, sync_actions::reason::published);
  EXPECT_TRUE(t.set.in_sync());
}

TEST(SyncSet, LaggingWhileRequiringReleasesAtOnceWithoutWritingSync) {
  sync_table t;
  t.cores[0].require_applied = false;
  t.step();
  ASSERT_EQ(t.set.current(), state::requiring);
  t.cores[0].oldest_unacked_ns = t.now;
  t.now += 501 * kMs;
  sync_actions a = t.step();
  EXPECT_EQ(a.require, sync_actions::require_change::off);
  EXPECT_TRUE(a.close_streams);
  EXPECT_EQ(a.write, sync_actions::sync_write::none);
  EXPECT_EQ(a.why, sync_actions::reason::lost_before_sync);
  EXPECT_EQ(t.set.current(), state::alone);
}

TEST(SyncSet, ASilentStandbyIsDroppedSyncFirstThenTheRequirement) {
  sync_table t;
  t.into_sync();
  t.cores[1].oldest_unacked_ns = t.now;
  t.now += 500 * kMs;  // the bound itself is still in time
  EXPECT_EQ(t.step().why, sync_actions::reason::none);
  t.now += 1 * kMs;
  sync_actions a = t.step();
  EXPECT_EQ(a.why, sync_actions::reason::stopped_acking);
  EXPECT_TRUE(a.close_streams);
  EXPECT_EQ(a.write, sync_actions::sync_write::nobody);
  EXPECT_EQ(a.require, sync_actions::require_change::none);  // writes still wait
  EXPECT_EQ(t.set.current(), state::dropping);
  EXPECT_EQ(t.step().require, sync_actions::require_change::none);  // /sync not yet written
  t.written = true;
  a = t.step();
  EXPECT_EQ(a.require, sync_actions::require_change::off);
  EXPECT_EQ(a.why, sync_actions::reason::dropped);
  EXPECT_EQ(t.set.current(), state::alone);
}

TEST(SyncSet, AStreamThatEndsInTheSetIsADrop) {
  sync_table t;
  t.into_sync();
  t.cores[0].state = progress::none;
  EXPECT_EQ(t.step().why, sync_actions::reason::stopped_acking);
}

TEST(SyncSet, LateAcksDropTheStandbyAndHoldItsRejoin) {
  sync_table t;
  t.into_sync();
  t.cores[0].slow_since_ns = t.now;
  t.cores[0].slow_acks = 3;
  t.now += 2000 * kMs - 1;  // 4 × --sync-timeout-ms
  EXPECT_EQ(t.step().why, sync_actions::reason::none);
  t.now += 1;
  t.cores[0].slow_acks = 2;  // too few acks say nothing yet
  EXPECT_EQ(t.step().why, sync_actions::reason::none);
  t.cores[0].slow_acks = 3;
  EXPECT_EQ(t.step().why, sync_actions::reason::late_acks);
  t.written = true;
  EXPECT_EQ(t.step().why, sync_actions::reason::dropped);
  t.written = false;
  t.cores[0] = {progress::caught_up, true, 0, 0, 0};
  t.now += 29'999 * kMs;
  EXPECT_EQ(t.step().require, sync_actions::require_change::none);  // the rejoin pause
  t.now += 1 * kMs;
  EXPECT_EQ(t.step().require, sync_actions::require_change::on);
}

TEST(SyncSet, ACatchingUpStandbySilentForAMinuteHasItsStreamsClosed) {
  sync_table t;
  t.cores[0].state = progress::catching_up;
  t.cores[0].oldest_unacked_ns = t.now;
  t.now += 60'000 * kMs;
  EXPECT_FALSE(t.step().close_streams);
  t.now += 1;
  sync_actions a = t.step();
  EXPECT_TRUE(a.close_streams);
  EXPECT_EQ(a.why, sync_actions::reason::catch_up_silent);
  EXPECT_EQ(t.set.current(), state::alone);
}

TEST(SyncSet, ANewEpochStartsOverAloneAndNoEpochDecidesNothing) {
  sync_table t;
  t.into_sync();
  t.epoch = 4;
  sync_actions a = t.step();
  EXPECT_EQ(a.require, sync_actions::require_change::off);
  EXPECT_EQ(a.why, sync_actions::reason::new_epoch);
  EXPECT_EQ(t.set.current(), state::alone);
  t.epoch = 0;
  EXPECT_EQ(t.step().require, sync_actions::require_change::none);
  EXPECT_EQ(t.set.current(), state::alone);
  t.epoch = 5;
  EXPECT_EQ(t.step().require, sync_actions::require_change::on);
}

TEST(CoreRequirement, AppliedOnlyOnceTheStandbyHoldsWhatWasAnsweredBefore) {
  repl::core_requirement r;
  EXPECT_FALSE(r.poll(false, 100, 40));
  EXPECT_FALSE(r.applied());
  EXPECT_TRUE(r.poll(true, 120, 40));  // writes up to 120 were answered without it
  EXPECT_FALSE(r.applied());
  EXPECT_TRUE(r.poll(true, 200, 119));
  EXPECT_FALSE(r.applied());
  EXPECT_TRUE(r.poll(true, 250, 120));  // the mark stays where the requirement began
  EXPECT_TRUE(r.applied());
  EXPECT_FALSE(r.poll(false, 250, 120));
  EXPECT_FALSE(r.applied());
  EXPECT_TRUE(r.poll(true, 300, 250));  // a new requirement, a new mark
  EXPECT_FALSE(r.applied());
}

TEST(CoreRequirement, AnIdleCoreIsAppliedAtOnce) {
  repl::core_requirement r;
  EXPECT_TRUE(r.poll(true, 0, 0));
  EXPECT_TRUE(r.applied());
}

TEST(AckLatency, LateOnAverageSinceTheFirstLateWriteAndBackOnTime) {
  repl::ack_latency l(500 * kMs);
  l.on_ack(10 * kMs, 1000 * kMs);
  EXPECT_EQ(l.slow_since_ns(), 0u);
  l.on_ack(1000 * kMs, 2000 * kMs);  // EWMA 257.5 ms: above 250
  EXPECT_EQ(l.slow_since_ns(), 1000 * kMs);
  EXPECT_EQ(l.slow_acks(), 1u);
  l.on_ack(300 * kMs, 2100 * kMs);
  EXPECT_EQ(l.slow_since_ns(), 1000 * kMs);
  EXPECT_EQ(l.slow_acks(), 2u);
  for (int i = 0; i < 10; ++i) l.on_ack(1 * kMs, 2200 * kMs);
  EXPECT_EQ(l.slow_since_ns(), 0u);
  EXPECT_EQ(l.slow_acks(), 0u);
  l.on_ack(5000 * kMs, 9000 * kMs);
  l.reset();
  EXPECT_EQ(l.slow_since_ns(), 0u);
}

}  // namespace
