// Open-addressing maps used by one core's shard state: key_map (key bytes → small
// value; linear probing, backward-shift deletion, no tombstones), which holds the keys
// packed_map cannot (not 32 lowercase hex characters), and page_owners (reserved page →
// the key holding it). Single-threaded: only the owning core touches them. A key_map
// slot is 16 bytes for a 4-byte value; each key's bytes live in one heap block whose
// address is stable for the key's lifetime (page_owners may point at it).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "metad/assert.hpp"

namespace metad::shard {

// The hash a table indexes with: key_hash remixed, so that a core's directory slice
// (whose keys share key_hash mod cores) still spreads over the whole table.
std::uint32_t table_hash(std::string_view key);

// A key's bytes on the heap, prefixed by their length: [uint32 length][bytes].
namespace key_blob {
char* make(std::string_view key);
void destroy(char* blob) noexcept;
inline std::string_view view(const char* blob) noexcept {
  std::uint32_t length;
  std::memcpy(&length, blob, sizeof length);
  return {blob + sizeof length, length};
}
}  // namespace key_blob

template <class Value>
class key_map {
 public:
  struct slot {
    std::uint32_t hash;
    Value value;
    char* key;  // nullptr: empty slot
  };

  key_map() = default;
  key_map(const key_map&) = delete;
  key_map& operator=(const key_map&) = delete;
  key_map(key_map&& other) noexcept { swap(other); }
  key_map& operator=(key_map&& other) noexcept {
    key_map(std::move(other)).swap(*this);
    return *this;
  }
  ~key_map() { clear(); }

  void swap(key_map& other) noexcept {
    slots_.swap(other.slots_);
    std::swap(size_, other.size_);
  }

  std::size_t size() const { return size_; }
  std::size_t capacity() const { return slots_.size(); }

  // The slot holding `key`, or nullptr. Valid until the next insert or erase.
  slot* find(std::string_view key, std::uint32_t hash) {
    const std::size_t i = index_of(key, hash);
    return i == npos ? nullptr : &slots_[i];
  }
  const slot* find(std::string_view key, std::uint32_t hash) const {
    const std::size_t i = index_of(key, hash);
    return i == npos ? nullptr : &slots_[i];
  }

  // Inserts `key` (which must be absent) and returns its slot.
  slot& insert_new(std::string_view key, std::uint32_t hash, Value value) {
    if ((size_ + 1) * 5 > slots_.size() * 4) rehash(slots_.empty() ? 16 : slots_.size() * 2);
    std::size_t i = hash & mask();
    while (slots_[i].key != nullptr) {
      METAD_ASSERT(!(slots_[i].hash == hash && key_blob::view(slots_[i].key) == key));
      i = (i + 1) & mask();
    }
    slots_[i] = slot{hash, value, key_blob::make(key)};
    ++size_;
    return slots_[i];
  }

  // Erases the slot (from find) and frees its key bytes.
  void erase(slot& s) {
    std::size_t hole = static_cast<std::size_t>(&s - slots_.data());
    METAD_ASSERT(hole < slots_.size() && s.key != nullptr);
    key_blob::destroy(s.key);
    for (std::size_t j = (hole + 1) & mask(); slots_[j].key != nullptr; j = (j + 1) & mask()) {
      // Move the entry at j back into the hole unless its home lies in (hole, j].
      const std::size_t home = slots_[j].hash & mask();
      if (((j - home) & mask()) >= ((j - hole) & mask())) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].key = nullptr;
    --size_;
  }

  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const slot& s : slots_) {
      if (s.key != nullptr) fn(s);
    }
  }

  void clear() noexcept {
    for (slot& s : slots_) {
      if (s.key != nullptr) key_blob::destroy(s.key);
    }
    std::vector<slot>().swap(slots_);
    size_ = 0;
  }

  std::size_t memory_bytes() const {
    std::size_t bytes = slots_.capacity() * sizeof(slot);
    for_each([&](const slot& s) { bytes += sizeof(std::uint32_t) + key_blob::view(s.key).size(); });
    return bytes;
  }

 private:
  static constexpr std::size_t npos = ~std::size_t{0};
  std::size_t mask() const { return slots_.size() - 1; }

  std::size_t index_of(std::string_view key, std::uint32_t hash) const {
    if (size_ == 0) return npos;
    for (std::size_t i = hash & mask();; i = (i + 1) & mask()) {
      const slot& s = slots_[i];
      if (s.key == nullptr) return npos;
      if (s.hash == hash && key_blob::view(s.key) == key) return i;
    }
  }

  void rehash(std::size_t capacity) {
    std::vector<slot> old(capacity, slot{0, Value{}, nullptr});
    old.swap(slots_);
    for (const slot& s : old) {
      if (s.key == nullptr) continue;
      std::size_t i = s.hash & mask();
      while (slots_[i].key != nullptr) i = (i + 1) & mask();
      slots_[i] = s;
    }
  }

  std::vector<slot> slots_;  // power-of-two size, or empty
  std::size_t size_ = 0;
};

// Reserved page → the key that reserves it (Owner: how the rank's key map names a key;
// Owner{} means none). Holds only in-flight reservations, so it stays small; releasing
// a reserved page needs its key.
template <class Owner = char*>
class page_owners {
 public:
  std::size_t size() const { return size_; }
  // Owner{} when the page has no owner here.
  Owner find(std::uint64_t page) const {
    const std::size_t i = index_of(page);
    return i == npos ? Owner{} : slots_[i].owner;
  }
  void insert(std::uint64_t page, const Owner& owner) {
    METAD_ASSERT(page != empty_page && !(owner == Owner{}));
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 16 : slots_.size() * 2);
    std::size_t i = home(page);
    while (slots_[i].page != empty_page) {
      METAD_ASSERT(slots_[i].page != page);
      i = (i + 1) & mask();
    }
    slots_[i] = slot{page, owner};
    ++size_;
  }
  // Removes the page's owner and returns it (Owner{} if none).
  Owner take(std::uint64_t page) {
    std::size_t hole = index_of(page);
    if (hole == npos) return Owner{};
    const Owner owner = slots_[hole].owner;
    for (std::size_t j = (hole + 1) & mask(); slots_[j].page != empty_page; j = (j + 1) & mask()) {
      // Move the entry at j back into the hole unless its home lies in (hole, j].
      const std::size_t h = home(slots_[j].page);
      if (((j - h) & mask()) >= ((j - hole) & mask())) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = slot{};
    --size_;
    return owner;
  }
  void clear() noexcept {
    std::vector<slot>().swap(slots_);
    size_ = 0;
    shift_ = 64;
  }

  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const slot& s : slots_) {
      if (s.page != empty_page) fn(s.page, s.owner);
    }
  }

 private:
  static constexpr std::uint64_t empty_page = UINT64_MAX;  // beyond any pool's page
  static constexpr std::size_t npos = ~std::size_t{0};
  struct slot {
    std::uint64_t page = empty_page;
    Owner owner{};
  };
  std::size_t home(std::uint64_t page) const {
    return static_cast<std::size_t>((page * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  std::size_t mask() const { return slots_.size() - 1; }
  std::size_t index_of(std::uint64_t page) const {
    if (size_ == 0) return npos;
    for (std::size_t i = home(page);; i = (i + 1) & mask()) {
      if (slots_[i].page == empty_page) return npos;
      if (slots_[i].page == page) return i;
    }
  }
  void rehash(std::size_t capacity) {
    std::vector<slot> old(capacity);
    old.swap(slots_);
    shift_ = 64 - std::countr_zero(capacity);
    for (const slot& s : old) {
      if (s.page == empty_page) continue;
      std::size_t i = home(s.page);
      while (slots_[i].page != empty_page) i = (i + 1) & mask();
      slots_[i] = s;
    }
  }

  std::vector<slot> slots_;
  std::size_t size_ = 0;
  int shift_ = 64;
};

}  // namespace metad::shard
