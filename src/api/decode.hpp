// Request decoding (simdjson DOM: the whole body is validated before anything is read).
// No server state is touched here. One decoder per core; its parser is reused across
// requests.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "api/commands.hpp"

// simdjson stays out of this header (it is 31k lines, and every core's state holds a
// decoder): the parser is behind a pointer, defined in the .cpp files that parse.
namespace simdjson::dom {
class parser;
class array;
class element;
}  // namespace simdjson::dom

namespace metad::api {

// Readable bytes every body must have after its end (simdjson's SIMDJSON_PADDING, which
// decode.cpp checks against this).
inline constexpr std::size_t body_padding_bytes = 64;

class decoder {
 public:
  decoder();
  ~decoder();
  decoder(decoder&&) noexcept;
  decoder& operator=(decoder&&) noexcept;

  // Keys longer than this (bytes, decoded) are refused with a 400.
  void set_key_bytes_max(std::size_t bytes) { key_bytes_max_ = bytes; }

  // `body` must have SIMDJSON_PADDING readable bytes after its end.
  // initialize: a rank that does not parse → 400 "Invalid rank in path"; invalid
  // role/num_pages → kind == invalid_parameters (no error: the caller serves the
  // precomputed 400); num_pages over pages_max → 400 with the limit in the detail.
  error decode_initialize(std::string_view rank_text, std::string_view body, std::int64_t pages_max,
                          initialize_cmd& out);
  error decode_allocate(std::string_view body, allocate_cmd& out);
  error decode_confirm(std::string_view body, confirm_cmd& out);
  error decode_exists(std::string_view body, exists_cmd& out);
  // Same body and the same errors as batch_exists: {"keys": [string, ...]}.
  error decode_delete(std::string_view body, delete_cmd& out);
  error decode_locations(std::string_view body, locations_cmd& out);
  // POST /keys/inspect: batch_exists' body and errors, and more than kInspectKeysMax keys
  // → 400.
  error decode_inspect(std::string_view body, inspect_cmd& out);

 private:
  // An object whose optional `keys` is a list of strings (batch_exists, keys/delete).
  error decode_key_strings(std::string_view body, key_list& out);
  // Every element of `list` a string; collected into scratch_.
  error collect_string_keys(simdjson::dom::array list);

  // Appends a key to scratch_, or the 400 for one over key_bytes_max_.
  error add_key(std::string_view key, std::size_t index);

  std::unique_ptr<simdjson::dom::parser> parser_;
  std::vector<std::string_view> scratch_;
  std::size_t key_bytes_max_ = SIZE_MAX;
};

}  // namespace metad::api
