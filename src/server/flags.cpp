#include "server/flags.hpp"

#include <sched.h>
#include <sys/stat.h>
#include <sys/utsname.h>

#include <array>
#include <fstream>

#include "ha/control.hpp"
#include "metad/server.hpp"
#include "pipeline/routes.hpp"
#include "pipeline/tenants.hpp"
#include "server/flag_setters.hpp"
#include "server/ha_setup.hpp"

namespace metad::flags {
namespace {

using namespace setters;

// The names of each choice flag's values, config{}'s among them.
constexpr std::array kIo{named<io_mode>{"auto", io_mode::automatic},
                         named<io_mode>{"uring", io_mode::uring},
                         named<io_mode>{"epoll", io_mode::epoll}};
constexpr std::array kDurability{named<durability>{"sync", durability::sync},
                                 named<durability>{"none", durability::none}};
constexpr std::array kEviction{named<eviction>{"none", eviction::none},
                               named<eviction>{"lru", eviction::lru}};
constexpr std::array kLogLevel{
    named<log_level>{"error", log_level::error}, named<log_level>{"warn", log_level::warn},
    named<log_level>{"info", log_level::info}, named<log_level>{"debug", log_level::debug}};

void cpus(config& c, std::string_view, std::string_view value) {
  c.cpus.clear();
  if (!parse_cpu_list(value, CPU_SETSIZE - 1, c.cpus))
    throw usage_error("--cpus: expected CPUs in [0, " + std::to_string(CPU_SETSIZE - 1) +
                      "] such as 0-3,8, got '" + std::string(value) + "'");
}

// A byte count with an optional binary suffix: 512, 64KiB, 8GiB (K, M, G, T accepted).
void memory_max(config& c, std::string_view flag, std::string_view value) {
  std::size_t digits = 0;
  while (digits < value.size() && value[digits] >= '0' && value[digits] <= '9') ++digits;
  std::string_view suffix = value.substr(digits);
  if (suffix.ends_with("iB")) suffix.remove_suffix(2);
  static constexpr std::string_view units = "KMGT";
  unsigned shift = 0;
  if (suffix.size() == 1 && units.find(suffix[0]) != std::string_view::npos)
    shift = 10 * static_cast<unsigned>(units.find(suffix[0]) + 1);
  else if (!suffix.empty())
    throw usage_error(std::string(flag) + ": expected bytes like 1073741824 or 1GiB, got '" +
                      std::string(value) + "'");
  c.memory_max =
      parse_int<std::uint64_t>(flag, value.substr(0, digits), 1, (std::uint64_t{1} << 50) >> shift)
      << shift;
}

// A token file's first line, without surrounding whitespace; it must not be empty.
template <auto Field>
void token(config& c, std::string_view flag, std::string_view path) {
  std::ifstream in{std::string(path)};
  std::string line;
  if (!in || !std::getline(in, line))
    throw usage_error(std::string(flag) + ": cannot read '" + std::string(path) + "'");
  const auto first = line.find_first_not_of(" \t\r");
  const auto last = line.find_last_not_of(" \t\r");
  if (first == std::string::npos) throw usage_error(std::string(flag) + ": the token is empty");
  c.*Field = line.substr(first, last - first + 1);
}

// The tenants file must parse now: a bad one stops the start naming its line (exit 2).
// The server reads it again when it starts serving, and on SIGHUP.
void tenants_file(config& c, std::string_view flag, std::string_view path) {
  pipeline::tenant_table table;
  if (const std::string error =
          pipeline::load_tenants_file(std::string(path), pipeline::kPatterns, table);
      !error.empty())
    throw usage_error(std::string(flag) + ": " + error);
  c.tenants_file = path;
}

// SGLang's server: persistence in the file P. Here the state of both APIs goes to a data
// directory: P itself, or P.metad beside the reference's file P, which is imported on
// the first start and never written.
void persistence_path(config& c, std::string_view, std::string_view value) {
  const std::string path(value);
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && S_ISREG(st.st_mode)) {
    c.data_dir = path + ".metad";
    c.sglang_import_path = path;
  } else if (exists && !S_ISDIR(st.st_mode)) {
    throw usage_error("--persistence-path " + path + ": neither a file nor a directory");
  } else {
    c.data_dir = path;
  }
}

// SGLang's server: seconds between saves. Every change is logged here as it is made
// (--durability), so the value is checked and not used.
void save_interval(config&, std::string_view flag, std::string_view value) {
  parse_int<std::uint64_t>(flag, value, 0, std::uint64_t{1} << 32);
}

void reservation_ttl(config& c, std::string_view flag, std::string_view value) {
  c.reservation_ttl_ms = parse_int<std::uint64_t>(flag, value, 0, 86'400'000) * 1000;
}
std::string reservation_ttl_shown(const config& c) {
  return std::to_string(c.reservation_ttl_ms / 1000);
}
std::string threads_shown(const config&) { return std::to_string(config::default_threads); }

using C = config;
constexpr std::uint32_t kDayMs = 86'400'000;

}  // namespace

// clang-format off
const std::vector<row>& table() {
  static const std::vector<row> rows{
  {"--host", "ADDR", "listen address (default {})", text<&C::host>, string_of<&C::host>},
  {"--port", "N", "TCP port (default {}; 0 picks a free one)",
   integer<&C::port, 0, 65535>, number<&C::port>},
  {"--threads", "N", "core threads (default {}, or fewer when the affinity mask's\n"
                     "first NUMA node has fewer CPUs; one thread per CPU)",
   integer<&C::threads, 1, 1024>, threads_shown},
  {"--directory-cores", "N", "the key directory lives on this many cores, so batch_exists\n"
                             "visits at most N whatever --threads is (default {})",
   integer<&C::directory_cores, 1, 1024>, number<&C::directory_cores>},
  {"--cpus", "LIST", "pin core threads to these CPUs, e.g. 0-3,8 (overrides --threads)", cpus},
  {"--io", "auto|uring|epoll", "transport (default {}: io_uring, epoll where refused)",
   choice<&C::io, kIo>, choice_shown<&C::io, kIo>},
  {"--header-bytes-max", "N", "request line + headers limit, else 431 (default {})",
   integer<&C::header_bytes_max, 256, std::size_t{1} << 24>, number<&C::header_bytes_max>},
  {"--body-bytes-max", "N", "request body limit, else 413 (default {})",
   integer<&C::body_bytes_max, 0, std::size_t{1} << 32>, number<&C::body_bytes_max>},
  {"--pages-per-rank-max", "N", "largest num_pages a rank or pool may have (default and most\n"
                               "{} = 2^48; a pool costs what it hands out)",
   integer<&C::pages_per_rank_max, 1, std::int64_t{1} << 48>, number<&C::pages_per_rank_max>},
  {"--ranks-max", "N", "worker ranks that may exist at once; one more gets a 400\n"
                       "(default {})",
   integer<&C::ranks_max, 1, std::int64_t{1} << 24>, number<&C::ranks_max>},
  {"--key-bytes-max", "N", "longest key a request may carry, else 400 (default {})",
   integer<&C::key_bytes_max, 1, std::size_t{1} << 24>, number<&C::key_bytes_max>},
  {"--memory-max", "BYTES", "memory clients may make the server hold, e.g. 8GiB: a rank\n"
                            "or pool created past it gets a 507, an allocation past it\n"
                            "is answered as by a full pool, a request body that\n"
                            "does not fit a 503 before it is read (default: half of the\n"
                            "physical memory, or of the cgroup's limit when lower)",
   memory_max},
  {"--idle-timeout-ms", "N", "close keep-alive connections idle this long (default {})",
   integer<&C::idle_timeout_ms, 1, kDayMs>, number<&C::idle_timeout_ms>},
  {"--header-timeout-ms", "N", "a started request must arrive within this (default {})",
   integer<&C::header_timeout_ms, 1, kDayMs>, number<&C::header_timeout_ms>},
  {"--drain-timeout-ms", "N", "grace for in-flight requests on SIGINT/SIGTERM (default {})",
   integer<&C::drain_timeout_ms, 0, kDayMs>, number<&C::drain_timeout_ms>},
  {"--connections-max", "N", "open connections per core; more are closed (default {})",
   integer<&C::connections_per_core_max, 1, 1'000'000>, number<&C::connections_per_core_max>},
  {"--unix", "PATH", "also listen on this unix socket (the fast path behind a proxy)",
   text<&C::unix_path>},
  {"--no-tcp", "", "listen only on --unix", set_to<&C::tcp, false>},
  {"--auth-token-file", "F", "require \"Authorization: Bearer <token>\" (the file's first line)\n"
                             "on every endpoint but /health and the status page (GET /)",
   token<&C::auth_token>},
  {"--admin-token-file", "F", "require this token (not the --auth-token-file one) for the\n"
                              "destructive endpoints: POST /clear and POST /keys/delete",
   token<&C::admin_token>},
  {"--tenants-file", "F", "tenants bound to credentials, one a line: NAME SHA256[,SHA256]\n"
                          "[ranks=N] [pages=N] [vllm] (SHA256: of the tenant's token).\n"
                          "Every API request belongs to its token's tenant; SGLang's\n"
                          "/{rank}/... acts on it, vLLM's API on its own ranks and keys\n"
                          "(the vllm tenant's: the state kept without the file).\n"
                          "Read again on SIGHUP (a bad file keeps the old table); a bad\n"
                          "file stops the start (docs/operations.md, Tenants)",
   tenants_file},
  {"--access-log", "", "one log line per request", set_to<&C::access_log, true>},
  {"--summary-interval-ms", "N", "periodic one-line summary at info level, none while nothing\n"
                                 "changes (default {}; 0: off)",
   integer<&C::summary_interval_ms, 0, kDayMs>, number<&C::summary_interval_ms>},
  {"--data-dir", "DIR", "keep state in DIR (per-core logs + snapshots) and recover it\n"
                        "on start; without it, state lives in memory only",
   text<&C::data_dir>},
  {"--durability", "sync|none", "{} (default): answer a mutating request only after its log\n"
                                "records are fdatasynced; none: log without syncing or waiting",
   choice<&C::durable, kDurability>, choice_shown<&C::durable, kDurability>},
  {"--snapshot-log-bytes", "N", "snapshot a core and start a new log segment past N log bytes\n"
                                "(default {})",
   integer<&C::snapshot_log_bytes, 4096, std::uint64_t{1} << 40>, number<&C::snapshot_log_bytes>},
  {"--reservation-ttl", "S", "a page reserved by batch_allocate and neither confirmed nor\n"
                             "released within S seconds returns to the pool (default {};\n"
                             "0: never)",
   reservation_ttl, reservation_ttl_shown},
  {"--release-quarantine-ms", "N", "a page released by confirm_write (vLLM's or SGLang's) goes\n"
                                   "to another key only N ms later, unless no other page is\n"
                                   "free (SGLang: nor evictable), so that a replayed release\n"
                                   "cannot free it (default {}; 0: at once, SGLang's pages in\n"
                                   "the reference's order)",
   integer<&C::release_quarantine_ms, 0, kDayMs>, number<&C::release_quarantine_ms>},
  {"--eviction", "none|lru", "lru: a full rank evicts the least recently used complete keys\n"
                             "(on every rank) to serve an allocation (default {}: -1)",
   choice<&C::evict, kEviction>, choice_shown<&C::evict, kEviction>},
  {"--read-lease-ms", "N", "keys whose pages get_locations returned are not evicted or\n"
                           "deleted for N ms (default {})",
   integer<&C::read_lease_ms, 0, kDayMs>, number<&C::read_lease_ms>},
  {"--incomplete-grace-ms", "N", "a key confirmed on some ranks but not all, with no reservation\n"
                                 "left, is removed on every rank N ms after its last\n"
                                 "confirmation: no writer will complete it (default {}; 0:\n"
                                 "never)",
   integer<&C::incomplete_grace_ms, 0, kDayMs>, number<&C::incomplete_grace_ms>},
  {"--persistence-path", "P", "SGLang's server's flag. P a directory or absent: as --data-dir\n"
                              "P. P a file (the state SGLang's server saved): the data\n"
                              "directory is P.metad beside it, and P is imported into it on\n"
                              "the first start (P is only read, never written)",
   persistence_path},
  {"--import-sglang-state", "F", "import F, a state file of SGLang's own metadata server, into\n"
                                 "the default tenant when --data-dir holds no state yet (the\n"
                                 "first start); an invalid F stops the start",
   text<&C::sglang_import_path>},
  {"--save-interval", "S", "SGLang's server's flag: accepted and not needed (every change\n"
                           "is logged as it is made)",
   save_interval},
  {"--sglang-read-lease-ms", "N", "SGLang API: keys get_page_indices returned are not evicted\n"
                                  "for N ms (default {}: the reference's eviction order)",
   integer<&C::sglang_read_lease_ms, 0, kDayMs>, number<&C::sglang_read_lease_ms>},
  {"--strict-reinit", "", "SGLang API: initializing a pool again with fewer pages is a\n"
                          "409 (default: 204, the pool unchanged, and a warning)",
   set_to<&C::strict_reinit, true>},
  {"--ha-etcd", "URL[,URL...]", "high availability: hold the leader lease in this etcd\n"
                                "cluster (its members' http(s)://HOST:PORT); only the leader\n"
                                "serves the API, the other nodes answer 503 naming it. Needs\n"
                                "--ha-cluster and --ha-node (docs/operations.md)",
   text<&C::ha_etcd>},
  {"--ha-etcd-ca", "FILE", "https:// etcd: verify its members' certificates (and that\n"
                           "they name the URL's host) against this PEM CA (default: the\n"
                           "system's CAs)",
   text<&C::ha_etcd_ca>},
  {"--ha-etcd-cert", "FILE", "a client certificate for etcd, when it asks for one (without\n"
                             "a Common Name: etcd's gateway refuses one with a CN)",
   text<&C::ha_etcd_cert>},
  {"--ha-etcd-key", "FILE", "that certificate's private key", text<&C::ha_etcd_key>},
  {"--ha-etcd-user", "NAME", "authenticate to etcd as NAME (https:// only)", text<&C::ha_etcd_user>},
  {"--ha-etcd-password-file", "FILE", "its password, FILE's first line; FILE readable by its\n"
                                      "owner only (0600); a password etcd refuses stops the start\n"
                                      "(exit 2)",
   text<&C::ha_etcd_password_file>},
  {"--ha-cluster", "NAME", "the nodes that share one leader lease (A-Za-z0-9._-)",
   text<&C::ha_cluster>},
  {"--ha-node", "ID", "this node's id in the cluster, unique (A-Za-z0-9._-)", text<&C::ha_node>},
  {"--ha-advertise", "URL", "http://HOST:PORT the other nodes name as this node's address\n"
                            "when it leads (default http://<--host>:<port>)",
   text<&C::ha_advertise>},
  {"--ha-ttl-ms", "N", "leader lease TTL, whole seconds (default {}; etcd grants at\n"
                       "least 1.5 x its election timeout)",
   integer<&C::ha_ttl_ms, 1000, 3'600'000>, number<&C::ha_ttl_ms>},
  {"--ha-renew-ms", "N", "renew the lease this often while leading (default {})",
   integer<&C::ha_renew_ms, 1, 3'600'000>, number<&C::ha_renew_ms>},
  {"--ha-margin-ms", "N", "stop serving this long before the lease could expire, counted\n"
                          "from the last renewal sent (default {})",
   integer<&C::ha_margin_ms, 1, 3'600'000>, number<&C::ha_margin_ms>},
  {"--repl-listen", "HOST:PORT", "synchronous replication to a hot standby (with --ha-*\n"
                                 "and --data-dir): standbys connect here; a write is answered\n"
                                 "once this node and the standby both have it on disk",
   text<&C::repl_listen>},
  {"--repl-advertise", "HOST:PORT", "where the other nodes connect for this node's streams\n"
                                    "(default: --repl-listen, 0.0.0.0 as --ha-advertise's host)",
   text<&C::repl_advertise>},
  // The three TLS rows share one help paragraph, beside their three names.
  {"--repl-tls-cert", "FILE", "replication over mutual TLS (all three flags or none): this",
   text<&C::repl_tls_cert>},
  {"--repl-tls-key", "FILE", "node's certificate (PEM, naming --ha-node as a DNS",
   text<&C::repl_tls_key>},
  {"--repl-tls-ca", "FILE", "subjectAltName or CN), its key (mode 0600 or 0400) and the\n"
                            "CA that signs every node's; a peer is accepted (and a leader\n"
                            "followed) only with a certificate from that CA naming the\n"
                            "node it claims to be",
   text<&C::repl_tls_ca>},
  {"--repl-insecure", "", "replicate in clear text on a --repl-listen that is not a\n"
                          "loopback address (refused without it: anyone who reaches the\n"
                          "port could read every key or pose as the standby)",
   set_to<&C::repl_insecure, true>},
  {"--sync-timeout-ms", "N", "a standby silent this long is dropped from /sync, then the\n"
                             "leader answers alone (default {})",
   integer<&C::sync_timeout_ms, 10, 600'000>, number<&C::sync_timeout_ms>},
  {"--repl-retain-log-bytes", "N", "a leader keeps up to N bytes a core of the log segments\n"
                                   "its snapshots made old, so that a standby that was cut off\n"
                                   "for long resumes from them, not from a new snapshot\n"
                                   "(default {}; 0: removed at once)",
   integer<&C::repl_retain_log_bytes, 0, std::uint64_t{1} << 44>,
   number<&C::repl_retain_log_bytes>},
  {"--log-level", "LEVEL", "error|warn|info|debug (default {})",
   choice<&C::log, kLogLevel>, choice_shown<&C::log, kLogLevel>},
  {"--verify-data-dir", "DIR", "read DIR (stopped server) without serving: print its ranks,\n"
                               "pages, bindings and keys, or the damage with file and offset;\n"
                               "exit 0 if readable, 1 if damaged",
   nullptr},
  {"--help", "", "this text", nullptr},
  {"--version", "", "print the version, the transports built in and whether this\n"
                    "host lets the process use io_uring",
   nullptr},
  };
  return rows;
}
// clang-format on

std::string usage() {
  const config defaults{};
  std::string out =
      "Usage: hf3fs-metad [flags]\n"
      "KV-cache page metadata server for vLLM's HF3FS connector (drop-in for its "
      "Python\nmetadata server; same HTTP API, default port " +
      std::to_string(defaults.port) + ").\n\n";
  for (const row& r : table()) {
    std::string head = "  " + std::string(r.name);
    if (!r.metavar.empty()) head += " " + std::string(r.metavar);
    const std::size_t width = head.size() - 2;
    head.append(width < 26 ? 26 - width : 2, ' ');
    std::string help(r.help);
    if (const auto at = help.find("{}"); at != std::string::npos && r.shown)
      help.replace(at, 2, r.shown(defaults));
    for (std::size_t from = 0, nl; from < help.size(); from = nl + 1) {
      nl = help.find('\n', from);
      if (nl == std::string::npos) nl = help.size();
      out += (from == 0 ? head : std::string(28, ' ')) + help.substr(from, nl - from) + "\n";
    }
  }
  return out;
}

// Both transports are always built; which one --io auto picks depends on the host, so
// say that too: a container that refuses io_uring shows here, not only in the log.
std::string version() {
  utsname host{};
  const std::string kernel = ::uname(&host) == 0 ? host.release : "unknown";
  std::string out =
      std::string("hf3fs-metad ") + METAD_VERSION + " (transports: io_uring, epoll)\n";
  if (uring_usable()) return out + "io_uring: usable here (kernel " + kernel + ")\n";
  return out + "io_uring: refused here (kernel " + kernel + "): --io auto serves on epoll\n";
}

parsed parse(int argc, const char* const* argv) {
  parsed out;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") return {parsed::action::help, {}, {}};
    if (flag == "--version") return {parsed::action::version, {}, {}};
    if (flag == "--verify-data-dir") {
      if (i + 1 >= argc) throw usage_error("--verify-data-dir: missing DIR");
      return {parsed::action::verify_data_dir, {}, argv[i + 1]};
    }
    const row* found = nullptr;
    for (const row& r : table())
      if (r.name == flag && r.set) found = &r;
    if (found && found->metavar.empty()) {
      found->set(out.cfg, flag, {});
      continue;
    }
    if (i + 1 >= argc) throw usage_error(std::string(flag) + ": unknown flag or missing value");
    const std::string_view value = argv[++i];
    if (!found) throw usage_error(std::string(flag) + ": unknown flag (see --help)");
    found->set(out.cfg, flag, value);
  }
  if (const std::string error = validate(out.cfg); !error.empty()) throw usage_error(error);
  return out;
}

std::string validate(const config& cfg) {
  if (!cfg.tcp && cfg.unix_path.empty()) return "--no-tcp needs --unix PATH";
  const config d{};
  const bool ha_flags = !cfg.ha_cluster.empty() || !cfg.ha_node.empty() ||
                        !cfg.ha_advertise.empty() || !cfg.ha_etcd_ca.empty() ||
                        !cfg.ha_etcd_cert.empty() || !cfg.ha_etcd_key.empty() ||
                        !cfg.ha_etcd_user.empty() || !cfg.ha_etcd_password_file.empty() ||
                        cfg.ha_ttl_ms != d.ha_ttl_ms || cfg.ha_renew_ms != d.ha_renew_ms ||
                        cfg.ha_margin_ms != d.ha_margin_ms;
  const bool repl_tls =
      !cfg.repl_tls_cert.empty() || !cfg.repl_tls_key.empty() || !cfg.repl_tls_ca.empty();
  if (cfg.ha_etcd.empty()) {
    if (ha_flags)
      return "--ha-* flags need --ha-etcd (give --ha-etcd, --ha-cluster and --ha-node, or none)";
    if (!cfg.repl_listen.empty() || !cfg.repl_advertise.empty() || repl_tls || cfg.repl_insecure)
      return "--ha-cluster, --ha-node, --ha-advertise, the other --ha-* flags and the --repl-* "
             "flags need --ha-etcd";
  } else if (cfg.ha_cluster.empty() || cfg.ha_node.empty()) {
    return "--ha-etcd needs --ha-cluster and --ha-node (give all three, or none)";
  }
  if (!cfg.repl_listen.empty() && cfg.data_dir.empty())
    return "--repl-listen needs --data-dir (a standby keeps what it acknowledges on disk)";
  if (cfg.repl_listen.empty() && !cfg.repl_advertise.empty())
    return "--repl-advertise needs --repl-listen";
  if (cfg.repl_listen.empty() && (repl_tls || cfg.repl_insecure))
    return "--repl-tls-cert, --repl-tls-key, --repl-tls-ca and --repl-insecure need --repl-listen";
  if (repl_tls &&
      (cfg.repl_tls_cert.empty() || cfg.repl_tls_key.empty() || cfg.repl_tls_ca.empty()))
    return "--repl-tls-cert, --repl-tls-key and --repl-tls-ca go together (give all three, or "
           "none)";
  if (repl_tls && cfg.repl_insecure)
    return "--repl-insecure and --repl-tls-* contradict each other: give one or the other";
  if (!cfg.sglang_import_path.empty() && cfg.data_dir.empty())
    return "--import-sglang-state needs --data-dir (the imported state lives there)";
  // Each --ha-* and --repl-* value (etcd's URLs, names, the password file, the TLS
  // files, --repl-listen on loopback unless TLS or --repl-insecure, the timings' fit,
  // the advertised addresses). A port of 0 is picked at start-up: any port stands in.
  std::string error;
  ha_settings(cfg, cfg.port == 0 ? 1 : cfg.port, error);
  return error;
}

}  // namespace metad::flags
