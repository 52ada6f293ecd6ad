// SGLang pools in the per-core journal: the records run_sglang writes as it changes a
// pool, and the pools' snapshot section. Defined in sglang_endpoints.cpp; their replay
// is persist/sglang_durability.hpp's.
#pragma once

#include <cstdint>
#include <string>

#include "pipeline/node.hpp"

namespace metad::pipeline {

// The SGLang clock on core `core`: the node's clock plus the offset recovery set, so
// that it never runs behind the times of the records it replayed (their pools' deadlines
// and leases are on that clock).
std::uint64_t sg_now(node& nd, core_state& core);

// A snapshot's SGLang section: one sg_snapshot_pool record per pool of the core.
void append_sg_snapshot(std::string& bytes, const core_state& core);
// The same into the core's journal (after a vLLM /clear record, which voids what came
// before it in the log).
void log_sg_pools(core_state& core);
// After recovery or a promotion, when the quarantines replayed from the log have no time
// of their own: every SGLang quarantine of the core lasts --release-quarantine-ms again
// from now (a client may retry across a restart or a failover); with 0, it ends on the
// next tick, which logs it.
void restart_sg_quarantines(node& nd, core_state& core);

}  // namespace metad::pipeline
