// hf3fs-metad: flags → config → server. SIGINT/SIGTERM stop it cleanly (exit 0);
// bad flags print one line and exit 2.
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/utsname.h>

#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "metad/config.hpp"
#include "metad/log.hpp"
#include "metad/server.hpp"

namespace {

constexpr std::string_view kUsage = R"(Usage: hf3fs-metad [flags]
KV-cache page metadata server for vLLM's HF3FS connector (drop-in for its Python
metadata server; same HTTP API, default port 18000).

  --host ADDR               listen address (default 127.0.0.1)
  --port N                  TCP port (default 18000; 0 picks a free one)
  --threads N               core threads (default 4, or fewer when the affinity mask's
                            first NUMA node has fewer CPUs; one thread per CPU)
  --directory-cores N       the key directory lives on this many cores, so batch_exists
                            visits at most N whatever --threads is (default 2)
  --cpus LIST               pin core threads to these CPUs, e.g. 0-3,8 (overrides --threads)
  --io auto|uring|epoll     transport (default auto: io_uring, epoll where refused)
  --header-bytes-max N      request line + headers limit, else 431 (default 65536)
  --body-bytes-max N        request body limit, else 413 (default 33554432)
  --pages-per-rank-max N    largest num_pages a rank or pool may have (default and most
                            281474976710656 = 2^48; a pool costs what it hands out)
  --ranks-max N             worker ranks that may exist at once; one more gets a 400
                            (default 4096)
  --key-bytes-max N         longest key a request may carry, else 400 (default 4096)
  --memory-max BYTES        memory clients may make the server hold, e.g. 8GiB: a rank
                            or pool created past it gets a 507, an allocation past it
                            is answered as by a full pool, a request body that
                            does not fit a 503 before it is read (default: half of the
                            physical memory, or of the cgroup's limit when lower)
  --idle-timeout-ms N       close keep-alive connections idle this long (default 60000)
  --header-timeout-ms N     a started request must arrive within this (default 10000)
  --drain-timeout-ms N      grace for in-flight requests on SIGINT/SIGTERM (default 5000)
  --connections-max N       open connections per core; more are closed (default 16384)
  --unix PATH               also listen on this unix socket (the fast path behind a proxy)
  --no-tcp                  listen only on --unix
  --auth-token-file F       require "Authorization: Bearer <token>" (the file's first line)
                            on every endpoint but /health and the status page (GET /)
  --admin-token-file F      require this token (not the --auth-token-file one) for the
                            destructive endpoints: POST /clear and POST /keys/delete
  --access-log              one log line per request
  --summary-interval-ms N   periodic one-line summary at info level, none while nothing
                            changes (default 10000; 0: off)
  --data-dir DIR            keep state in DIR (per-core logs + snapshots) and recover it
                            on start; without it, state lives in memory only
  --durability sync|none    sync (default): answer a mutating request only after its log
                            records are fdatasynced; none: log without syncing or waiting
  --snapshot-log-bytes N    snapshot a core and start a new log segment past N log bytes
                            (default 268435456)
  --reservation-ttl S       a page reserved by batch_allocate and neither confirmed nor
                            released within S seconds returns to the pool (default 600;
                            0: never)
  --release-quarantine-ms N a page released by confirm_write (vLLM's or SGLang's) goes
                            to another key only N ms later, unless no other page is
                            free (SGLang: nor evictable), so that a replayed release
                            cannot free it (default 5000; 0: at once, SGLang's pages in
                            the reference's order)
  --eviction none|lru       lru: a full rank evicts the least recently used complete keys
                            (on every rank) to serve an allocation (default none: -1)
  --read-lease-ms N         keys whose pages get_locations returned are not evicted or
                            deleted for N ms (default 10000)
  --incomplete-grace-ms N   a key confirmed on some ranks but not all, with no reservation
                            left, is removed on every rank N ms after its last
                            confirmation: no writer will complete it (default 30000; 0:
                            never)
  --persistence-path P      SGLang's server's flag. P a directory or absent: as --data-dir
                            P. P a file (the state SGLang's server saved): the data
                            directory is P.metad beside it, and P is imported into it on
                            the first start (P is only read, never written)
  --import-sglang-state F   import F, a state file of SGLang's own metadata server, into
                            the default tenant when --data-dir holds no state yet (the
                            first start); an invalid F stops the start
  --save-interval S         SGLang's server's flag: accepted and not needed (every change
                            is logged as it is made)
  --sglang-read-lease-ms N  SGLang API: keys get_page_indices returned are not evicted
                            for N ms (default 0: the reference's eviction order)
  --strict-reinit           SGLang API: initializing a pool again with fewer pages is a
                            409 (default: 204, the pool unchanged, and a warning)
  --ha-etcd URL[,URL...]    high availability: hold the leader lease in this etcd
                            cluster (its members' http(s)://HOST:PORT); only the leader
                            serves the API, the other nodes answer 503 naming it. Needs
                            --ha-cluster and --ha-node (docs/operations.md)
  --ha-etcd-ca FILE         https:// etcd: verify its members' certificates (and that
                            they name the URL's host) against this PEM CA (default: the
                            system's CAs)
  --ha-etcd-cert FILE       a client certificate for etcd, when it asks for one (without
                            a Common Name: etcd's gateway refuses one with a CN)
  --ha-etcd-key FILE        that certificate's private key
  --ha-etcd-user NAME       authenticate to etcd as NAME (https:// only)
  --ha-etcd-password-file FILE  its password, FILE's first line; FILE readable by its
                            owner only (0600); a password etcd refuses stops the start
                            (exit 2)
  --ha-cluster NAME         the nodes that share one leader lease (A-Za-z0-9._-)
  --ha-node ID              this node's id in the cluster, unique (A-Za-z0-9._-)
  --ha-advertise URL        http://HOST:PORT the other nodes name as this node's address
                            when it leads (default http://<--host>:<port>)
  --ha-ttl-ms N             leader lease TTL, whole seconds (default 1000; etcd grants at
                            least 1.5 x its election timeout)
  --ha-renew-ms N           renew the lease this often while leading (default 200)
  --ha-margin-ms N          stop serving this long before the lease could expire, counted
                            from the last renewal sent (default 150)
  --repl-listen HOST:PORT   synchronous replication to a hot standby (with --ha-*
                            and --data-dir): standbys connect here; a write is answered
                            once this node and the standby both have it on disk
  --repl-advertise HOST:PORT  where the other nodes connect for this node's streams
                            (default: --repl-listen, 0.0.0.0 as --ha-advertise's host)
  --repl-tls-cert FILE      replication over mutual TLS (all three flags or none): this
  --repl-tls-key FILE       node's certificate (PEM, naming --ha-node as a DNS
  --repl-tls-ca FILE        subjectAltName or CN), its key (mode 0600 or 0400) and the
                            CA that signs every node's; a peer is accepted (and a leader
                            followed) only with a certificate from that CA naming the
                            node it claims to be
  --repl-insecure           replicate in clear text on a --repl-listen that is not a
                            loopback address (refused without it: anyone who reaches the
                            port could read every key or pose as the standby)
  --sync-timeout-ms N       a standby silent this long is dropped from /sync, then the
                            leader answers alone (default 500)
  --log-level LEVEL         error|warn|info|debug (default info)
  --verify-data-dir DIR     read DIR (stopped server) without serving: print its ranks,
                            pages, bindings and keys, or the damage with file and offset;
                            exit 0 if readable, 1 if damaged
  --help                    this text
  --version                 print the version, the transports built in and whether this
                            host lets the process use io_uring
)";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename Int>
Int parse_int(std::string_view flag, std::string_view text, Int lo, Int hi) {
  Int value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value < lo || value > hi)
    throw usage_error(std::string(flag) + ": expected an integer in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "], got '" + std::string(text) + "'");
  return value;
}

std::vector<int> parse_cpus(std::string_view text) {
  std::vector<int> cpus;
  if (!metad::parse_cpu_list(text, CPU_SETSIZE - 1, cpus))
    throw usage_error("--cpus: expected CPUs in [0, " + std::to_string(CPU_SETSIZE - 1) +
                      "] such as 0-3,8, got '" + std::string(text) + "'");
  return cpus;
}

// A byte count with an optional binary suffix: 512, 64KiB, 8GiB (K, M, G, T accepted).
std::uint64_t parse_bytes(std::string_view flag, std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  std::string_view suffix = text.substr(digits);
  if (suffix.ends_with("iB")) suffix.remove_suffix(2);
  static constexpr std::string_view units = "KMGT";
  unsigned shift = 0;
  if (suffix.size() == 1 && units.find(suffix[0]) != std::string_view::npos)
    shift = 10 * static_cast<unsigned>(units.find(suffix[0]) + 1);
  else if (!suffix.empty())
    throw usage_error(std::string(flag) + ": expected bytes like 1073741824 or 1GiB, got '" +
                      std::string(text) + "'");
  const auto value =
      parse_int<std::uint64_t>(flag, text.substr(0, digits), 1, (std::uint64_t{1} << 50) >> shift);
  return value << shift;
}

// A token file's first line, without surrounding whitespace; it must not be empty.
std::string read_token(std::string_view flag, std::string_view path) {
  std::ifstream in{std::string(path)};
  std::string token;
  if (!in || !std::getline(in, token))
    throw usage_error(std::string(flag) + ": cannot read '" + std::string(path) + "'");
  const auto first = token.find_first_not_of(" \t\r");
  const auto last = token.find_last_not_of(" \t\r");
  if (first == std::string::npos) throw usage_error(std::string(flag) + ": the token is empty");
  return token.substr(first, last - first + 1);
}

// Both transports are always built; which one --io auto picks depends on the host, so
// say that too: a container that refuses io_uring shows here, not only in the log.
void print_version() {
  utsname host{};
  const char* kernel = ::uname(&host) == 0 ? host.release : "unknown";
  std::printf("hf3fs-metad %s (transports: io_uring, epoll)\n", METAD_VERSION);
  if (metad::uring_usable())
    std::printf("io_uring: usable here (kernel %s)\n", kernel);
  else
    std::printf("io_uring: refused here (kernel %s): --io auto serves on epoll\n", kernel);
}

// --ha-*: kept as given; metad::ha_config_error checks them together once all are read.
void parse_ha_flag(metad::config& cfg, std::string_view flag, std::string_view value) {
  if (flag == "--ha-etcd")
    cfg.ha_etcd = value;
  else if (flag == "--ha-cluster")
    cfg.ha_cluster = value;
  else if (flag == "--ha-node")
    cfg.ha_node = value;
  else if (flag == "--ha-advertise")
    cfg.ha_advertise = value;
  else if (flag == "--ha-etcd-ca")
    cfg.ha_etcd_ca = value;
  else if (flag == "--ha-etcd-cert")
    cfg.ha_etcd_cert = value;
  else if (flag == "--ha-etcd-key")
    cfg.ha_etcd_key = value;
  else if (flag == "--ha-etcd-user")
    cfg.ha_etcd_user = value;
  else if (flag == "--ha-etcd-password-file")
    cfg.ha_etcd_password_file = value;
  else if (flag == "--ha-ttl-ms")
    cfg.ha_ttl_ms = parse_int<std::uint32_t>(flag, value, 1000, 3'600'000);
  else if (flag == "--ha-renew-ms")
    cfg.ha_renew_ms = parse_int<std::uint32_t>(flag, value, 1, 3'600'000);
  else if (flag == "--ha-margin-ms")
    cfg.ha_margin_ms = parse_int<std::uint32_t>(flag, value, 1, 3'600'000);
  else
    throw usage_error(std::string(flag) + ": unknown flag (see --help)");
}

metad::config parse_flags(int argc, char** argv) {
  metad::config cfg;
  bool ha_flags = false;  // any --ha-* given
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fwrite(kUsage.data(), 1, kUsage.size(), stdout);
      std::exit(0);
    }
    if (flag == "--version") {
      print_version();
      std::exit(0);
    }
    if (flag == "--verify-data-dir") {
      if (i + 1 >= argc) throw usage_error("--verify-data-dir: missing DIR");
      metad::log::threshold = metad::log_level::warn;
      std::exit(metad::verify_data_dir(argv[i + 1]));
    }
    if (flag == "--access-log") {
      cfg.access_log = true;
      continue;
    }
    if (flag == "--strict-reinit") {
      cfg.strict_reinit = true;
      continue;
    }
    if (flag == "--no-tcp") {
      cfg.tcp = false;
      continue;
    }
    if (flag == "--repl-insecure") {
      cfg.repl_insecure = true;
      continue;
    }
    if (i + 1 >= argc) throw usage_error(std::string(flag) + ": unknown flag or missing value");
    std::string_view value = argv[++i];
    if (flag == "--host")
      cfg.host = value;
    else if (flag == "--port")
      cfg.port = parse_int<std::uint16_t>(flag, value, 0, 65535);
    else if (flag == "--threads")
      cfg.threads = parse_int<int>(flag, value, 1, 1024);
    else if (flag == "--directory-cores")
      cfg.directory_cores = parse_int<int>(flag, value, 1, 1024);
    else if (flag == "--cpus")
      cfg.cpus = parse_cpus(value);
    else if (flag == "--io") {
      if (value == "auto")
        cfg.io = metad::io_mode::automatic;
      else if (value == "uring")
        cfg.io = metad::io_mode::uring;
      else if (value == "epoll")
        cfg.io = metad::io_mode::epoll;
      else
        throw usage_error("--io: expected auto, uring or epoll");
    } else if (flag == "--header-bytes-max") {
      cfg.header_bytes_max = parse_int<std::size_t>(flag, value, 256, std::size_t{1} << 24);
    } else if (flag == "--body-bytes-max") {
      cfg.body_bytes_max = parse_int<std::size_t>(flag, value, 0, std::size_t{1} << 32);
    } else if (flag == "--pages-per-rank-max") {
      cfg.pages_per_rank_max = parse_int<std::int64_t>(flag, value, 1, std::int64_t{1} << 48);
    } else if (flag == "--ranks-max") {
      cfg.ranks_max = parse_int<std::int64_t>(flag, value, 1, std::int64_t{1} << 24);
    } else if (flag == "--key-bytes-max") {
      cfg.key_bytes_max = parse_int<std::size_t>(flag, value, 1, std::size_t{1} << 24);
    } else if (flag == "--memory-max") {
      cfg.memory_max = parse_bytes(flag, value);
    } else if (flag == "--idle-timeout-ms") {
      cfg.idle_timeout_ms = parse_int<std::uint32_t>(flag, value, 1, 86'400'000);
    } else if (flag == "--header-timeout-ms") {
      cfg.header_timeout_ms = parse_int<std::uint32_t>(flag, value, 1, 86'400'000);
    } else if (flag == "--drain-timeout-ms") {
      cfg.drain_timeout_ms = parse_int<std::uint32_t>(flag, value, 0, 86'400'000);
    } else if (flag == "--connections-max") {
      cfg.connections_per_core_max = parse_int<std::uint32_t>(flag, value, 1, 1'000'000);
    } else if (flag == "--unix") {
      cfg.unix_path = value;
    } else if (flag == "--auth-token-file") {
      cfg.auth_token = read_token(flag, value);
    } else if (flag == "--admin-token-file") {
      cfg.admin_token = read_token(flag, value);
    } else if (flag == "--summary-interval-ms") {
      cfg.summary_interval_ms = parse_int<std::uint32_t>(flag, value, 0, 86'400'000);
    } else if (flag == "--data-dir") {
      cfg.data_dir = value;
    } else if (flag == "--persistence-path") {
      // SGLang's server: persistence in the file P. Here the state of both APIs goes to
      // a data directory: P itself, or P.metad beside the reference's file P, which is
      // imported on the first start and never written.
      const std::string path(value);
      struct stat st {};
      const bool exists = ::stat(path.c_str(), &st) == 0;
      if (exists && S_ISREG(st.st_mode)) {
        cfg.data_dir = path + ".metad";
        cfg.sglang_import_path = path;
      } else if (exists && !S_ISDIR(st.st_mode)) {
        throw usage_error("--persistence-path " + path + ": neither a file nor a directory");
      } else {
        cfg.data_dir = path;
      }
    } else if (flag == "--import-sglang-state") {
      cfg.sglang_import_path = value;
    } else if (flag == "--save-interval") {
      // SGLang's server: seconds between saves. Every change is logged here as it is
      // made (--durability), so the value is checked and not used.
      parse_int<std::uint64_t>(flag, value, 0, std::uint64_t{1} << 32);
    } else if (flag == "--durability") {
      if (value == "sync")
        cfg.durable = metad::durability::sync;
      else if (value == "none")
        cfg.durable = metad::durability::none;
      else
        throw usage_error("--durability: expected sync or none");
    } else if (flag == "--snapshot-log-bytes") {
      cfg.snapshot_log_bytes = parse_int<std::uint64_t>(flag, value, 4096, std::uint64_t{1} << 40);
    } else if (flag == "--reservation-ttl") {
      cfg.reservation_ttl_ms = parse_int<std::uint64_t>(flag, value, 0, 86'400'000) * 1000;
    } else if (flag == "--release-quarantine-ms") {
      cfg.release_quarantine_ms = parse_int<std::uint32_t>(flag, value, 0, 86'400'000);
    } else if (flag == "--eviction") {
      if (value == "none")
        cfg.evict = metad::eviction::none;
      else if (value == "lru")
        cfg.evict = metad::eviction::lru;
      else
        throw usage_error("--eviction: expected none or lru");
    } else if (flag == "--read-lease-ms") {
      cfg.read_lease_ms = parse_int<std::uint32_t>(flag, value, 0, 86'400'000);
    } else if (flag == "--sglang-read-lease-ms") {
      cfg.sglang_read_lease_ms = parse_int<std::uint32_t>(flag, value, 0, 86'400'000);
    } else if (flag == "--incomplete-grace-ms") {
      cfg.incomplete_grace_ms = parse_int<std::uint32_t>(flag, value, 0, 86'400'000);
    } else if (flag == "--repl-listen") {
      cfg.repl_listen = value;
    } else if (flag == "--repl-advertise") {
      cfg.repl_advertise = value;
    } else if (flag == "--repl-tls-cert") {
      cfg.repl_tls_cert = value;
    } else if (flag == "--repl-tls-key") {
      cfg.repl_tls_key = value;
    } else if (flag == "--repl-tls-ca") {
      cfg.repl_tls_ca = value;
    } else if (flag == "--sync-timeout-ms") {
      cfg.sync_timeout_ms = parse_int<std::uint32_t>(flag, value, 10, 600'000);
    } else if (flag.starts_with("--ha-")) {
      parse_ha_flag(cfg, flag, value);
      ha_flags = true;
    } else if (flag == "--log-level") {
      if (value == "error")
        cfg.log = metad::log_level::error;
      else if (value == "warn")
        cfg.log = metad::log_level::warn;
      else if (value == "info")
        cfg.log = metad::log_level::info;
      else if (value == "debug")
        cfg.log = metad::log_level::debug;
      else
        throw usage_error("--log-level: expected error, warn, info or debug");
    } else {
      throw usage_error(std::string(flag) + ": unknown flag (see --help)");
    }
  }
  if (!cfg.tcp && cfg.unix_path.empty()) throw usage_error("--no-tcp needs --unix PATH");
  if (ha_flags && cfg.ha_etcd.empty())
    throw usage_error(
        "--ha-* flags need --ha-etcd (give --ha-etcd, --ha-cluster and --ha-node, or none)");
  if (const std::string error = metad::ha_config_error(cfg); !error.empty())
    throw usage_error(error);

  if (const std::string error = metad::sglang_import_config_error(cfg); !error.empty())
    throw usage_error(error);
  return cfg;
}

}  // namespace

int main(int argc, char** argv) {
  metad::config cfg;
  try {
    cfg = parse_flags(argc, argv);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "hf3fs-metad: %s\n", e.what());
    return 2;
  }
  metad::log::threshold = cfg.log;
  // Key tables grow by reallocation: a fixed mmap threshold puts every big table in its
  // own mapping, so the old one goes back to the system when it is freed (glibc's
  // sliding threshold would otherwise keep them in the heap, as resident memory).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);

  // Signals are taken synchronously by one thread; every other thread blocks them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGXFSZ, SIG_IGN);  // a file size limit makes writes fail (EFBIG), not kill us

  try {
    metad::server server(cfg);
    std::atomic<bool> finished{false};
    std::thread signal_thread([&] {
      const timespec poll_interval{0, 200'000'000};
      while (!finished.load()) {
        const int sig = sigtimedwait(&stop_signals, nullptr, &poll_interval);
        if (sig > 0) {
          metad::log::info("{} received: draining", strsignal(sig));
          server.stop();
          return;
        }
      }
    });
    try {
      server.run();
    } catch (...) {
      finished = true;
      signal_thread.join();
      throw;
    }
    finished = true;
    signal_thread.join();
  } catch (const metad::config_error& e) {
    // The configuration is wrong (e.g. etcd refused --ha-etcd-user's password): a
    // restart cannot help (ha.conf: RestartPreventExitStatus=2).
    metad::log::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    metad::log::error("{}", e.what());
    return 1;
  }
  return 0;
}
