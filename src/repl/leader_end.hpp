// The pieces of a leader core's end of its stream that know nothing of the node (its
// state, its log writer, its lease): each belongs to the core thread that owns the stream
// (src/replica/leader_end.cpp is their glue).
// - retained_log: the bytes the core shipped lately, so that a standby whose stream broke
//   resumes from its position instead of copying the whole state again;
// - ack_clock: when each write was sent and the standby's ack latency on this stream;
// - snapshot_cut: a new standby's snapshot cut by a forked child (a copy-on-write image
//   of the core's state), moved from a pipe into the stream while the peer keeps up.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "repl/sync_set.hpp"

namespace metad::repl {

class channel;

// What a leader core keeps of the log bytes it shipped; older positions need a snapshot.
inline constexpr std::uint64_t kRetainBytes = std::uint64_t{16} << 20;

// The bytes shipped lately, [from(), end()) in consecutive chunks (one per flush), kept
// from a leadership's first stream on, with or without one now.
class retained_log {
 public:
  bool retaining() const { return retaining_; }
  // Starts keeping what is shipped from `lsn` on (the first stream of this leadership).
  void begin(std::uint64_t lsn);
  // Keeps the flushed bytes [lsn, lsn + size) (kRetainBytes at most in all).
  void keep(std::uint64_t lsn, const char* data, std::uint64_t size);
  // Calls `chunk` with each retained piece from `lsn` (at least from()) on.
  void each_from(std::uint64_t lsn, const std::function<void(std::string_view)>& chunk) const;
  std::uint64_t from() const { return from_; }
  std::uint64_t end() const { return end_; }

 private:
  bool retaining_ = false;
  std::deque<std::string> chunks_;
  std::uint64_t from_ = 0, end_ = 0;
  std::uint64_t bytes_ = 0;  // Σ chunks_: from_ + bytes_ == end_
};

// When each write shipped on one stream was sent, until its ack: what the sync set reads
// (the oldest unacked write, late acks).
class ack_clock {
 public:
  // A new stream: the standby is caught up once it acks `caught_up_at` (its snapshot's
  // or its hello's position), sent at `now_ns`; acks later than half `bound_ns` are late.
  void start(std::uint64_t caught_up_at, std::uint64_t now_ns, std::uint64_t bound_ns);
  void stop();
  // A write ending at `end` sent at `now_ns` (ends ascend).
  void sent(std::uint64_t end, std::uint64_t now_ns);
  // An ack up to `lsn` at `now_ns`; true once the standby is caught up (the first time).
  bool acked(std::uint64_t lsn, std::uint64_t now_ns);

  std::uint64_t caught_up_at() const { return caught_up_at_; }
  std::uint64_t oldest_unacked_ns() const {  // 0: everything sent was acked
    return unacked_.empty() ? 0 : unacked_.front().second;
  }
  std::uint64_t slow_since_ns() const { return latency_ ? latency_->slow_since_ns() : 0; }
  std::uint64_t slow_acks() const { return latency_ ? latency_->slow_acks() : 0; }

 private:
  std::uint64_t caught_up_at_ = 0;
  // When the standby caught up on this stream (0: not yet): only writes shipped from then
  // on are timed (a catch-up's first ack comes a snapshot's transfer later).
  std::uint64_t caught_up_ns_ = 0;
  std::deque<std::pair<std::uint64_t, std::uint64_t>> unacked_;  // (end lsn, sent ns)
  std::optional<ack_latency> latency_;                           // late acks, on this stream
};

// A standby behind what retained_log keeps, streamed from the leader's log segment files
// instead of a new snapshot: whole frames from its position on, segment after segment,
// a bounded piece per call so that the core goes on serving. The segments are the core's
// (pipeline::core_state::segments): each file holds the log from its start position
// (file offset = position - start) to the next one's start; the last one is still being
// written, and is read only up to what the caller says is written.
class log_file_pump {
 public:
  struct segment {
    std::string path;
    std::uint64_t start = 0;  // the log position at the file's offset 0
  };
  log_file_pump() = default;
  log_file_pump(const log_file_pump&) = delete;
  log_file_pump& operator=(const log_file_pump&) = delete;
  ~log_file_pump();

  // From log position `from`: false (and nothing open) if no segment holds it.
  bool start(std::vector<segment> segments, std::uint64_t from);
  // A segment the log switched to since start() (a snapshot cut while it pumps): read on
  // once pos() reaches its start. Ignored unless it starts after the last one known.
  void extend(segment s);
  // Appends whole frames from pos() on, at least one and about `max` bytes, none at or
  // past `until` (what is written), to `out`. False if a file could not be read or a
  // frame's length is impossible (error() says which): the stream must end.
  bool read(std::string& out, std::size_t max, std::uint64_t until);
  std::uint64_t pos() const { return pos_; }
  std::uint64_t last_start() const { return segments_.empty() ? 0 : segments_.back().start; }
  const std::string& error() const { return error_; }

 private:
  bool open_at(std::size_t i);
  bool pread_all(char* to, std::size_t n, std::uint64_t position);

  std::vector<segment> segments_;
  std::size_t current_ = 0;  // index in segments_ of the file open in fd_
  int fd_ = -1;
  std::uint64_t pos_ = 0;
  std::string block_, error_;
};

// A new standby's snapshot cut by a child process so that the core goes on serving: the
// fork is the only pause (it copies the page tables, not the state). What the core ships
// meanwhile waits in held(), then follows the snapshot.
class snapshot_cut {
 public:
  // Hands each encoded piece to `write` (which empties it); runs in the child.
  using encoder = std::function<void(const std::function<void(std::string&)>& write)>;
  // Forks a child that runs `encode` on the core's state as it is now, on `cpus` (the
  // process's CPUs, not the pinned core's; null: the core's) at a lower priority. False if
  // no child could be started (then the core cuts the snapshot itself). The child holds
  // the server's descriptors (listeners, the data directory's lock): it dies with the
  // thread that forked it.
  bool start(const encoder& encode, const cpu_set_t* cpus, int core, const std::string& node,
             std::uint64_t lsn);
  bool running() const { return fd_ >= 0; }

  enum class outcome : std::uint8_t { pending, done, failed };
  // Moves what the child wrote to `stream` while less than `limit` bytes are queued on
  // the channel; when the child is done, what was held follows.
  outcome pump(channel& ch, std::uint64_t stream, std::size_t limit);
  // Ends the cut (the stream ended, or it is cut for being slow): the child if it still
  // runs, and the batches held for the stream.
  void abort();

  std::string& held() { return held_; }

 private:
  int reap();  // closes the pipe, waits for the child: its wait status (0: it wrote all)

  pid_t child_ = -1;
  int fd_ = -1;
  int core_ = 0;
  std::string held_, buffer_;
  std::uint64_t lsn_ = 0, bytes_ = 0, started_ns_ = 0;
  std::string for_;  // the standby's node id, for the log
};

}  // namespace metad::repl
