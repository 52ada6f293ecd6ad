#include "server/ha_setup.hpp"

#include <fmt/format.h>

#include <chrono>

#include "metad/server.hpp"
#include "repl/link.hpp"
#include "repl/tls.hpp"

namespace metad {
namespace {

// The advertised URL goes into JSON (the leader key's value) and into other nodes' 503
// details as is: http://HOST:PORT, printable, nothing to escape.
bool valid_advertise(const std::string& url) {
  const auto at = ha::parse_endpoint(url);
  if (!at || at->tls) return false;
  for (const char c : url)
    if (c <= ' ' || c > '~' || c == '"' || c == '\\') return false;
  return true;
}

// --repl-tls-* and --repl-insecure, given a valid --repl-listen on `host`: "" or why not.
std::string repl_security_error(const metad::config& cfg, const std::string& host) {
  const bool tls =
      !cfg.repl_tls_cert.empty() || !cfg.repl_tls_key.empty() || !cfg.repl_tls_ca.empty();
  if (tls && (cfg.repl_tls_cert.empty() || cfg.repl_tls_key.empty() || cfg.repl_tls_ca.empty()))
    return "--repl-tls-cert, --repl-tls-key and --repl-tls-ca go together (give all three, or "
           "none)";
  if (tls && cfg.repl_insecure)
    return "--repl-insecure and --repl-tls-* contradict each other: give one or the other";
  if (tls)
    return repl::tls_files_error({cfg.repl_tls_cert, cfg.repl_tls_key, cfg.repl_tls_ca},
                                 cfg.ha_node);
  // 127.0.0.0/8: only this host's processes reach it.
  if (!cfg.repl_insecure && !host.starts_with("127."))
    return fmt::format(
        "--repl-listen {} is not a loopback address: give --repl-tls-cert, --repl-tls-key and "
        "--repl-tls-ca (mutual TLS between the nodes; docs/operations.md), or --repl-insecure to "
        "replicate in clear text (anyone who reaches the port can read every key and pose as "
        "the standby)",
        cfg.repl_listen);
  return {};
}

std::string default_advertise(const std::string& host, std::uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("http://[{}]:{}", host, port);
  return fmt::format("http://{}:{}", host, port);
}

}  // namespace

std::string leader_value(const std::string& node, const std::string& http,
                         const std::string& repl) {
  if (repl.empty()) return fmt::format(R"({{"node":"{}","http":"{}"}})", node, http);
  return fmt::format(R"({{"node":"{}","http":"{}","repl":"{}"}})", node, http, repl);
}

ha::config ha_settings(const metad::config& cfg, std::uint16_t port, std::string& error) {
  ha::config c;
  error.clear();
  if (cfg.ha_etcd.empty()) {
    if (!cfg.ha_cluster.empty() || !cfg.ha_node.empty() || !cfg.ha_advertise.empty() ||
        !cfg.repl_listen.empty() || !cfg.repl_advertise.empty() || !cfg.ha_etcd_ca.empty() ||
        !cfg.ha_etcd_cert.empty() || !cfg.ha_etcd_key.empty() || !cfg.ha_etcd_user.empty() ||
        !cfg.ha_etcd_password_file.empty() || !cfg.repl_tls_cert.empty() ||
        !cfg.repl_tls_key.empty() || !cfg.repl_tls_ca.empty() || cfg.repl_insecure)
      error =
          "--ha-cluster, --ha-node, --ha-advertise, the other --ha-* flags and the --repl-* "
          "flags need --ha-etcd";
    return c;
  }
  if (cfg.ha_cluster.empty() || cfg.ha_node.empty()) {
    error = "--ha-etcd needs --ha-cluster and --ha-node (give all three, or none)";
    return c;
  }
  for (const auto& [flag, value] :
       {std::pair{"--ha-etcd", &cfg.ha_etcd}, std::pair{"--ha-cluster", &cfg.ha_cluster},
        std::pair{"--ha-node", &cfg.ha_node}}) {
    error = ha::set_flag(c, flag, *value);
    if (!error.empty()) return c;
  }
  for (const auto& [flag, value] :
       {std::pair{"--ha-etcd-ca", &cfg.ha_etcd_ca}, std::pair{"--ha-etcd-cert", &cfg.ha_etcd_cert},
        std::pair{"--ha-etcd-key", &cfg.ha_etcd_key},
        std::pair{"--ha-etcd-user", &cfg.ha_etcd_user},
        std::pair{"--ha-etcd-password-file", &cfg.ha_etcd_password_file}}) {
    if (value->empty()) continue;
    error = ha::set_flag(c, flag, *value);
    if (!error.empty()) return c;
  }
  c.timings.ttl = std::chrono::milliseconds(cfg.ha_ttl_ms);
  c.timings.renew_interval = std::chrono::milliseconds(cfg.ha_renew_ms);
  c.timings.margin = std::chrono::milliseconds(cfg.ha_margin_ms);
  error = ha::validate(c);
  if (!error.empty()) return c;
  error = ha::prepare_etcd(c);
  if (!error.empty()) return c;
  const std::string http =
      cfg.ha_advertise.empty() ? default_advertise(cfg.host, port) : cfg.ha_advertise;
  if (!valid_advertise(http)) {
    error = fmt::format("--ha-advertise: expected http://HOST:PORT, got {}", http);
    return c;
  }
  std::string repl;
  if (!cfg.repl_listen.empty()) {
    std::string host;
    std::uint16_t repl_port = 0;
    if (!repl::split_host_port(cfg.repl_listen, host, repl_port)) {
      error = fmt::format("--repl-listen: expected IPv4 HOST:PORT, got {}", cfg.repl_listen);
      return c;
    }
    if (cfg.data_dir.empty()) {
      error = "--repl-listen needs --data-dir (a standby keeps what it acknowledges on disk)";
      return c;
    }
    error = repl_security_error(cfg, host);
    if (!error.empty()) return c;
    repl = repl_advertise(cfg.repl_listen, http);
    if (!cfg.repl_advertise.empty()) {
      if (!repl::split_host_port(cfg.repl_advertise, host, repl_port) || host == "0.0.0.0") {
        error = fmt::format("--repl-advertise: expected IPv4 HOST:PORT others can reach, got {}",
                            cfg.repl_advertise);
        return c;
      }
      repl = cfg.repl_advertise;
    }
  } else if (!cfg.repl_advertise.empty()) {
    error = "--repl-advertise needs --repl-listen";
    return c;
  } else if (!cfg.repl_tls_cert.empty() || !cfg.repl_tls_key.empty() || !cfg.repl_tls_ca.empty() ||
             cfg.repl_insecure) {
    error = "--repl-tls-cert, --repl-tls-key, --repl-tls-ca and --repl-insecure need --repl-listen";
    return c;
  }
  c.advertise = leader_value(c.node, http, repl);
  return c;
}

std::string repl_advertise(const std::string& listen, const std::string& http) {
  std::string host;
  std::uint16_t port = 0;
  if (!repl::split_host_port(listen, host, port)) return listen;
  if (host != "0.0.0.0") return listen;
  // Listening on every address: the host others reach this node's HTTP side at.
  const auto at = ha::parse_endpoint(http);
  return at ? fmt::format("{}:{}", at->host, port) : listen;
}

}  // namespace metad

namespace metad {

std::string ha_config_error(const config& cfg) {
  std::string error;
  // A port of 0 is picked at start-up: any port stands in for it here.
  ha_settings(cfg, cfg.port == 0 ? 1 : cfg.port, error);
  return error;
}

}  // namespace metad
