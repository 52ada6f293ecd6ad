// The decisions of both ends of one core pair's replication stream, sans-IO: the
// leader's answer to a handshake and its bookkeeping of acks; the standby's verdict on
// each batch (apply, duplicate, gap, wrong epoch) and the acks it sends. Each object
// belongs to the thread that runs its stream.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "repl/protocol.hpp"

namespace metad::repl {

// What the leader knows of itself when a standby says hello for one core.
struct leader_view {
  std::string_view cluster;
  std::uint64_t epoch = 0;
  std::uint64_t generation = 0;
  std::uint32_t cores = 0;
  std::uint64_t retained_from = 0;  // the oldest lsn of the core still in its log segments
  std::uint64_t end = 0;            // the core's log end (store::log_writer::end)
  // The oldest version whose standby reads what this leader ships (kScopedRecordsVersion
  // once tenants have vLLM state of their own).
  std::uint16_t min_version = kProtocolVersionMin;
};

// The leader's answer to a hello (docs/replication.md, "Catch-up and resume" and
// "Fencing and lease timing"):
// - another cluster, version (or one older than the leader's min_version) or core count:
//   refused;
// - the standby follows a newer epoch: wrong_epoch (this leader is deposed);
// - an older epoch, another generation, or a position the leader no longer holds (or
//   never wrote): need_snapshot, since the standby's log may have forked from ours;
// - else stream from the standby's lsn.
answer answer_hello(const hello& h, const leader_view& leader);

// The leader's end of one stream: the batches it sent, the acks it got.
class leader_stream {
 public:
  leader_stream(std::uint64_t epoch, std::uint64_t generation, std::uint32_t core,
                std::uint64_t from)
      : epoch_(epoch), generation_(generation), core_(core), sent_(from), acked_(from) {}

  // Appends the batch of the log bytes [sent(), sent() + bytes.size()) to `out`.
  void send(std::string& out, std::string_view bytes);
  // An ack: true and acked() moved on, or false if it does not belong to this stream
  // (epoch, generation, core), goes backwards or acks what was never sent (close it).
  bool on_ack(const ack& a);

  std::uint64_t sent() const { return sent_; }
  std::uint64_t acked() const { return acked_; }

 private:
  std::uint64_t epoch_, generation_;
  std::uint32_t core_;
  std::uint64_t sent_, acked_;
};

// The standby's end of one stream: where it stands in the leader's log of one core.
class follower {
 public:
  // The position the standby holds durably, as told in its hello.
  follower(std::uint64_t epoch, std::uint64_t generation, std::uint32_t core, std::uint64_t lsn)
      : epoch_(epoch), generation_(generation), core_(core), received_(lsn), durable_(lsn) {}

  // The leader's answer to our hello. stream from our own lsn: follow its epoch (an
  // empty standby, epoch 0, adopts it); anything else: false (no stream).
  bool on_answer(const answer& a);
  // An empty standby's way in (nothing received yet): need_snapshot from the leader it
  // asked. true: it follows that leader's epoch and generation, and snapshot pieces
  // follow (on_snapshot), then batches from their lsn.
  bool on_snapshot_answer(const answer& a);
  // One piece of the awaited snapshot: false if none is awaited or it belongs to
  // another stream or position (a protocol error). After the last piece received() is
  // the snapshot's lsn, and the snapshot's durability is acked as durable(lsn).
  bool on_snapshot(const snapshot& s);
  bool awaiting_snapshot() const { return awaiting_snapshot_; }

  enum class verdict : std::uint8_t {
    apply,         // `bytes` (start_lsn at received() before the call) are new: append and apply
    duplicate,     // nothing new: ack again, apply nothing
    wrong_epoch,   // another leadership's batch: refuse it, ack nothing (fencing)
    wrong_stream,  // another generation or core: a protocol error
    gap,           // starts beyond what we have: bytes are missing; resync
    bad_frames,    // the new bytes are not whole, valid log frames
  };
  struct result {
    verdict v = verdict::wrong_stream;
    std::string_view bytes;  // apply: the new bytes only (a batch may overlap what we have)
    std::uint64_t start_lsn = 0;
  };
  result on_batch(const batch& b);

  // The applier made [0, lsn) durable (its fdatasync returned): the ack to send.
  ack durable(std::uint64_t lsn);
  ack current_ack() const { return {epoch_, generation_, core_, durable_}; }

  std::uint64_t epoch() const { return epoch_; }
  std::uint64_t generation() const { return generation_; }
  std::uint64_t received() const { return received_; }
  std::uint64_t acked() const { return durable_; }

 private:
  std::uint64_t epoch_, generation_;
  std::uint32_t core_;
  std::uint64_t received_;  // bytes handed to the applier
  std::uint64_t durable_;   // bytes the applier made durable
  bool awaiting_snapshot_ = false;
  std::uint64_t snapshot_lsn_ = 0;
};

}  // namespace metad::repl
