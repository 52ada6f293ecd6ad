// Whole-node consistency, for tests and fuzzers (every core idle, read from one
// thread): vLLM's ranks against the directory, SGLang's pools against their owners.
#pragma once

#include <string>

#include "pipeline/node.hpp"

namespace metad::pipeline {

// Every shard structure's own invariants hold (rank_table, directory, sglang_pools and
// their pools' verify()), each directory count is the number of ranks holding the key
// bound; each SGLang pool is on its rank's owner core and counted; with --tenants-file,
// each tenant's pages=N count is the pages it holds. "" when consistent, else the first
// violation.
std::string check_consistency(const node& nd);

}  // namespace metad::pipeline
