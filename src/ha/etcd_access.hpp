// How the ha module reaches etcd: its members' URLs, TLS for https:// ones (CA, client
// certificate and key) and etcd's password authentication (user, password). Built from
// metad::config by server/ha_setup.cpp, then ha::prepare_etcd (control.hpp); every etcd
// client made from it shares the TLS context.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ha/http_client.hpp"
#include "ha/tls.hpp"

namespace metad::ha {

struct etcd_access {
  std::vector<endpoint> endpoints;
  std::shared_ptr<const tls_context> tls;  // set when any endpoint is https
  tls_files tls_paths;                     // what tls was made from
  std::string user;                        // empty: etcd's auth is off
  std::string password;                    // a secret: never logged

  etcd_access() = default;
  // Plain endpoints, no authentication (tests and etcd without auth).
  etcd_access(std::vector<endpoint> list) : endpoints(std::move(list)) {}  // NOLINT: implicit

  bool empty() const { return endpoints.empty(); }
  std::size_t size() const { return endpoints.size(); }
  bool authenticates() const { return !user.empty(); }
};

}  // namespace metad::ha
