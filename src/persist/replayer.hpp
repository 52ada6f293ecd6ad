// Applying records to the cores' state, in one place for both of its users: recovery's
// replayer (decoded log and snapshot records applied to one core's state at start-up),
// and a hot standby's standby_core (docs/replication.md, "What is shipped"), which
// appends the leader's frames to its own log and applies them with the same replayer as
// they arrive. Then the directory phase that recovery (and a promotion) runs once every
// record is in. A replayer is used by one thread at a time, on its core's state only.
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pipeline/node.hpp"
#include "shard/packed_key.hpp"
#include "store/record.hpp"
#include "store/recovery.hpp"

namespace metad::persist {

// Confirmed bindings gained and lost for one core's directory slice (its keys' counts),
// 32-hex keys packed. Applied in one go: gains first, so that a binding lost after it was
// gained in the same batch is counted before it is taken off.
struct binding_changes {
  std::vector<shard::packed_key> gained, lost;
  // Gained keys of rank tables walked in slot order, by the bucket of its two each sat
  // in (0: its first, 1: its second): within a table's run each list rises in that
  // bucket, so counting them sweeps the directory's table (directory::restore_count).
  std::vector<shard::packed_key> gained_in[2];
  std::vector<std::string> gained_others, lost_others;
  bool empty() const {
    return gained.empty() && gained_in[0].empty() && gained_in[1].empty() && lost.empty() &&
           gained_others.empty() && lost_others.empty();
  }
  // Into a staged directory; a gained key that no record named takes fallback_tp
  // (directory::unnamed_tp: none yet). Returns how many keys took it.
  std::size_t apply(shard::directory& d, std::int32_t fallback_tp) const;
  void clear();
};

// What one core learns while replaying, for the directory phase: the confirmed bindings
// of its ranks, by the core that owns each key's directory slice now (one entry per
// (rank, key)). Recovery collects them at the end (collect_confirmed); a hot standby
// hands them over as each batch is applied (standby_core). (The tp_world_size of the
// keys a core owns goes straight into its directory: directory::restore_key.)
struct replay_output {
  // By vLLM space (tenant_registry's ids), then by the core that owns the keys'
  // directory slices.
  std::vector<std::vector<binding_changes>> by_space;
  std::size_t cores = 0;
  binding_changes& to(int space, std::size_t owner) {
    const auto at = static_cast<std::size_t>(space);
    if (at >= by_space.size()) by_space.resize(at + 1);
    if (by_space[at].empty()) by_space[at].resize(cores);
    return by_space[at][owner];
  }
  std::uint64_t records = 0;
  // Rank tables of snapshot images: loaded as laid out, and key by key (another layout,
  // a log after them that outgrows them, a table left sparse, a rank not empty).
  std::uint64_t images_laid = 0, images_by_key = 0;
};

// A hot standby's binding changes on their way to the core that owns each key's slice
// (issue 35: the standby's directory counts stay current, so that promotion need not
// count every binding). Any core posts; the owner drains, in the order posted, on its
// own thread, or promotion's threads while the cores are parked. Each core posts the
// changes of its own ranks only, in its stream's order, so a binding's loss never
// reaches its owner before its gain. One mutex per owner, off the request path (a
// standby serves no vLLM request).
class binding_feed {
 public:
  explicit binding_feed(int cores);
  void post(int owner, int space, binding_changes&& changes);
  // Applies what was posted for `owner`'s slice to its directories (staged), each
  // space's to its own.
  void drain(int owner, pipeline::core_state& core);

 private:
  struct inbox {
    std::mutex mutex;
    std::vector<std::pair<int, binding_changes>> queued;
  };
  std::unique_ptr<inbox[]> inboxes_;
};

// Quarantines replayed from the log end where the log says (quarantine_end); after
// recovery they all restart (rank_table::restart_quarantines).
inline constexpr std::uint64_t kQuarantinedUntilLogged = UINT64_MAX;

class replayer {
 public:
  // sizes: what the files hold, to size the tables before filling them (empty: unknown).
  replayer(pipeline::node& nd, int core, replay_output& out, const store::file_sizes& sizes);

  // One record, if it belongs to this core (its rank, or its key's directory slice), to
  // the vLLM space of its tenant. clear records are not applied: recovery starts after a
  // core's last one (a tenant's scoped clear: its records before it are skipped), and a
  // standby applies them itself. Throws std::runtime_error for a record that no longer
  // applies.
  void apply(const store::record& r);
  // The vLLM space of a record's tenant (made on first use).
  int space_of(const store::record& r);

  // After the last record: the keys this core's ranks hold confirmed, by the core
  // that owns each key's directory slice (which counts them).
  void collect_confirmed();
  // Every confirmed binding this core's ranks hold (of `space` only, when >= 0), into the
  // output by owner, as gained or (a clear on a hot standby) lost.
  void collect_bindings(bool lost, int space = -1);
  // Every binding change from here on goes into the output as it happens (a hot
  // standby: standby_core hands them to their owners after each batch).
  void track_changes() { tracking_ = true; }
  // The rank tables' bulk load ends (collect_confirmed does it too).
  void end_bulk();

  // The time reservations made from here on count their TTL from (recovery: when it
  // started; a hot standby: when each batch arrives, close to the leader's own time).
  void set_now(std::uint64_t now) { now_ = now; }

 private:
  void restore_rank_keys(const store::record& r, shard::rank_table& ranks);
  void restore_rank_slots(const store::record& r, shard::rank_table& ranks);
  // Whether a rank's image holds all it is expected to (its log's keys too) below the
  // load at which its table would grow: then it is loaded as laid out.
  // (Of the space of the record being applied.)
  bool image_fits(std::int64_t rank, std::size_t buckets) const;
  // A space's rank tables load in bulk until end_bulk (rank_table::set_bulk).
  void bulk(pipeline::vllm_space& sp);
  // tracking_: the confirmed keys of bindings_ gained; `buckets`: of the table whose slots
  // they name, in slot order (0: no order).
  void gained(std::span<const shard::rank_table::packed_binding> bindings, std::size_t buckets);
  // A confirmed binding of a packed key gained, at `slot` of a table of `buckets` buckets
  // walked in slot order (0: no order).
  void gain(int space, const shard::packed_key& key, std::uint64_t slot, std::size_t buckets);
  void restore_directory_keys(const store::record& r, shard::directory& directory);
  // tracking_: a confirmed binding of `key` gained or lost on this core's ranks.
  void changed(int space, std::string_view key, bool gained);
  // The core that owns a 32-hex key's directory slice.
  std::size_t owner_of(const shard::packed_key& key) const;

  pipeline::node& node_;
  int core_;
  replay_output& out_;
  // Keys the files hold of each (space, rank) this core owns (file_sizes::rank_keys).
  std::map<std::pair<int, std::int64_t>, std::size_t> expected_;
  // This core's ranks with an image in the files (file_sizes::image_buckets), and how
  // each rank's image is being loaded.
  std::map<std::pair<int, std::int64_t>, std::size_t> image_buckets_;
  struct image_load {
    std::uint64_t buckets = 0;
    bool laid = false;  // into the slots it names (else key by key: restore_packed)
  };
  std::map<std::pair<int, std::int64_t>, image_load> images_;  // by (space, rank)
  std::uint64_t now_ = node_.clock();
  std::vector<std::uint32_t> indices_;
  std::vector<shard::rank_table::packed_binding> bindings_;
  std::vector<std::int64_t> pages_;
  std::vector<std::string> unbound_;
  std::string detail_;
  bool tracking_ = false;
  std::vector<bool> bulked_;  // by space: set_bulk(true) done (bulk)
  int space_ = 0;             // of the record being applied
  std::string last_tenant_;   // space_of's last name ...
  int last_space_ = 0;        // ... and its space
  // No file sizes told the directory's: the first snapshot_directory_keys chunk does.
  bool size_directory_ = false;
};

// Counts every confirmed binding into the directory slice of the key's owner (each core
// reads the lists the others made for it, and frees them), then finishes it.
// A key whose tp_world_size record was not found takes its space's worker ranks.
void rebuild_directory(pipeline::node& nd, int core, std::vector<replay_output>& outputs);
// Sets each space's worker ranks (tenant_registry::worker_ranks) and the node's from the
// ranks the cores hold; returns the node's. While no core serves.
std::int64_t count_worker_ranks(pipeline::node& nd);

// A hot standby's side of replication: the leader's log frames for core c are appended
// to this node's own log of core c, made durable by the core's usual group commit, and
// applied to core c's state with the replayer as they arrive. promote_standby ends the
// replay as recovery does. A standby_core is used on its core's thread only; the node it
// fills serves no request meanwhile.
class standby_core {
 public:
  // Core c of `nd`, a node recovered from the standby's own data directory (its log
  // open and idle), whose state is the leader's core c at leader_lsn.
  // Its binding changes go to their slices' owners through `feed` (shared by the node's
  // standby_cores).
  standby_core(pipeline::node& nd, int core, std::uint64_t leader_lsn, binding_feed& feed);

  // Whole, checked frames (repl::follower's verdict apply) starting at the leader's
  // position received_lsn(): appended to the core's log, then applied. Throws
  // std::runtime_error if a record no longer applies (the states diverged: resync).
  void receive(std::string_view frames);
  // What other cores' ranks changed in this core's directory slice, counted (after each
  // receive(); replication's poll drains the feed on every turn too).
  void drain_feed();

  // Leader positions: what was received, and what this node's log holds durably (what
  // to ack once the core's group commit returns).
  std::uint64_t received_lsn() const { return leader_base_ + (log_.end() - local_base_); }
  // 0 until this node's log holds the bytes before leader_lsn (a snapshot received).
  std::uint64_t durable_lsn() const {
    return snapshot_durable() ? leader_base_ + (log_.durable() - local_base_) : 0;
  }
  bool snapshot_durable() const { return log_.durable() >= local_base_; }
  // The state received so far (a snapshot's records) is the leader's at leader_lsn:
  // what follows is the leader's log from there.
  void rebase(std::uint64_t leader_lsn) {
    leader_base_ = leader_lsn;
    local_base_ = log_.end();
  }

  int core() const { return core_; }
  replay_output& output() { return out_; }
  replayer& replay() { return replayer_; }

 private:
  pipeline::node& node_;
  int core_;
  store::log_writer& log_;
  std::uint64_t leader_base_, local_base_;
  void hand_over();

  binding_feed& feed_;
  replay_output out_;
  replayer replayer_;
};

// Promotion's replay half, once the streams are closed and every received frame is
// applied: the directory, whose counts the standby kept current (binding_feed), takes in
// what is still queued and is finished (restore_finish: O(keys), not O(bindings)),
// quarantines restart, worker ranks are counted (and with --tenants-file each tenant's
// SGLang ranks, its ranks=N count, and the pages it holds, its pages=N count), and
// recovered keys are leased for --read-lease-ms (as after a restart). The node can serve
// afterwards; the standby_cores are spent. Called on one thread while the cores are
// idle; the directory phase runs on one thread per core. A reservation keeps the TTL it
// got when its batch arrived (close to the leader's deadline).
void promote_standby(pipeline::node& nd, std::vector<std::unique_ptr<standby_core>>& cores,
                     binding_feed& feed);

// Runs work(c) for every core c on a thread of its own, and rethrows the first error.
template <typename Work>
void on_every_core(pipeline::node& nd, Work&& work) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(nd.cores));
  for (int c = 0; c < nd.cores; ++c) {
    threads.emplace_back([&, c] {
      try {
        work(c);
      } catch (...) {
        errors[static_cast<std::size_t>(c)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace metad::persist
