// The flag table (server/flags.hpp): --help's defaults are config{}'s, each row's check
// and message, and validate()'s rules across flags. The binary's own --help is checked
// against README.md by tests/e2e/test_docs.py; exit codes by tests/e2e/test_bad_input.py.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "server/flags.hpp"
#include "temp_dir.hpp"

using namespace metad;

namespace {

// The flags' --help entries (the first line and its continuation lines, joined).
std::map<std::string, std::string> flag_help_entries() {
  std::map<std::string, std::string> out;
  std::string current;
  const std::string text = flags::usage();
  std::size_t from = 0;
  while (from < text.size()) {
    std::size_t nl = text.find('\n', from);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(from, nl - from);
    from = nl + 1;
    std::smatch m;
    if (std::regex_search(line, m, std::regex("^  (--[a-z-]+)"))) {
      current = m[1];
      out[current] = line;
    } else if (!current.empty() && line.starts_with("    ")) {
      out[current] += " " + line.substr(line.find_first_not_of(' '));
    } else {
      current.clear();
    }
  }
  return out;
}

// The first field where two configs differ, or "" (every field of config, so that a
// row setting something other than its own field shows).
std::string flags_first_difference(const config& a, const config& b) {
#define FLAGS_FIELD(f) \
  if (!(a.f == b.f)) return #f
  FLAGS_FIELD(host);
  FLAGS_FIELD(port);
  FLAGS_FIELD(cpus);
  FLAGS_FIELD(threads);
  FLAGS_FIELD(directory_cores);
  FLAGS_FIELD(io);
  FLAGS_FIELD(log);
  FLAGS_FIELD(header_bytes_max);
  FLAGS_FIELD(body_bytes_max);
  FLAGS_FIELD(pages_per_rank_max);
  FLAGS_FIELD(ranks_max);
  FLAGS_FIELD(key_bytes_max);
  FLAGS_FIELD(memory_max);
  FLAGS_FIELD(idle_timeout_ms);
  FLAGS_FIELD(header_timeout_ms);
  FLAGS_FIELD(drain_timeout_ms);
  FLAGS_FIELD(connections_per_core_max);
  FLAGS_FIELD(unix_path);
  FLAGS_FIELD(tcp);
  FLAGS_FIELD(auth_token);
  FLAGS_FIELD(admin_token);
  FLAGS_FIELD(tenants_file);
  FLAGS_FIELD(access_log);
  FLAGS_FIELD(summary_interval_ms);
  FLAGS_FIELD(data_dir);
  FLAGS_FIELD(sglang_import_path);
  FLAGS_FIELD(durable);
  FLAGS_FIELD(snapshot_log_bytes);
  FLAGS_FIELD(reservation_ttl_ms);
  FLAGS_FIELD(release_quarantine_ms);
  FLAGS_FIELD(evict);
  FLAGS_FIELD(read_lease_ms);
  FLAGS_FIELD(incomplete_grace_ms);
  FLAGS_FIELD(sglang_read_lease_ms);
  FLAGS_FIELD(strict_reinit);
  FLAGS_FIELD(ha_etcd);
  FLAGS_FIELD(ha_etcd_ca);
  FLAGS_FIELD(ha_etcd_cert);
  FLAGS_FIELD(ha_etcd_key);
  FLAGS_FIELD(ha_etcd_user);
  FLAGS_FIELD(ha_etcd_password_file);
  FLAGS_FIELD(ha_cluster);
  FLAGS_FIELD(ha_node);
  FLAGS_FIELD(ha_advertise);
  FLAGS_FIELD(ha_ttl_ms);
  FLAGS_FIELD(ha_renew_ms);
  FLAGS_FIELD(ha_margin_ms);
  FLAGS_FIELD(repl_listen);
  FLAGS_FIELD(repl_advertise);
  FLAGS_FIELD(sync_timeout_ms);
  FLAGS_FIELD(repl_retain_log_bytes);
  FLAGS_FIELD(repl_tls_cert);
  FLAGS_FIELD(repl_tls_key);
  FLAGS_FIELD(repl_tls_ca);
  FLAGS_FIELD(repl_insecure);
#undef FLAGS_FIELD
  return "";
}

// argv for flags::parse from a list of words.
flags::parsed flags_parse(std::vector<std::string> words) {
  words.insert(words.begin(), "hf3fs-metad");
  std::vector<const char*> argv;
  for (const auto& w : words) argv.push_back(w.c_str());
  return flags::parse(static_cast<int>(argv.size()), argv.data());
}

// The usage error of a command line, or "" if it parses.
std::string flags_error(std::vector<std::string> words) {
  try {
    flags_parse(std::move(words));
  } catch (const flags::usage_error& e) {
    return e.what();
  }
  return "";
}

const flags::row& flags_row(std::string_view name) {
  for (const auto& r : flags::table())
    if (r.name == name) return r;
  throw std::logic_error("no row " + std::string(name));
}

TEST(Flags, TableRowsAreDistinctAndHelpListsEach) {
  std::set<std::string_view> names;
  const auto entries = flag_help_entries();
  for (const auto& r : flags::table()) {
    EXPECT_TRUE(names.insert(r.name).second) << r.name;
    EXPECT_TRUE(r.name.starts_with("--")) << r.name;
    EXPECT_TRUE(entries.contains(std::string(r.name))) << r.name;
    EXPECT_FALSE(r.help.empty()) << r.name;
    // A row that prints a default says where: "{}" in its help, and the other way round.
    EXPECT_EQ(r.help.find("{}") != std::string_view::npos, r.shown != nullptr) << r.name;
  }
  EXPECT_EQ(entries.size(), names.size());
  EXPECT_EQ(flags::usage().find("{}"), std::string::npos);
}

// Every "(default X" --help prints, given back to its flag, leaves config{} as it is:
// the help text cannot drift from the struct's defaults.
TEST(Flags, HelpDefaultsAreConfigDefaults) {
  const auto entries = flag_help_entries();
  // "(default 18000;", "(default auto: io_uring", not "(default http://<--host>...".
  const std::regex default_re(R"(\(default ([A-Za-z0-9.]+)(?:[;,)]|: ))");
  int checked = 0;
  for (const auto& [name, entry] : entries) {
    std::smatch m;
    if (!std::regex_search(entry, m, default_re)) continue;
    const flags::row& r = flags_row(name);
    ASSERT_NE(r.set, nullptr) << name;
    config c;
    r.set(c, r.name, m[1].str());
    if (name == "--threads") {
      // threads == 0 is "default_threads of them" (fewer on a small NUMA node).
      EXPECT_EQ(c.threads, config::default_threads);
      EXPECT_EQ(config{}.threads, 0);
      continue;
    }
    EXPECT_EQ(flags_first_difference(c, config{}), "") << name << " " << m[1].str();
    ++checked;
  }
  EXPECT_GE(checked, 25);
  // The defaults are config{}'s even where the text puts them first.
  EXPECT_NE(entries.at("--durability").find("sync|none    sync (default)"), std::string::npos);
  EXPECT_NE(entries.at("--io").find("(default auto:"), std::string::npos);
  EXPECT_NE(entries.at("--port").find("(default 18000;"), std::string::npos);
  EXPECT_NE(flags::usage().find("default port 18000)"), std::string::npos);
}

TEST(Flags, ValuesLandInTheirFields) {
  const config c = flags_parse({"--host",
                                "0.0.0.0",
                                "--port",
                                "0",
                                "--threads",
                                "3",
                                "--cpus",
                                "0-1,3",
                                "--io",
                                "epoll",
                                "--memory-max",
                                "8GiB",
                                "--reservation-ttl",
                                "7",
                                "--eviction",
                                "lru",
                                "--durability",
                                "none",
                                "--log-level",
                                "debug",
                                "--no-tcp",
                                "--unix",
                                "/tmp/s",
                                "--access-log",
                                "--strict-reinit",
                                "--save-interval",
                                "5",
                                "--ha-ttl-ms",
                                "2000",
                                "--ha-etcd",
                                "http://127.0.0.1:1",
                                "--ha-cluster",
                                "c",
                                "--ha-node",
                                "n"})
                       .cfg;
  EXPECT_EQ(c.host, "0.0.0.0");
  EXPECT_EQ(c.port, 0);
  EXPECT_EQ(c.threads, 3);
  EXPECT_EQ(c.cpus, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(c.io, io_mode::epoll);
  EXPECT_EQ(c.memory_max, std::uint64_t{8} << 30);
  EXPECT_EQ(c.reservation_ttl_ms, 7000u);
  EXPECT_EQ(c.evict, eviction::lru);
  EXPECT_EQ(c.durable, durability::none);
  EXPECT_EQ(c.log, log_level::debug);
  EXPECT_FALSE(c.tcp);
  EXPECT_TRUE(c.access_log);
  EXPECT_TRUE(c.strict_reinit);
  EXPECT_EQ(c.ha_ttl_ms, 2000u);
  EXPECT_EQ(c.ha_node, "n");
  EXPECT_EQ(flags_parse({"--memory-max", "512"}).cfg.memory_max, 512u);
  EXPECT_EQ(flags_parse({"--memory-max", "64K"}).cfg.memory_max, 64u << 10);
  EXPECT_EQ(flags_first_difference(flags_parse({}).cfg, config{}), "");
}

TEST(Flags, BadValuesNameTheFlag) {
  EXPECT_EQ(flags_error({"--port", "65536"}),
            "--port: expected an integer in [0, 65535], got '65536'");
  EXPECT_EQ(flags_error({"--threads", "0"}),
            "--threads: expected an integer in [1, 1024], got '0'");
  EXPECT_EQ(flags_error({"--header-bytes-max", "255"}),
            "--header-bytes-max: expected an integer in [256, 16777216], got '255'");
  EXPECT_EQ(flags_error({"--pages-per-rank-max", "281474976710657"}),
            "--pages-per-rank-max: expected an integer in [1, 281474976710656], got "
            "'281474976710657'");
  EXPECT_EQ(flags_error({"--ha-ttl-ms", "500"}),
            "--ha-ttl-ms: expected an integer in [1000, 3600000], got '500'");
  EXPECT_EQ(flags_error({"--sync-timeout-ms", "9"}),
            "--sync-timeout-ms: expected an integer in [10, 600000], got '9'");
  EXPECT_EQ(flags_error({"--reservation-ttl", "1x"}),
            "--reservation-ttl: expected an integer in [0, 86400000], got '1x'");
  EXPECT_EQ(flags_error({"--io", "kqueue"}), "--io: expected auto, uring or epoll");
  EXPECT_EQ(flags_error({"--durability", "x"}), "--durability: expected sync or none");
  EXPECT_EQ(flags_error({"--eviction", "x"}), "--eviction: expected none or lru");
  EXPECT_EQ(flags_error({"--log-level", "x"}), "--log-level: expected error, warn, info or debug");
  EXPECT_EQ(flags_error({"--memory-max", "8GB"}),
            "--memory-max: expected bytes like 1073741824 or 1GiB, got '8GB'");
  EXPECT_EQ(flags_error({"--memory-max", "0"}),
            "--memory-max: expected an integer in [1, 1125899906842624], got '0'");
  EXPECT_NE(flags_error({"--cpus", "3-1"}).find("--cpus: expected CPUs in [0, "),
            std::string::npos);
  EXPECT_EQ(flags_error({"--auth-token-file", "/nonexistent/t"}),
            "--auth-token-file: cannot read '/nonexistent/t'");
  EXPECT_EQ(flags_error({"--bogus", "1"}), "--bogus: unknown flag (see --help)");
  EXPECT_EQ(flags_error({"--bogus"}), "--bogus: unknown flag or missing value");
  EXPECT_EQ(flags_error({"--port"}), "--port: unknown flag or missing value");
  EXPECT_EQ(flags_error({"--verify-data-dir"}), "--verify-data-dir: missing DIR");
}

TEST(Flags, ActionsStopTheParse) {
  EXPECT_EQ(flags_parse({"--port", "1", "--help", "--bogus"}).what, flags::parsed::action::help);
  EXPECT_EQ(flags_parse({"-h"}).what, flags::parsed::action::help);
  EXPECT_EQ(flags_parse({"--version"}).what, flags::parsed::action::version);
  const auto verify = flags_parse({"--verify-data-dir", "/d", "--bogus"});
  EXPECT_EQ(verify.what, flags::parsed::action::verify_data_dir);
  EXPECT_EQ(verify.verify_dir, "/d");
  EXPECT_EQ(flags_error({"--bogus", "1", "--help"}), "--bogus: unknown flag (see --help)");
}

TEST(Flags, PersistencePathPicksTheDataDirectory) {
  sim::temp_dir dir("metad-flags");
  const std::string file = dir.path() + "/state.json";
  std::ofstream(file) << "{}";
  auto c = flags_parse({"--persistence-path", file}).cfg;
  EXPECT_EQ(c.data_dir, file + ".metad");
  EXPECT_EQ(c.sglang_import_path, file);
  c = flags_parse({"--persistence-path", dir.path()}).cfg;
  EXPECT_EQ(c.data_dir, dir.path());
  EXPECT_EQ(c.sglang_import_path, "");
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(flags_error({"--persistence-path", fifo}),
            "--persistence-path " + fifo + ": neither a file nor a directory");
}

// A tenants file is read when the flag is parsed: a bad one is a usage error (exit 2)
// naming the file and the line; a good one lands as its path.
TEST(Flags, TenantsFileIsCheckedWhenParsed) {
  sim::temp_dir dir("metad-flags");
  const std::string good = dir.path() + "/tenants";
  std::ofstream(good) << "# a comment\n\nteam_a " << std::string(64, 'a') << " ranks=4 vllm\n";
  EXPECT_EQ(flags_parse({"--tenants-file", good}).cfg.tenants_file, good);
  const std::string bad = dir.path() + "/bad";
  std::ofstream(bad) << "team_a " << std::string(64, 'a') << "\nteam_b xyz\n";
  EXPECT_EQ(flags_error({"--tenants-file", bad}),
            "--tenants-file: " + bad +
                ": line 2: 'xyz' is not a SHA-256 in hex (64 hex digits, as printf %s "
                "\"$TOKEN\" | sha256sum prints)");
  EXPECT_EQ(flags_error({"--tenants-file", dir.path() + "/missing"}),
            "--tenants-file: " + dir.path() + "/missing: cannot open it");
  EXPECT_EQ(flags_error({"--tenants-file", dir.path()}),
            "--tenants-file: " + dir.path() + ": not a regular file");
}

TEST(Flags, ValidateHoldsTheRulesAcrossFlags) {
  EXPECT_EQ(flags::validate(config{}), "");
  config c;
  c.tcp = false;
  EXPECT_EQ(flags::validate(c), "--no-tcp needs --unix PATH");
  c.unix_path = "/tmp/s";
  EXPECT_EQ(flags::validate(c), "");

  c = {};
  c.sglang_import_path = "/x";
  EXPECT_EQ(flags::validate(c),
            "--import-sglang-state needs --data-dir (the imported state lives there)");
  c.data_dir = "/d";
  EXPECT_EQ(flags::validate(c), "");

  const std::string need_etcd =
      "--ha-* flags need --ha-etcd (give --ha-etcd, --ha-cluster and --ha-node, or none)";
  EXPECT_EQ(flags_error({"--ha-node", "a"}), need_etcd);
  EXPECT_EQ(flags_error({"--ha-ttl-ms", "2000"}), need_etcd);
  EXPECT_EQ(flags_error({"--ha-etcd-user", "u"}), need_etcd);
  EXPECT_EQ(flags_error({"--repl-advertise", "127.0.0.1:1"}),
            "--ha-cluster, --ha-node, --ha-advertise, the other --ha-* flags and the --repl-* "
            "flags need --ha-etcd");
  EXPECT_EQ(flags_error({"--repl-insecure"}),
            "--ha-cluster, --ha-node, --ha-advertise, the other --ha-* flags and the --repl-* "
            "flags need --ha-etcd");
  const std::vector<std::string> named{
      "--ha-etcd", "http://127.0.0.1:2379", "--ha-cluster", "c", "--ha-node", "a"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), named.begin(), named.end());
    return flags_error(more);
  };
  EXPECT_EQ(with({}), "");
  EXPECT_EQ(flags_error({"--ha-etcd", "http://127.0.0.1:2379"}),
            "--ha-etcd needs --ha-cluster and --ha-node (give all three, or none)");
  EXPECT_EQ(flags_error({"--ha-etcd", "etcd:2379", "--ha-cluster", "c", "--ha-node", "a"}),
            "--ha-etcd: expected http(s)://HOST:PORT[,...], got etcd:2379");
  EXPECT_EQ(flags_error({"--ha-etcd", "http://e:1", "--ha-cluster", "a/b", "--ha-node", "a"}),
            "--ha-cluster: 1-64 of A-Za-z0-9._-");
  EXPECT_EQ(flags_error({"--ha-etcd", "http://e:1", "--ha-cluster", "c", "--ha-node", "a b"}),
            "--ha-node: 1-64 of A-Za-z0-9._-");
  EXPECT_EQ(with({"--ha-ttl-ms", "1500"}), "--ha-ttl-ms must be whole seconds");
  EXPECT_EQ(with({"--ha-renew-ms", "900"}), "--ha-renew-ms + --ha-margin-ms must be < TTL");
  EXPECT_EQ(with({"--ha-etcd-ca", "/x"}),
            "--ha-etcd-ca, --ha-etcd-cert and --ha-etcd-key need https:// --ha-etcd URLs");
  EXPECT_EQ(with({"--ha-etcd-user", "a b"}), "--ha-etcd-user: 1-64 of A-Za-z0-9._-");
  EXPECT_EQ(with({"--ha-etcd-password-file", "/nonexistent"}).find("--ha-etcd-password-file "), 0u);
  EXPECT_EQ(with({"--ha-advertise", "https://h:1"}),
            "--ha-advertise: expected http://HOST:PORT, got https://h:1");
  EXPECT_EQ(with({"--repl-listen", "127.0.0.1:1"}),
            "--repl-listen needs --data-dir (a standby keeps what it acknowledges on disk)");
  EXPECT_EQ(with({"--repl-listen", "nohost", "--data-dir", "/d"}),
            "--repl-listen: expected IPv4 HOST:PORT, got nohost");
  EXPECT_EQ(with({"--repl-advertise", "127.0.0.1:1"}), "--repl-advertise needs --repl-listen");
  EXPECT_EQ(with({"--repl-listen", "0.0.0.0:1", "--data-dir", "/d", "--repl-advertise", "0.0.0.0:2",
                  "--repl-insecure"}),
            "--repl-advertise: expected IPv4 HOST:PORT others can reach, got 0.0.0.0:2");
  EXPECT_EQ(with({"--repl-listen", "127.0.0.1:1", "--data-dir", "/d"}), "");
  EXPECT_EQ(with({"--repl-listen", "0.0.0.0:1", "--data-dir", "/d", "--repl-insecure"}), "");
  EXPECT_EQ(with({"--repl-listen", "0.0.0.0:1", "--data-dir", "/d"})
                .find("--repl-listen 0.0.0.0:1 is not a loopback address: give --repl-tls-cert"),
            0u);
  EXPECT_EQ(
      with({"--repl-tls-ca", "/ca", "--repl-insecure"}),
      "--repl-tls-cert, --repl-tls-key, --repl-tls-ca and --repl-insecure need --repl-listen");
  const std::vector<std::string> listen{"--repl-listen", "127.0.0.1:1", "--data-dir", "/d"};
  auto listening = [&](std::vector<std::string> more) {
    more.insert(more.begin(), listen.begin(), listen.end());
    return with(more);
  };
  EXPECT_EQ(listening({"--repl-tls-cert", "/c", "--repl-tls-key", "/k"}),
            "--repl-tls-cert, --repl-tls-key and --repl-tls-ca go together (give all three, or "
            "none)");
  EXPECT_EQ(listening({"--repl-tls-cert", "/c", "--repl-tls-key", "/k", "--repl-tls-ca", "/a",
                       "--repl-insecure"}),
            "--repl-insecure and --repl-tls-* contradict each other: give one or the other");
  EXPECT_NE(listening({"--repl-tls-cert", "/c", "--repl-tls-key", "/k", "--repl-tls-ca", "/a"})
                .find("/c"),
            std::string::npos)
      << "the files are checked";
}

}  // namespace
