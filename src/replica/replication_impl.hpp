// replication's state, shared by its files (the table of who owns what is
// replication.hpp's opening comment): replication.cpp (construction, each core's turn,
// the sync set on the link thread), leader_end.cpp, standby_end.cpp and promotion.cpp.
#pragma once

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "persist/replayer.hpp"
#include "repl/leader_end.hpp"
#include "repl/link.hpp"
#include "repl/protocol.hpp"
#include "repl/session.hpp"
#include "repl/sync_set.hpp"
#include "replica/replication.hpp"

namespace metad::replica {

[[noreturn]] void exit_to_resync(std::string_view why);

// Defined outside replication::impl so that they are complete where the variant asks
// whether they can be built.
namespace replication_parts {

// What each core's end of its stream shares with the sync-set decisions.
struct shared_core {
  std::atomic<repl::progress> state{repl::progress::none};
  std::atomic<bool> cutting{false};  // a child is cutting a snapshot: wake the core
  std::atomic<bool> pumping{false};  // the stream is sent from the log files: wake the core
  std::atomic<std::uint64_t> oldest_unacked_ns{0};  // 0: everything sent was acked
  std::atomic<bool> require_applied{false};         // repl::core_requirement::applied
  std::atomic<std::uint64_t> lag_bytes{0};          // sent − acked
  // Acks late on average since slow_since_ns (0: not late), slow_acks of them.
  std::atomic<std::uint64_t> slow_since_ns{0}, slow_acks{0};
};
// A leader core's end (leader_end.cpp).
struct leading_end {
  std::optional<repl::leader_stream> stream;  // the standby's, once it said hello
  repl::ack_clock acks;
  repl::retained_log retained;    // from this leadership's first stream on
  repl::snapshot_cut cut;         // a new standby's snapshot, cut by a child
  std::uint64_t last_cut_ns = 0;  // when the latest cut began (kCutIntervalMs)
  bool cut_charged = false;       // the running cut holds a memory_budget::begin_cut()
  bool cut_waits = false;         // the latest cut was refused by the budget (logged once)
  // A resumed stream behind what `retained` holds: streamed from the log files first
  // (pump_files), what the core ships meanwhile only retained; then from memory on.
  std::unique_ptr<repl::log_file_pump> files;
  // A pump failed to read the files at files_failed_at: hellos at or before it need a
  // snapshot (else they would be answered stream, and fail again, forever).
  bool files_failed = false;
  std::uint64_t files_failed_at = 0;
};
// A standby core's end (standby_end.cpp).
struct following_end {
  std::optional<repl::follower> follower;
  std::unique_ptr<persist::standby_core> applier;
  // The leader answered this stream's hello (a resume or a snapshot): acks may flow.
  bool answered = false;
  bool acked_once = false;  // on this stream
  // The protocol version this core's hellos say: a leader of version 1 refuses 2, and is
  // then greeted as version 1 (its snapshots hold no rank image, which this node reads
  // either way) until a leader refuses that.
  std::uint16_t hello_version = repl::kProtocolVersion;
};
// One core's end, touched by that core only (and by promotion while it is parked):
// a standby's until promotion makes it a leader's, never the other way.
struct core_end {
  std::uint64_t stream = 0;
  bool closing = false;  // close() asked; the link has not ended it yet
  repl::decoder decoder;
  std::string in, out;
  repl::core_requirement requirement;
  std::variant<leading_end, following_end> role;
  leading_end* leader() { return std::get_if<leading_end>(&role); }
  following_end* standby() { return std::get_if<following_end>(&role); }
};

}  // namespace replication_parts

struct replication::impl {
  using progress = repl::progress;
  using shared_core = replication_parts::shared_core;
  using leading_end = replication_parts::leading_end;
  using following_end = replication_parts::following_end;
  using core_end = replication_parts::core_end;

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
  // A standby's binding changes on their way to each key's directory slice (its cores
  // post and drain; promotion drains what is left while they are parked).
  std::unique_ptr<persist::binding_feed> feed;

  // Promotion parks every core in poll() while its thread finishes the replay.
  std::mutex park_mutex;
  std::condition_variable park_cv;
  std::atomic<bool> park_asked{false};
  int parked = 0;

  // The sync set, decided on the link thread (repl/sync_set.hpp).
  repl::sync_set sync;
  std::uint64_t sync_ticket = 0;  // the /sync write it asked for last

  // Bytes queued for one core's peer before its stream is cut (kQueuedCeiling).
  std::size_t queued_max = 0;

  impl(pipeline::node& n, start_as as);  // replication.cpp

  pipeline::core_state& core(int c) { return *nd.core[static_cast<std::size_t>(c)]; }
  shared_core& share(int c) { return shared[static_cast<std::size_t>(c)]; }
  bool all(progress p) const;
  void send(int c, core_end& e);
  void close(int c, core_end& e);  // what else arrives on the stream is dropped
  void wake_cores();

  // Each core's turn (replication.cpp).
  void poll(int c);
  void handle(int c, core_end& e);

  // The leader's end (leader_end.cpp).
  void on_hello(int c, core_end& e, leading_end& l, const repl::hello& h);
  void on_ack(int c, core_end& e, leading_end& l, const repl::ack& a);
  void shipped(int c, const store::log_writer::flush_job& job);
  void end_leading(int c, leading_end& l);
  void publish(int c, const leading_end& l);
  // images: the standby reads rank images (its hello's version is 2 or more).
  std::uint64_t encode_snapshot(int c, const repl::snapshot& head, bool images,
                                const std::function<void(std::string&)>& out);
  void cut_here(int c, core_end& e, const repl::snapshot& head, bool images,
                const std::string& node);
  void pump_cut(int c, core_end& e, leading_end& l);
  void pump_files(int c, core_end& e, leading_end& l);
  void abort_cut(int c, leading_end& l);
  void end_cut(int c, leading_end& l);
  void resend(int c, core_end& e, leading_end& l, std::uint64_t lsn);

  // The standby's end (standby_end.cpp).
  void say_hello(int c, core_end& e, following_end& f);
  void on_answer(int c, core_end& e, following_end& f, const repl::answer& a);
  void on_snapshot(int c, following_end& f, const repl::snapshot& s);
  void on_batch(int c, core_end& e, following_end& f, const repl::batch& b);
  void ack_durable(int c, core_end& e);

  // The sync set (replication.cpp, on the link thread).
  void decide_sync();
  void set_require(bool on);
  void close_all();

  // Promotion (promotion.cpp, off the ha thread).
  void park();
  bool promote();
};

}  // namespace metad::replica
