#include "ha/probe.hpp"

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ha/etcd.hpp"
#include "metad/log.hpp"

namespace metad::ha {

start_role probe_start_role(const config& settings, std::uint32_t patience_ms) {
  etcd_client etcd(settings.etcd, settings.connect_timeout);
  const std::vector<std::string> keys{leader_key(settings.cluster), sync_key(settings.cluster)};
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(patience_ms);
  for (;;) {
    auto read = etcd.read(keys, std::chrono::steady_clock::now() + settings.request_timeout);
    if (read) {
      std::optional<std::string> sync;
      if (read->keys[1]) sync = read->keys[1]->value;
      if (read->keys[0]) {
        const key_value& key = *read->keys[0];
        const auto info = parse_leader_value(key.value);
        // Another node's, or a key without a lease (no node writes one: the ha thread
        // reports it and removes it once it has stood for two TTLs).
        if (!info || info->node != settings.node || key.lease == 0) return start_role::standby;
        // This node's previous run (this one holds its data directory's lock, so that
        // process is gone): give its lease back now rather than wait out the TTL; else
        // (another address: the flags changed) wait until it expires.
        if (key.value == settings.advertise) {
          auto revoked =
              etcd.revoke(key.lease, std::chrono::steady_clock::now() + settings.request_timeout);
          if (revoked && *revoked) {
            metad::log::info("replication: revoked the lease of this node's previous run");
            continue;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      return listed_in_sync(sync, settings.node) ? start_role::own_state : start_role::standby;
    }
    if (std::chrono::steady_clock::now() >= until)
      throw std::runtime_error("replication: etcd does not answer (" + read.error +
                               "): cannot tell whether this node leads or follows");
    metad::log::warn("replication: etcd does not answer yet ({}); retrying", read.error);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace metad::ha
