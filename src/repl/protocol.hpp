// The replication wire protocol between a leader core and a standby core (one TCP stream
// per core pair; docs/replication.md, "What is shipped"): the messages, their encoder and an
// incremental decoder. Sans-IO: bytes in, messages out. Owned by whichever thread runs
// the stream; nothing here is shared.
//
// A message is [u32 body length][u32 crc32c of the body][body]; a body starts with its
// type. A batch carries the leader's log bytes exactly as written to its log (whole
// store/record.hpp frames): no new record format.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace metad::repl {

// 2: a snapshot may hold rank tables as images (store::record_kind::snapshot_rank_slots),
// which a version-1 standby cannot read: a leader cuts a version-1 standby's snapshot
// without them, and a standby that a version-1 leader refuses says hello as version 1
// (docs/replication.md, "Versions").
// 3: the stream and snapshots may hold records of a tenant's own vLLM state
// (store::record_kind::in_tenant), which standbys of versions 1 and 2 cannot read: a
// leader that has or may make such records (--tenants-file, or a tenant's state
// recovered) refuses their hellos, and such a standby falls back as above.
inline constexpr std::uint16_t kProtocolVersion = 3;
inline constexpr std::uint16_t kProtocolVersionMin = 1;
inline constexpr std::uint16_t kScopedRecordsVersion = 3;
inline constexpr std::size_t kHeaderBytes = 8;
// A body larger than this is damage, not a message. A batch is one group commit of one
// core, which stays far below it (a 32 MiB confirm_write body logs less than that).
inline constexpr std::uint32_t kBodyBytesMax = 256u << 20;
inline constexpr std::size_t kNameBytesMax = 255;  // cluster and node names

enum class message_type : std::uint8_t {
  hello = 1,     // standby → leader: who it is and where it stands
  answer = 2,    // leader → standby: what the leader will do about it
  batch = 3,     // leader → standby: log bytes from start_lsn
  ack = 4,       // standby → leader: [0, lsn) is durable on the standby
  snapshot = 5,  // leader → standby: one piece of the core's state as of lsn (need_snapshot)
};

// A position in one core's log: the generation (a leader's start-up writes a new one,
// whose positions begin at 0 with a snapshot) and the byte offset in that generation's
// log of the core (store::log_writer positions).
struct hello {
  std::uint16_t version = kProtocolVersion;
  std::string cluster, node;
  std::uint64_t epoch = 0;       // the leadership it follows (etcd create_revision); 0: none
  std::uint64_t generation = 0;  // of the leader's data directory
  std::uint32_t cores = 0;       // the standby's core count (a hot standby needs the same)
  std::uint32_t core = 0;
  std::uint64_t lsn = 0;  // the standby holds [0, lsn) of that core's log durably
};

enum class answer_status : std::uint8_t {
  stream = 1,         // batches follow from `lsn`
  need_snapshot = 2,  // the leader no longer has (or never had) that position
  wrong_epoch = 3,    // the standby follows a newer leadership: this leader is deposed
  refused = 4,        // another cluster, protocol version or core count
  busy = 5,           // needs a snapshot the leader's core cannot cut yet: connect again
};

struct answer {
  answer_status status = answer_status::refused;
  std::uint64_t epoch = 0;
  std::uint64_t generation = 0;
  std::uint32_t core = 0;
  std::uint64_t lsn = 0;  // stream: the first batch's start_lsn
};

struct batch {
  std::uint64_t epoch = 0;
  std::uint64_t generation = 0;
  std::uint32_t core = 0;
  std::uint64_t start_lsn = 0;
  std::string_view bytes;  // whole log frames; a view into the decoder's buffer
  std::uint64_t end_lsn() const { return start_lsn + bytes.size(); }
};

// After answer need_snapshot: the core's state as of log position `lsn`, as snapshot
// records (the format of the data directory's snapshot files), in pieces of whole
// records; the last has `last` set. Batches from `lsn` follow.
struct snapshot {
  std::uint64_t epoch = 0;
  std::uint64_t generation = 0;
  std::uint32_t core = 0;
  std::uint64_t lsn = 0;
  bool last = false;
  std::string_view bytes;  // whole records; a view into the decoder's buffer
};

struct ack {
  std::uint64_t epoch = 0;
  std::uint64_t generation = 0;
  std::uint32_t core = 0;
  std::uint64_t lsn = 0;
};

// Encoders append one whole message to `out`.
void encode(std::string& out, const hello& m);
void encode(std::string& out, const answer& m);
void encode(std::string& out, const ack& m);
// A batch's bytes are copied once, into `out` (the send buffer).
void encode(std::string& out, const batch& m);
void encode(std::string& out, const snapshot& m);

// Cuts messages out of a byte stream split anywhere. feed() the bytes as they arrive,
// then call next() until it returns need_more; a message's views stay valid until the
// next feed(). Any error is final: the stream is to be closed.
class decoder {
 public:
  enum class status : std::uint8_t {
    message,       // `type` and the matching member hold one
    need_more,     // no whole message buffered
    bad_length,    // a length field beyond kBodyBytesMax or too short for its type
    bad_checksum,  // the body does not match its crc32c
    bad_message,   // unknown type, a field that does not decode, or trailing bytes
  };

  void feed(std::string_view bytes);
  status next();
  // Bytes received and not yet cut into messages.
  std::size_t buffered() const { return buffer_.size() - consumed_; }
  // Those bytes (to hand the stream to another decoder after the handshake).
  std::string_view unread() const { return std::string_view(buffer_).substr(consumed_); }

  message_type type{};
  struct hello hello;
  struct answer answer;
  struct batch batch;
  struct snapshot snapshot;
  struct ack ack;

 private:
  status decode_body(std::string_view body);
  std::string buffer_;
  std::size_t consumed_ = 0;  // bytes of buffer_ already returned as messages
  status failed_ = status::need_more;
};

}  // namespace metad::repl
