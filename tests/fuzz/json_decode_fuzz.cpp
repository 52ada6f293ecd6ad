// libFuzzer harness for api::decoder: the input picks an endpoint and the rest is the
// body, copied into a buffer with exactly simdjson::SIMDJSON_PADDING bytes after it (so ASan flags
// any read beyond). One decoder is reused across inputs, as one core reuses its own.
// Checks that a decoded command is well formed and that decoding is repeatable.
//
// Input: byte 0 = endpoint (mod 7: initialize, allocate, confirm, exists, locations, delete,
// inspect); for
// initialize, byte 1 = length of the {rank} path text (mod 24) that follows; the rest = the body.
#include <simdjson.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/decode.hpp"
#include "api/encode.hpp"
#include "fuzz_input.hpp"

using namespace metad;

namespace {

constexpr std::int64_t kPagesMax = std::int64_t{1} << 28;

api::decoder& shared_decoder() {
  static api::decoder d;
  return d;
}

// The body in its own allocation: [body][padding], the padding filled with junk (simdjson
// may read it but must not depend on it).
struct padded {
  std::unique_ptr<char[]> bytes;
  std::string_view body;
  explicit padded(std::string_view b) : bytes(new char[b.size() + simdjson::SIMDJSON_PADDING]) {
    if (!b.empty()) std::memcpy(bytes.get(), b.data(), b.size());
    std::memset(bytes.get() + b.size(), '"', simdjson::SIMDJSON_PADDING);
    body = std::string_view(bytes.get(), b.size());
  }
};

void check_error(const api::error& e) {
  fuzz::require(e.status == 400 || e.status == 413, "decode errors are 400 or 413");
  fuzz::require(!e.detail.empty(), "an error has a detail");
}

void check_keys(const api::key_list& keys) {
  // Views point into the list's own storage, and copies re-point them.
  api::key_list copy(keys);
  fuzz::require(copy.size() == keys.size(), "key_list copy keeps the size");
  for (std::size_t i = 0; i < keys.size(); ++i)
    fuzz::require(copy[i] == keys[i], "key_list copy keeps the keys");
  api::key_list moved(std::move(copy));
  for (std::size_t i = 0; i < keys.size(); ++i)
    fuzz::require(moved[i] == keys[i], "key_list move keeps the keys");
}

std::string flatten(const api::key_list& keys) {
  std::string out;
  for (std::string_view k : keys.views()) {
    out += std::to_string(k.size());
    out += ':';
    out += k;
  }
  return out;
}

template <class Cmd, class Decode, class Summary>
void decode_twice(Decode decode, Summary summary, Cmd& first, Cmd& second) {
  const api::error e1 = decode(first);
  const api::error e2 = decode(second);
  fuzz::require(e1.status == e2.status && e1.detail == e2.detail, "decoding is repeatable");
  if (e1) {
    check_error(e1);
    return;
  }
  fuzz::require(summary(first) == summary(second), "decoded commands are repeatable");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  api::decoder& d = shared_decoder();
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 7) {
    case 0: {
      std::string_view rank_text;
      if (!rest.empty()) {
        const std::size_t n =
            std::min<std::size_t>(static_cast<std::uint8_t>(rest[0]) % 24, rest.size() - 1);
        rank_text = rest.substr(1, n);
        rest.remove_prefix(1 + n);
      }
      const padded p(rest);
      api::initialize_cmd a, b;
      decode_twice(
          [&](api::initialize_cmd& out) {
            return d.decode_initialize(rank_text, p.body, kPagesMax, out);
          },
          [](const api::initialize_cmd& c) {
            return std::to_string(c.rank) + "/" + std::to_string(int(c.kind)) + "/" +
                   std::to_string(c.num_pages);
          },
          a, b);
      std::int64_t rank = 0;
      if (api::parse_rank(rank_text, rank) && a.kind == api::init_kind::worker) {
        fuzz::require(a.rank == rank, "initialize takes the path rank");
        fuzz::require(a.num_pages > 0 && a.num_pages <= kPagesMax, "worker num_pages in (0, max]");
      }
      break;
    }
    case 1: {
      const padded p(rest);
      api::allocate_cmd a, b;
      decode_twice(
          [&](api::allocate_cmd& out) { return d.decode_allocate(p.body, out); },
          [](const api::allocate_cmd& c) { return std::to_string(c.rank) + flatten(c.keys); }, a,
          b);
      check_keys(a.keys);
      break;
    }
    case 2: {
      const padded p(rest);
      api::confirm_cmd a, b;
      const api::error e = d.decode_confirm(p.body, a);
      const api::error e2 = d.decode_confirm(p.body, b);
      fuzz::require(e.status == e2.status && e.detail == e2.detail, "decoding is repeatable");
      if (e) {
        check_error(e);
        break;
      }
      fuzz::require(a.keys.size() == a.pages.size(), "one page per confirmed key");
      for (std::int64_t page : a.pages) fuzz::require(page >= 0, "confirmed pages are >= 0");
      for (std::int64_t page : a.releases) fuzz::require(page >= 0, "released pages are >= 0");
      fuzz::require(
          a.pages == b.pages && a.releases == b.releases && flatten(a.keys) == flatten(b.keys),
          "decoded commands are repeatable");
      check_keys(a.keys);
      break;
    }
    case 3: {
      const padded p(rest);
      api::exists_cmd a, b;
      decode_twice([&](api::exists_cmd& out) { return d.decode_exists(p.body, out); },
                   [](const api::exists_cmd& c) { return flatten(c.keys); }, a, b);
      check_keys(a.keys);
      break;
    }
    case 4: {
      const padded p(rest);
      api::locations_cmd a, b;
      decode_twice(
          [&](api::locations_cmd& out) { return d.decode_locations(p.body, out); },
          [](const api::locations_cmd& c) { return std::to_string(c.rank) + flatten(c.keys); }, a,
          b);
      check_keys(a.keys);
      break;
    }
    case 5: {
      const padded p(rest);
      api::delete_cmd a, b;
      decode_twice([&](api::delete_cmd& out) { return d.decode_delete(p.body, out); },
                   [](const api::delete_cmd& c) { return flatten(c.keys); }, a, b);
      check_keys(a.keys);
      break;
    }
    case 6: {
      const padded p(rest);
      api::inspect_cmd a, b;
      decode_twice([&](api::inspect_cmd& out) { return d.decode_inspect(p.body, out); },
                   [](const api::inspect_cmd& c) { return flatten(c.keys); }, a, b);
      fuzz::require(a.keys.size() <= api::kInspectKeysMax, "an inspection is bounded");
      check_keys(a.keys);
      break;
    }
  }
  return 0;
}
