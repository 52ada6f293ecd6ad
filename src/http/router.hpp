// Method and path → a row of the caller's route table. Pure function, no state: the
// rows (which paths exist and what they do) belong to src/pipeline/routes.hpp; this file
// only knows how a path pattern matches.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "http/parser.hpp"

namespace metad::http {

// The methods a row answers. `get` is GET and HEAD: HEAD is GET without the body
// (RFC 9110 9.3.2), the pipeline drops the body.
enum class methods : std::uint8_t { post, get };

// A row's methods and path. The path is '/'-separated segments, each a literal or one of:
//   {rank}    any non-empty segment (its text is route::rank_text, undecoded)
//   {int}     an optional '+' or '-' then one or more digits (also route::rank_text)
//   {tenant}  [A-Za-z_][A-Za-z0-9_.-]{0,63}, and not the first segment of another row's
//             path when that one is a literal (route::tenant)
// An empty segment matches nothing: "", "//x" and "/x/" are no row's path. The pattern
// is split when the table is compiled; a path without placeholders is compared whole.
struct path_pattern {
  enum class part : std::uint8_t { literal, rank, integer, tenant };
  static constexpr std::size_t kSegmentsMax = 4;

  methods allow = methods::post;
  std::string_view path;
  std::array<std::string_view, kSegmentsMax> segments{};
  std::array<part, kSegmentsMax> parts{};
  std::uint8_t count = 0;
  bool literal = true;  // no placeholders: matched by comparing the whole path

  constexpr path_pattern() = default;
  // "POST /path" or "GET /path"; anything else (a method, an empty segment, more than
  // kSegmentsMax of them) does not compile.
  consteval path_pattern(const char* route) {
    std::string_view text = route;
    if (text.starts_with("POST /")) {
      text.remove_prefix(5);
    } else if (text.starts_with("GET /")) {
      allow = methods::get;
      text.remove_prefix(4);
    } else {
      throw "a route is \"POST /path\" or \"GET /path\"";
    }
    path = text;
    if (text == "/") return;  // the root: no segments, matched literally
    while (!text.empty()) {
      text.remove_prefix(1);  // the '/'
      const std::string_view segment = text.substr(0, text.find('/'));
      if (segment.empty() || count == kSegmentsMax) throw "an empty segment, or too many";
      parts[count] = segment == "{rank}"     ? part::rank
                     : segment == "{int}"    ? part::integer
                     : segment == "{tenant}" ? part::tenant
                                             : part::literal;
      literal = literal && parts[count] == part::literal;
      segments[count++] = segment;
      text.remove_prefix(segment.size());
    }
  }
};

enum class match_result : std::uint8_t {
  found,         // rows[row] matches path and method
  not_found,     // no row's path matches
  wrong_method,  // a row's path matches, its method does not (405, `allow` says which)
};

struct route {
  match_result result = match_result::not_found;
  std::uint8_t row = 0;           // found: the index into the rows
  methods allow = methods::post;  // wrong_method: what the matching path answers
  std::string_view rank_text;     // the {rank} or {int} segment
  std::string_view tenant;        // the {tenant} segment
};

// The row whose path matches and whose methods include verb (literal paths are tried
// first, then the others in order); else wrong_method if some row's path matches; else
// not_found. At most 256 rows.
route match(std::span<const path_pattern> rows, method verb, std::string_view path);

}  // namespace metad::http
