// Base64 (RFC 4648, padded) for etcd's JSON gateway, which carries keys and values as
// base64 strings. Pure functions; any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace metad::ha {

std::string base64_encode(std::string_view bytes);
// nullopt on a character outside the alphabet, bad padding or a length not a multiple of 4.
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace metad::ha
