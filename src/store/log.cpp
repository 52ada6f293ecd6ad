#include "store/log.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "metad/assert.hpp"

namespace metad::store {

log_writer::log_writer(int fd, std::uint64_t size)
    : fd_(fd), durable_(size), committed_(size), allocated_(size) {}

log_writer::~log_writer() {
  if (fd_ >= 0) ::close(fd_);
}

bool log_writer::make_room(std::uint64_t bytes) {
  if (fd_ < 0) return true;
  // A failed write still queued must go out first; a failed reservation is retried.
  if (failing_ && !(pending_.empty() && in_flight_.empty())) return false;
  // In bytes of the current segment file.
  const std::uint64_t needed = end() - segment_start_ + bytes;
  if (needed <= allocated_ && !failing_) return true;
  // Once the disk was found full, writes resume only with real headroom again, rather
  // than trickling into the last reserved bytes.
  constexpr std::uint64_t kChunk = 16u << 20;     // few fallocate calls, little waste
  constexpr std::uint64_t kHeadroom = 64u << 10;  // the least a recovering log asks for
  const std::uint64_t from = std::max(allocated_, size() + in_flight_.size());
  const std::uint64_t least = failing_ ? std::max(needed, from) + kHeadroom : needed;
  const std::uint64_t wants[] = {std::max(needed, from) + kChunk,
                                 (least + 4095) & ~std::uint64_t{4095}};
  for (std::uint64_t want : wants) {
    if (want <= from) continue;
    if (::fallocate(fd_, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from),
                    static_cast<off_t>(want - from)) == 0) {
      allocated_ = want;
      failing_ = false;
      return true;
    }
    if (errno == EOPNOTSUPP) {  // no preallocation here: rely on the write's own check
      allocated_ = ~std::uint64_t{0};
      return true;
    }
  }
  failing_ = true;
  return false;
}

bool log_writer::flush_due(bool retry_failed) const {
  if (fd_ < 0 || !in_flight_.empty() || pending_.empty()) return false;
  return !failing_ || retry_failed;  // a failing disk is retried at the tick's pace
}

log_writer::flush_job log_writer::begin_flush() {
  METAD_ASSERT(fd_ >= 0 && in_flight_.empty() && !pending_.empty());
  in_flight_.swap(pending_);
  return {fd_, in_flight_.data(), in_flight_.size(), size(), durable_};
}

void log_writer::end_flush(long written, int synced) {
  METAD_ASSERT(!in_flight_.empty());  // a flush was begun
  const bool ok = written == static_cast<long>(in_flight_.size()) && synced == 0;
  if (ok) {
    // Positions only grow, and never past what was appended.
    METAD_ASSERT(durable_ + in_flight_.size() <= end());
    durable_ += in_flight_.size();
    update_committed();
    in_flight_.clear();
    failing_ = false;
  } else {
    // Nothing of this batch counts as durable: put it back in front of what came since,
    // to be rewritten at the same offset when the disk recovers.
    failing_ = true;
    in_flight_ += pending_;
    pending_.swap(in_flight_);
    in_flight_.clear();
  }
  resume_waiters(!ok);
}

void log_writer::resume_waiters(bool failed) {
  // Resume in order; a resumed request may append and wait again, behind these.
  const std::uint64_t committed = committed_;
  std::size_t ready = 0;
  while (ready < waiters_.size() && (failed || waiters_[ready].lsn <= committed)) ++ready;
  for (std::size_t i = 0; i < ready; ++i) {
    waiter w = waiters_.front();
    waiters_.pop_front();
    *w.ok = w.lsn <= committed;
    w.handle.resume();
  }
}

void log_writer::require_standby(bool on) {
  standby_required_ = on;
  update_committed();
  // Dropping the standby (it stopped acking and was taken off the sync record first)
  // releases what the local disk alone already holds.
  if (!on) resume_waiters(false);
}

void log_writer::replicated_until(std::uint64_t lsn) {
  METAD_ASSERT(lsn <= end());  // a standby acks only bytes it was sent
  if (lsn <= replicated_) return;
  replicated_ = lsn;
  update_committed();
  if (standby_required_) resume_waiters(false);
}

void log_writer::switch_segment(int fd) {
  METAD_ASSERT(in_flight_.empty());
  if (fd_ >= 0) {
    // The old segment stays on disk while a leader keeps it for its standbys: give back
    // what make_room reserved past its durable end (up to 16 MiB), and any torn write
    // past it (its bytes are rewritten in the next segment).
    if (allocated_ > size()) (void)::ftruncate(fd_, static_cast<off_t>(size()));
    ::close(fd_);
  }
  fd_ = fd;
  segment_start_ = durable_;  // positions stay monotonic: waiters keep their meaning
  allocated_ = 0;
}

}  // namespace metad::store
