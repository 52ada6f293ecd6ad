// One core's append-only log with group commit. Records are appended to a pending
// buffer; once per loop iteration the loop takes all of it (begin_flush), writes it at
// the log's end and fdatasyncs it, then reports back (end_flush), which resumes every
// request that was waiting for those bytes to be durable. Touched only by its core.
#pragma once

#include <coroutine>
#include <cstdint>
#include <deque>
#include <string>

#include "metad/assert.hpp"
#include "smp/flush_job.hpp"

namespace metad::store {

class log_writer {
 public:
  log_writer() = default;
  // Takes ownership of fd, an open log segment already holding `size` valid bytes.
  log_writer(int fd, std::uint64_t size);
  ~log_writer();
  log_writer(const log_writer&) = delete;
  log_writer& operator=(const log_writer&) = delete;

  bool enabled() const { return fd_ >= 0; }
  // Appenders (store::append_*) write whole frames here.
  std::string& pending() { return pending_; }
  // Positions are log-wide and only grow (a new segment continues where the last ended):
  // waiting for end() makes everything appended so far durable.
  std::uint64_t end() const { return durable_ + in_flight_.size() + pending_.size(); }
  std::uint64_t durable() const { return durable_; }
  // The last flush or reservation failed (disk full, I/O error): mutations are refused.
  bool failing() const { return failing_; }
  // Called before a change is made: reserves disk space (fallocate) for `bytes` more of
  // records, so a full disk refuses the request before anything changes rather than
  // failing its write afterwards. False: refuse the request (503). A failing log also
  // retries here, so writes resume once space returns.
  bool make_room(std::uint64_t bytes);
  // Durable bytes of the current segment file.
  std::uint64_t size() const { return durable_ - segment_start_; }
  // The log position where the current segment file starts.
  std::uint64_t segment_start() const { return segment_start_; }

  // A write + fdatasync the loop should issue now, if any.
  using flush_job = smp::flush_job;
  bool flush_due(bool retry_failed) const;
  flush_job begin_flush();
  // written: bytes written or -errno; synced: fdatasync's result (0 or -errno).
  void end_flush(long written, int synced);

  // co_await durable_until(lsn): true once [0, lsn) is durable, false if a flush failed
  // first (the caller answers 503; the bytes stay queued and are retried). With a
  // synchronous standby, durable means on both disks: [0, lsn) fdatasynced here and
  // acknowledged by the standby (committed()).
  struct wait_awaiter {
    log_writer& log;
    std::uint64_t lsn;
    bool ok = true;
    bool await_ready() const noexcept { return log.fd_ < 0 || log.committed_ >= lsn; }
    void await_suspend(std::coroutine_handle<> h) {
      // Waiters queue in position order (end() only grows), so a flush resumes a prefix.
      METAD_ASSERT(log.waiters_.empty() || log.waiters_.back().lsn <= lsn);
      METAD_ASSERT(lsn <= log.end());
      log.waiters_.push_back({lsn, h, &ok});
    }
    bool await_resume() const noexcept { return ok; }
  };
  wait_awaiter durable_until(std::uint64_t lsn) { return {*this, lsn}; }

  // Synchronous replication (docs/replication.md, "Synchronous commit"). While a standby
  // is required, waiters resume at min(durable, replicated): the local fdatasync and the
  // standby's ack of the same position, whichever comes last. Without one (the default) only the
  // local watermark counts, as before.
  void require_standby(bool on);
  bool standby_required() const { return standby_required_; }
  // The standby acknowledged [0, lsn) durable (it may do so before the local fdatasync
  // returns: it was sent the same bytes). Positions only grow, and never past end().
  void replicated_until(std::uint64_t lsn);
  std::uint64_t replicated() const { return replicated_; }
  // What waiters may count as durable.
  std::uint64_t committed() const { return committed_; }

  // Swaps in a new segment (after a snapshot): the old fd is closed. Only when nothing is
  // in flight; what is pending goes to the new segment.
  void switch_segment(int fd);
  bool idle() const { return in_flight_.empty() && pending_.empty(); }

 private:
  struct waiter {
    std::uint64_t lsn;
    std::coroutine_handle<> handle;
    bool* ok;
  };

  int fd_ = -1;
  std::uint64_t durable_ = 0;     // log position known durable
  std::uint64_t replicated_ = 0;  // log position the standby acknowledged durable
  bool standby_required_ = false;
  // durable_, or min(durable_, replicated_) while a standby is required: kept in step
  // with both, so that a waiter's check costs what it did before replication.
  std::uint64_t committed_ = 0;
  void update_committed() {
    committed_ = standby_required_ && replicated_ < durable_ ? replicated_ : durable_;
  }
  std::uint64_t segment_start_ = 0;  // log position where the current segment file starts
  std::string pending_;              // appended, not yet handed to the loop
  std::string in_flight_;            // being written
  bool failing_ = false;
  std::uint64_t allocated_ = 0;  // bytes of the current segment file reserved on disk
  std::deque<waiter> waiters_;   // in lsn order

  // Resumes the waiters up to committed(); all of them after a failed flush (false
  // for those not committed).
  void resume_waiters(bool failed);
};

}  // namespace metad::store
