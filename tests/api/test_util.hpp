// Helpers shared by the api tests: bodies in padded buffers, keys as plain strings,
// the exact details of docs/api.md.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "api/decode.hpp"
#include "api/encode.hpp"

namespace metad::api::testing {

// Owns a copy of `text` followed by SIMDJSON_PADDING bytes, as the HTTP layer provides.
class body {
 public:
  explicit body(std::string_view text) : storage_(text) {}
  std::string_view view() const { return {storage_.data(), storage_.size()}; }
  operator std::string_view() const { return view(); }

 private:
  simdjson::padded_string storage_;
};

using strs = std::vector<std::string>;
using ints = std::vector<std::int64_t>;

inline constexpr std::int64_t kPagesMax = 268435456;

inline constexpr std::string_view kNeedRankKeys = "Invalid request format: need 'rank' and 'keys'";
inline constexpr std::string_view kNeedRankConfirmations =
    "Invalid request format: need 'rank' and 'confirmations'";
inline constexpr std::string_view kReleasesNotList =
    "Invalid request format: 'pages_to_release' must be a list of page numbers";
inline constexpr std::string_view kNotObject = "Invalid JSON body: expected an object";

inline std::string allocate_key_detail(int index) {
  return "Invalid key at index " + std::to_string(index) +
         ": expected a string or a [key, prefix_key] pair of strings";
}
inline std::string string_key_detail(int index) {
  return "Invalid key at index " + std::to_string(index) + ": expected a string";
}
inline std::string confirmation_detail(int index) {
  return "Invalid confirmation at index " + std::to_string(index) +
         ": expected [key, page] with a string key and a non-negative integer page";
}
inline std::string release_detail(int index) {
  return "Invalid page in pages_to_release at index " + std::to_string(index);
}

// One row of a key-list endpoint's table (batch_allocate, batch_exists, get_locations).
struct keys_case {
  std::string_view what;
  std::string body;
  std::string detail;  // empty: success expected
  std::int64_t rank = 0;
  strs keys = {};
};

inline const std::string kHex32 = "0123456789abcdef0123456789abcdef";
inline const std::string kHex64 = kHex32 + kHex32;

inline std::vector<std::string> strings(const key_list& keys) {
  return {keys.views().begin(), keys.views().end()};
}

}  // namespace metad::api::testing
