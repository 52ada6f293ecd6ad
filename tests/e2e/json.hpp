// A tiny JSON reader for end-to-end tests: parses a server response into a value tree.
// Only what the metadata API answers with: objects, arrays, strings, int64, bools, null.
// Test-only code: errors throw std::runtime_error; not used on any server path.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace e2e::json {

struct value;
using array = std::vector<value>;
using object = std::vector<std::pair<std::string, value>>;

struct value {
  std::variant<std::nullptr_t, bool, std::int64_t, std::string, array, object> data;

  bool is_null() const { return std::holds_alternative<std::nullptr_t>(data); }
  bool as_bool() const { return get<bool>("bool"); }
  std::int64_t as_int() const { return get<std::int64_t>("integer"); }
  const std::string& as_string() const { return get<std::string>("string"); }
  const array& as_array() const { return get<array>("array"); }
  const object& as_object() const { return get<object>("object"); }

  // The member `name` of an object; throws if absent.
  const value& at(std::string_view name) const {
    for (const auto& [key, member] : as_object()) {
      if (key == name) return member;
    }
    throw std::runtime_error("JSON object has no member \"" + std::string(name) + "\"");
  }

 private:
  template <typename T>
  const T& get(const char* what) const {
    if (const T* v = std::get_if<T>(&data)) return *v;
    throw std::runtime_error(std::string("JSON value is not a ") + what);
  }
};

namespace detail {

class reader {
 public:
  explicit reader(std::string_view text) : text_(text) {}

  value parse_document() {
    value v = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("trailing content");
    return v;
  }

 private:
  static constexpr int kDepthMax = 64;

  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("invalid JSON at offset " + std::to_string(pos_) + ": " + why);
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t')) {
      ++pos_;
    }
  }

  char peek() {
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end");
    return text_[pos_];
  }

  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  bool consume_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  value parse_value(int depth) {
    if (depth > kDepthMax) fail("nesting too deep");
    const char c = peek();
    if (c == '{') return value{parse_object(depth)};
    if (c == '[') return value{parse_array(depth)};
    if (c == '"') return value{parse_string()};
    if (consume_literal("null")) return value{nullptr};
    if (consume_literal("true")) return value{true};
    if (consume_literal("false")) return value{false};
    return value{parse_integer()};
  }

  object parse_object(int depth) {
    object members;
    expect('{');
    if (peek() == '}') {
      ++pos_;
      return members;
    }
    while (true) {
      if (peek() != '"') fail("expected a member name");
      std::string name = parse_string();
      expect(':');
      members.emplace_back(std::move(name), parse_value(depth + 1));
      if (peek() == '}') {
        ++pos_;
        return members;
      }
      expect(',');
    }
  }

  array parse_array(int depth) {
    array items;
    expect('[');
    if (peek() == ']') {
      ++pos_;
      return items;
    }
    while (true) {
      items.push_back(parse_value(depth + 1));
      if (peek() == ']') {
        ++pos_;
        return items;
      }
      expect(',');
    }
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) break;
      const char esc = text_[pos_++];
      switch (esc) {
        case '"':
        case '\\':
        case '/':
          out.push_back(esc);
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        default:
          fail("unsupported escape");  // \u never appears in this API's answers
      }
    }
    fail("unterminated string");
  }

  std::int64_t parse_integer() {
    const std::size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    const std::size_t digits = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    if (pos_ == digits) fail("expected a value");
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      fail("non-integer number");
    }
    try {
      return std::stoll(std::string(text_.substr(start, pos_ - start)));
    } catch (const std::out_of_range&) {
      fail("integer out of int64 range");
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace detail

inline value parse(std::string_view text) { return detail::reader(text).parse_document(); }

// JSON string literal for a test key (keys are hex, but quote defensively).
inline std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

}  // namespace e2e::json
