#include "repl/session.hpp"

#include "metad/assert.hpp"
#include "store/record.hpp"

namespace metad::repl {

answer answer_hello(const hello& h, const leader_view& leader) {
  answer a;
  a.epoch = leader.epoch;
  a.generation = leader.generation;
  a.core = h.core;
  if (h.version < kProtocolVersionMin || h.version < leader.min_version ||
      h.version > kProtocolVersion || h.cluster != leader.cluster || h.cores != leader.cores ||
      h.core >= leader.cores) {
    a.status = answer_status::refused;
  } else if (h.epoch > leader.epoch) {
    a.status = answer_status::wrong_epoch;
  } else if (h.epoch < leader.epoch || h.generation != leader.generation ||
             h.lsn < leader.retained_from || h.lsn > leader.end) {
    a.status = answer_status::need_snapshot;
  } else {
    a.status = answer_status::stream;
    a.lsn = h.lsn;
  }
  return a;
}

void leader_stream::send(std::string& out, std::string_view bytes) {
  encode(out, batch{epoch_, generation_, core_, sent_, bytes});
  sent_ += bytes.size();
}

bool leader_stream::on_ack(const ack& a) {
  if (a.epoch != epoch_ || a.generation != generation_ || a.core != core_ || a.lsn < acked_ ||
      a.lsn > sent_)
    return false;
  acked_ = a.lsn;
  return true;
}

bool follower::on_answer(const answer& a) {
  if (a.status != answer_status::stream || a.core != core_ || a.generation != generation_ ||
      a.lsn != durable_ || a.epoch < epoch_)
    return false;
  epoch_ = a.epoch;
  return true;
}

bool follower::on_snapshot_answer(const answer& a) {
  if (a.status != answer_status::need_snapshot || a.core != core_ || received_ != 0 ||
      awaiting_snapshot_ || a.epoch < epoch_)
    return false;
  epoch_ = a.epoch;
  generation_ = a.generation;
  snapshot_lsn_ = a.lsn;
  awaiting_snapshot_ = true;
  return true;
}

bool follower::on_snapshot(const snapshot& s) {
  if (!awaiting_snapshot_ || s.epoch != epoch_ || s.generation != generation_ || s.core != core_ ||
      s.lsn != snapshot_lsn_)
    return false;
  if (s.last) {
    awaiting_snapshot_ = false;
    received_ = s.lsn;
  }
  return true;
}

follower::result follower::on_batch(const batch& b) {
  result r;
  if (awaiting_snapshot_) {
    r.v = verdict::wrong_stream;  // the leader sends the whole snapshot first
  } else if (b.epoch != epoch_) {
    r.v = verdict::wrong_epoch;
  } else if (b.generation != generation_ || b.core != core_) {
    r.v = verdict::wrong_stream;
  } else if (b.start_lsn > received_) {
    r.v = verdict::gap;
  } else if (b.end_lsn() <= received_) {
    r.v = verdict::duplicate;
  } else {
    // The part we lack; it starts at a frame boundary if the leader's log is one stream.
    const std::string_view fresh = b.bytes.substr(received_ - b.start_lsn);
    if (store::scan(fresh, [](const store::record&, std::size_t) {}).status !=
        store::scan_status::ok) {
      r.v = verdict::bad_frames;
      return r;
    }
    r.v = verdict::apply;
    r.bytes = fresh;
    r.start_lsn = received_;
    received_ += fresh.size();
  }
  return r;
}

ack follower::durable(std::uint64_t lsn) {
  METAD_ASSERT(lsn >= durable_ && lsn <= received_);  // the applier syncs what it was given
  durable_ = lsn;
  return current_ack();
}

}  // namespace metad::repl
