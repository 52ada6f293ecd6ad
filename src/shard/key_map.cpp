#include "shard/key_map.hpp"

#include <bit>

#include "shard/ownership.hpp"

namespace metad::shard {

std::uint32_t table_hash(std::string_view key) {
  // murmur3's fmix64: a bijection, so distinct key hashes stay distinct.
  std::uint64_t h = key_hash(key);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return static_cast<std::uint32_t>(h);
}

namespace key_blob {

char* make(std::string_view key) {
  METAD_ASSERT(key.size() <= UINT32_MAX);
  const auto length = static_cast<std::uint32_t>(key.size());
  char* blob = new char[sizeof length + key.size()];
  std::memcpy(blob, &length, sizeof length);
  if (!key.empty()) std::memcpy(blob + sizeof length, key.data(), key.size());
  return blob;
}

void destroy(char* blob) noexcept { delete[] blob; }

}  // namespace key_blob

}  // namespace metad::shard
