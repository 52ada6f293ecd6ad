// Request decoders: the simdjson DOM parser validates the whole body (syntax errors
// anywhere, NaN/Infinity, trailing content) before any field is read. Runs on the core
// that owns the decoder; the decoded commands own copies of their keys.
#include "api/decode.hpp"

#include "api/json_detail.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace metad::api {

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

constexpr int kTooLarge = 413;
// Bodies up to this size (a prompt of ~30k blocks) parse without reallocating.
constexpr std::size_t kRetainedCapacity = std::size_t{1} << 20;

constexpr std::string_view kInvalidRank = "Invalid rank in path";
constexpr std::string_view kNeedRankKeys = "Invalid request format: need 'rank' and 'keys'";
constexpr std::string_view kNeedRankConfirmations =
    "Invalid request format: need 'rank' and 'confirmations'";
constexpr std::string_view kReleasesNotList =
    "Invalid request format: 'pages_to_release' must be a list of page numbers";
constexpr std::string_view kInvalidKeysFormat = "Invalid keys format";

// Short, stable reasons: simdjson's own messages are long and may change between versions.
std::string_view parse_failure_reason(simdjson::error_code code) {
  switch (code) {
    case simdjson::EMPTY:
      return "empty body";
    case simdjson::TAPE_ERROR:
      return "syntax error or trailing content";
    case simdjson::DEPTH_ERROR:
      return "nesting too deep";
    case simdjson::STRING_ERROR:
      return "invalid string";
    case simdjson::UNCLOSED_STRING:
      return "unclosed string";
    case simdjson::UNESCAPED_CHARS:
      return "unescaped control character in string";
    case simdjson::T_ATOM_ERROR:
    case simdjson::F_ATOM_ERROR:
    case simdjson::N_ATOM_ERROR:
      return "invalid literal";
    case simdjson::NUMBER_ERROR:
      return "invalid number";
    case simdjson::UTF8_ERROR:
      return "invalid UTF-8";
    default:
      return simdjson::error_message(code);
  }
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Whether [begin, end) is a JSON number by the grammar (RFC 8259 section 6).
bool json_number_syntax(std::string_view t) {
  std::size_t i = 0;
  if (i < t.size() && t[i] == '-') ++i;
  if (i >= t.size()) return false;
  if (t[i] == '0') {
    ++i;
  } else if (is_digit(t[i])) {
    while (i < t.size() && is_digit(t[i])) ++i;
  } else {
    return false;
  }
  if (i < t.size() && t[i] == '.') {
    const std::size_t start = ++i;
    while (i < t.size() && is_digit(t[i])) ++i;
    if (i == start) return false;
  }
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    const std::size_t start = i;
    while (i < t.size() && is_digit(t[i])) ++i;
    if (i == start) return false;
  }
  return i == t.size();
}

// A body whose numbers simdjson refused (integers beyond 64 bits, doubles beyond the
// double range) is still valid JSON, and Python's json accepts it. Such numbers cannot
// be a rank, page or num_pages anyway, so each becomes "0.0" padded with spaces — valid,
// and still not an integer where one is read. Malformed numbers are left alone, so they
// still fail. Returns false when nothing was replaced.
bool neutralise_big_numbers(std::string_view body, simdjson::padded_string& out) {
  std::string copy(body);
  bool replaced = false;
  bool in_string = false;
  for (std::size_t i = 0; i < copy.size(); ++i) {
    const char c = copy[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    if (c != '-' && !is_digit(c)) continue;
    std::size_t end = i;
    while (end < copy.size() && (is_digit(copy[end]) || copy[end] == '-' || copy[end] == '+' ||
                                 copy[end] == '.' || copy[end] == 'e' || copy[end] == 'E'))
      ++end;
    const std::string_view token(copy.data() + i, end - i);
    if (json_number_syntax(token) && token.size() >= 3) {
      const bool integer = token.find_first_of(".eE") == std::string_view::npos;
      bool fits = true;
      if (integer) {
        std::int64_t s;
        std::uint64_t u;
        fits = std::from_chars(token.data(), token.data() + token.size(), s).ec == std::errc{} ||
               std::from_chars(token.data(), token.data() + token.size(), u).ec == std::errc{};
      } else {
        const double d = std::strtod(std::string(token).c_str(), nullptr);
        fits = std::isfinite(d);
      }
      if (!fits) {
        copy.replace(i, token.size(), "0.0" + std::string(token.size() - 3, ' '));
        replaced = true;
      }
    }
    i = end - 1;
  }
  if (replaced) out = simdjson::padded_string(copy);
  return replaced;
}

}  // namespace

namespace detail {

// Parses `body` (padded by the caller) and requires an object at the top level.
error parse_object(simdjson::dom::parser& parser, std::string_view body,
                   simdjson::dom::object& out) {
  // Python's json.loads accepts a UTF-8 byte order mark on a bytes body; so do we.
  constexpr std::string_view kBom = "\xEF\xBB\xBF";
  if (body.starts_with(kBom)) body.remove_prefix(kBom.size());
  // The DOM parser keeps buffers of ~15x the largest body it has seen (one parser per
  // core). Drop them when a small body follows a big one, so that one huge prompt does not
  // pin that memory on every core for good; parse() allocates what the body needs.
  if (parser.capacity() > kRetainedCapacity && body.size() <= kRetainedCapacity) {
    parser = simdjson::dom::parser{};
  }
  auto parsed = parser.parse(body.data(), body.size(), false);
  simdjson::padded_string neutralised;
  if (parsed.error() == simdjson::NUMBER_ERROR && neutralise_big_numbers(body, neutralised))
    parsed = parser.parse(neutralised);
  if (parsed.error() == simdjson::CAPACITY || parsed.error() == simdjson::MEMALLOC) {
    return {kTooLarge, "Request body too large to parse"};
  }
  if (parsed.error()) {
    return {kBadRequest,
            fmt::format("Invalid JSON body: {}", parse_failure_reason(parsed.error()))};
  }
  if (parsed.value_unsafe().get_object().get(out) != simdjson::SUCCESS) {
    return bad_request("Invalid JSON body: expected an object");
  }
  return {};
}

// A JSON integer token within int64 (not 1.0, not 1e2, not a bool, not above INT64_MAX).
bool get_int64(element value, std::int64_t& out) {
  if (value.type() != element_type::INT64) return false;
  return value.get_int64().get(out) == simdjson::SUCCESS;
}

// The two elements of a JSON array of exactly two elements.
bool get_pair(element value, element& first, element& second) {
  simdjson::dom::array array;
  if (value.get_array().get(array) != simdjson::SUCCESS) return false;
  auto it = array.begin();
  const auto end = array.end();
  if (it == end) return false;
  first = *it;
  if (++it == end) return false;
  second = *it;
  return ++it == end;
}

}  // namespace detail

using namespace detail;

namespace {

// `rank` (an int64) and an optional list field, as batch_allocate, confirm_write and
// get_locations take them. Any other shape → `shape_detail`.
error get_rank_and_list(const field& rank_field, const field& list_field,
                        std::string_view shape_detail, std::int64_t& rank,
                        simdjson::dom::array& list, bool& has_list) {
  if (!rank_field.present || !get_int64(rank_field.value, rank)) return bad_request(shape_detail);
  has_list = list_field.present;
  if (has_list && list_field.value.get_array().get(list) != simdjson::SUCCESS) {
    return bad_request(shape_detail);
  }
  return {};
}

}  // namespace

static_assert(body_padding_bytes >= simdjson::SIMDJSON_PADDING);

decoder::decoder() : parser_(std::make_unique<simdjson::dom::parser>()) {}
decoder::~decoder() = default;
decoder::decoder(decoder&&) noexcept = default;
decoder& decoder::operator=(decoder&&) noexcept = default;

error decoder::add_key(std::string_view key, std::size_t index) {
  if (key.size() > key_bytes_max_) [[unlikely]] {
    return bad_request(fmt::format("Key at index {} is {} bytes long; the limit is {}", index,
                                   key.size(), key_bytes_max_));
  }
  scratch_.push_back(key);
  return {};
}

// Every element a string; collected into scratch_.
error decoder::collect_string_keys(simdjson::dom::array list) {
  std::size_t index = 0;
  for (element value : list) {
    std::string_view key;
    if (!get_string(value, key)) {
      return bad_request(fmt::format("Invalid key at index {}: expected a string", index));
    }
    if (error e = add_key(key, index)) return e;
    ++index;
  }
  return {};
}

error decoder::decode_initialize(std::string_view rank_text, std::string_view body,
                                 std::int64_t pages_max, initialize_cmd& out) {
  out = initialize_cmd{};
  std::int64_t rank = 0;
  if (!parse_rank(rank_text, rank)) return bad_request(kInvalidRank);
  simdjson::dom::object object;
  if (error e = parse_object(*parser_, body, object)) return e;
  out.rank = rank;
  const auto [role, num_pages] = find_fields<2>(object, {"role", "num_pages"});

  std::string_view role_name = "worker";
  if (role.present && !get_string(role.value, role_name)) return {};
  if (role_name == "scheduler") {
    out.kind = init_kind::scheduler;
    return {};
  }
  std::int64_t pages = 0;
  if (role_name != "worker" || !num_pages.present || !get_int64(num_pages.value, pages) ||
      pages <= 0) {
    return {};
  }
  if (pages > pages_max) {
    return bad_request(fmt::format("num_pages exceeds the limit of {}", pages_max));
  }
  out.kind = init_kind::worker;
  out.num_pages = pages;
  return {};
}

error decoder::decode_allocate(std::string_view body, allocate_cmd& out) {
  simdjson::dom::object object;
  if (error e = parse_object(*parser_, body, object)) return e;
  const auto [rank_field, keys_field] = find_fields<2>(object, {"rank", "keys"});
  std::int64_t rank = 0;
  simdjson::dom::array list;
  bool has_list = false;
  if (error e = get_rank_and_list(rank_field, keys_field, kNeedRankKeys, rank, list, has_list)) {
    return e;
  }
  scratch_.clear();
  if (has_list) {
    std::size_t index = 0;
    for (element value : list) {
      std::string_view key;
      element first;
      element second;
      std::string_view prefix;
      const bool ok =
          get_string(value, key) ||
          (get_pair(value, first, second) && get_string(first, key) && get_string(second, prefix));
      if (!ok) {
        return bad_request(fmt::format(
            "Invalid key at index {}: expected a string or a [key, prefix_key] pair of strings",
            index));
      }
      if (error e = add_key(key, index)) return e;
      ++index;
    }
  }
  out.rank = rank;
  out.keys.assign_within_one_buffer(scratch_);
  return {};
}

error decoder::decode_confirm(std::string_view body, confirm_cmd& out) {
  simdjson::dom::object object;
  if (error e = parse_object(*parser_, body, object)) return e;
  const auto [rank_field, confirmations_field, releases_field] =
      find_fields<3>(object, {"rank", "confirmations", "pages_to_release"});
  std::int64_t rank = 0;
  simdjson::dom::array confirmations;
  bool has_confirmations = false;
  if (error e = get_rank_and_list(rank_field, confirmations_field, kNeedRankConfirmations, rank,
                                  confirmations, has_confirmations)) {
    return e;
  }
  simdjson::dom::array releases;
  const bool has_releases = releases_field.present;
  if (has_releases && releases_field.value.get_array().get(releases) != simdjson::SUCCESS) {
    return bad_request(kReleasesNotList);
  }

  scratch_.clear();
  out.pages.clear();
  out.releases.clear();
  if (has_confirmations) {
    std::size_t index = 0;
    for (element value : confirmations) {
      element key_value;
      element page_value;
      std::string_view key;
      std::int64_t page = 0;
      if (!get_pair(value, key_value, page_value) || !get_string(key_value, key) ||
          !get_int64(page_value, page) || page < 0) {
        return bad_request(fmt::format(
            "Invalid confirmation at index {}: expected [key, page] with a string key and "
            "a non-negative integer page",
            index));
      }
      if (error e = add_key(key, index)) return e;
      out.pages.push_back(page);
      ++index;
    }
  }
  if (has_releases) {
    std::size_t index = 0;
    for (element value : releases) {
      std::int64_t page = 0;
      if (!get_int64(value, page) || page < 0) {
        return bad_request(fmt::format("Invalid page in pages_to_release at index {}", index));
      }
      out.releases.push_back(page);
      ++index;
    }
  }
  out.rank = rank;
  out.keys.assign_within_one_buffer(scratch_);
  return {};
}

error decoder::decode_key_strings(std::string_view body, key_list& out) {
  simdjson::dom::object object;
  if (error e = parse_object(*parser_, body, object)) return e;
  const auto [keys_field] = find_fields<1>(object, {"keys"});
  scratch_.clear();
  if (keys_field.present) {
    simdjson::dom::array list;
    if (keys_field.value.get_array().get(list) != simdjson::SUCCESS) {
      return bad_request(kInvalidKeysFormat);
    }
    if (error e = collect_string_keys(list)) return e;
  }
  out.assign_within_one_buffer(scratch_);
  return {};
}

error decoder::decode_exists(std::string_view body, exists_cmd& out) {
  return decode_key_strings(body, out.keys);
}

error decoder::decode_delete(std::string_view body, delete_cmd& out) {
  return decode_key_strings(body, out.keys);
}

error decoder::decode_inspect(std::string_view body, inspect_cmd& out) {
  if (error e = decode_key_strings(body, out.keys)) return e;
  return bound_inspection(out.keys);
}

error decoder::decode_locations(std::string_view body, locations_cmd& out) {
  simdjson::dom::object object;
  if (error e = parse_object(*parser_, body, object)) return e;
  const auto [rank_field, keys_field] = find_fields<2>(object, {"rank", "keys"});
  std::int64_t rank = 0;
  simdjson::dom::array list;
  bool has_list = false;
  if (error e = get_rank_and_list(rank_field, keys_field, kNeedRankKeys, rank, list, has_list)) {
    return e;
  }
  scratch_.clear();
  if (has_list) {
    if (error e = collect_string_keys(list)) return e;
  }
  out.rank = rank;
  out.keys.assign_within_one_buffer(scratch_);
  return {};
}

}  // namespace metad::api
