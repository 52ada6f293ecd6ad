// Whole-string integer parsing for the ha module's wire formats and flags: the text
// must be entirely digits (a leading '-' for signed types) and fit the type.
#pragma once

#include <charconv>
#include <string_view>

namespace metad::ha {

template <typename T>
bool parse_whole(std::string_view text, T& out, int base = 10) {
  if (text.empty()) return false;
  const char* last = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), last, out, base);
  return ec == std::errc{} && ptr == last;
}

}  // namespace metad::ha
