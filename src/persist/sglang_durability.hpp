// SGLang pools in the data directory at start-up: the replay of their records (the
// records themselves and the snapshot section: pipeline/sglang_journal.hpp).
#pragma once

#include <string>

#include "pipeline/node.hpp"
#include "store/record.hpp"

namespace metad::persist {

// Replays one sg_* record on the core that owns its rank; "" or what went wrong.
std::string apply_sg_record(pipeline::node& nd, pipeline::core_state& core, const store::record& r);

}  // namespace metad::persist
