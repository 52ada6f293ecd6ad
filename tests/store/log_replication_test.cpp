// The second watermark: with a synchronous standby, a waiter resumes only once its bytes
// are durable here *and* acknowledged by the standby, in whichever order those come;
// without one, nothing changes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <coroutine>
#include <cstdio>
#include <string>

#include "log_waiter.hpp"
#include "store/log.hpp"

using namespace metad;

namespace {

using log_test::temp_fd;
using log_test::wait_for;

// Appends `bytes`, starts a waiter for the end, and begins the flush (write + fdatasync
// in flight; the same bytes go to the standby).
store::log_writer::flush_job append_and_flush(store::log_writer& log, const std::string& bytes,
                                              int& result) {
  log.pending() += bytes;
  wait_for(log, log.end(), result);
  return log.begin_flush();
}

void finish(store::log_writer& log, const store::log_writer::flush_job& job) {
  log.end_flush(static_cast<long>(job.bytes), 0);
}

}  // namespace

TEST(LogReplication, LocalFirstThenTheStandbysAckResumes) {
  store::log_writer log(temp_fd(), 0);
  log.require_standby(true);
  int result = -1;
  const auto job = append_and_flush(log, "abc", result);
  EXPECT_EQ(job.lsn, 0u);
  finish(log, job);
  EXPECT_EQ(log.durable(), 3u);
  EXPECT_EQ(log.committed(), 0u);
  EXPECT_EQ(result, -1) << "durable here, not yet on the standby";
  log.replicated_until(2);
  EXPECT_EQ(result, -1) << "the standby has only part of it";
  log.replicated_until(3);
  EXPECT_EQ(result, 1);
  EXPECT_EQ(log.committed(), 3u);
}

TEST(LogReplication, StandbyFirstThenTheLocalFlushResumes) {
  store::log_writer log(temp_fd(), 0);
  log.require_standby(true);
  int result = -1;
  const auto job = append_and_flush(log, "abcd", result);
  log.replicated_until(4);  // the standby's fdatasync returned before ours
  EXPECT_EQ(result, -1);
  EXPECT_EQ(log.committed(), 0u);
  finish(log, job);
  EXPECT_EQ(result, 1);
}

TEST(LogReplication, ALaggingStandbyHoldsBackOnlyWhatItHasNotAcked) {
  store::log_writer log(temp_fd(), 0);
  log.require_standby(true);
  int first = -1, second = -1, third = -1;
  auto job = append_and_flush(log, "aa", first);
  finish(log, job);
  job = append_and_flush(log, "bbb", second);
  finish(log, job);
  job = append_and_flush(log, "c", third);
  finish(log, job);
  EXPECT_EQ(log.durable(), 6u);
  EXPECT_EQ(first + second + third, -3) << "all durable here, none acked";
  log.replicated_until(5);  // the standby catches up to the second batch
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 1);
  EXPECT_EQ(third, -1);
  log.replicated_until(4);  // a stale ack changes nothing
  EXPECT_EQ(log.replicated(), 5u);
  log.replicated_until(6);
  EXPECT_EQ(third, 1);
}

TEST(LogReplication, DroppingTheStandbyReleasesWhatIsDurableHere) {
  store::log_writer log(temp_fd(), 0);
  log.require_standby(true);
  int first = -1, second = -1;
  auto job = append_and_flush(log, "aa", first);
  finish(log, job);
  job = append_and_flush(log, "bb", second);  // in flight
  log.require_standby(false);  // the standby stopped acking and was dropped from /sync
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, -1) << "not durable anywhere yet";
  finish(log, job);
  EXPECT_EQ(second, 1);
}

TEST(LogReplication, AFailedLocalFlushAnswersEvenWhatTheStandbyHas) {
  store::log_writer log(temp_fd(), 0);
  log.require_standby(true);
  int result = -1;
  append_and_flush(log, "abc", result);
  log.replicated_until(3);
  log.end_flush(-5 /* EIO */, 0);
  EXPECT_EQ(result, 0) << "the local log must hold what is answered";
  EXPECT_TRUE(log.failing());
}

TEST(LogReplication, AFailedLocalFlushAnswersWhatIsDurableHereButNotAcked) {
  store::log_writer log(temp_fd(), 0);
  log.require_standby(true);
  int first = -1, second = -1;
  auto job = append_and_flush(log, "aa", first);
  finish(log, job);
  job = append_and_flush(log, "bb", second);
  log.end_flush(-5 /* EIO */, 0);
  // A failure answers every waiter (503: unknown outcome, the client retries); the
  // bytes stay queued at the same position.
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 0);
  EXPECT_EQ(log.durable(), 2u);
}

TEST(LogReplication, WithoutAStandbyAcksChangeNothing) {
  store::log_writer log(temp_fd(), 0);
  int result = -1;
  const auto job = append_and_flush(log, "abc", result);
  log.replicated_until(3);
  EXPECT_EQ(result, -1) << "only the local fdatasync counts";
  finish(log, job);
  EXPECT_EQ(result, 1);
  EXPECT_FALSE(log.standby_required());
}

TEST(LogReplication, AnAlreadyCommittedPositionIsReadyAtOnce) {
  store::log_writer log(temp_fd(), 0);
  log.require_standby(true);
  int result = -1;
  const auto job = append_and_flush(log, "ab", result);
  finish(log, job);
  log.replicated_until(2);
  ASSERT_EQ(result, 1);
  int again = -1;
  wait_for(log, 2, again);
  EXPECT_EQ(again, 1);
}
