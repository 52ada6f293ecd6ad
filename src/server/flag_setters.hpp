// The kinds of flag rows (server/flags.cpp's table): each a setter that checks a value
// and stores it in the config field named by its template argument, or a printer of
// that field's default for --help. Start-up only.
#pragma once

#include <charconv>
#include <string>
#include <string_view>
#include <type_traits>

#include "metad/config.hpp"
#include "server/flags.hpp"

namespace metad::flags::setters {

template <typename Int>
Int parse_int(std::string_view flag, std::string_view text, Int lo, Int hi) {
  Int value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value < lo || value > hi)
    throw usage_error(std::string(flag) + ": expected an integer in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "], got '" + std::string(text) + "'");
  return value;
}

// The setters and printers a row names; Field is where the value lands in config.
template <auto Field, auto Lo, auto Hi>
void integer(config& c, std::string_view flag, std::string_view value) {
  using T = std::remove_cvref_t<decltype(c.*Field)>;
  c.*Field = parse_int<T>(flag, value, static_cast<T>(Lo), static_cast<T>(Hi));
}
template <auto Field>
void text(config& c, std::string_view, std::string_view value) {
  c.*Field = value;
}
template <auto Field, auto Value>
void set_to(config& c, std::string_view, std::string_view) {
  c.*Field = Value;
}
template <auto Field>
std::string number(const config& c) {
  return std::to_string(c.*Field);
}
template <auto Field>
std::string string_of(const config& c) {
  return c.*Field;
}

template <typename E>
struct named {
  std::string_view name;
  E value;
};
template <auto Field, const auto& Names>
void choice(config& c, std::string_view flag, std::string_view value) {
  std::string expected;
  for (std::size_t i = 0; i < Names.size(); ++i) {
    if (Names[i].name == value) {
      c.*Field = Names[i].value;
      return;
    }
    expected += i == 0 ? "" : i + 1 == Names.size() ? " or " : ", ";
    expected += Names[i].name;
  }
  throw usage_error(std::string(flag) + ": expected " + expected);
}
template <auto Field, const auto& Names>
std::string choice_shown(const config& c) {
  for (const auto& n : Names)
    if (n.value == c.*Field) return std::string(n.name);
  return "?";
}

}  // namespace metad::flags::setters
