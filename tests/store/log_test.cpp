// Group commit: waiters resume once their bytes are durable; failures keep the bytes.
#include "store/log.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <coroutine>
#include <cstdio>
#include <string>

#include "log_waiter.hpp"

using namespace metad;

namespace {

using log_test::temp_fd;
using log_test::wait_for;

}  // namespace

TEST(LogWriter, WaitersResumeOnlyAfterTheirFlush) {
  store::log_writer log(temp_fd(), 0);
  log.pending() += "abc";
  int first = -1;
  wait_for(log, log.end(), first);
  EXPECT_EQ(first, -1) << "nothing is durable yet";
  ASSERT_TRUE(log.flush_due(false));
  store::log_writer::flush_job job = log.begin_flush();
  EXPECT_EQ(job.bytes, 3u);
  log.pending() += "de";  // arrives while the flush is in flight
  int second = -1;
  wait_for(log, log.end(), second);
  EXPECT_FALSE(log.flush_due(false)) << "one flush at a time";
  log.end_flush(::pwrite(job.fd, job.data, job.bytes, static_cast<off_t>(job.offset)), 0);
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, -1);
  job = log.begin_flush();
  EXPECT_EQ(job.offset, 3u);
  log.end_flush(static_cast<long>(job.bytes), 0);
  EXPECT_EQ(second, 1);
  EXPECT_EQ(log.durable(), 5u);
}

TEST(LogWriter, FailedFlushAnswersWaitersAndKeepsTheBytesForTheRetry) {
  store::log_writer log(temp_fd(), 10);
  log.pending() += "abcd";
  int result = -1;
  wait_for(log, log.end(), result);
  store::log_writer::flush_job job = log.begin_flush();
  log.pending() += "ef";
  log.end_flush(-28 /* ENOSPC */, 0);
  EXPECT_EQ(result, 0);
  EXPECT_TRUE(log.failing());
  EXPECT_FALSE(log.flush_due(false)) << "a failing disk is retried on the tick only";
  ASSERT_TRUE(log.flush_due(true));
  job = log.begin_flush();
  EXPECT_EQ(std::string(job.data, job.bytes), "abcdef");
  EXPECT_EQ(job.offset, 10u) << "rewritten where the failed write started";
  log.end_flush(static_cast<long>(job.bytes), 0);
  EXPECT_FALSE(log.failing());
  EXPECT_EQ(log.durable(), 16u);
}

// The write went through but fdatasync failed (EIO: the data may not be on the disk):
// nothing of the batch is durable, exactly as if the write had failed.
TEST(LogWriter, AFullWriteWhoseSyncFailedIsNotDurable) {
  store::log_writer log(temp_fd(), 10);
  log.pending() += "abcd";
  int result = -1;
  wait_for(log, log.end(), result);
  store::log_writer::flush_job job = log.begin_flush();
  log.end_flush(static_cast<long>(job.bytes), -5 /* EIO */);
  EXPECT_EQ(result, 0) << "the waiter is told its bytes are not durable";
  EXPECT_TRUE(log.failing());
  EXPECT_EQ(log.durable(), 10u);
  ASSERT_TRUE(log.flush_due(true));
  job = log.begin_flush();
  EXPECT_EQ(std::string(job.data, job.bytes), "abcd") << "the bytes stay queued";
  EXPECT_EQ(job.offset, 10u) << "at the same offset";
}

TEST(LogWriter, WithoutAFileEverythingIsDurableAtOnce) {
  store::log_writer log;
  int result = -1;
  wait_for(log, 100, result);
  EXPECT_EQ(result, 1);
}

TEST(LogWriter, WaitersSurviveASegmentSwitchWithPendingBytes) {
  store::log_writer log(temp_fd(), 0);
  log.pending() += "old";
  store::log_writer::flush_job job = log.begin_flush();
  log.pending() += "new!";  // appended after the cut: belongs to the next segment
  int result = -1;
  wait_for(log, log.end(), result);
  log.end_flush(static_cast<long>(job.bytes), 0);
  log.switch_segment(temp_fd());
  EXPECT_EQ(log.size(), 0u) << "a fresh segment file";
  ASSERT_TRUE(log.flush_due(false));
  job = log.begin_flush();
  EXPECT_EQ(job.offset, 0u) << "written at the start of the new file";
  EXPECT_EQ(std::string(job.data, job.bytes), "new!");
  log.end_flush(static_cast<long>(job.bytes), 0);
  EXPECT_EQ(result, 1) << "the waiter resumes once its bytes are durable in the new segment";
  EXPECT_EQ(log.size(), 4u);
  EXPECT_EQ(log.durable(), 7u);
}
