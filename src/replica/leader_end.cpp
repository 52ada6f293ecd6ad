// The leader's end of each core's stream, on that core: a standby's hello answered (a
// resume from the retained bytes, or a snapshot cut by a child), what the core's group
// commit writes shipped, and the replicated watermark moved as acks come back.
#include <algorithm>

#include "metad/assert.hpp"
#include "metad/log.hpp"
#include "persist/durability.hpp"
#include "replica/replication_impl.hpp"
#include "smp/clock.hpp"

namespace metad::replica {

namespace {

// A core starts at most one snapshot cut (a fork) per this interval; a hello that needs
// one sooner is answered busy (the standby connects again after its pause). A cut runs
// alone: the stream it is for ends before another hello reaches the core.
constexpr std::uint64_t kCutIntervalMs = 2'000;

// What pump_files reads from the log files on one turn of the core, at most (about; the
// link thread wakes a pumping core every turn, <= 20 ms).
constexpr std::size_t kPumpBytesPerTurn = std::size_t{4} << 20;

}  // namespace

// What the sync set reads of this core's stream.
void replication::impl::publish(int c, const leading_end& l) {
  shared_core& s = share(c);
  s.oldest_unacked_ns.store(l.acks.oldest_unacked_ns(), std::memory_order_relaxed);
  s.lag_bytes.store(l.stream ? l.stream->sent() - l.stream->acked() : 0, std::memory_order_relaxed);
  s.slow_since_ns.store(l.acks.slow_since_ns());
  s.slow_acks.store(l.acks.slow_acks());
}

void replication::impl::end_leading(int c, leading_end& l) {
  abort_cut(c, l);
  l.files.reset();
  share(c).pumping.store(false);
  l.stream.reset();
  l.acks.stop();
  publish(c, l);
  share(c).state.store(progress::none);
}

void replication::impl::on_hello(int c, core_end& e, leading_end& l, const repl::hello& h) {
  if (l.stream || l.cut.running()) {  // one hello per stream
    log::warn("replication: core {}: a second hello on node {}'s stream; closing it", c, h.node);
    return close(c, e);
  }
  const bool leading = nd.ha != nullptr && nd.ha->serving();
  store::log_writer& log = core(c).log;
  repl::leader_view view;
  view.cluster = nd.cfg.ha_cluster;
  view.epoch = leading ? static_cast<std::uint64_t>(nd.ha->epoch()) : 0;
  view.generation = nd.data ? nd.data->generation() : 0;
  view.cores = static_cast<std::uint32_t>(nd.cores);
  view.retained_from = l.retained.retaining() ? l.retained.from() : log.end();
  // Older positions of this generation are still in its log segment files (as many as
  // --repl-retain-log-bytes keeps): a standby that was cut off resumes from them.
  // Not at or before a position a pump could not read from (a damaged or unreadable
  // file): those need a snapshot.
  const std::deque<std::pair<std::uint64_t, std::uint64_t>>& segments = core(c).segments;
  if (l.retained.retaining() && nd.data && !segments.empty())
    view.retained_from =
        std::min(view.retained_from,
                 std::max(segments.front().second, l.files_failed ? l.files_failed_at + 1 : 0));
  view.end = l.retained.retaining() ? l.retained.end() : log.end();
  // Tenants' own vLLM states (a tenants file, or one recovered): scoped records, which
  // only a standby of version 3 reads.
  if (nd.tenants.enabled() || nd.tenants.spaces() > 1)
    view.min_version = repl::kScopedRecordsVersion;
  repl::answer a = repl::answer_hello(h, view);
  if (!leading) a.status = repl::answer_status::refused;
  // Behind what this core keeps in memory: from the log files first (pump_files), if
  // they open; else a snapshot.
  std::unique_ptr<repl::log_file_pump> pump;
  if (a.status == repl::answer_status::stream && l.retained.retaining() &&
      a.lsn < l.retained.from()) {
    std::vector<repl::log_file_pump::segment> files;
    for (const auto& [segment, start] : segments)
      files.push_back({nd.data->log_path(view.generation, c, segment), start});
    pump = std::make_unique<repl::log_file_pump>();
    if (!pump->start(std::move(files), a.lsn)) {
      log::warn("replication: core {}: node {}'s stream cannot resume at {} from the log files: {}",
                c, h.node, a.lsn, pump->error());
      l.files_failed = true;
      l.files_failed_at = std::max(l.files_failed_at, a.lsn);
      pump.reset();
      a.status = repl::answer_status::need_snapshot;
      a.lsn = 0;
    }
  }
  const std::uint64_t now = smp::monotonic_ns();
  if (a.status == repl::answer_status::need_snapshot && l.last_cut_ns != 0 &&
      now - l.last_cut_ns < kCutIntervalMs * smp::kNsPerMs) {
    log::info(
        "replication: core {}: node {} needs a snapshot, but this core began one {:.0f} ms ago "
        "(at most one per {} ms): answered busy",
        c, h.node, static_cast<double>(now - l.last_cut_ns) / smp::kNsPerMs, kCutIntervalMs);
    a.status = repl::answer_status::busy;
    a.lsn = 0;
  }
  if (a.status == repl::answer_status::need_snapshot && !nd.memory.begin_cut()) {
    // The fork's copy-on-write worst case does not fit --memory-max (memory_budget.hpp,
    // begin_cut): the cut waits until it does; logged once until a cut starts.
    const auto mib = [](std::uint64_t bytes) { return bytes >> 20; };
    if (!l.cut_waits)
      log::warn(
          "replication: core {}: node {} needs a snapshot, but the child that cuts it may copy "
          "up to the resident size ({} MiB) while it runs, and --memory-max ({} MiB, {} MiB "
          "used) has no room for that: the standby waits (answered busy) until it fits",
          c, h.node, mib(nd.memory.resident()), mib(nd.memory.max()), mib(nd.memory.used()));
    l.cut_waits = true;
    a.status = repl::answer_status::busy;
    a.lsn = 0;
  }
  if (a.status == repl::answer_status::need_snapshot) {
    l.cut_waits = false;
    l.last_cut_ns = now;
    a.lsn = log.end();  // the state now is the log up to its end, pending records included
    repl::encode(e.out, a);
    send(c, e);
    repl::snapshot head;
    head.epoch = view.epoch;
    head.generation = view.generation;
    head.core = static_cast<std::uint32_t>(c);
    head.lsn = a.lsn;
    const bool images = h.version >= 2;  // a version-1 standby reads no rank image
    const auto encode = [this, c, &head, images](const std::function<void(std::string&)>& write) {
      encode_snapshot(c, head, images, write);
    };
    if (l.cut.start(encode, have_process_cpus ? &process_cpus : nullptr, c, h.node, head.lsn)) {
      share(c).cutting.store(true);
      l.cut_charged = true;
    } else {
      nd.memory.end_cut();  // no child: nothing is copied
      cut_here(c, e, head, images, h.node);
    }
  } else {
    repl::encode(e.out, a);
    send(c, e);
    if (a.status != repl::answer_status::stream) {
      // While not serving (starting, promoting) a refusal is expected: the standby
      // comes back. While serving it is a mismatch an operator must see.
      if (leading && a.status != repl::answer_status::busy)
        log::warn(
            "replication: refused node {}'s stream for core {}: cluster {}, {} cores, protocol "
            "{} (this node: {}, {} cores, protocol {})",
            h.node, c, h.cluster, h.cores, h.version, view.cluster, view.cores,
            repl::kProtocolVersion);
      return close(c, e);
    }
  }
  l.stream.emplace(view.epoch, view.generation, static_cast<std::uint32_t>(c), a.lsn);
  if (!l.retained.retaining()) {
    l.retained.begin(a.lsn);
  } else if (pump) {
    l.files = std::move(pump);
    share(c).pumping.store(true);
    log::info(
        "replication: core {} resumes node {}'s stream at {} from its log files ({} bytes "
        "behind the {} this core keeps in memory)",
        c, h.node, a.lsn, l.retained.from() - a.lsn, l.retained.end() - l.retained.from());
  } else if (a.status == repl::answer_status::stream) {
    resend(c, e, l, a.lsn);
    log::info("replication: core {} resumes node {}'s stream at {} ({} bytes resent)", c, h.node,
              a.lsn, l.stream->sent() - a.lsn);
  }
  // Caught up once it acks what this core has shipped. From the files: not before the
  // pump hands over to memory (pump_files starts the clock again there); meanwhile each
  // piece sent is timed, so that a standby that stops acking is seen silent.
  l.acks.start(l.stream->sent(), smp::monotonic_ns(),
               std::uint64_t{nd.cfg.sync_timeout_ms} * smp::kNsPerMs);
  publish(c, l);
  share(c).state.store(progress::catching_up);
  std::lock_guard lock(standby_mutex);
  standby_node = h.node;
}

// Encodes core c's state as the snapshot messages of `head` (the pieces, then the last
// one) and hands them to `out` as they fill; returns the state's bytes.
std::uint64_t replication::impl::encode_snapshot(int c, const repl::snapshot& head, bool images,
                                                 const std::function<void(std::string&)>& out) {
  std::string bytes;
  std::uint64_t state = 0;
  persist::serialize_state(
      core(c),
      [&](std::string_view piece) {
        repl::snapshot s = head;
        s.bytes = piece;
        state += piece.size();
        repl::encode(bytes, s);
        out(bytes);
      },
      images);
  repl::snapshot last = head;
  last.last = true;
  repl::encode(bytes, last);
  out(bytes);
  return state;
}

// The snapshot cut on the core itself (no child could be started), which serves nothing
// meanwhile.
void replication::impl::cut_here(int c, core_end& e, const repl::snapshot& head, bool images,
                                 const std::string& node) {
  const std::uint64_t started = smp::monotonic_ns();
  const std::uint64_t bytes = encode_snapshot(c, head, images, [&](std::string& out) {
    link->at(c).send(e.stream, out);
    out.clear();
  });
  log::info("replication: core {} sends node {} its state at {}: {} bytes, cut in {:.1f} ms", c,
            node, head.lsn, bytes,
            static_cast<double>(smp::monotonic_ns() - started) / smp::kNsPerMs);
  nd.repl.snapshots_sent.fetch_add(1);
}

// Moves what the child wrote to the stream while less than half the queue bound is
// queued on it, then what this core shipped meanwhile.
void replication::impl::pump_cut(int c, core_end& e, leading_end& l) {
  using outcome = repl::snapshot_cut::outcome;
  const outcome o = l.cut.pump(link->at(c), e.stream, queued_max / 2);
  if (o == outcome::pending) return;
  end_cut(c, l);
  if (o == outcome::done) return static_cast<void>(nd.repl.snapshots_sent.fetch_add(1));
  close(c, e);
}

void replication::impl::abort_cut(int c, leading_end& l) {
  l.cut.abort();
  end_cut(c, l);
}

// The child is reaped (or was never started): its pages are no longer charged.
void replication::impl::end_cut(int c, leading_end& l) {
  METAD_ASSERT(!l.cut.running());
  share(c).cutting.store(false);
  if (l.cut_charged) nd.memory.end_cut();
  l.cut_charged = false;
}

void replication::impl::on_ack(int c, core_end& e, leading_end& l, const repl::ack& a) {
  if (!l.stream || !l.stream->on_ack(a)) {
    log::warn("replication: core {}: an ack out of order; closing the stream", c);
    return close(c, e);
  }
  store::log_writer& log = core(c).log;
  log.replicated_until(std::min(a.lsn, log.end()));
  const bool caught_up = l.acks.acked(a.lsn, smp::monotonic_ns());
  publish(c, l);
  // Still pumping from the log files: the clock starts again when the pump ends.
  if (caught_up && !l.files) share(c).state.store(progress::caught_up);
}

// A stream resumed from the log files: whole frames from them while less than half the
// queue bound is queued on it, up to what the core keeps in memory; then the retained
// bytes, and the stream goes on live.
void replication::impl::pump_files(int c, core_end& e, leading_end& l) {
  const store::log_writer& log = core(c).log;
  std::size_t read = 0;  // this turn's: the core serves requests between turns
  while (link->at(c).queued() < queued_max / 2 && read < kPumpBytesPerTurn) {
    const std::uint64_t at = l.files->pos();
    if (at >= l.retained.from()) {
      // The retained bytes go at once: only once the queue has room for them, so that
      // the live writes after them do not pass its bound.
      const std::size_t queued = link->at(c).queued();
      if (queued != 0 && queued + (l.retained.end() - at) > queued_max / 2) return;
      l.files.reset();
      share(c).pumping.store(false);
      resend(c, e, l, at);
      // Caught up once it acks what the core shipped until now (the retained bytes).
      l.acks.start(l.retained.end(), smp::monotonic_ns(),
                   std::uint64_t{nd.cfg.sync_timeout_ms} * smp::kNsPerMs);
      publish(c, l);
      log::info("replication: core {} streamed its log files up to {}; on from memory", c, at);
      return;
    }
    // The segments the log switched to since the hello: without them the last one
    // listed then would be read past its end once the retained bytes move past it.
    for (const auto& [segment, start] : core(c).segments)
      if (start > l.files->last_start())
        l.files->extend({nd.data->log_path(nd.data->generation(), c, segment), start});
    std::string bytes;
    if (!l.files->read(bytes, std::size_t{1} << 20, std::min(l.retained.from(), log.durable()))) {
      log::warn("replication: core {}: a resumed stream ends: {}", c, l.files->error());
      // A hello at or before here gets a snapshot: the files cannot give it.
      l.files_failed = true;
      l.files_failed_at = std::max(l.files_failed_at, l.files->pos());
      return close(c, e);
    }
    if (bytes.empty()) return;  // the next piece is not written yet
    read += bytes.size();
    l.stream->send(e.out, bytes);
    send(c, e);
    l.acks.sent(l.stream->sent(), smp::monotonic_ns());
    publish(c, l);
  }
}

// Sends the retained bytes from `lsn` (at least retained.from()) on a resumed stream.
void replication::impl::resend(int c, core_end& e, leading_end& l, std::uint64_t lsn) {
  l.retained.each_from(lsn, [&](std::string_view chunk) {
    l.stream->send(e.out, chunk);
    if (e.out.size() >= (std::size_t{4} << 20)) send(c, e);
  });
  send(c, e);
}

void replication::impl::shipped(int c, const store::log_writer::flush_job& job) {
  core_end& e = ends[static_cast<std::size_t>(c)];
  leading_end* l = e.leader();
  if (l == nullptr) return;                                 // a standby's own group commit
  METAD_ASSERT(l->cut.held().empty() || l->cut.running());  // held only while a child cuts
  if (l->retained.retaining()) l->retained.keep(job.lsn, job.data, job.bytes);
  if (!l->stream || l->files) return;  // pump_files sends it when it gets there
  const std::uint64_t end = job.lsn + job.bytes;
  const std::uint64_t from = std::max(job.lsn, l->stream->sent());
  if (end <= from) return;
  METAD_ASSERT(job.lsn <= l->stream->sent());  // every byte since the snapshot passes here
  l->stream->send(e.out, std::string_view(job.data + (from - job.lsn), end - from));
  if (l->cut.running()) {  // after the snapshot a child is cutting
    l->cut.held() += e.out;
    e.out.clear();
  } else {
    send(c, e);
  }
  l->acks.sent(end, smp::monotonic_ns());
  publish(c, *l);
  const std::size_t queued = link->at(c).queued() + l->cut.held().size();
  if (queued > queued_max) {
    log::warn(
        "replication: core {}: {} bytes queued for the standby (at most {}): it does not read "
        "fast enough; closing its stream",
        c, queued, queued_max);
    abort_cut(c, *l);  // frees what was held for it
    close(c, e);
  }
}

}  // namespace metad::replica
