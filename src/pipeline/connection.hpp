// One connection's request pipeline on its home core: bytes → http::parser → router →
// api decode → endpoint coroutine (which may hop to other cores) → response bytes.
// Requests on a connection are handled one at a time, in order (pipelining included).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "api/decode.hpp"
#include "api/encode.hpp"
#include "api/inspect.hpp"
#include "api/sglang_codec.hpp"
#include "http/parser.hpp"
#include "http/response.hpp"
#include "http/router.hpp"
#include "net/transport.hpp"
#include "pipeline/answer.hpp"
#include "pipeline/node.hpp"
#include "pipeline/rank_sample.hpp"
#include "pipeline/routes.hpp"
#include "shard/directory.hpp"
#include "shard/sglang_pool.hpp"

namespace metad::pipeline {

// Why keys leave every rank, for the counters.
enum class removal_kind : std::uint8_t { deleted, evicted, stale };

// The keys a removal (delete, eviction, stale reclamation) takes off every rank,
// gathered on the cores that own them; home-owned, reserved before the walk starts.
struct removal_job {
  std::string bytes;                   // the keys back to back
  std::vector<std::uint32_t> ends;     // key i ends at bytes[ends[i]]
  std::vector<std::string_view> keys;  // views of them, once sealed
  std::vector<std::uint16_t> owner;    // each key's directory core
  std::vector<std::int32_t> bindings;  // each key: ranks that dropped it
  // Eviction's candidates: each key's last use (to put it back) and whether the rank
  // short of pages holds it.
  std::vector<std::uint64_t> used;
  std::vector<std::uint8_t> member;
  // Scratch of the walk: the merge of the cores' oldest keys, one rank's removals.
  std::vector<std::pair<std::uint64_t, std::uint16_t>> oldest;
  std::vector<std::uint64_t> times;
  std::vector<std::uint32_t> quota;
  std::vector<std::int64_t> ranks, pages;
  std::vector<std::uint32_t> removed;
  std::vector<std::string_view> removed_keys;
  std::vector<std::uint8_t> core_has_keys;  // per core: a key's directory slice is there
  std::uint64_t clears = 0;  // the space's tenant_registry::clears_begun when the walk began
  int space = 0;             // the vLLM space it removes from (set by begin)

  // Starts a walk; false (do nothing) while a /clear runs.
  bool begin(const node& nd, int in_space) {
    space = in_space;
    bytes.clear();
    ends.clear();
    keys.clear();
    used.clear();
    member.clear();
    clears = nd.tenants.clears_begun(space).load();
    return nd.tenants.clears_done(space).load() == clears;
  }
  // On any core during the walk: false once a /clear of its space has begun since.
  bool valid(const node& nd) const { return nd.tenants.clears_begun(space).load() == clears; }
  void add(std::string_view key, std::uint64_t last_use = 0) {
    bytes.append(key);
    ends.push_back(static_cast<std::uint32_t>(bytes.size()));
    used.push_back(last_use);
    member.push_back(0);
  }
  // After the last add: the views, owners and zeroed counts.
  void seal(const node& nd);
  // Keeps only the members (bindings of the others are lost: call before the walk).
  void keep_members(const node& nd);
};

// SGLang's operations (docs/sglang-api.md).
enum class sg_op : std::uint8_t {
  initialize,
  exists,
  reserve,
  confirm,
  delete_keys,
  clear,
  get_page_indices,
  inspect  // this server's, not the reference's: read-only
};

// One SGLang pool's row in /stats and /metrics.
struct sg_pool_row {
  std::string tenant;
  std::int64_t rank = 0;
  std::string ns;
  shard::sglang_pool_stats stats{};
  auto order() const { return std::tie(tenant, rank, ns); }
};

// What /stats and /metrics show of the SGLang pools: the kRankRowsMax first rows in
// (tenant, rank, namespace) order, and sums over all of them. Memory stays bounded: the
// rows are cut back to kRankRowsMax whenever twice that many have gathered.
struct sg_pool_sample {
  std::vector<sg_pool_row> rows;
  std::uint64_t pools = 0, pages = 0, free = 0, in_flight = 0, bound = 0;
  void clear();
  void add(std::string_view tenant, std::int64_t rank, std::string_view ns,
           const shard::sglang_pool_stats& stats);
  // The kept rows in order; call once, after the last add.
  std::span<const sg_pool_row> sorted();
};

// Per-connection buffers reused by every request: commands, results, encoder output.
struct scratch {
  api::initialize_cmd init;
  api::allocate_cmd allocate;
  api::confirm_cmd confirm;
  api::exists_cmd exists;
  api::locations_cmd locations;
  api::delete_cmd remove;
  // POST /keys/inspect and SGLang's inspect: what each core found, then the rows.
  api::inspect_cmd inspect;
  struct inspect_found {
    std::uint32_t key;  // index in the request
    api::inspect_hold hold;
    std::uint64_t deadline;  // the reservation's, on the server's clock
  };
  std::vector<inspect_found> inspect_holds;
  std::vector<api::inspect_hold> inspect_hold_rows;
  std::vector<shard::key_report> inspect_reports;
  std::vector<shard::sglang_key_report> sg_inspect_reports;
  std::vector<api::inspect_row> inspect_rows;
  std::vector<api::sg_inspect_row> sg_inspect_rows;
  removal_job removal;
  rank_sample rank_rows;  // /stats, /metrics
  api::stats_totals totals;
  std::vector<std::uint32_t> indices;
  std::vector<std::int64_t> pages;
  std::vector<std::uint8_t> flags;
  // The directory walk (plan_directory_walk): key indices grouped by core, where each
  // core's group begins, and each walked key's core.
  std::vector<std::uint32_t> walk;
  std::vector<std::uint32_t> walk_begin;
  std::vector<std::uint16_t> key_owner;
  std::vector<std::string_view> selected;
  std::string detail;
  std::string body;
  // /metrics' totals (~3.5 KB): made on the connection's first scrape, not by every
  // connection (16,384 idle connections per core would hold ~57 MB of zeros).
  std::unique_ptr<metrics_snapshot> snapshot;
  // SGLang requests: the operation, its tenant ("" default) and rank, its command, and
  // a decoding error answered only if the pool exists (else the pool's 404 goes first).
  sg_op sg = sg_op::initialize;
  std::string tenant;
  std::int64_t sg_rank = 0;
  api::sg_initialize_cmd sg_init;
  api::sg_keys_cmd sg_keys;
  api::sg_confirm_cmd sg_confirm;
  api::sg_clear_cmd sg_clear;
  api::error sg_error;
  std::vector<shard::sglang_slot> slots;
  sg_pool_sample sg_rows;  // /stats, /metrics
  core_state::sglang_counters sg_sum;
  // --tenants-file: the request's tenant's ranks=N and pages=N (-1: none), its name (vLLM's quota
  // detail; SGLang's is `tenant`) and its usage (null: the request has no tenant, as
  // without --tenants-file or with the admin token). Copied from the table at dispatch:
  // a reload while the request runs does not change them.
  std::int64_t rank_quota = -1;
  std::int64_t page_quota = -1;
  std::string quota_tenant;
  tenant_usage* usage = nullptr;
  // The request's tenant's counters on the home core (null: an endpoint of no tenant, or
  // refused before its tenant was settled) and its API; set at dispatch.
  tenant_counts* tenant_row = nullptr;
  tenant_api api = tenant_api::vllm;
  // vLLM requests: the space (core_state::spaces) of the request's tenant; 0, the unnamed
  // one, without --tenants-file. Settled before the start function runs.
  int space = 0;
};

class connection final : public net::connection_handler {
 public:
  connection(node& nd, core_state& home, net::waker& waker);
  ~connection() override;
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  std::span<char> read_space() override { return parser_.read_space(); }
  net::flow on_bytes(std::size_t bytes) override;
  net::flow on_resume() override;
  net::flow on_drained() override { return advance(); }
  void trim() override;
  std::string& output() override { return out_; }
  bool mid_request() const override { return parser_.mid_request(); }

  // Bytes of memory this connection's buffers hold (tests: they shrink when it idles).
  std::size_t buffer_bytes() const;

  // For the start functions and endpoint coroutines (home core only).
  node& shared() { return node_; }
  core_state& home() { return home_; }
  scratch& work() { return scratch_; }
  // A decoding error's answer (its detail kept in work().detail).
  answer refused(api::error err);

 private:
  friend struct endpoint_task::promise_type;
  // Writes the request's answer and lets the connection go on: the one place that
  // completes a request.
  void finish(const answer& a);
  void respond_json(int status, std::string_view body);
  void respond_error(int status, std::string_view detail);
  void respond_canned(http::canned what);
  void respond_metrics(std::string_view text);
  void complete();
  net::flow advance();
  // The request being received announced a body: charge it to the memory budget (false:
  // it does not fit), give the charge back, answer the refusal.
  bool charge_body();
  void release_body();
  net::flow refuse_body();
  void dispatch(const http::request& request);
  // False when the request lacks the token its endpoint needs (without --tenants-file).
  bool authorized(const http::request& request, access auth) const;
  // With --tenants-file: 0 when the request's token may call its endpoint, else 401, or
  // 403 with the reason in work().detail. Settles the request's tenant: on SGLang's rows
  // `route.tenant` becomes the token's tenant (checked against the path's), and the
  // quota fields of work() are set. `found`: a row matched (else any known token will do,
  // for the 404 or 405).
  int authorize_tenant(const http::request& request, bool found, http::route& route);
  // The admin token's X-Metad-Tenant: work().space becomes that tenant's vLLM space; 0 or
  // 404 (no such state) with work().detail.
  int admin_space(std::string_view name);
  // The tenant table this core serves with, the published one once its version changed.
  const tenant_table& current_tenants();
  // Settles the found request's tenant row for the per-tenant counters (work().tenant_row).
  void count_tenant(const http::route& route);
  void start(route_label route);
  // Whether the answer being written leaves the connection open (and says so).
  bool answer_keeps_alive();
  // Drops the body of the answer just written (its last body_bytes) if it answers HEAD.
  void drop_body_of_head(std::size_t body_bytes);

  node& node_;
  core_state& home_;
  net::waker& waker_;
  http::parser parser_;
  std::string out_;
  scratch scratch_;
  bool keep_alive_ = true;
  bool head_ = false;            // the request is HEAD: answers carry no body
  bool grew_ = false;            // a request since the last trim() was big: buffers may have grown
  std::size_t body_charge_ = 0;  // bytes charged to node::memory for bodies
  route_label route_ = kNotFound;
  int status_ = 0;
  std::uint64_t started_ns_ = 0;
  std::string_view target_;  // for the access log; valid until consume()
  bool in_flight_ = false;   // a request is being executed
  bool parked_ = false;      // ... and the connection was told to wait for it
  // With HA, the request's route answers on the leader only: its answer goes out only
  // while this node still serves (else a 503), so that no answer leaves past the lease
  // deadline, the fencing rule.
  bool leader_only_ = false;
  // --tenants-file: the last token a request on this connection presented that named a
  // tenant, the table's version and that tenant. A keep-alive client's next request with
  // the same token is compared with it (in constant time) instead of hashed again: its
  // SHA-256 is most of what a tenant's request costs more than one without a token. A
  // reload (another version) voids it; an unknown token is never kept.
  struct verified_token {
    std::string token;
    std::uint64_t version = 0;
    const tenant* who = nullptr;
  } verified_;
};

}  // namespace metad::pipeline
