// Response encoders: compact JSON, byte-identical to the reference's (Python's json with
// separators (",", ":") and ensure_ascii=False). Pure functions appending to a caller's
// buffer: any core may call them.
#include "api/encode.hpp"

#include <array>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "api/text_detail.hpp"
#include "metad/assert.hpp"

namespace metad::api {

namespace {

using detail::append_int;
using detail::append_uint;

// The body of a rank-info object, shared by GET /rank/{rank} and each row of /stats so the
// two cannot drift apart.
void append_rank_counters(std::string& out, std::int64_t num_pages, std::int64_t free,
                          std::int64_t reserved, std::int64_t bound) {
  out.append(R"("num_pages":)");
  append_int(out, num_pages);
  out.append(R"(,"free":)");
  append_int(out, free);
  out.append(R"(,"reserved":)");
  append_int(out, reserved);
  out.append(R"(,"bound":)");
  append_int(out, bound);
}

// For each byte: 0 when it is copied verbatim, else the character after the backslash
// ('u' for \u00XX). Python escapes exactly '"', '\\' and the C0 controls.
constexpr std::array<char, 256> kEscapes = [] {
  std::array<char, 256> table{};
  for (int c = 0; c < 0x20; ++c) table[c] = 'u';
  table['"'] = '"';
  table['\\'] = '\\';
  table['\b'] = 'b';
  table['\f'] = 'f';
  table['\n'] = 'n';
  table['\r'] = 'r';
  table['\t'] = 't';
  return table;
}();

// Whether any of the 8 bytes in `word` needs escaping (< 0x20, '"' or '\\').
bool word_needs_escape(std::uint64_t word) {
  constexpr std::uint64_t ones = 0x0101010101010101ULL;
  constexpr std::uint64_t highs = 0x8080808080808080ULL;
  const auto has_zero = [](std::uint64_t x) { return ((x - ones) & ~x & highs) != 0; };
  const bool has_control = ((word - ones * 0x20) & ~word & highs) != 0;
  return has_control || has_zero(word ^ (ones * '"')) || has_zero(word ^ (ones * '\\'));
}

// Length of the prefix of `text` that needs no escaping. Keys are hex: usually all of it.
std::size_t clean_prefix(std::string_view text) {
  std::size_t i = 0;
  for (; i + 8 <= text.size(); i += 8) {
    std::uint64_t word;
    std::memcpy(&word, text.data() + i, sizeof word);
    if (word_needs_escape(word)) break;
  }
  while (i < text.size() && kEscapes[static_cast<unsigned char>(text[i])] == 0) ++i;
  return i;
}

void append_string(std::string& out, std::string_view text) {
  out.push_back('"');
  append_escaped(out, text);
  out.push_back('"');
}

// Writes an array's elements through a pointer into room made up front, then trims the
// string to what was written: an append per element costs a capacity check and a call
// to memcpy each, a third of encoding 1,250 booleans.
class array_writer {
 public:
  array_writer(std::string& out, std::size_t most) : out_(out) { make_room(out.size(), most); }
  array_writer(const array_writer&) = delete;
  array_writer& operator=(const array_writer&) = delete;
  ~array_writer() { out_.resize(static_cast<std::size_t>(at_ - out_.data())); }

  void put(char c) { *at_++ = c; }
  template <std::size_t N>
  void put(const char (&text)[N]) {  // a literal: a fixed-size copy
    std::memcpy(at_, text, N - 1);
    at_ += N - 1;
  }
  static constexpr std::size_t int_chars_max = 20;  // "-9223372036854775808"
  void put_int(std::int64_t value) { at_ = std::to_chars(at_, at_ + int_chars_max, value).ptr; }
  // A JSON string; the room made counts text.size() + 2 bytes for it (what it takes
  // unescaped: keys are hex). One that needs escapes goes through append_string.
  void put_string(std::string_view text) {
    if (clean_prefix(text) == text.size()) {
      put('"');
      std::memcpy(at_, text.data(), text.size());
      at_ += text.size();
      put('"');
      return;
    }
    const std::size_t left = static_cast<std::size_t>(end_ - at_) - (text.size() + 2);
    out_.resize(static_cast<std::size_t>(at_ - out_.data()));
    at_ = end_ = out_.data() + out_.size();  // consistent if the append throws
    append_string(out_, text);
    make_room(out_.size(), left);
  }

 private:
  void make_room(std::size_t at, std::size_t bytes) {
    out_.resize(at + bytes);
    at_ = out_.data() + at;
    end_ = at_ + bytes;
  }

  std::string& out_;
  char* at_ = nullptr;
  char* end_ = nullptr;
};

}  // namespace

void append_escaped(std::string& out, std::string_view text) {
  constexpr std::string_view hex = "0123456789abcdef";
  while (true) {
    const std::size_t clean = clean_prefix(text);
    out.append(text.data(), clean);
    if (clean == text.size()) return;
    const auto c = static_cast<unsigned char>(text[clean]);
    const char escape = kEscapes[c];
    if (escape == 'u') {
      const char sequence[] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 0xF]};
      out.append(sequence, sizeof sequence);
    } else {
      const char sequence[] = {'\\', escape};
      out.append(sequence, sizeof sequence);
    }
    text.remove_prefix(clean + 1);
  }
}

void encode_initialized(std::string& out, std::int64_t rank, std::int64_t num_pages) {
  out.append(R"({"message":"Rank )");
  append_int(out, rank);
  out.append(" initialized with ");
  append_int(out, num_pages);
  out.append(R"( pages"})");
}

void encode_allocation(std::string& out, std::int64_t rank, std::span<const std::string_view> keys,
                       std::span<const std::int64_t> pages) {
  METAD_ASSERT(keys.size() == pages.size());  // parallel arrays: a caller bug, never input
  std::size_t key_bytes = 0;
  for (std::string_view key : keys) key_bytes += key.size();
  // ["key",page], : 6 bytes of punctuation and up to 20 digits per entry.
  array_writer w(out, 48 + key_bytes + keys.size() * (6 + array_writer::int_chars_max));
  w.put(R"({"rank":)");
  w.put_int(rank);
  w.put(R"(,"results":[)");
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i != 0) w.put(',');
    w.put('[');
    w.put_string(keys[i]);
    w.put(',');
    w.put_int(pages[i]);
    w.put(']');
  }
  w.put("]}");
}

void encode_exists(std::string& out, std::span<const std::uint8_t> exists) {
  array_writer w(out, 13 + exists.size() * 6);  // "false," per element at most
  w.put(R"({"exists":[)");
  for (std::size_t i = 0; i < exists.size(); ++i) {
    if (i != 0) w.put(',');
    if (exists[i] != 0) {
      w.put("true");
    } else {
      w.put("false");
    }
  }
  w.put("]}");
}

void encode_locations(std::string& out, std::span<const std::int64_t> pages) {
  array_writer w(out, 16 + pages.size() * (array_writer::int_chars_max + 1));
  w.put(R"({"locations":[)");
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (i != 0) w.put(',');
    if (pages[i] < 0) {
      w.put("null");
    } else {
      w.put_int(pages[i]);
    }
  }
  w.put("]}");
}

void encode_rank_info(std::string& out, std::int64_t num_pages, std::int64_t free,
                      std::int64_t reserved, std::int64_t bound, std::uint64_t incomplete) {
  out.push_back('{');
  append_rank_counters(out, num_pages, free, reserved, bound);
  out.append(R"(,"incomplete":)");
  append_uint(out, incomplete);
  out.push_back('}');
}

void encode_deleted(std::string& out, std::uint64_t deleted) {
  out.append(R"({"deleted":)");
  append_uint(out, deleted);
  out.push_back('}');
}

void encode_stats(std::string& out, std::span<const rank_info_row> ranks, const rank_pool& pool,
                  const stats_totals& t) {
  // A row is 52 bytes of punctuation and up to 5 x 20 digits; the totals fit in 512.
  out.reserve(out.size() + 512 + ranks.size() * 152);
  out.append(R"({"ranks":[)");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const rank_info_row& r = ranks[i];
    if (i != 0) out.push_back(',');
    out.append(R"({"rank":)");
    append_int(out, r.rank);
    out.push_back(',');
    append_rank_counters(out, r.num_pages, r.free, r.reserved, r.bound);
    out.push_back('}');
  }
  out.append(R"(],"ranks_total":)");
  append_uint(out, pool.ranks);
  out.append(pool.ranks > ranks.size() ? R"(,"ranks_truncated":true)"
                                       : R"(,"ranks_truncated":false)");
  const std::pair<std::string_view, std::uint64_t> totals[] = {
      {R"(,"pages_total":)", pool.pages},
      {R"(,"pages_free":)", pool.free},
      {R"(,"pages_reserved":)", pool.reserved},
      {R"(,"pages_bound":)", pool.bound},
      {R"(,"keys":)", t.keys},
      {R"(,"leased_keys":)", t.leased_keys},
      {R"(,"evicted_keys":)", t.evicted_keys},
      {R"(,"expired_reservations":)", t.expired_reservations},
      {R"(,"deleted_keys":)", t.deleted_keys},
      {R"(,"refused_releases":)", t.refused_releases},
      {R"(,"incomplete_keys":)", t.incomplete_keys},
      {R"(,"incomplete_pages":)", t.incomplete_pages},
      {R"(,"stale_keys":)", t.stale_keys},
  };
  for (const auto& [name, value] : totals) {
    out.append(name);
    append_uint(out, value);
  }
  out.push_back('}');
}

void encode_error(std::string& out, std::string_view detail) {
  out.append(R"({"detail":)");
  append_string(out, detail);
  out.push_back('}');
}

}  // namespace metad::api
