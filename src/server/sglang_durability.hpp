// SGLang pools in the data directory: their records in the per-core journal (written by
// run_sglang as it changes a pool), their snapshot section, and their replay. Defined in
// sglang_endpoints.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "server/cluster.hpp"
#include "store/record.hpp"

namespace server {

// The SGLang clock on core `core`: the cluster's clock plus the offset recovery set, so
// that it never runs behind the times of the records it replayed (their pools' deadlines
// and leases are on that clock).
std::uint64_t sg_now(cluster& cl, core_state& core);

// A snapshot's SGLang section: one sg_snapshot_pool record per pool of the core.
void append_sg_snapshot(std::string& bytes, const core_state& core);
// The same into the core's journal (after a vLLM /clear record, which voids what came
// before it in the log).
void log_sg_pools(core_state& core);

// Replays one sg_* record on the core that owns its rank; "" or what went wrong.
std::string apply_sg_record(cluster& cl, core_state& core, const store::record& r);

}  // namespace server
