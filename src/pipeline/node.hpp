// One process (a node: in a high-availability cluster, one member): everything its cores
// share, namely the config, each core's state and the mailbox between them.
// core_state i is touched only by core i's thread (other cores reach it by hopping).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "api/decode.hpp"
#include "api/encode.hpp"
#include "api/sglang_codec.hpp"
#include "metad/config.hpp"
#include "net/transport.hpp"
#include "pipeline/memory_budget.hpp"
#include "pipeline/metrics.hpp"
#include "pipeline/tenants.hpp"
#include "shard/directory.hpp"
#include "shard/ownership.hpp"
#include "shard/rank_table.hpp"
#include "shard/sglang_pools.hpp"
#include "smp/clock.hpp"
#include "smp/mailbox.hpp"
#include "store/data_dir.hpp"
#include "store/journal.hpp"
#include "store/log.hpp"

namespace metad::ha {
class control;
}

namespace metad::pipeline {

// One tenant's vLLM state on one core (issue 34: two tenants' rank 0 are two pools, and a
// key of one is not another's): the ranks this core owns and its slice of the key
// directory. Space 0 is the unnamed state (no --tenants-file, or the `vllm` tenant's);
// tenant_registry numbers the others.
struct vllm_space {
  vllm_space(int space_id, std::string name) : id(space_id), tenant(std::move(name)) {}
  const int id;
  const std::string tenant;  // "" for space 0: what its records name (journal)
  shard::rank_table ranks;
  shard::directory directory;
  // --tenants-file's pages=N (tenant_usage::pages): the usage this space's held pages on
  // this core are counted in (the space's tenant's; for space 0, the `vllm` tenant's as
  // this core's table says; null: none) and how many it added there (settle_vllm_pages).
  tenant_usage* pages_usage = nullptr;
  std::int64_t pages_added = 0;
};

struct core_state {
  // sync: --durability sync (the journal's durable() waits for fdatasync).
  core_state(bool sync, tenant_registry& names) : journal(log, sync), names_(names) {
    spaces.push_back(std::make_unique<vllm_space>(0, ""));
    live_.push_back(spaces.back().get());
  }

  int index = 0;
  // vLLM's state, one space per tenant, by space id (tenant_registry::space_of); space 0
  // always exists, others are made by the first write that needs them. A null entry: no
  // state of that tenant here.
  std::vector<std::unique_ptr<vllm_space>> spaces;
  vllm_space& space(int id) {
    if (static_cast<std::size_t>(id) >= spaces.size())
      spaces.resize(static_cast<std::size_t>(id) + 1);
    auto& at = spaces[static_cast<std::size_t>(id)];
    if (at == nullptr) {
      at = std::make_unique<vllm_space>(id, names_.space_name(id));
      if (id != 0) at->pages_usage = &names_.usage(at->tenant);  // a lock, once a space
      at->ranks.set_reservation_ttl(reservation_ttl);
      at->directory.set_lru(lru);
      live_.push_back(at.get());
    }
    return *at;
  }
  // The space, or nullptr when this core holds none of it (reads make none).
  vllm_space* find_space(int id) const {
    return static_cast<std::size_t>(id) < spaces.size() ? spaces[static_cast<std::size_t>(id)].get()
                                                        : nullptr;
  }
  // How many spaces this core holds (1: the unnamed one only).
  std::size_t space_count() const { return live_.size(); }
  vllm_space& unnamed() { return *spaces[0]; }
  const vllm_space& unnamed() const { return *spaces[0]; }
  // Calls f(vllm_space&) for each space this core holds (space 0 first, then in the
  // order they were made).
  template <class F>
  void for_each_space(F&& f) const {
    for (vllm_space* sp : live_) f(*sp);
  }
  // What a space made later is set up with (node::node).
  std::uint64_t reservation_ttl = 0;
  bool lru = false;
  api::decoder decoder;
  request_metrics metrics;
  flush_metrics flushes;
  // Keys found or not by the requests this core is home to (the hit ratio), vLLM's and
  // SGLang's default tenant, and SGLang's named tenants; pages this core's ranks and
  // pools handed out, by source.
  lookup_counts lookups;
  tenant_lookups sg_tenant_lookups;
  // Per tenant (with --tenants-file or not): requests and existence probes (metrics.hpp,
  // tenant_counters); what tenants hold is counted at the scrape.
  tenant_counters tenant_rows;
  // The row of each vLLM space's tenant, by space id (connection::count_tenant; space 0:
  // the `vllm` tenant's, else the default tenant's), and the tenant table's version they
  // were looked up with (0: none).
  std::vector<tenant_counts*> vllm_tenant_rows;
  std::uint64_t vllm_tenant_version = 0;
  allocation_counts allocations;
  net::loop_stats connections;
  // Keys that left the directory slice here: by /keys/delete, by eviction, as stale
  // incomplete keys (metrics).
  std::uint64_t deleted_keys = 0, evicted_keys = 0, stale_keys = 0;
  // Initializations of this core's ranks with another page count than the rank has
  // (metrics): the usual sign of a second model, with another KV layout, on this server.
  std::uint64_t ranks_grown = 0, ranks_shrunk = 0;
  // This core's share of --memory-max for what allocations add to its ranks and pools.
  memory_credit credit;
  // directory.oldest_incomplete(), published for the other cores: an allocation short of
  // pages looks for stale keys only when some core has one. Refreshed by this core on
  // its tick and after each confirmation or removal it settles.
  std::atomic<std::uint64_t> oldest_incomplete{UINT64_MAX};
  void publish_incomplete() {
    std::uint64_t oldest = UINT64_MAX;  // over every space
    for_each_space(
        [&](const vllm_space& sp) { oldest = std::min(oldest, sp.directory.oldest_incomplete()); });
    oldest_incomplete.store(oldest, std::memory_order_relaxed);
  }
  // Durability (inactive without --data-dir): this core's log and its snapshots. Requests
  // log their changes through the journal; the loop flushes the log.
  store::log_writer log;
  store::journal journal;
  std::uint64_t log_segment = 0;
  // This generation's log segments on disk, oldest first, as (segment, the log position
  // it starts at); the current one last. Older ones than the newest snapshot are kept up
  // to --repl-retain-log-bytes with --repl-listen, for a standby to resume from
  // (replica/leader_end.cpp reads them). This core's thread alone.
  std::deque<std::pair<std::uint64_t, std::uint64_t>> segments;
  bool snapshot_due = false;    // the segment outgrew --snapshot-log-bytes: cut at next flush
  int next_segment_fd = -1;     // a cut in progress: the segment after the current one
  std::string snapshot_bytes;   // ... and the state at the cut
  std::thread snapshot_writer;  // background write of the newest snapshot
  std::atomic<bool> snapshot_done{false};  // set by that thread when it finishes
  bool snapshot_failed = false;            // written by that thread, read after done

  // SGLang's HiCache API (docs/sglang-api.md): the pools of the ranks this core owns, one
  // registry per tenant ("" is the default tenant, /{rank}/{op}). Shares nothing with
  // `ranks` and `directory`.
  api::sglang_decoder sg_decoder;
  shard::sglang_config sg_config;  // in the clock's unit
  bool sg_strict_reinit = false;
  std::unordered_map<std::string, shard::sglang_pools> sg_tenants;
  std::uint64_t sg_last_now = 0;  // the latest SGLang clock reading here (snapshots)
  // The tenant's registry; nullptr when it has none here and `create` is false.
  shard::sglang_pools* sg_pools(std::string_view tenant, bool create) {
    auto it = sg_tenants.find(std::string(tenant));
    if (it != sg_tenants.end()) return &it->second;
    if (!create) return nullptr;
    return &sg_tenants.try_emplace(std::string(tenant), sg_config, sg_strict_reinit).first->second;
  }
  // Counters of this core's SGLang pools (metrics).
  struct sglang_counters {
    std::uint64_t reinit_smaller = 0;   // initialize with fewer pages than the pool has
    std::uint64_t evicted = 0;          // bound keys evicted by reserves
    std::uint64_t no_page = 0;          // reserve answers (false, -1)
    std::uint64_t expired = 0;          // reservations expired (TTL)
    std::uint64_t skipped = 0;          // confirmations that did not bind (stale included)
    std::uint64_t release_refused = 0;  // released pages still bound: kept
    std::uint64_t deleted = 0;          // keys dropped by delete_keys
  } sg_counters;

  // --tenants-file: the table this core serves with (tenants.hpp). Only this core's thread
  // reads or replaces it (tenant_registry::take, from connection::current_tenants and
  // settle_vllm_pages).
  std::shared_ptr<const tenant_table> tenants;

 private:
  tenant_registry& names_;
  std::vector<vllm_space*> live_;  // the non-null entries of `spaces`
};

struct node {
  node(const metad::config& config, int core_count);

  const metad::config& cfg;
  const int cores;
  // When the node was made (GET /status.json's uptime), on smp::monotonic_ns.
  const std::uint64_t started_ns = smp::monotonic_ns();
  // Cores [0, directory_cores) hold the directory's slices (see config::directory_cores).
  const int directory_cores;
  // The core that holds `key`'s directory slice.
  int key_owner(std::string_view key) const {
    return directory_cores == 1 ? 0 : shard::owner_of_key(key, directory_cores);
  }
  // The same for a key of 32 lowercase hex characters, packed.
  int key_owner(const shard::packed_key& key) const {
    return directory_cores == 1 ? 0 : shard::owner_of_key(key, directory_cores);
  }
  std::vector<std::unique_ptr<core_state>> core;
  smp::mailbox mailbox;
  // vLLM worker ranks on all cores and spaces (at most --ranks-max; each space's own
  // count is tenant_registry::worker_ranks).
  std::atomic<std::int64_t> worker_ranks{0};
  // SGLang pools on all cores and tenants (at most --ranks-max).
  std::atomic<std::int64_t> sglang_pools{0};
  // Added to `clock` for SGLang's pools: recovery sets it so that their clock continues
  // from the times its records were logged at (sglang_durability.hpp).
  std::atomic<std::uint64_t> sglang_clock_offset{0};
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
  std::function<std::uint64_t()> clock = smp::monotonic_ns;
  // Nothing is evicted or deleted before this time: the leases readers held before a
  // restart were not kept, so recovered keys count as leased for --read-lease-ms.
  std::uint64_t removal_floor = 0;  // on `clock`
  // --tenants-file: the current table (published by the thread that loads the file; each
  // core takes it when its version changes) and every tenant's usage.
  tenant_registry tenants;
  // High availability (--ha-etcd; null: off): the control thread's published role and
  // serving deadline, which the leader-only gate reads (ha_gate.hpp). Set before the
  // cores start, owned by the server.
  const ha::control* ha = nullptr;
  // Replication (--repl-listen), as the server's replication publishes it for /metrics
  // (ha_gate.hpp); any thread reads.
  struct replication_status {
    std::atomic<bool> enabled{false};
    std::atomic<bool> in_sync{false};    // leader: /sync names a standby; writes wait for it
    std::atomic<bool> caught_up{false};  // standby: it holds the leader's whole state
    // A standby (until promoted): its old log segments serve no hello, so it keeps none
    // (persist::finish_cut).
    std::atomic<bool> following{false};
    std::atomic<std::uint64_t> lag_bytes{0};  // leader: sent and not yet acked, all cores
    std::atomic<std::uint64_t> drops{0}, promotions{0}, snapshots_sent{0};
    // Connections the leader refused, by repl::refusal (handshake, name, taken,
    // no_such_core, rate).
    std::atomic<std::uint64_t> refused[5] = {};
    // A standby that won the lease finishes its replay before it answers (ha_gate.hpp).
    std::atomic<bool> promoting{false};
  } repl;
};

// --tenants-file's usage counted from the state the node holds: each tenant's SGLang
// ranks (tenant_usage::sg_ranks, against ranks=N) become the distinct ranks its pools are
// on, over every core, and its pages (tenant_usage::pages, against pages=N) those its
// pools hold plus its own vLLM state's ranks' (the unnamed state's for the `vllm` tenant);
// each vLLM space's share and each registry's page counter are set with them. After recovery (the
// server, before the cores start) and when a standby is promoted (persist::promote_standby, while
// the cores are parked): one thread, no core serving.
void count_tenant_usage(node& nd);

// On core `core`'s thread, after anything changed a vLLM space's pages: adds to the
// usage of the space's tenant (space 0: the `vllm` tenant, as the core's table says) what
// the space's ranks hold now less what it added there before (a reload that moved `vllm`
// to another tenant moves the core's pages over). O(the space's ranks); nothing without
// --tenants-file.
void settle_vllm_pages(node& nd, core_state& core, vllm_space& sp);

}  // namespace metad::pipeline
