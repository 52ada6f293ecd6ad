// Helpers shared by the api tests: bodies in padded buffers, keys as plain strings.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <simdjson.h>

#include "api/codec.hpp"

namespace api::testing {

// Owns a copy of `text` followed by SIMDJSON_PADDING bytes, as the HTTP layer provides.
class body {
 public:
  explicit body(std::string_view text) : storage_(text) {}
  std::string_view view() const { return {storage_.data(), storage_.size()}; }
  operator std::string_view() const { return view(); }

 private:
  simdjson::padded_string storage_;
};

inline std::vector<std::string> strings(const key_list& keys) {
  return {keys.views().begin(), keys.views().end()};
}

}  // namespace api::testing
