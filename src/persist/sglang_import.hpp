// --import-sglang-state FILE (and --persistence-path FILE): the state file of SGLang's own
// metadata server, read into the default tenant's pools on the cores that own their
// ranks. Called by recovery after its replay and before it commits the new generation
// (durability.hpp's before_commit), on the recovering thread while no core serves: the
// imported pools are in that generation's snapshots before a client can connect.
#pragma once

#include "pipeline/node.hpp"
#include "store/data_dir.hpp"

namespace metad::persist {

// Imports nd.cfg.sglang_import_path when `dir` holds no committed generation (a first
// start); otherwise only logs that the directory's state is used instead. The file is
// only read. Returns whether any core's state changed. Throws std::runtime_error naming
// the file and what is wrong with it (unreadable, invalid, or a pool that exists).
bool import_sglang_state(pipeline::node& nd, const store::data_dir& dir);

}  // namespace metad::persist
