// Start-up, before recovery: whether this node leads with its own state or joins as an
// empty standby, as etcd says (the server asks with --repl-listen).
#pragma once

#include <cstdint>

#include "ha/control.hpp"

namespace metad::ha {

enum class start_role : std::uint8_t { own_state, standby };

// With the data directory locked: a standby if another node leads, or /sync exists and
// does not list this node; else this node recovers its own state. A leader key holding
// this node's own value is its previous run's (that process is gone: the lock says so):
// its lease is revoked, so that a restart does not wait out the TTL. Asks etcd, retrying
// for up to `patience_ms` while it does not answer; throws std::runtime_error if it never
// does.
start_role probe_start_role(const config& settings, std::uint32_t patience_ms);

}  // namespace metad::ha
