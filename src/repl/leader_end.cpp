#include "repl/leader_end.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "metad/assert.hpp"
#include "metad/log.hpp"
#include "repl/link.hpp"
#include "repl/protocol.hpp"
#include "smp/clock.hpp"

namespace metad::repl {

namespace {

// A snapshot is moved from the child's pipe a piece of at most this many bytes per read.
constexpr std::size_t kSnapshotReadBytes = std::size_t{1} << 20;
// The child's pipe holds up to this much (a non-root process gets at most
// /proc/sys/fs/pipe-max-size, 1 MiB by default): the core moves a pipeful a turn, and
// with the default 64 KiB an 8M-binding snapshot (190 MB) took ~3,000 turns, 8-9 s.
constexpr int kPipeBytesMax = 8 << 20;

// Writes all of `bytes` to a blocking descriptor; false on an error (the reader went).
bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

double ms_since(std::uint64_t ns) {
  return static_cast<double>(smp::monotonic_ns() - ns) / smp::kNsPerMs;
}

}  // namespace

// --- retained_log --------------------------------------------------------------------

void retained_log::begin(std::uint64_t lsn) {
  retaining_ = true;
  from_ = end_ = lsn;
}

void retained_log::keep(std::uint64_t lsn, const char* data, std::uint64_t size) {
  const std::uint64_t end = lsn + size;
  if (end <= end_) return;
  if (lsn > end_) {  // not consecutive (never expected): start again here
    chunks_.clear();
    bytes_ = 0;
    from_ = end_ = lsn;
  }
  const std::uint64_t from = end_;
  chunks_.emplace_back(data + (from - lsn), end - from);
  bytes_ += end - from;
  end_ = end;
  while (end_ - from_ - chunks_.front().size() >= kRetainBytes) {
    from_ += chunks_.front().size();
    bytes_ -= chunks_.front().size();
    chunks_.pop_front();
  }
  METAD_ASSERT(from_ + bytes_ == end_);
}

void retained_log::each_from(std::uint64_t lsn,
                             const std::function<void(std::string_view)>& chunk) const {
  std::uint64_t at = from_;
  for (const std::string& piece : chunks_) {
    const std::uint64_t end = at + piece.size();
    if (end > lsn) chunk(std::string_view(piece).substr(lsn > at ? lsn - at : 0));
    at = end;
  }
}

// --- ack_clock -----------------------------------------------------------------------

void ack_clock::start(std::uint64_t caught_up_at, std::uint64_t now_ns, std::uint64_t bound_ns) {
  caught_up_at_ = caught_up_at;
  latency_.emplace(bound_ns);
  caught_up_ns_ = 0;
  unacked_.assign(1, {caught_up_at, now_ns});
}

void ack_clock::stop() {
  unacked_.clear();
  latency_.reset();
}

void ack_clock::sent(std::uint64_t end, std::uint64_t now_ns) {
  METAD_ASSERT(unacked_.empty() || unacked_.back().first <= end);  // ascending
  unacked_.emplace_back(end, now_ns);
}

bool ack_clock::acked(std::uint64_t lsn, std::uint64_t now_ns) {
  std::uint64_t newest_sent = 0;  // of the newest write this ack covers
  while (!unacked_.empty() && unacked_.front().first <= lsn) {
    newest_sent = unacked_.front().second;
    unacked_.pop_front();
  }
  if (caught_up_ns_ != 0 && newest_sent >= caught_up_ns_ && latency_)
    latency_->on_ack(now_ns - newest_sent, now_ns);
  if (lsn < caught_up_at_ || caught_up_ns_ != 0) return false;
  caught_up_ns_ = now_ns;
  return true;
}

// --- snapshot_cut --------------------------------------------------------------------

bool snapshot_cut::start(const encoder& encode, const cpu_set_t* cpus, int core,
                         const std::string& node, std::uint64_t lsn) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  for (int bytes = kPipeBytesMax; bytes > 65536; bytes /= 2)
    if (::fcntl(fds[1], F_SETPIPE_SZ, bytes) >= 0) break;
  const std::uint64_t started = smp::monotonic_ns();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    log::warn("replication: core {}: fork for a snapshot failed ({}); cutting it on the core", core,
              std::strerror(errno));
    ::close(fds[0]);
    ::close(fds[1]);
    return false;
  }
  if (pid == 0) {
    // The child: reads the core's state as it was at the fork and writes the encoded
    // snapshot messages; no logging, no other thread, no destructors.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    if (cpus != nullptr) ::sched_setaffinity(0, sizeof *cpus, cpus);
    ::setpriority(PRIO_PROCESS, 0, 10);
    ::close(fds[0]);
    bool ok = true;
    encode([&](std::string& bytes) {
      ok = ok && write_all(fds[1], bytes);
      bytes.clear();
    });
    ::_exit(ok ? 0 : 1);
  }
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  child_ = pid;
  fd_ = fds[0];
  core_ = core;
  lsn_ = lsn;
  bytes_ = 0;
  started_ns_ = started;
  for_ = node;
  buffer_.resize(kSnapshotReadBytes);
  log::info("replication: core {} forked in {:.1f} ms to cut node {}'s snapshot at {}", core,
            ms_since(started), node, lsn);
  return true;
}

snapshot_cut::outcome snapshot_cut::pump(channel& ch, std::uint64_t stream, std::size_t limit) {
  while (ch.queued() < limit) {
    const ssize_t n = ::read(fd_, buffer_.data(), buffer_.size());
    if (n > 0) {
      ch.send(stream, std::string_view(buffer_.data(), static_cast<std::size_t>(n)));
      bytes_ += static_cast<std::uint64_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return outcome::pending;
    if (n != 0 || reap() != 0) {
      log::warn("replication: core {}: cutting node {}'s snapshot failed; closing its stream",
                core_, for_);
      abort();
      return outcome::failed;
    }
    log::info(
        "replication: core {} sends node {} its state at {}: {} bytes, cut in {:.1f} ms by a "
        "child",
        core_, for_, lsn_, bytes_, ms_since(started_ns_));
    ch.send(stream, held_);
    std::string().swap(held_);
    std::string().swap(buffer_);
    return outcome::done;
  }
  return outcome::pending;
}

int snapshot_cut::reap() {
  ::close(fd_);
  fd_ = -1;
  int status = -1;
  while (::waitpid(child_, &status, 0) < 0 && errno == EINTR) {
  }
  child_ = -1;
  return status;
}

void snapshot_cut::abort() {
  if (child_ >= 0) {
    ::kill(child_, SIGKILL);
    reap();
  }
  std::string().swap(held_);
  std::string().swap(buffer_);
}

}  // namespace metad::repl

namespace metad::repl {

log_file_pump::~log_file_pump() {
  if (fd_ >= 0) ::close(fd_);
}

bool log_file_pump::start(std::vector<segment> segments, std::uint64_t from) {
  segments_ = std::move(segments);
  pos_ = from;
  error_.clear();
  for (std::size_t i = segments_.size(); i-- > 0;)
    if (segments_[i].start <= from) return open_at(i);
  return false;
}

void log_file_pump::extend(segment s) {
  if (!segments_.empty() && s.start > segments_.back().start) segments_.push_back(std::move(s));
}

bool log_file_pump::open_at(std::size_t i) {
  if (fd_ >= 0) ::close(fd_);
  current_ = i;
  fd_ = ::open(segments_[i].path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) error_ = segments_[i].path + ": " + std::strerror(errno);
  return fd_ >= 0;
}

bool log_file_pump::pread_all(char* to, std::size_t n, std::uint64_t position) {
  const std::uint64_t offset = position - segments_[current_].start;
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, to + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      error_ = segments_[current_].path + ": " +
               (got < 0 ? std::strerror(errno) : "shorter than the log it should hold");
      return false;
    }
    done += static_cast<std::size_t>(got);
  }
  return true;
}

bool log_file_pump::read(std::string& out, std::size_t max, std::uint64_t until) {
  if (fd_ < 0) return false;
  // At a segment's end (the next one's start), on to the next file.
  if (current_ + 1 < segments_.size() && pos_ >= segments_[current_ + 1].start &&
      !open_at(current_ + 1))
    return false;
  std::uint64_t end = until;
  if (current_ + 1 < segments_.size()) end = std::min(end, segments_[current_ + 1].start);
  if (pos_ >= end) return true;
  block_.resize(
      static_cast<std::size_t>(std::min<std::uint64_t>(end - pos_, std::max<std::size_t>(max, 8))));
  if (!pread_all(block_.data(), block_.size(), pos_)) return false;
  // Whole frames only ([u32 length][u32 crc32c][payload]); a frame longer than the block
  // is read alone.
  std::size_t whole = 0;
  while (whole + 8 <= block_.size()) {
    std::uint32_t length = 0;
    std::memcpy(&length, block_.data() + whole, 4);
    const std::uint64_t frame = std::uint64_t{8} + length;
    if (length == 0 || frame > kBodyBytesMax / 2 || pos_ + whole + frame > end) {
      if (length == 0 || frame > kBodyBytesMax / 2 || whole == 0) {
        error_ = segments_[current_].path + ": a frame of " + std::to_string(length) +
                 " bytes at log position " + std::to_string(pos_ + whole) +
                 (length == 0 || frame > kBodyBytesMax / 2 ? "" : " runs past the written end");
        return false;
      }
      break;
    }
    if (whole + frame > block_.size()) {
      if (whole == 0) {  // the first frame alone, whatever `max` says
        block_.resize(static_cast<std::size_t>(frame));
        if (!pread_all(block_.data(), block_.size(), pos_)) return false;
        whole = block_.size();
      }
      break;
    }
    whole += static_cast<std::size_t>(frame);
  }
  if (whole == 0) {
    error_ =
        segments_[current_].path + ": a torn frame header at log position " + std::to_string(pos_);
    return false;
  }
  out.append(block_.data(), whole);
  pos_ += whole;
  return true;
}

}  // namespace metad::repl
