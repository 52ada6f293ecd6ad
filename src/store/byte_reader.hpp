// Reads a little-endian binary payload front to back, every read bounds-checked: the log
// records (record.cpp) and replication's messages (repl/protocol.cpp) decode with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace metad::store {

class byte_reader {
 public:
  explicit byte_reader(std::string_view bytes) : bytes_(bytes) {}

  // A fixed-size value, copied as it lies in memory.
  template <typename T>
  bool get(T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (bytes_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // Bytes prefixed by their count as a Length (std::uint8_t, std::uint32_t, ...); the
  // view points into the payload.
  template <typename Length>
  bool get_prefixed(std::string_view& s) {
    Length length = 0;
    if (!get(length) || bytes_.size() - pos_ < length) return false;
    s = bytes_.substr(pos_, length);
    pos_ += length;
    return true;
  }
  // Everything not read yet.
  std::string_view rest() {
    const std::string_view r = bytes_.substr(pos_);
    pos_ = bytes_.size();
    return r;
  }
  bool done() const { return pos_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  std::size_t pos_ = 0;
};

}  // namespace metad::store
