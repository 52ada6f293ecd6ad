// replication's construction (the link and its callbacks), each core's turn (its stream's
// messages to the leader's or the standby's end, the ack set's requirement, parking), and
// the sync set on the link thread. The ends are leader_end.cpp and standby_end.cpp; roles
// and promotion, promotion.cpp.
#include "replica/replication.hpp"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "metad/log.hpp"
#include "repl/tls.hpp"
#include "replica/replication_impl.hpp"
#include "smp/clock.hpp"

namespace metad::replica {

namespace {

// A stream whose peer is this far behind in bytes queued is cut (a standby that cannot
// keep up, or a peer that never reads, must not take the leader's memory with it): per
// core, an eighth of --memory-max over all cores, within [kQueuedFloor, kQueuedCeiling].
// Its buffers are freed when the stream ends.
constexpr std::size_t kQueuedCeiling = std::size_t{64} << 20;
constexpr std::size_t kQueuedFloor = std::size_t{32} << 20;
// A resumed stream is sent up to repl::kRetainBytes at once (resend) and then what the
// core ships: the queue bound leaves room for both.
static_assert(kQueuedFloor >= 2 * repl::kRetainBytes);

}  // namespace

[[noreturn]] void exit_to_resync(std::string_view why) {
  log::error("replication: {}; exiting with status {} to start again as an empty standby", why,
             kExitResync);
  std::_Exit(kExitResync);
}

replication::impl::impl(pipeline::node& n, start_as as)
    : nd(n),
      mode(as),
      ends(static_cast<std::size_t>(n.cores)),
      shared(std::make_unique<shared_core[]>(static_cast<std::size_t>(n.cores))),
      feed(std::make_unique<persist::binding_feed>(n.cores)),
      sync(repl::sync_config{.sync_timeout_ms = n.cfg.sync_timeout_ms}) {
  if (as == start_as::standby)
    for (core_end& e : ends) e.role.emplace<following_end>();
  nd.repl.following = as == start_as::standby;
  const std::uint64_t per_core = nd.memory.max() / 8 / static_cast<std::uint64_t>(n.cores);
  queued_max =
      static_cast<std::size_t>(std::clamp<std::uint64_t>(per_core, kQueuedFloor, kQueuedCeiling));
  CPU_ZERO(&process_cpus);
  have_process_cpus = ::sched_getaffinity(0, sizeof process_cpus, &process_cpus) == 0;
  std::string host;
  std::uint16_t port = 0;
  repl::split_host_port(nd.cfg.repl_listen, host, port);
  repl::link_config lc;
  lc.cores = nd.cores;
  lc.listen_host = host;
  lc.listen_port = port;
  for (int c = 0; c < nd.cores; ++c) lc.wake_fds.push_back(nd.mailbox.wake_fd(c));
  if (!nd.cfg.repl_tls_cert.empty())
    lc.tls = std::make_shared<repl::tls_context>(
        repl::tls_files{nd.cfg.repl_tls_cert, nd.cfg.repl_tls_key, nd.cfg.repl_tls_ca});
  lc.refused = [this](repl::refusal r) {
    nd.repl.refused[static_cast<std::size_t>(r)].fetch_add(1, std::memory_order_relaxed);
  };
  lc.answer_refused = [this](const repl::hello& h, repl::refusal why) {
    repl::answer a;
    a.epoch = nd.ha != nullptr && nd.ha->serving() ? static_cast<std::uint64_t>(nd.ha->epoch()) : 0;
    a.core = h.core;
    // Another node holds this node's streams: that node may be the standby in the ack
    // set, which a newcomer must not displace. Busy: the newcomer connects again after
    // its pause, and gets in once those streams have ended.
    a.status =
        why == repl::refusal::taken ? repl::answer_status::busy : repl::answer_status::refused;
    // A hello for a core this node lacks (another core count): refused like the
    // others, so that the standby can say why.
    if (a.status == repl::answer_status::refused && a.epoch != 0)
      log::warn(
          "replication: refused node {}'s stream for core {}: cluster {}, {} cores, protocol {} "
          "(this node: {}, {} cores, protocol {})",
          h.node, h.core, h.cluster, h.cores, h.version, nd.cfg.ha_cluster, nd.cores,
          repl::kProtocolVersion);
    std::string out;
    repl::encode(out, a);
    return out;
  };
  lc.each_turn = [this] {
    decide_sync();
    // A core moving a child's snapshot or its log files to a stream has no event to wake
    // it when the pipe fills or the queue drains.
    for (int c = 0; c < nd.cores; ++c)
      if (share(c).cutting.load() || share(c).pumping.load()) nd.mailbox.wake(c);
  };
  link = std::make_unique<repl::link>(std::move(lc));
}

bool replication::impl::all(progress p) const {
  for (int c = 0; c < nd.cores; ++c)
    if (shared[static_cast<std::size_t>(c)].state.load() != p) return false;
  return true;
}

namespace {

// Empties a buffer, giving its memory back if it grew past a batch's usual size.
void release_if_big(std::string& s) {
  if (s.capacity() > (std::size_t{1} << 20))
    std::string().swap(s);
  else
    s.clear();
}

}  // namespace

void replication::impl::send(int c, core_end& e) {
  if (!e.out.empty()) link->at(c).send(e.stream, e.out);
  release_if_big(e.out);
}

void replication::impl::close(int c, core_end& e) {
  link->at(c).close(e.stream);
  e.closing = true;
}

void replication::impl::wake_cores() {
  for (int c = 0; c < nd.cores; ++c) nd.mailbox.wake(c);
}

// --- each core's turn ------------------------------------------------------------------

// The messages that arrived on core c's stream, to its leader's or its standby's end.
void replication::impl::handle(int c, core_end& e) {
  for (;;) {
    const repl::decoder::status st = e.decoder.next();
    if (st == repl::decoder::status::need_more) return;
    if (st != repl::decoder::status::message) {
      log::warn("replication: core {}: a damaged message; closing the stream", c);
      return close(c, e);
    }
    using type = repl::message_type;
    const type t = e.decoder.type;
    leading_end* l = e.leader();
    following_end* f = e.standby();
    if (l != nullptr && t == type::hello) {
      on_hello(c, e, *l, e.decoder.hello);
    } else if (l != nullptr && t == type::ack) {
      on_ack(c, e, *l, e.decoder.ack);
    } else if (f != nullptr && t == type::answer) {
      on_answer(c, e, *f, e.decoder.answer);
    } else if (f != nullptr && t == type::snapshot) {
      on_snapshot(c, *f, e.decoder.snapshot);
    } else if (f != nullptr && t == type::batch) {
      on_batch(c, e, *f, e.decoder.batch);
    } else {
      log::warn("replication: core {}: an unexpected message; closing the stream", c);
      return close(c, e);
    }
    if (e.closing) return;
  }
}

void replication::impl::poll(int c) {
  core_end& e = ends[static_cast<std::size_t>(c)];
  release_if_big(e.in);
  const std::uint64_t stream = link->at(c).take(e.in);
  if (stream != e.stream) {
    if (e.standby() != nullptr && e.stream != 0 && !e.closing) {
      // What the leader said last on the stream that ended (a refusal) is heard.
      std::string last;
      if (link->at(c).take_last(last) == e.stream && !last.empty()) {
        e.decoder.feed(last);
        handle(c, e);
      }
    }
    e.stream = stream;
    e.closing = false;
    e.decoder = repl::decoder{};
    if (leading_end* l = e.leader())
      end_leading(c, *l);
    else if (stream != 0)
      say_hello(c, e, *e.standby());
  }
  if (!e.in.empty() && e.stream != 0 && !e.closing) {
    e.decoder.feed(e.in);
    handle(c, e);
  }
  if (leading_end* l = e.leader(); l != nullptr && l->cut.running() && !e.closing)
    pump_cut(c, e, *l);
  if (leading_end* l = e.leader(); l != nullptr && l->files && !e.closing) pump_files(c, e, *l);
  // Other cores' binding changes for this core's slice, also before its own snapshot
  // arrives (it counts them into its directory, staged: directory::restore_count).
  if (e.standby() != nullptr) feed->drain(c, core(c));
  ack_durable(c, e);  // a standby's
  // The requirement: applied once the standby also holds what was answered before it.
  store::log_writer& log = core(c).log;
  const bool required = e.requirement.poll(require.load(), log.end(), log.replicated());
  if (log.standby_required() != required) log.require_standby(required);
  share(c).require_applied.store(e.requirement.applied());
  if (park_asked.load()) park();
}

// --- the sync set (link thread) ----------------------------------------------------------

// Into or out of the ack set: each core applies it to its log on its next poll().
void replication::impl::set_require(bool on) {
  require = on;
  wake_cores();
}

void replication::impl::close_all() {
  for (int c = 0; c < nd.cores; ++c) link->at(c).close(link->at(c).current());
}

// Feeds the sync set what the cores report and does what it decides.
void replication::impl::decide_sync() {
  if (nd.ha == nullptr || mode.load() != start_as::primary) return;
  std::uint64_t lag = 0;
  std::vector<repl::core_report> reports(static_cast<std::size_t>(nd.cores));
  for (int c = 0; c < nd.cores; ++c) {
    const shared_core& s = shared[static_cast<std::size_t>(c)];
    lag += s.lag_bytes.load(std::memory_order_relaxed);
    reports[static_cast<std::size_t>(c)] = {s.state.load(), s.require_applied.load(),
                                            s.oldest_unacked_ns.load(std::memory_order_relaxed),
                                            s.slow_since_ns.load(), s.slow_acks.load()};
  }
  nd.repl.lag_bytes.store(lag);
  using A = repl::sync_actions;
  const A a = sync.step({nd.ha->epoch(), smp::monotonic_ns(), reports,
                         sync_ticket != 0 && nd.ha->sync_written(sync_ticket)});
  if (a.require != A::require_change::none) set_require(a.require == A::require_change::on);
  if (a.close_streams) close_all();
  if (a.write == A::sync_write::standby) {
    std::string node;
    {
      std::lock_guard lock(standby_mutex);
      node = standby_node;
    }
    sync_ticket = control->request_sync({node});
  } else if (a.write == A::sync_write::nobody) {
    sync_ticket = control->request_sync({});
  }
  nd.repl.in_sync.store(sync.in_sync());
  const repl::sync_config& cfg = sync.config();
  switch (a.why) {
    case A::reason::catch_up_silent:
      log::warn("replication: a standby catching up went silent; closing its streams");
      break;
    case A::reason::late_acks:
      nd.repl.drops.fetch_add(1);
      log::warn(
          "replication: the standby acknowledges late (on average over half of "
          "--sync-timeout-ms {} for {} ms): /sync first, then alone; it may rejoin in {} ms",
          cfg.sync_timeout_ms, 4 * cfg.sync_timeout_ms, cfg.slow_rejoin_ms);
      break;
    case A::reason::stopped_acking:
      nd.repl.drops.fetch_add(1);
      log::warn("replication: the standby stopped acknowledging: /sync first, then alone");
      break;
    case A::reason::published:
      log::info("replication: the standby is in sync: writes wait for its acknowledgement");
      break;
    case A::reason::dropped:
      log::info("replication: /sync lists no standby: acknowledging alone");
      break;
    case A::reason::none:
    case A::reason::caught_up:
    case A::reason::lost_before_sync:
    case A::reason::new_epoch:
      break;
  }
}

// --- the public face ---------------------------------------------------------------------

replication::replication(pipeline::node& nd, start_as as) : impl_(std::make_unique<impl>(nd, as)) {
  nd.repl.enabled = true;
}

replication::~replication() { stop(); }

void replication::start(ha::control& control) {
  impl_->control = &control;
  if (impl_->mode.load() == start_as::standby) {
    log::info("replication: starting empty, as a standby: waiting for the leader's address");
  }
  impl_->link->start();
}

void replication::stop() {
  if (impl_->promotion.joinable()) impl_->promotion.join();
  impl_->link->stop();
}

bool replication::standby() const { return impl_->mode.load() == start_as::standby; }

void replication::poll(int c) { impl_->poll(c); }

void replication::shipped(int c, const store::log_writer::flush_job& job) {
  impl_->shipped(c, job);
}

void replication::flushed(int c) {
  impl_->ack_durable(c, impl_->ends[static_cast<std::size_t>(c)]);
}

}  // namespace metad::replica
