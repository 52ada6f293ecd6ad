// The standby's end of each core's stream, on that core: the hello that says where it
// stands, the leader's answer, the snapshot and the batches appended to its own log and
// applied (persist::standby_core), and the acks of what its group commit made durable.
// A state that can no longer follow the leader exits to resync (kExitResync).
#include <algorithm>
#include <exception>

#include "metad/log.hpp"
#include "replica/replication_impl.hpp"

namespace metad::replica {

namespace {

// This core holds something from a stream (state, or the start of a snapshot): a new
// stream must resume where that one broke, or the node resyncs from empty. A core whose
// leader wrote nothing since its snapshot holds that state at position 0: its epoch (a
// serving leader's, never 0) says it followed, not its position.
bool has_followed(const std::optional<repl::follower>& f) {
  return f && (f->received() > 0 || f->awaiting_snapshot() || f->epoch() != 0);
}

// Appends and applies whole frames; a record that no longer applies means the states
// diverged.
void apply(persist::standby_core& applier, std::string_view frames) {
  try {
    applier.receive(frames);
  } catch (const std::exception& error) {
    exit_to_resync(error.what());
  }
}

}  // namespace

void replication::impl::say_hello(int c, core_end& e, following_end& f) {
  // After a stream ended, what this core holds stays as it is until a leader answers: a
  // connection that closes unanswered (the leader died, and something else accepted on
  // its address) must leave this standby able to take over.
  if (!has_followed(f.follower)) f.follower.emplace(0, 0, static_cast<std::uint32_t>(c), 0);
  // A new stream: nothing is acked on it before the leader answers, then the first ack
  // says where this core stands, even at position 0 (the leader waits for it).
  f.answered = false;
  f.acked_once = false;
  repl::hello h;
  h.version = f.hello_version;
  h.cluster = nd.cfg.ha_cluster;
  h.node = nd.cfg.ha_node;
  h.cores = static_cast<std::uint32_t>(nd.cores);
  h.core = static_cast<std::uint32_t>(c);
  if (!f.follower->awaiting_snapshot()) {  // where it stands: the leader may resume there
    h.epoch = f.follower->epoch();
    h.generation = f.follower->generation();
    h.lsn = f.follower->acked();
  }
  repl::encode(e.out, h);
  send(c, e);
}

void replication::impl::on_answer(int c, core_end& e, following_end& f, const repl::answer& a) {
  if (a.status == repl::answer_status::refused) {
    // A leader that does not serve (yet: starting, promoting) refuses with epoch 0: try
    // again shortly. A serving one refuses a mismatch, which an operator must see; a
    // leader of an older build may refuse only this node's newer protocol: the next hello
    // says the older one (and after a refusal of that, the newest again).
    if (a.epoch == 0) {
      log::debug("replication: the leader refused core {}'s stream for now", c);
    } else if (f.hello_version > repl::kProtocolVersionMin) {
      log::info(
          "replication: the leader (epoch {}) refused core {}'s stream at protocol {} (this "
          "node: cluster {}, {} cores): trying protocol {} (a leader of an older build; "
          "otherwise the next refusal is a mismatch)",
          a.epoch, c, f.hello_version, nd.cfg.ha_cluster, nd.cores, f.hello_version - 1);
      --f.hello_version;
    } else {
      log::warn(
          "replication: the leader (epoch {}) refused core {}'s stream: its cluster name, core "
          "count or protocol version differs from this node's (cluster {}, {} cores, protocol "
          "{} to {}); its log names its own",
          a.epoch, c, nd.cfg.ha_cluster, nd.cores, repl::kProtocolVersionMin,
          repl::kProtocolVersion);
      f.hello_version = repl::kProtocolVersion;
    }
    return close(c, e);
  }
  if (a.status == repl::answer_status::busy) {
    log::info(
        "replication: the leader is busy with core {} (cutting a snapshot, another node's "
        "streams are live, or its --memory-max has no room for a cut; its log says which): "
        "connecting again",
        c);
    return close(c, e);
  }
  if (a.status == repl::answer_status::wrong_epoch) {
    // This node follows a newer leadership than the one that answered (a deposed leader
    // still listening): not this node's state to drop; connect again.
    log::warn(
        "replication: core {}: the node at the leader's address leads an older epoch ({}) than "
        "this node follows; closing",
        c, a.epoch);
    return close(c, e);
  }
  if (has_followed(f.follower)) {
    if (!f.follower->awaiting_snapshot() && f.follower->on_answer(a)) {
      log::info("replication: core {} resumes the leader's stream at {}", c, a.lsn);
      f.answered = true;  // tell the leader where it stands at once
      return;
    }
    exit_to_resync(
        "the leader cannot resume this standby's stream where it broke (another leadership, or "
        "a position it no longer keeps)");
  }
  if (a.status == repl::answer_status::need_snapshot && f.follower->on_snapshot_answer(a)) {
    f.answered = true;
    return;
  }
  exit_to_resync("the leader cannot stream to this standby's position");
}

void replication::impl::on_snapshot(int c, following_end& f, const repl::snapshot& s) {
  if (!f.follower->on_snapshot(s)) exit_to_resync("a snapshot piece out of order");
  if (!f.applier) f.applier = std::make_unique<persist::standby_core>(nd, c, 0, *feed);
  apply(*f.applier, s.bytes);
  if (s.last) {
    f.applier->rebase(s.lsn);
    // It holds the leader's whole state from here on, even after the stream ends.
    share(c).state.store(progress::caught_up);
    if (all(progress::caught_up)) nd.repl.caught_up = true;
    log::info("replication: core {} received the leader's state at {}", c, s.lsn);
  }
}

void replication::impl::on_batch(int c, core_end& e, following_end& f, const repl::batch& b) {
  using verdict = repl::follower::verdict;
  const repl::follower::result r = f.follower->on_batch(b);
  switch (r.v) {
    case verdict::apply:
      return apply(*f.applier, r.bytes);
    case verdict::duplicate:
      repl::encode(e.out, f.follower->current_ack());
      return send(c, e);
    case verdict::wrong_epoch:  // a deposed leader's: never acked (fencing)
      log::warn("replication: core {}: a batch of epoch {}, following {}; closing", c, b.epoch,
                f.follower->epoch());
      return close(c, e);
    default:
      exit_to_resync("a batch that does not continue this standby's log");
  }
}

// Acks what this core's group commit made durable (on each turn, and after each flush).
void replication::impl::ack_durable(int c, core_end& e) {
  following_end* f = e.standby();
  if (f == nullptr || !f->follower || !f->applier || f->follower->awaiting_snapshot() ||
      e.stream == 0 || !f->answered || e.closing)
    return;
  const std::uint64_t log_durable = f->applier->durable_lsn();
  if (log_durable == 0 && !f->applier->snapshot_durable()) return;
  const std::uint64_t durable = std::min(log_durable, f->follower->received());
  // The first ack says the snapshot is durable, even at position 0.
  if (durable <= f->follower->acked() && f->acked_once) return;
  f->acked_once = true;
  repl::encode(e.out, f->follower->durable(durable));
  send(c, e);
}

}  // namespace metad::replica
