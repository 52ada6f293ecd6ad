// High availability's start-up wiring: the ha control's settings (ha::config) from the
// server's config, each value checked (flags::validate runs this, once, for main and
// embedders alike, after the rules across flags), and the leader key's value that
// names this node. Start-up only.
#pragma once

#include <cstdint>
#include <string>

#include "ha/control.hpp"
#include "metad/config.hpp"

namespace metad {

// The ha control's settings for a node listening on `port` (the advertised address
// defaults to http://<host>:<port>); why they are unusable in `error` (naming the flag),
// empty if usable. Assumes flags::validate's rules across flags hold; HA off: empty.
ha::config ha_settings(const metad::config& cfg, std::uint16_t port, std::string& error);

// The leader key's value: {"node":"<id>","http":"<advertised URL>"}, and
// "repl":"<HOST:PORT>" with replication.
std::string leader_value(const std::string& node, const std::string& http,
                         const std::string& repl = {});
// The replication address others connect to: --repl-listen, with 0.0.0.0 replaced by
// the host of the advertised http URL.
std::string repl_advertise(const std::string& listen, const std::string& http);

}  // namespace metad
