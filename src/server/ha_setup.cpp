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

// --repl-tls-* and --repl-insecure, given a valid --repl-listen on `host` (and
// flags::validate's rules: all three TLS files or none, not with --repl-insecure): ""
// or why not.
std::string repl_security_error(const metad::config& cfg, const std::string& host) {
  if (!cfg.repl_tls_cert.empty())
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
  // The rules across flags (--ha-etcd needs --ha-cluster and --ha-node, ...) are
  // flags::validate's, which the server runs first.
  if (cfg.ha_etcd.empty()) return c;
  // The config's typed fields into the ha control's settings; each value checked here.
  auto endpoints = ha::parse_endpoints(cfg.ha_etcd);
  if (!endpoints) {
    error = fmt::format("--ha-etcd: expected http(s)://HOST:PORT[,...], got {}", cfg.ha_etcd);
    return c;
  }
  c.etcd.endpoints = std::move(*endpoints);
  if (!ha::valid_name(cfg.ha_cluster)) {
    error = "--ha-cluster: 1-64 of A-Za-z0-9._-";
    return c;
  }
  c.cluster = cfg.ha_cluster;
  if (!ha::valid_name(cfg.ha_node)) {
    error = "--ha-node: 1-64 of A-Za-z0-9._-";
    return c;
  }
  c.node = cfg.ha_node;
  c.etcd.tls_paths = {cfg.ha_etcd_ca, cfg.ha_etcd_cert, cfg.ha_etcd_key};
  if (!cfg.ha_etcd_user.empty()) {
    // etcd's user names are free text; these are the ones an etcdctl line and a log
    // line show as they are.
    if (!ha::valid_name(cfg.ha_etcd_user)) {
      error = "--ha-etcd-user: 1-64 of A-Za-z0-9._-";
      return c;
    }
    c.etcd.user = cfg.ha_etcd_user;
  }
  if (!cfg.ha_etcd_password_file.empty()) {
    auto password = ha::read_password_file(cfg.ha_etcd_password_file, error);
    if (!password) return c;
    c.etcd.password = std::move(*password);
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
