#include "shard/key_map.hpp"

#include <bit>

#include "shard/state.hpp"

namespace shard {

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
  SHARD_CHECK(key.size() <= UINT32_MAX);
  const auto length = static_cast<std::uint32_t>(key.size());
  char* blob = new char[sizeof length + key.size()];
  std::memcpy(blob, &length, sizeof length);
  if (!key.empty()) std::memcpy(blob + sizeof length, key.data(), key.size());
  return blob;
}

void destroy(char* blob) noexcept { delete[] blob; }

}  // namespace key_blob

char* page_owners::find(std::uint32_t page) const {
  const std::size_t i = index_of(page);
  return i == SIZE_MAX ? nullptr : slots_[i].key;
}

std::size_t page_owners::index_of(std::uint32_t page) const {
  if (size_ == 0) return SIZE_MAX;
  for (std::size_t i = home(page);; i = (i + 1) & mask()) {
    if (slots_[i].key == nullptr) return SIZE_MAX;
    if (slots_[i].page == page) return i;
  }
}

void page_owners::insert(std::uint32_t page, char* key) {
  SHARD_CHECK(key != nullptr);
  if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 16 : slots_.size() * 2);
  std::size_t i = home(page);
  while (slots_[i].key != nullptr) {
    SHARD_CHECK(slots_[i].page != page);
    i = (i + 1) & mask();
  }
  slots_[i] = slot{page, key};
  ++size_;
}

char* page_owners::take(std::uint32_t page) {
  std::size_t hole = index_of(page);
  if (hole == SIZE_MAX) return nullptr;
  char* key = slots_[hole].key;
  for (std::size_t j = (hole + 1) & mask(); slots_[j].key != nullptr; j = (j + 1) & mask()) {
    const std::size_t h = home(slots_[j].page);
    if (((j - h) & mask()) >= ((j - hole) & mask())) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole].key = nullptr;
  --size_;
  return key;
}

void page_owners::rehash(std::size_t capacity) {
  std::vector<slot> old(capacity, slot{0, nullptr});
  old.swap(slots_);
  shift_ = 64 - std::countr_zero(capacity);
  for (const slot& s : old) {
    if (s.key == nullptr) continue;
    std::size_t i = home(s.page);
    while (slots_[i].key != nullptr) i = (i + 1) & mask();
    slots_[i] = s;
  }
}

void page_owners::clear() noexcept {
  std::vector<slot>().swap(slots_);
  size_ = 0;
  shift_ = 64;
}

}  // namespace shard
