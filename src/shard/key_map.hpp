// Compact open-addressing maps used by one core's shard state: key_map (key bytes →
// small value; linear probing, backward-shift deletion, no tombstones) and page_owners
// (reserved page → the key holding it). Single-threaded: only the owning core touches
// them. A slot is 16 bytes for a 4-byte value; each key's bytes live in one heap block
// whose address is stable for the key's lifetime (page_owners points at it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "shard/check.hpp"

namespace shard {

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
      SHARD_CHECK(!(slots_[i].hash == hash && key_blob::view(slots_[i].key) == key));
      i = (i + 1) & mask();
    }
    slots_[i] = slot{hash, value, key_blob::make(key)};
    ++size_;
    return slots_[i];
  }

  // Erases the slot (from find) and frees its key bytes.
  void erase(slot& s) {
    std::size_t hole = static_cast<std::size_t>(&s - slots_.data());
    SHARD_CHECK(hole < slots_.size() && s.key != nullptr);
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

// Reserved page → the key blob (owned by the rank's key_map) that reserves it. Holds only
// in-flight reservations, so it stays small; releasing a reserved page needs its key.
class page_owners {
 public:
  std::size_t size() const { return size_; }
  // nullptr when the page has no owner here.
  char* find(std::uint32_t page) const;
  void insert(std::uint32_t page, char* key);
  // Removes the page's owner and returns it (nullptr if none).
  char* take(std::uint32_t page);
  void clear() noexcept;

  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const slot& s : slots_) {
      if (s.key != nullptr) fn(s.page, s.key);
    }
  }

 private:
  struct slot {
    std::uint32_t page;
    char* key;  // nullptr: empty slot
  };
  std::size_t home(std::uint32_t page) const {
    return static_cast<std::size_t>((page * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  std::size_t mask() const { return slots_.size() - 1; }
  std::size_t index_of(std::uint32_t page) const;
  void rehash(std::size_t capacity);

  std::vector<slot> slots_;
  std::size_t size_ = 0;
  int shift_ = 64;
};

}  // namespace shard
