// Small text helpers shared by the encoders and decoders of both API families. Internal to
// src/api; pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace metad::api::detail {

// Appends the decimal form of `value`.
inline void append_int(std::string& out, std::int64_t value) {
  const fmt::format_int text(value);
  out.append(text.data(), text.size());
}

// Counters are unsigned: through append_int one above INT64_MAX would print negative.
inline void append_uint(std::string& out, std::uint64_t value) {
  const fmt::format_int text(value);
  out.append(text.data(), text.size());
}

// Unicode code points in valid UTF-8 (simdjson validated it): bytes that do not continue one.
inline std::size_t code_points(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

}  // namespace metad::api::detail
