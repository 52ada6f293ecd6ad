#include "http/router.hpp"

namespace metad::http {
namespace {

using part = path_pattern::part;
using segments = std::array<std::string_view, path_pattern::kSegmentsMax>;

bool is_decimal(char c) { return c >= '0' && c <= '9'; }
bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

bool is_int(std::string_view segment) {
  if (!segment.empty() && (segment[0] == '+' || segment[0] == '-')) segment.remove_prefix(1);
  if (segment.empty()) return false;
  for (char c : segment)
    if (!is_decimal(c)) return false;
  return true;
}

bool is_tenant(std::string_view segment, std::span<const path_pattern> rows) {
  if (segment.size() > 64 || !is_letter(segment[0])) return false;
  for (char c : segment)
    if (!is_letter(c) && !is_decimal(c) && c != '.' && c != '-') return false;
  for (const path_pattern& row : rows) {  // a tenant may not look like another route
    if (row.parts[0] == part::literal && row.segments[0] == segment) return false;
  }
  return true;
}

// Splits "/a/b" into {"a", "b"}; 0 when a segment is empty or there are too many. Loops
// rather than memchr/memcmp calls: paths and segments are short, and this runs per request.
std::size_t split(std::string_view path, segments& out) {
  if (path.empty() || path[0] != '/') return 0;
  std::size_t n = 0, begin = 1;
  for (std::size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    if (i == begin || n == out.size()) return 0;
    out[n++] = path.substr(begin, i - begin);
    begin = i + 1;
  }
  return n;
}

bool same(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

bool matches(const path_pattern& pattern, const segments& path, std::size_t n,
             std::span<const path_pattern> rows, route& out) {
  if (pattern.count != n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    const std::string_view segment = path[i];
    switch (pattern.parts[i]) {
      case part::literal:
        if (!same(segment, pattern.segments[i])) return false;
        break;
      case part::rank:
        out.rank_text = segment;
        break;
      case part::integer:
        if (!is_int(segment)) return false;
        out.rank_text = segment;
        break;
      case part::tenant:
        if (!is_tenant(segment, rows)) return false;
        out.tenant = segment;
        break;
    }
  }
  return true;
}

}  // namespace

route match(std::span<const path_pattern> rows, method verb, std::string_view path) {
  const bool get = verb == method::get || verb == method::head;
  route out;
  // Whether row i takes the request; else notes a wrong method in `out`.
  auto take = [&](std::size_t i) {
    if (rows[i].allow == methods::get ? get : verb == method::post) {
      out.result = match_result::found;
      out.row = static_cast<std::uint8_t>(i);
      return true;
    }
    if (out.result == match_result::not_found) {
      out.result = match_result::wrong_method;
      out.allow = rows[i].allow;
    }
    return false;
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].literal && rows[i].path == path && take(i)) return out;
  }
  segments parts;
  const std::size_t n = split(path, parts);
  if (n == 0) return out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].literal) continue;
    route captured;
    if (!matches(rows[i], parts, n, rows, captured) || !take(i)) continue;
    out.rank_text = captured.rank_text;
    out.tenant = captured.tenant;
    return out;
  }
  return out;
}

}  // namespace metad::http
