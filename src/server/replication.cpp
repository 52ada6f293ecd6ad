#include "server/replication.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "ha/etcd.hpp"
#include "metad/log.hpp"
#include "persist/durability.hpp"
#include "persist/standby.hpp"
#include "repl/link.hpp"
#include "repl/protocol.hpp"
#include "repl/session.hpp"
#include "repl/sync_set.hpp"
#include "repl/tls.hpp"
#include "smp/clock.hpp"

namespace metad {

namespace {

// A stream whose peer is this far behind in bytes queued is cut (a standby that cannot
// keep up, or a peer that never reads, must not take the leader's memory with it): per
// core, an eighth of --memory-max over all cores, within [kQueuedFloor, kQueuedCeiling].
// Its buffers are freed when the stream ends.
constexpr std::size_t kQueuedCeiling = std::size_t{64} << 20;
constexpr std::size_t kQueuedFloor = std::size_t{32} << 20;
// What a leader core keeps of the log bytes it shipped, so that a standby whose stream
// broke (a network blip, a restart of the link) resumes from its position instead of
// copying the whole state again. Older positions need a snapshot.
constexpr std::uint64_t kRetainBytes = std::uint64_t{16} << 20;
// A resumed stream is sent up to kRetainBytes at once (resend) and then what the core
// ships: the queue bound leaves room for both.
static_assert(kQueuedFloor >= 2 * kRetainBytes);
// A snapshot cut by a child process is moved to the stream while less than half the
// queue bound is queued on it, a piece of at most kSnapshotReadBytes per read.
constexpr std::size_t kSnapshotReadBytes = std::size_t{1} << 20;
// A core starts at most one snapshot cut (a fork) per this interval; a hello that needs
// one sooner is answered busy (the standby connects again after its pause). A cut runs
// alone: the stream it is for ends before another hello reaches the core.
constexpr std::uint64_t kCutIntervalMs = 2'000;

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

[[noreturn]] void exit_to_resync(std::string_view why) {
  log::error("replication: {}; exiting with status {} to start again as an empty standby", why,
             kExitResync);
  std::_Exit(kExitResync);
}

}  // namespace

struct replication::impl {
  // What each core's end of its stream shares with the sync-set decisions.
  using progress = repl::progress;
  struct shared_core {
    std::atomic<progress> state{progress::none};
    std::atomic<bool> cutting{false};  // a child is cutting a snapshot: wake the core
    std::atomic<std::uint64_t> oldest_unacked_ns{0};  // 0: everything sent was acked
    std::atomic<bool> require_applied{false};         // repl::core_requirement::applied
    std::atomic<std::uint64_t> lag_bytes{0};          // sent − acked
    // Acks late on average since slow_since_ns (0: not late), slow_acks of them.
    std::atomic<std::uint64_t> slow_since_ns{0}, slow_acks{0};
  };
  // One core's end, touched by that core only (and by promotion while it is parked).
  struct core_end {
    std::uint64_t stream = 0;
    bool closing = false;  // close() asked; the link has not ended it yet
    repl::decoder decoder;
    std::string in, out;
    // Leader.
    std::optional<repl::leader_stream> leading;
    std::uint64_t caught_up_at = 0;  // the snapshot's (or hello's) position
    std::deque<std::pair<std::uint64_t, std::uint64_t>> unacked;  // (end lsn, sent ns)
    // The bytes shipped lately, [retained_from, shipped_end) in consecutive chunks (one
    // per flush), kept from this leadership's first stream on, with or without one now.
    bool retaining = false;
    std::deque<std::string> retained;
    std::uint64_t retained_from = 0, shipped_end = 0;
    std::uint64_t retained_bytes = 0;  // Σ retained: retained_from + retained_bytes == shipped_end
    // A new standby's snapshot being cut by a child process (fork(): a copy-on-write
    // image of this core's state at the hello), its encoded messages read from `cut_fd`
    // into the stream; what this core ships meanwhile waits in `held`, then follows.
    pid_t cut_child = -1;
    int cut_fd = -1;
    std::string held;
    std::uint64_t cut_lsn = 0, cut_bytes = 0, cut_started = 0;
    std::string cut_for;  // the standby's node id, for the log
    std::string cut_buffer;
    std::uint64_t last_cut_ns = 0;             // when the latest cut began (kCutIntervalMs)
    std::optional<repl::ack_latency> latency;  // late acks, on this stream
    repl::core_requirement requirement;
    // When the standby caught up on this stream (0: not yet): only writes shipped from
    // then on are timed (a catch-up's first ack comes a snapshot's transfer later).
    std::uint64_t caught_up_ns = 0;
    // Standby.
    std::optional<repl::follower> following;
    std::unique_ptr<persist::standby_core> applier;
    // The leader answered this stream's hello (a resume or a snapshot): acks may flow.
    bool answered = false;
    bool acked_once = false;  // on this stream
  };

  pipeline::node& nd;
  // The process's CPUs before the cores were pinned: a child cutting a snapshot runs on
  // any of them (at a lower priority), not on the pinned core that forked it.
  cpu_set_t process_cpus;
  bool have_process_cpus = false;
  std::atomic<start_as> mode;
  std::vector<core_end> ends;
  std::unique_ptr<shared_core[]> shared;
  std::atomic<bool> require{false};
  std::mutex standby_mutex;
  std::string standby_node;  // the node whose hello the cores answered last
  std::unique_ptr<repl::link> link;
  ha::control* control = nullptr;  // the lease's control thread (writes /sync)
  std::thread promotion;           // a standby that won the lease: promote() runs here

  // Promotion parks every core in poll() while its thread finishes the replay.
  std::mutex park_mutex;
  std::condition_variable park_cv;
  std::atomic<bool> park_asked{false};
  int parked = 0;

  // The sync set, decided on the link thread (repl/sync_set.hpp).
  repl::sync_set sync;
  std::uint64_t sync_ticket = 0;  // the /sync write it asked for last

  // Bytes queued for one core's peer before its stream is cut (kQueuedCeiling).
  std::size_t queued_max = kQueuedCeiling;

  impl(pipeline::node& n, start_as as)
      : nd(n),
        mode(as),
        ends(static_cast<std::size_t>(n.cores)),
        shared(std::make_unique<shared_core[]>(static_cast<std::size_t>(n.cores))),
        sync(repl::sync_config{.sync_timeout_ms = n.cfg.sync_timeout_ms}) {
    const std::uint64_t share = nd.memory.max() / 8 / static_cast<std::uint64_t>(n.cores);
    queued_max =
        static_cast<std::size_t>(std::clamp<std::uint64_t>(share, kQueuedFloor, kQueuedCeiling));
    CPU_ZERO(&process_cpus);
    have_process_cpus = ::sched_getaffinity(0, sizeof process_cpus, &process_cpus) == 0;
    std::string host;
    std::uint16_t port = 0;
    repl::split_host_port(nd.cfg.repl_listen, host, port);
    repl::link_config lc;
    lc.cores = nd.cores;
    lc.listen_host = host;
    lc.listen_port = port;
    lc.wake_core = [this](int c) { nd.mailbox.wake(c); };
    if (!nd.cfg.repl_tls_cert.empty())
      lc.tls = std::make_shared<repl::tls_context>(
          repl::tls_files{nd.cfg.repl_tls_cert, nd.cfg.repl_tls_key, nd.cfg.repl_tls_ca});
    lc.refused = [this](repl::refusal r) {
      nd.repl.refused[static_cast<std::size_t>(r)].fetch_add(1, std::memory_order_relaxed);
    };
    lc.answer_refused = [this](const repl::hello& h, repl::refusal why) {
      repl::answer a;
      a.epoch =
          nd.ha != nullptr && nd.ha->serving() ? static_cast<std::uint64_t>(nd.ha->epoch()) : 0;
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
      // A core moving a child's snapshot has no event to wake it when the pipe fills.
      for (int c = 0; c < nd.cores; ++c)
        if (shared[static_cast<std::size_t>(c)].cutting.load()) nd.mailbox.wake(c);
    };
    link = std::make_unique<repl::link>(std::move(lc));
  }

  pipeline::core_state& core(int c) { return *nd.core[static_cast<std::size_t>(c)]; }
  // Empties a buffer, giving its memory back if it grew past a batch's usual size.
  static void release_if_big(std::string& s) {
    if (s.capacity() > (std::size_t{1} << 20))
      std::string().swap(s);
    else
      s.clear();
  }
  void send(int c, core_end& e) {
    if (!e.out.empty()) link->at(c).send(e.stream, e.out);
    release_if_big(e.out);
  }
  // Ends the stream: what else arrives on it is dropped until the link closes it.
  void close(int c, core_end& e) {
    link->at(c).close(e.stream);
    e.closing = true;
  }

  // --- the leader's side -------------------------------------------------------------

  void publish_unacked(int c, const core_end& e) {
    shared_core& s = shared[static_cast<std::size_t>(c)];
    s.oldest_unacked_ns.store(e.unacked.empty() ? 0 : e.unacked.front().second,
                              std::memory_order_relaxed);
    s.lag_bytes.store(e.leading ? e.leading->sent() - e.leading->acked() : 0,
                      std::memory_order_relaxed);
  }

  void end_leading(int c, core_end& e) {
    abort_cut(c, e);
    e.leading.reset();
    e.unacked.clear();
    e.latency.reset();
    publish_unacked(c, e);
    publish_latency(c, e);
    shared[static_cast<std::size_t>(c)].state.store(progress::none);
  }

  void on_hello(int c, core_end& e, const repl::hello& h) {
    if (e.leading || e.cut_fd >= 0) {  // one hello per stream
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
    view.retained_from = e.retaining ? e.retained_from : log.end();
    view.end = e.retaining ? e.shipped_end : log.end();
    repl::answer a = repl::answer_hello(h, view);
    if (!leading) a.status = repl::answer_status::refused;
    const std::uint64_t now = smp::monotonic_ns();
    if (a.status == repl::answer_status::need_snapshot && e.last_cut_ns != 0 &&
        now - e.last_cut_ns < kCutIntervalMs * smp::kNsPerMs) {
      log::info(
          "replication: core {}: node {} needs a snapshot, but this core began one {:.0f} ms ago "
          "(at most one per {} ms): answered busy",
          c, h.node, static_cast<double>(now - e.last_cut_ns) / smp::kNsPerMs, kCutIntervalMs);
      a.status = repl::answer_status::busy;
      a.lsn = 0;
    }
    if (a.status == repl::answer_status::need_snapshot) {
      e.last_cut_ns = now;
      a.lsn = log.end();  // the state now is the log up to its end, pending records included
      repl::encode(e.out, a);
      send(c, e);
      repl::snapshot head;
      head.epoch = view.epoch;
      head.generation = view.generation;
      head.core = static_cast<std::uint32_t>(c);
      head.lsn = a.lsn;
      if (!fork_cut(c, e, head, h.node)) cut_here(c, e, head, h.node);
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
    e.leading.emplace(view.epoch, view.generation, static_cast<std::uint32_t>(c), a.lsn);
    if (!e.retaining) {
      e.retaining = true;
      e.retained_from = e.shipped_end = a.lsn;
    } else if (a.status == repl::answer_status::stream) {
      resend(c, e, a.lsn);
      log::info("replication: core {} resumes node {}'s stream at {} ({} bytes resent)", c, h.node,
                a.lsn, e.leading->sent() - a.lsn);
    }
    e.caught_up_at = e.leading->sent();
    e.latency.emplace(std::uint64_t{nd.cfg.sync_timeout_ms} * smp::kNsPerMs);
    e.caught_up_ns = 0;
    e.unacked.assign(1, {e.caught_up_at, smp::monotonic_ns()});
    publish_unacked(c, e);
    publish_latency(c, e);
    shared[static_cast<std::size_t>(c)].state.store(progress::catching_up);
    std::lock_guard lock(standby_mutex);
    standby_node = h.node;
  }

  // Encodes core c's state as the snapshot messages of `head` (the pieces, then the last
  // one) and hands them to `out` as they fill; returns the state's bytes.
  std::uint64_t encode_snapshot(int c, const repl::snapshot& head,
                                const std::function<void(std::string&)>& out) {
    std::string bytes;
    std::uint64_t state = 0;
    persist::serialize_state(core(c), [&](std::string_view piece) {
      repl::snapshot s = head;
      s.bytes = piece;
      state += piece.size();
      repl::encode(bytes, s);
      out(bytes);
    });
    repl::snapshot last = head;
    last.last = true;
    repl::encode(bytes, last);
    out(bytes);
    return state;
  }

  // A new standby's state, cut by a child process so that this core goes on serving: the
  // fork is the only pause (it copies the page tables, not the state). False if no child
  // could be started (then cut_here).
  bool fork_cut(int c, core_end& e, const repl::snapshot& head, const std::string& node) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    const std::uint64_t started = smp::monotonic_ns();
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      log::warn("replication: core {}: fork for a snapshot failed ({}); cutting it on the core", c,
                std::strerror(errno));
      ::close(fds[0]);
      ::close(fds[1]);
      return false;
    }
    if (pid == 0) {
      // The child: reads this core's state as it was at the fork and writes the encoded
      // snapshot messages; no logging, no other thread, no destructors. It holds the
      // server's descriptors (listeners, the data directory's lock), so it must not
      // outlive the thread that forked it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      if (have_process_cpus) ::sched_setaffinity(0, sizeof process_cpus, &process_cpus);
      ::setpriority(PRIO_PROCESS, 0, 10);
      ::close(fds[0]);
      bool ok = true;
      encode_snapshot(c, head, [&](std::string& bytes) {
        ok = ok && write_all(fds[1], bytes);
        bytes.clear();
      });
      ::_exit(ok ? 0 : 1);
    }
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    e.cut_child = pid;
    e.cut_fd = fds[0];
    e.cut_lsn = head.lsn;
    e.cut_bytes = 0;
    e.cut_started = started;
    e.cut_for = node;
    e.cut_buffer.resize(kSnapshotReadBytes);
    shared[static_cast<std::size_t>(c)].cutting.store(true);
    log::info("replication: core {} forked in {:.1f} ms to cut node {}'s snapshot at {}", c,
              static_cast<double>(smp::monotonic_ns() - started) / smp::kNsPerMs, node, head.lsn);
    return true;
  }

  // The same on the core itself, which serves nothing meanwhile.
  void cut_here(int c, core_end& e, const repl::snapshot& head, const std::string& node) {
    const std::uint64_t started = smp::monotonic_ns();
    const std::uint64_t bytes = encode_snapshot(c, head, [&](std::string& out) {
      link->at(c).send(e.stream, out);
      out.clear();
    });
    log::info("replication: core {} sends node {} its state at {}: {} bytes, cut in {:.1f} ms", c,
              node, head.lsn, bytes,
              static_cast<double>(smp::monotonic_ns() - started) / smp::kNsPerMs);
    nd.repl.snapshots_sent.fetch_add(1);
  }

  // Moves what the child wrote to the stream (while the peer keeps up), then what this
  // core shipped meanwhile.
  void pump_cut(int c, core_end& e) {
    repl::channel& ch = link->at(c);
    while (ch.queued() < queued_max / 2) {
      const ssize_t n = ::read(e.cut_fd, e.cut_buffer.data(), e.cut_buffer.size());
      if (n > 0) {
        ch.send(e.stream, std::string_view(e.cut_buffer.data(), static_cast<std::size_t>(n)));
        e.cut_bytes += static_cast<std::uint64_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      const bool whole = n == 0 && reap_cut(c, e) == 0;
      if (!whole) {
        log::warn("replication: core {}: cutting node {}'s snapshot failed; closing its stream", c,
                  e.cut_for);
        abort_cut(c, e);
        return close(c, e);
      }
      log::info(
          "replication: core {} sends node {} its state at {}: {} bytes, cut in {:.1f} ms by a "
          "child",
          c, e.cut_for, e.cut_lsn, e.cut_bytes,
          static_cast<double>(smp::monotonic_ns() - e.cut_started) / smp::kNsPerMs);
      nd.repl.snapshots_sent.fetch_add(1);
      ch.send(e.stream, e.held);
      std::string().swap(e.held);
      std::string().swap(e.cut_buffer);
      return;
    }
  }

  // Closes the pipe and waits for the child; its wait status (0: it wrote everything).
  int reap_cut(int c, core_end& e) {
    ::close(e.cut_fd);
    e.cut_fd = -1;
    int status = -1;
    while (::waitpid(e.cut_child, &status, 0) < 0 && errno == EINTR) {
    }
    e.cut_child = -1;
    shared[static_cast<std::size_t>(c)].cutting.store(false);
    return status;
  }

  // Ends a cut (the stream ended, or the child failed): the child if it still runs, and
  // the batches held for the stream.
  void abort_cut(int c, core_end& e) {
    if (e.cut_child >= 0) {
      ::kill(e.cut_child, SIGKILL);
      reap_cut(c, e);
    }
    std::string().swap(e.held);
    std::string().swap(e.cut_buffer);
  }

  void on_ack(int c, core_end& e, const repl::ack& a) {
    if (!e.leading || !e.leading->on_ack(a)) {
      log::warn("replication: core {}: an ack out of order; closing the stream", c);
      return close(c, e);
    }
    store::log_writer& log = core(c).log;
    log.replicated_until(std::min(a.lsn, log.end()));
    std::uint64_t newest_sent = 0;  // of the newest write this ack covers
    while (!e.unacked.empty() && e.unacked.front().first <= a.lsn) {
      newest_sent = e.unacked.front().second;
      e.unacked.pop_front();
    }
    const std::uint64_t now = smp::monotonic_ns();
    if (e.caught_up_ns != 0 && newest_sent >= e.caught_up_ns && e.latency) {
      e.latency->on_ack(now - newest_sent, now);
      publish_latency(c, e);
    }
    publish_unacked(c, e);
    if (a.lsn >= e.caught_up_at && e.caught_up_ns == 0) {
      e.caught_up_ns = now;
      shared[static_cast<std::size_t>(c)].state.store(progress::caught_up);
    }
  }

  // What the sync set reads of the ack latency (repl::ack_latency).
  void publish_latency(int c, const core_end& e) {
    shared_core& s = shared[static_cast<std::size_t>(c)];
    s.slow_since_ns.store(e.latency ? e.latency->slow_since_ns() : 0);
    s.slow_acks.store(e.latency ? e.latency->slow_acks() : 0);
  }

  // --- the standby's side ------------------------------------------------------------

  // This core holds something from a stream (state, or the start of a snapshot): a new
  // stream must resume where that one broke, or the node resyncs from empty. A core
  // whose leader wrote nothing since its snapshot holds that state at position 0: its
  // epoch (a serving leader's, never 0) says it followed, not its position.
  static bool has_followed(const core_end& e) {
    return e.following && (e.following->received() > 0 || e.following->awaiting_snapshot() ||
                           e.following->epoch() != 0);
  }

  void say_hello(int c, core_end& e) {
    // After a stream ended, what this core holds stays as it is until a leader answers:
    // a connection that closes unanswered (the leader died, and something else accepted
    // on its address) must leave this standby able to take over.
    if (!has_followed(e)) e.following.emplace(0, 0, static_cast<std::uint32_t>(c), 0);
    // A new stream: nothing is acked on it before the leader answers, then the first ack
    // says where this core stands, even at position 0 (the leader waits for it).
    e.answered = false;
    e.acked_once = false;
    repl::hello h;
    h.cluster = nd.cfg.ha_cluster;
    h.node = nd.cfg.ha_node;
    h.cores = static_cast<std::uint32_t>(nd.cores);
    h.core = static_cast<std::uint32_t>(c);
    if (!e.following->awaiting_snapshot()) {  // where it stands: the leader may resume there
      h.epoch = e.following->epoch();
      h.generation = e.following->generation();
      h.lsn = e.following->acked();
    }
    repl::encode(e.out, h);
    send(c, e);
  }

  void on_answer(int c, core_end& e, const repl::answer& a) {
    if (a.status == repl::answer_status::refused) {
      // A leader that does not serve (yet: starting, promoting) refuses with epoch 0: try
      // again shortly. A serving one refuses a mismatch, which an operator must see.
      if (a.epoch == 0)
        log::debug("replication: the leader refused core {}'s stream for now", c);
      else
        log::warn(
            "replication: the leader (epoch {}) refused core {}'s stream: its cluster name, core "
            "count or protocol version differs from this node's (cluster {}, {} cores, protocol "
            "{}); its log names its own",
            a.epoch, c, nd.cfg.ha_cluster, nd.cores, repl::kProtocolVersion);
      return close(c, e);
    }
    if (a.status == repl::answer_status::busy) {
      log::info(
          "replication: the leader is busy with core {} (cutting a snapshot, or another node's "
          "streams are live): connecting again",
          c);
      return close(c, e);
    }
    if (a.status == repl::answer_status::wrong_epoch) {
      // This node follows a newer leadership than the one that answered (a deposed
      // leader still listening): not this node's state to drop; connect again.
      log::warn(
          "replication: core {}: the node at the leader's address leads an older epoch "
          "({}) than this node follows; closing",
          c, a.epoch);
      return close(c, e);
    }
    if (has_followed(e)) {
      if (!e.following->awaiting_snapshot() && e.following->on_answer(a)) {
        log::info("replication: core {} resumes the leader's stream at {}", c, a.lsn);
        e.answered = true;  // tell the leader where it stands at once
        return;
      }
      exit_to_resync(
          "the leader cannot resume this standby's stream where it broke (another leadership, "
          "or a position it no longer keeps)");
    }
    if (a.status == repl::answer_status::need_snapshot && e.following->on_snapshot_answer(a)) {
      e.answered = true;
      return;
    }
    exit_to_resync("the leader cannot stream to this standby's position");
  }

  // Appends and applies whole frames; a record that no longer applies means the states
  // diverged.
  static void apply(core_end& e, std::string_view frames) {
    try {
      e.applier->receive(frames);
    } catch (const std::exception& error) {
      exit_to_resync(error.what());
    }
  }

  void on_snapshot(int c, core_end& e, const repl::snapshot& s) {
    if (!e.following->on_snapshot(s)) exit_to_resync("a snapshot piece out of order");
    if (!e.applier) e.applier = std::make_unique<persist::standby_core>(nd, c, 0);
    apply(e, s.bytes);
    if (s.last) {
      e.applier->rebase(s.lsn);
      // It holds the leader's whole state from here on, even after the stream ends.
      shared[static_cast<std::size_t>(c)].state.store(progress::caught_up);
      if (all(progress::caught_up)) nd.repl.caught_up = true;
      log::info("replication: core {} received the leader's state at {}", c, s.lsn);
    }
  }

  void on_batch(int c, core_end& e, const repl::batch& b) {
    using verdict = repl::follower::verdict;
    const repl::follower::result r = e.following->on_batch(b);
    switch (r.v) {
      case verdict::apply:
        return apply(e, r.bytes);
      case verdict::duplicate:
        repl::encode(e.out, e.following->current_ack());
        return send(c, e);
      case verdict::wrong_epoch:  // a deposed leader's: never acked (fencing)
        log::warn("replication: core {}: a batch of epoch {}, following {}; closing", c, b.epoch,
                  e.following->epoch());
        return close(c, e);
      default:
        exit_to_resync("a batch that does not continue this standby's log");
    }
  }

  void ack_durable(int c, core_end& e) {
    if (!e.following || !e.applier || e.following->awaiting_snapshot() || e.stream == 0 ||
        !e.answered || e.closing)
      return;
    const std::uint64_t log_durable = e.applier->durable_lsn();
    if (log_durable == 0 && !e.applier->snapshot_durable()) return;
    const std::uint64_t durable = std::min(log_durable, e.following->received());
    // The first ack says the snapshot is durable, even at position 0.
    if (durable <= e.following->acked() && e.acked_once) return;
    e.acked_once = true;
    repl::encode(e.out, e.following->durable(durable));
    send(c, e);
  }

  // --- both -------------------------------------------------------------------------

  void handle(int c, core_end& e) {
    const bool leader = mode.load() == start_as::primary;
    for (;;) {
      const repl::decoder::status st = e.decoder.next();
      if (st == repl::decoder::status::need_more) return;
      if (st != repl::decoder::status::message) {
        log::warn("replication: core {}: a damaged message; closing the stream", c);
        return close(c, e);
      }
      using type = repl::message_type;
      const type t = e.decoder.type;
      if (leader && t == type::hello) {
        on_hello(c, e, e.decoder.hello);
      } else if (leader && t == type::ack) {
        on_ack(c, e, e.decoder.ack);
      } else if (!leader && t == type::answer) {
        on_answer(c, e, e.decoder.answer);
      } else if (!leader && t == type::snapshot) {
        on_snapshot(c, e, e.decoder.snapshot);
      } else if (!leader && t == type::batch) {
        on_batch(c, e, e.decoder.batch);
      } else {
        log::warn("replication: core {}: an unexpected message; closing the stream", c);
        return close(c, e);
      }
      if (e.closing) return;
    }
  }

  void poll(int c) {
    core_end& e = ends[static_cast<std::size_t>(c)];
    release_if_big(e.in);
    const std::uint64_t stream = link->at(c).take(e.in);
    if (stream != e.stream) {
      if (mode.load() == start_as::standby && e.stream != 0 && !e.closing) {
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
      if (mode.load() == start_as::primary)
        end_leading(c, e);
      else if (stream != 0)
        say_hello(c, e);
    }
    if (!e.in.empty() && e.stream != 0 && !e.closing) {
      e.decoder.feed(e.in);
      handle(c, e);
    }
    if (e.cut_fd >= 0 && !e.closing) pump_cut(c, e);
    if (mode.load() == start_as::standby) ack_durable(c, e);
    // The requirement: applied once the standby also holds what was answered before it.
    store::log_writer& log = core(c).log;
    const bool required = e.requirement.poll(require.load(), log.end(), log.replicated());
    if (log.standby_required() != required) log.require_standby(required);
    shared[static_cast<std::size_t>(c)].require_applied.store(e.requirement.applied());
    if (park_asked.load()) park();
  }

  void park() {
    std::unique_lock lock(park_mutex);
    ++parked;
    METAD_ASSERT(parked <= nd.cores);
    park_cv.notify_all();
    park_cv.wait(lock, [this] { return !park_asked.load(); });
    --parked;
  }

  // Keeps what a flush ships for a standby that comes back (kRetainBytes at most).
  static void retain(core_end& e, const store::log_writer::flush_job& job) {
    const std::uint64_t end = job.lsn + job.bytes;
    if (end <= e.shipped_end) return;
    if (job.lsn > e.shipped_end) {  // not consecutive (never expected): start again here
      e.retained.clear();
      e.retained_bytes = 0;
      e.retained_from = e.shipped_end = job.lsn;
    }
    const std::uint64_t from = e.shipped_end;
    e.retained.emplace_back(job.data + (from - job.lsn), end - from);
    e.retained_bytes += end - from;
    e.shipped_end = end;
    while (e.shipped_end - e.retained_from - e.retained.front().size() >= kRetainBytes) {
      e.retained_from += e.retained.front().size();
      e.retained_bytes -= e.retained.front().size();
      e.retained.pop_front();
    }
    METAD_ASSERT(e.retained_from + e.retained_bytes == e.shipped_end);
  }

  // Sends the retained bytes from `lsn` (at least retained_from) on a resumed stream.
  void resend(int c, core_end& e, std::uint64_t lsn) {
    std::uint64_t at = e.retained_from;
    for (const std::string& chunk : e.retained) {
      const std::uint64_t end = at + chunk.size();
      if (end > lsn) {
        const std::uint64_t skip = lsn > at ? lsn - at : 0;
        e.leading->send(e.out, std::string_view(chunk).substr(skip));
        if (e.out.size() >= (std::size_t{4} << 20)) send(c, e);
      }
      at = end;
    }
    send(c, e);
  }

  void shipped(int c, const store::log_writer::flush_job& job) {
    core_end& e = ends[static_cast<std::size_t>(c)];
    METAD_ASSERT(e.held.empty() || e.cut_fd >= 0);  // held only while a child cuts
    if (e.retaining) retain(e, job);
    if (!e.leading) return;
    const std::uint64_t end = job.lsn + job.bytes;
    const std::uint64_t from = std::max(job.lsn, e.leading->sent());
    if (end <= from) return;
    METAD_ASSERT(job.lsn <= e.leading->sent());  // every byte since the snapshot passes here
    e.leading->send(e.out, std::string_view(job.data + (from - job.lsn), end - from));
    if (e.cut_fd >= 0) {  // after the snapshot a child is cutting
      e.held += e.out;
      e.out.clear();
    } else {
      send(c, e);
    }
    METAD_ASSERT(e.unacked.empty() || e.unacked.back().first <= end);  // ascending
    e.unacked.emplace_back(end, smp::monotonic_ns());
    publish_unacked(c, e);
    if (link->at(c).queued() + e.held.size() > queued_max) {
      log::warn(
          "replication: core {}: {} bytes queued for the standby (at most {}): it does not read "
          "fast enough; closing its stream",
          c, link->at(c).queued() + e.held.size(), queued_max);
      abort_cut(c, e);  // frees what was held for it
      close(c, e);
    }
  }

  // --- the sync set (link thread) -----------------------------------------------------

  bool all(progress p) const {
    for (int c = 0; c < nd.cores; ++c)
      if (shared[static_cast<std::size_t>(c)].state.load() != p) return false;
    return true;
  }

  void wake_cores() {
    for (int c = 0; c < nd.cores; ++c) nd.mailbox.wake(c);
  }

  // Into or out of the ack set: each core applies it to its log on its next poll().
  void set_require(bool on) {
    require = on;
    wake_cores();
  }

  // Feeds the sync set what the cores report and does what it decides.
  void decide_sync() {
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

  void close_all() {
    for (int c = 0; c < nd.cores; ++c) link->at(c).close(link->at(c).current());
  }

  // --- promotion (ha thread) ---------------------------------------------------------

  // False if the node stopped first (it then never serves).
  bool promote() {
    auto t = std::chrono::steady_clock::now();
    link->set_mode(repl::link::mode::idle);  // the old leader's streams end first
    {
      std::unique_lock lock(park_mutex);
      park_asked = true;
      wake_cores();
      // A core that stopped (SIGTERM) never parks: then the node stops without serving.
      while (!park_cv.wait_for(lock, std::chrono::milliseconds(50),
                               [this] { return parked == nd.cores; }))
        if (nd.stopping.load()) {
          park_asked = false;
          park_cv.notify_all();
          return false;
        }
    }
    std::vector<std::unique_ptr<persist::standby_core>> appliers;
    for (core_end& e : ends) {
      appliers.push_back(std::move(e.applier));
      e.following.reset();
    }
    persist::promote_standby(nd, appliers);
    // A leader now, with no standby of its own yet: its progress starts over.
    for (int c = 0; c < nd.cores; ++c) shared[static_cast<std::size_t>(c)].state = progress::none;
    mode = start_as::primary;
    nd.repl.caught_up = false;
    nd.repl.promotions.fetch_add(1);
    {
      std::lock_guard lock(park_mutex);
      park_asked = false;
    }
    park_cv.notify_all();
    link->set_mode(repl::link::mode::accept);
    log::info(
        "replication: promoted in {:.1f} ms",
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
    return true;
  }
};

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
  if (standby()) impl_->ack_durable(c, impl_->ends[static_cast<std::size_t>(c)]);
}

void replication::on_role(ha::role from, ha::role to, std::int64_t) {
  impl& m = *impl_;
  const bool primary = m.mode.load() == start_as::primary;
  if (to == ha::role::leader) {
    if (primary) return m.link->set_mode(repl::link::mode::accept);
    // Off the ha thread, which must keep renewing the lease meanwhile; the API stays
    // 503 until the replay is finished.
    if (!m.promotion.joinable()) {
      m.nd.repl.promoting = true;
      m.promotion = std::thread([&m] {
        if (m.promote()) m.nd.repl.promoting.store(false, std::memory_order_release);
      });
    }
    return;
  }
  if (to != ha::role::standby) return;
  if (m.nd.repl.promoting.load())
    exit_to_resync("this node lost the lease while it was taking over");
  if (primary)
    exit_to_resync(from == ha::role::candidate
                       ? "another node leads: this node's own state may have forked from it"
                       : "this node was deposed: its state may have forked from the new leader's");
  const auto leader = m.nd.ha->leader();
  if (!leader || leader->repl.empty()) {
    log::warn("replication: the leader names no replication address: waiting");
    m.link->set_mode(repl::link::mode::idle);
    return;
  }
  log::info("replication: following node {} at {}{}", leader->node, leader->repl,
            m.nd.cfg.repl_tls_cert.empty() ? "" : " (TLS: its certificate must name it)");
  m.link->set_mode(repl::link::mode::follow, leader->repl, leader->node);
}

bool replication::may_campaign(const std::optional<std::string>& sync) const {
  if (!ha::listed_in_sync(sync, impl_->nd.cfg.ha_node)) return false;
  // A standby leads only with the whole of the leader's state (promotion needs it).
  return !standby() || impl_->all(impl::progress::caught_up);
}

replication::start_as probe_role(const ha::config& settings, std::uint32_t patience_ms) {
  ha::etcd_client etcd(settings.etcd, settings.connect_timeout);
  const std::vector<std::string> keys{ha::leader_key(settings.cluster),
                                      ha::sync_key(settings.cluster)};
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(patience_ms);
  for (;;) {
    auto read = etcd.read(keys, std::chrono::steady_clock::now() + settings.request_timeout);
    if (read) {
      std::optional<std::string> sync;
      if (read->keys[1]) sync = read->keys[1]->value;
      if (read->keys[0]) {
        const ha::key_value& key = *read->keys[0];
        const auto info = ha::parse_leader_value(key.value);
        // Another node's, or a key without a lease (no node writes one: the ha thread
        // reports it and removes it once it has stood for two TTLs).
        if (!info || info->node != settings.node || key.lease == 0)
          return replication::start_as::standby;
        // This node's previous run (this one holds its data directory's lock, so that
        // process is gone): give its lease back now rather than wait out the TTL; else
        // (another address: the flags changed) wait until it expires.
        if (key.value == settings.advertise) {
          auto revoked =
              etcd.revoke(key.lease, std::chrono::steady_clock::now() + settings.request_timeout);
          if (revoked && *revoked) {
            log::info("replication: revoked the lease of this node's previous run");
            continue;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      return ha::listed_in_sync(sync, settings.node) ? replication::start_as::primary
                                                     : replication::start_as::standby;
    }
    if (std::chrono::steady_clock::now() >= until)
      throw std::runtime_error("replication: etcd does not answer (" + read.error +
                               "): cannot tell whether this node leads or follows");
    log::warn("replication: etcd does not answer yet ({}); retrying", read.error);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace metad
