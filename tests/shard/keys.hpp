// The shard tests' key helper: a key parsed as the shard structures parse a request's key.
#pragma once

#include <string_view>

#include "shard/dual_key_map.hpp"

namespace metad::shard::testing_helpers {

// `key` through parse_key: its hash and, for a hex or wide key, its packed form.
inline parsed_key as_parsed(std::string_view key) {
  parsed_key p;
  parse_key(key, p);
  return p;
}

}  // namespace metad::shard::testing_helpers
