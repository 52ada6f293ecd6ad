// parsed_key: a request key parsed once per call into the forms dual_key_map and
// wide_store look keys up by: 32 lowercase hex characters packed (vLLM's block hashes),
// the other hex shapes as an index key and the rest (wide keys), any other key hashed.
#pragma once

#include <cstdint>
#include <string_view>

#include "shard/key_map.hpp"
#include "shard/packed_key.hpp"

namespace metad::shard {

// A request key, parsed once per call.
struct parsed_key {
  packed_key packed;                   // when hex: the key packed; when wide: its index key
  std::uint64_t hash;                  // packed_hash(packed) when hex or wide, else table_hash(key)
  bool hex;                            // 32 lowercase hex characters
  bool wide = false;                   // another hex shape (see key_shape)
  key_shape shape = key_shape::other;  // when wide
  packed_key rest{};  // when wide: characters 32..63 packed (zero for 32 characters)
};

// The mask a wide key's first half is XORed with to make its index key: a mix of its
// other half and its shape, so that two keys sharing a first half (or differing only in
// case) get different index keys, and the record (rest, shape) gives the first half back.
inline packed_key wide_mask(const packed_key& rest, key_shape shape) noexcept {
  auto fold = [](std::uint64_t x, std::uint64_t c) {
    const unsigned __int128 r = static_cast<unsigned __int128>(x) * c;
    return static_cast<std::uint64_t>(r) ^ static_cast<std::uint64_t>(r >> 64);
  };
  const std::uint64_t a = fold(rest.lo ^ 0x2d358dccaa6c78a5ull ^ static_cast<std::uint64_t>(shape),
                               0x8bb84b93962eacc9ull);
  const std::uint64_t b = fold(rest.hi ^ a ^ 0x4b33a62ed433d4a3ull, 0x4d5a2da51de1aa47ull);
  return {a ^ b, fold(b ^ 0x7a5cf3e8e1c0a14full, 0x9fb21c651e98df25ull)};
}

// Out of line: only keys of 32 or 64 characters that are not 32 lowercase hex get here.
[[gnu::noinline]] inline bool parse_wide_key(std::string_view key, parsed_key& p) {
  packed_key first;
  const key_shape shape = pack_any_hex_key(key, first, p.rest);
  if (shape == key_shape::other || shape == key_shape::hex32) return false;
  const packed_key m = wide_mask(p.rest, shape);
  p.packed = {first.lo ^ m.lo, first.hi ^ m.hi};
  p.hash = packed_hash(p.packed);
  p.shape = shape;
  p.wide = true;
  return true;
}

// Parses in place: returning the struct by value costs a store-forwarding stall per key
// (the copy reads back bytes just written by narrower stores).
inline void parse_key(std::string_view key, parsed_key& p) {
  p.hex = pack_hex_key(key, p.packed);
  p.wide = false;
  if (p.hex) {
    p.hash = packed_hash(p.packed);
    return;
  }
  if ((key.size() == 32 || key.size() == 64) && parse_wide_key(key, p)) return;
  p.hash = table_hash(key);
}

}  // namespace metad::shard
