// Deterministic KV-block keys for the benchmarks: 32 lowercase hex characters, like the
// MD5/xxh3-128 block hashes vLLM sends. Key i is the same in every C++ program and run
// (the wrk Lua scripts make their own, see bench/wrk/common.lua).
#pragma once

#include <cstdint>
#include <string>

namespace bench {

inline constexpr std::size_t key_chars = 32;

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Writes the 32 hex characters of key `id` at `out` (no allocation: the hot loops of the
// load generator build bodies in reused buffers).
inline void write_key(char* out, std::uint64_t id) {
  static constexpr char digits[] = "0123456789abcdef";
  const std::uint64_t halves[2] = {splitmix64(id), splitmix64(id ^ 0x5851F42D4C957F2Dull)};
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 16; ++i) out[h * 16 + i] = digits[(halves[h] >> (60 - 4 * i)) & 0xF];
}

inline void append_key(std::string& out, std::uint64_t id) {
  const std::size_t at = out.size();
  out.resize(at + key_chars);
  write_key(out.data() + at, id);
}

inline std::string make_key(std::uint64_t id) {
  std::string key;
  append_key(key, id);
  return key;
}

}  // namespace bench
