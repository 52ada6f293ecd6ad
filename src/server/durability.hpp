// Recovery from the data directory at start-up and snapshots while serving. Recovery
// runs one thread per core: each reads every file the previous run left, replays the
// records of the ranks it now owns (any former core count), then the directory is
// rebuilt and a new generation — one snapshot and one empty log per core — is committed.
#pragma once

#include "server/cluster.hpp"

namespace server {

// Before any core serves. Throws std::runtime_error naming the file and offset of a
// corrupt record.
void recover(cluster& cl);

// On core c's thread, each tick: starts a background snapshot when its log segment has
// grown past the limit, and finishes one that completed.
void snapshot_tick(cluster& cl, core_state& core);

// Waits for a running snapshot (shutdown).
void finish_snapshot(core_state& core);

}  // namespace server
