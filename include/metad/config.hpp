// Runtime configuration of one server instance: every limit the server enforces.
// Built once at start-up (from flags or by an embedder) and read-only afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace metad {

enum class io_mode { automatic, uring, epoll };
enum class log_level { error, warn, info, debug };
// sync: a mutating request is answered after its log records are fdatasynced.
// none: records are written by the loop but not synced, and nobody waits for them.
enum class durability { sync, none };
// lru: a rank that cannot serve an allocation evicts the least recently used complete
// keys (on every rank) until it can. none: it answers -1, as the reference does.
enum class eviction { none, lru };

struct config {
  std::string host = "127.0.0.1";
  std::uint16_t port = 18000;
  // CPUs to pin one core thread each to. Empty: `threads` threads on the CPUs of the
  // affinity mask, in order, wrapping around when there are more threads than CPUs
  // (tests, oversubscribed hosts); threads == 0: default_threads of them, from the NUMA
  // node of the mask's first CPU (fewer if it has fewer).
  std::vector<int> cpus;
  int threads = 0;
  // A whole fleet's metadata load is a fraction of one core: more cores buy headroom
  // for bursts, not throughput, and each costs memory and wake-ups.
  static constexpr int default_threads = 4;
  // The key-completion directory lives on this many cores (the first ones), so a
  // request that names no rank (batch_exists) visits at most this many, whatever the
  // core count; capped at the core count.
  int directory_cores = 2;
  io_mode io = io_mode::automatic;
  log_level log = log_level::info;

  std::size_t header_bytes_max = 64 * 1024;
  std::size_t body_bytes_max = 32 * 1024 * 1024;
  // Largest num_pages of a vLLM rank or SGLang pool (--pages-per-rank-max): an operator's
  // limit, 2^48 at most (the default). A pool costs what it hands out, not num_pages.
  std::int64_t pages_per_rank_max = std::int64_t{1} << 48;
  // Worker ranks that may exist at once; initializing one more gets a 400.
  std::int64_t ranks_max = 4096;
  // Longest key (bytes, as decoded from JSON) a request may carry; longer: 400.
  std::size_t key_bytes_max = 4096;
  // Memory clients may make the server hold (see pipeline/memory_budget.hpp): ranks
  // created or grown and request bodies past it are refused. 0: half of what this
  // process may use (physical memory, or its cgroup's limit when lower).
  std::uint64_t memory_max = 0;

  std::uint32_t idle_timeout_ms = 60'000;    // no request in progress
  std::uint32_t header_timeout_ms = 10'000;  // a request started but not complete
  std::uint32_t drain_timeout_ms = 5'000;    // grace for in-flight requests on stop
  std::uint32_t connections_per_core_max = 16'384;

  // Also (or, with tcp == false, only) listen on this unix socket path.
  std::string unix_path;
  bool tcp = true;
  // Non-empty: every endpoint but /health needs "Authorization: Bearer <auth_token>".
  std::string auth_token;
  // Non-empty: /clear (and other destructive endpoints) need this token instead.
  std::string admin_token;
  // Non-empty: tenants bound to credentials, one a line with the SHA-256 of its token
  // (docs/operations.md, "Tenants"); the path only: the server reads it at start and on
  // SIGHUP. Every API request then belongs to the tenant of its token.
  std::string tenants_file;
  bool access_log = false;
  std::uint32_t summary_interval_ms = 10'000;  // periodic one-line summary at info; 0: off

  // Empty: state lives in memory only.
  std::string data_dir;
  // The state file of SGLang's own metadata server (its --persistence-path), imported
  // into the default tenant when data_dir holds no committed state yet; only read.
  // Needs data_dir. Empty: none.
  std::string sglang_import_path;
  durability durable = durability::sync;
  // A core snapshots its state and starts a new log segment past this many log bytes.
  std::uint64_t snapshot_log_bytes = 256u << 20;

  // Page lifecycle. A reservation neither confirmed nor released within this returns
  // to the free pool (0: never).
  std::uint64_t reservation_ttl_ms = 600'000;
  // A page released by confirm_write's pages_to_release is handed out again only after
  // this long, unless no other page is free: a replay of that request (a client's retry)
  // then cannot free a page another writer got meanwhile (0: free at once).
  std::uint32_t release_quarantine_ms = 5'000;
  eviction evict = eviction::none;
  // A key whose pages get_locations returned is neither evicted nor deleted for this
  // long (its reader may still be reading the file).
  std::uint32_t read_lease_ms = 10'000;
  // A key confirmed on some ranks but not on all of its tp_world_size, for which no rank
  // holds a reservation, is stale this long after its last confirmation: no writer will
  // complete it, no reader can use it, so it is removed on every rank (0: never).
  std::uint32_t incomplete_grace_ms = 30'000;

  // SGLang's HiCache API (docs/sglang-api.md). Its pools use reservation_ttl_ms too.
  // get_page_indices leases the keys it finds for this long (0: no lease, the reference's
  // eviction order exactly, which SGLang's own tests assert).
  std::uint32_t sglang_read_lease_ms = 0;
  // Re-initializing a pool with fewer pages: 409 (else 204, unchanged, and a warning).
  bool strict_reinit = false;

  // High availability (docs/operations.md): with ha_etcd set, this node campaigns for
  // the leader lease in etcd and serves the API only while it holds it; other nodes
  // answer 503 naming the leader. Empty ha_etcd: off (and every ha_* must be unset).
  std::string ha_etcd;  // URL[,URL...] of etcd's members (http(s)://HOST:PORT)
  // https:// members: the CA that signed their certificates (empty: the system's), and
  // a client certificate and its key if etcd asks for one (paths).
  std::string ha_etcd_ca;
  std::string ha_etcd_cert;
  std::string ha_etcd_key;
  // etcd's password authentication: the user, and the file whose first line is its
  // password (the path only: the password is read where it is used, never kept here).
  std::string ha_etcd_user;
  std::string ha_etcd_password_file;
  std::string ha_cluster;  // the nodes that share one lease
  std::string ha_node;     // this node's id, unique in the cluster
  // The http://HOST:PORT other nodes name in their 503s; empty: http://host:port.
  std::string ha_advertise;
  // Lease TTL (whole seconds), renewal period, and how long before the lease could
  // expire the leader stops serving (design: TTL 1 s with a tuned etcd).
  std::uint32_t ha_ttl_ms = 1000;
  std::uint32_t ha_renew_ms = 200;
  std::uint32_t ha_margin_ms = 150;
  // Synchronous replication to a hot standby (needs ha_etcd and data_dir): where this
  // node takes its standbys' streams (IPv4 HOST:PORT); empty: no replication. A
  // standby that has not acknowledged for sync_timeout_ms is dropped from /sync, then
  // the leader acknowledges alone.
  std::string repl_listen;
  // The HOST:PORT other nodes connect to for this node's streams, when it differs from
  // repl_listen (NAT, a port mapping, a proxy); empty: repl_listen, with 0.0.0.0 replaced
  // by the host of the advertised http URL.
  std::string repl_advertise;
  std::uint32_t sync_timeout_ms = 500;
  // A leader's log segments older than its newest snapshot are kept on disk, up to this
  // many bytes a core, so that a standby cut off for longer than the bytes each core
  // keeps in memory (repl::kRetainBytes) resumes from the files instead of a snapshot;
  // 0: removed at each snapshot, as without replication.
  std::uint64_t repl_retain_log_bytes = 256u << 20;
  // Replication over mutual TLS (all three or none; docs/replication.md, "TLS"): this
  // node's certificate (PEM, naming ha_node) and private key (no access for group or
  // others), and the CA that signs every node's. A stream is accepted or followed only
  // from a node whose certificate the CA signed and names the node it claims to be.
  std::string repl_tls_cert, repl_tls_key, repl_tls_ca;
  // Without TLS, repl_listen must be a loopback address unless this is set (clear text
  // to any address: anyone who reaches the port can read every key, or pose as the
  // standby).
  bool repl_insecure = false;
};

// The CPUs of a list such as "0-3,8,10-11" (the --cpus flag, sysfs cpulist files), each
// in [0, cpu_max], appended to `cpus`; false if the list is malformed, empty or out of
// range.
bool parse_cpu_list(std::string_view text, int cpu_max, std::vector<int>& cpus);

}  // namespace metad
