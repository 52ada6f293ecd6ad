// Shared by the libFuzzer harnesses: how an input is cut into a few header bytes (mode,
// split seed) and a payload, and how the payload is dealt out in pieces of varying size,
// as a socket would deliver it. Header-only; used by one fuzzing thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace fuzz {

// Stops the run with a message: libFuzzer records the input as a crash.
[[noreturn]] inline void fail(const char* what, std::string_view detail = {}) {
  std::fprintf(stderr, "fuzz invariant violated: %s %.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

inline void require(bool ok, const char* what, std::string_view detail = {}) {
  if (!ok) fail(what, detail);
}

// Piece sizes for feeding a payload: deterministic for a seed, mixing single bytes,
// small and large reads so that every parser state meets a buffer boundary.
class splitter {
 public:
  explicit splitter(std::uint16_t seed)
      : state_(0x9E3779B9u ^ (std::uint32_t{seed} * 0x85EBCA6Bu) ^ seed) {
    if (state_ == 0) state_ = 1;
  }

  std::size_t next_piece() {
    const std::uint32_t r = step();
    switch (r & 7u) {
      case 0:
        return 1;
      case 1:
      case 2:
        return 1 + (r >> 8) % 8;
      case 3:
      case 4:
        return 1 + (r >> 8) % 64;
      case 5:
        return 1 + (r >> 8) % 1024;
      default:
        return 1 + (r >> 8) % 16384;
    }
  }
  bool coin() { return (step() & 16u) != 0; }

 private:
  std::uint32_t step() {  // xorshift32
    state_ ^= state_ << 13;
    state_ ^= state_ >> 17;
    state_ ^= state_ << 5;
    return state_;
  }
  std::uint32_t state_;
};

// The first `n` bytes of an input as header bytes (zeros if the input is shorter).
struct header {
  std::uint8_t byte[3] = {0, 0, 0};
  std::string_view payload;

  header(const std::uint8_t* data, std::size_t size) {
    const std::size_t n = std::min<std::size_t>(size, 3);
    for (std::size_t i = 0; i < n; ++i) byte[i] = data[i];
    payload = std::string_view(reinterpret_cast<const char*>(data) + n, size - n);
  }
  std::uint16_t seed() const { return static_cast<std::uint16_t>(byte[1] | (byte[2] << 8)); }
};

}  // namespace fuzz
