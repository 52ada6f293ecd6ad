// Everything the cores share: the config, each core's state, the mailbox between them.
// core_state i is touched only by core i's thread (other cores reach it by hopping).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api/codec.hpp"
#include "metad/config.hpp"
#include "net/transport.hpp"
#include "server/clock.hpp"
#include "server/memory_budget.hpp"
#include "server/metrics.hpp"
#include "shard/directory.hpp"
#include "shard/mailbox.hpp"
#include "shard/ownership.hpp"
#include "shard/rank_table.hpp"
#include "store/data_dir.hpp"
#include "store/journal.hpp"
#include "store/log.hpp"

namespace server {

struct core_state {
  // sync: --durability sync (the journal's durable() waits for fdatasync).
  explicit core_state(bool sync) : journal(log, sync) {}

  int index = 0;
  shard::rank_table ranks;
  shard::directory directory;
  api::decoder decoder;
  request_metrics metrics;
  flush_metrics flushes;
  net::loop_stats connections;
  // Keys that left the directory slice here: by /keys/delete, by eviction, as stale
  // incomplete keys (metrics).
  std::uint64_t deleted_keys = 0, evicted_keys = 0, stale_keys = 0;
  // Initializations of this core's ranks with another page count than the rank has
  // (metrics): the usual sign of a second model, with another KV layout, on this server.
  std::uint64_t ranks_grown = 0, ranks_shrunk = 0;
  // directory.oldest_incomplete(), published for the other cores: an allocation short of
  // pages looks for stale keys only when some core has one. Refreshed by this core on
  // its tick and after each confirmation or removal it settles.
  std::atomic<std::uint64_t> oldest_incomplete{UINT64_MAX};
  void publish_incomplete() {
    oldest_incomplete.store(directory.oldest_incomplete(), std::memory_order_relaxed);
  }
  // Durability (inactive without --data-dir): this core's log and its snapshots. Requests
  // log their changes through the journal; the loop flushes the log.
  store::log_writer log;
  store::journal journal;
  std::uint64_t log_segment = 0;
  bool snapshot_due = false;    // the segment outgrew --snapshot-log-bytes: cut at next flush
  int next_segment_fd = -1;     // a cut in progress: the segment after the current one
  std::string snapshot_bytes;   // ... and the state at the cut
  std::thread snapshot_writer;  // background write of the newest snapshot
  std::atomic<bool> snapshot_done{false};  // set by that thread when it finishes
  bool snapshot_failed = false;            // written by that thread, read after done
};

struct cluster {
  cluster(const metad::config& config, int core_count);

  const metad::config& cfg;
  const int cores;
  // Cores [0, directory_cores) hold the directory's slices (see config::directory_cores).
  const int directory_cores;
  // The core that holds `key`'s directory slice.
  int key_owner(std::string_view key) const {
    return directory_cores == 1 ? 0 : shard::owner_of_key(key, directory_cores);
  }
  std::vector<std::unique_ptr<core_state>> core;
  shard::mailbox mailbox;
  // Worker ranks initialised on all cores: a key's tp_world_size when first confirmed.
  std::atomic<std::int64_t> worker_ranks{0};
  // --memory-max: what ranks and request bodies may still take.
  memory_budget memory;
  std::atomic<bool> stopping{false};
  // Cores still serving connections after a stop; loops exit when it reaches 0.
  std::atomic<int> draining_cores;
  // The data directory (null: in memory only).
  std::unique_ptr<store::data_dir> data;
  // The clock of reservation deadlines, leases and recency: nanoseconds, monotonic (fine
  // enough to order uses on different cores); tests replace it with a fake. Any core
  // may call it.
  std::function<std::uint64_t()> clock = monotonic_ns;
  // Nothing is evicted or deleted before this time: the leases readers held before a
  // restart were not kept, so recovered keys count as leased for --read-lease-ms.
  std::uint64_t removal_floor = 0;  // on `clock`
  // /clear calls begun and finished. A delete or eviction walk, which carries keys from
  // core to core, stops touching state once a clear has begun since it started (it would
  // drop what was written after the clear), and does not start while one runs.
  std::atomic<std::uint64_t> clears_begun{0}, clears_done{0};
};

}  // namespace server
