// Which core owns a rank or a key. The hash is part of the on-disk and cross-core
// contract (every core must agree), so it is fixed and never seeded.
#pragma once

#include <cstdint>
#include <string_view>

#include "shard/packed_key.hpp"

namespace metad::shard {

// Rank r is owned by core r mod cores (non-negative for negative ranks too).
int owner_of_rank(std::int64_t rank, int cores);
// A stable 64-bit hash of a key; its directory slice is owned by core hash mod cores.
std::uint64_t key_hash(std::string_view key);
int owner_of_key(std::string_view key, int cores);
// The same for the 32 lowercase hex characters `k` was packed from, without writing them
// out (recovery and a standby hand millions of packed keys to their owners).
std::uint64_t key_hash(const packed_key& k);
int owner_of_key(const packed_key& k, int cores);

}  // namespace metad::shard
