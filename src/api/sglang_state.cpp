// The reference SGLang server's persistence file (sglang_state.hpp): parsed whole with
// simdjson's DOM parser, then every pool checked before anything is handed back.
#include "api/sglang_state.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <unordered_map>
#include <unordered_set>

#include "api/decode.hpp"
#include "api/encode.hpp"
#include "api/json_detail.hpp"
#include "api/sglang_codec.hpp"
#include "api/text_detail.hpp"

namespace metad::api {

namespace {

using detail::get_int64;
using detail::get_pair;
using simdjson::dom::element;

// A string for a message: quoted, at most 64 bytes of it.
std::string shown(std::string_view s) {
  constexpr std::size_t kShown = 64;
  if (s.size() <= kShown) return fmt::format("\"{}\"", s);
  return fmt::format("\"{}...\" ({} bytes)", s.substr(0, kShown), s.size());
}

using detail::code_points;

// "<rank>:<namespace>" or "<rank>" (files from before namespaces: "kv"). The rank has
// no ':', so the first one ends it; the namespace may hold more.
std::string parse_name(std::string_view name, sg_state_pool& pool) {
  const std::size_t colon = name.find(':');
  const std::string_view rank = name.substr(0, colon);
  if (!parse_rank(rank, pool.rank))
    return fmt::format("pool {}: the rank {} is not an integer within int64", shown(name),
                       shown(rank));
  pool.ns = colon == std::string_view::npos ? kSglangDefaultNamespace : name.substr(colon + 1);
  const std::size_t n = code_points(pool.ns);
  if (n == 0 || n > kSglangNamespaceCharsMax)
    return fmt::format("pool {}: the namespace must be 1 to {} characters", shown(name),
                       kSglangNamespaceCharsMax);
  return {};
}

// A page number of this pool, item `index` of `list`: a JSON integer in 0..num_pages-1.
std::string read_page(element value, const sg_state_pool& pool, std::string_view list,
                      std::size_t index, std::uint32_t& page) {
  // Formatted only for an error: a file may hold millions of pages.
  auto where = [&] { return fmt::format("{}[{}]", list, index); };
  std::int64_t p = 0;
  if (!get_int64(value, p))
    return fmt::format("pool {}: {}: a page must be an integer", shown(pool.name), where());
  if (p < 0 || p >= pool.num_pages)
    return fmt::format("pool {}: {}: page {} is outside 0..{} (num_pages {})", shown(pool.name),
                       where(), p, std::int64_t{pool.num_pages} - 1, pool.num_pages);
  page = static_cast<std::uint32_t>(p);
  return {};
}

// What each page is listed as while a pool is read.
enum class listed : std::uint8_t { nowhere, bound, free, bound_and_free };

std::string read_bound(element list, const sg_state_limits& limits, sg_state_pool& pool,
                       std::vector<listed>& pages) {
  simdjson::dom::array array;
  if (list.get_array().get(array) != simdjson::SUCCESS)
    return fmt::format("pool {}: key_to_index must be a list of [key, page] pairs",
                       shown(pool.name));
  std::unordered_map<std::string_view, std::size_t> seen;
  seen.reserve(array.size());
  pool.bound.reserve(array.size());
  std::size_t i = 0;
  for (element item : array) {
    auto where = [&i] { return fmt::format("key_to_index[{}]", i); };
    element key_value, page_value;
    std::string_view key;
    if (!get_pair(item, key_value, page_value) || !detail::get_string(key_value, key))
      return fmt::format("pool {}: {}: not a [key, page] pair with a string key", shown(pool.name),
                         where());
    if (key.size() > limits.key_bytes_max)
      return fmt::format("pool {}: {}: the key is {} bytes long; the limit is {}", shown(pool.name),
                         where(), key.size(), limits.key_bytes_max);
    std::uint32_t page = 0;
    if (std::string e = read_page(page_value, pool, "key_to_index", i, page); !e.empty()) return e;
    if (const auto [it, fresh] = seen.try_emplace(key, i); !fresh)
      return fmt::format("pool {}: {}: the key {} is listed twice (also key_to_index[{}])",
                         shown(pool.name), where(), shown(key), it->second);
    if (pages[page] == listed::bound)
      return fmt::format("pool {}: {}: page {} is bound to two keys", shown(pool.name), where(),
                         page);
    pages[page] = listed::bound;
    pool.bound.emplace_back(key, page);
    ++i;
  }
  return {};
}

// free_pages, then the pages listed nowhere below them (see sg_state_pool::free).
std::string read_free(element list, sg_state_pool& pool, std::vector<listed>& pages) {
  simdjson::dom::array array;
  if (list.get_array().get(array) != simdjson::SUCCESS)
    return fmt::format("pool {}: free_pages must be a list of pages", shown(pool.name));
  std::vector<std::uint32_t> listed_free;
  std::size_t i = 0;
  for (element item : array) {
    std::uint32_t page = 0;
    if (std::string e = read_page(item, pool, "free_pages", i, page); !e.empty()) return e;
    if (pages[page] == listed::free || pages[page] == listed::bound_and_free)
      return fmt::format("pool {}: free_pages[{}]: page {} is listed free twice", shown(pool.name),
                         i, page);
    if (pages[page] == listed::bound) {
      pages[page] = listed::bound_and_free;
      ++pool.free_and_bound;  // the key's data is in it: it stays bound
    } else {
      pages[page] = listed::free;
      listed_free.push_back(page);
    }
    ++i;
  }
  pool.free.reserve(pool.num_pages - pool.bound.size());
  for (std::uint32_t page = 0; page < pool.num_pages; ++page)
    if (pages[page] == listed::nowhere) pool.free.push_back(page);
  pool.reclaimed = static_cast<std::uint32_t>(pool.free.size());
  pool.free.insert(pool.free.end(), listed_free.begin(), listed_free.end());
  return {};
}

std::string read_pool(element value, const sg_state_limits& limits, sg_state_pool& pool,
                      std::uint64_t& pages_so_far) {
  simdjson::dom::object object;
  if (value.get_object().get(object) != simdjson::SUCCESS)
    return fmt::format("pool {}: not a JSON object", shown(pool.name));
  const auto [num_pages, free_pages, key_to_index] =
      detail::find_fields<3>(object, {"num_pages", "free_pages", "key_to_index"});
  for (const auto& [field, name] :
       {std::pair{&num_pages, "num_pages"}, std::pair{&free_pages, "free_pages"},
        std::pair{&key_to_index, "key_to_index"}})
    if (!field->present) return fmt::format("pool {}: no {}", shown(pool.name), name);
  std::int64_t n = 0;
  if (!get_int64(num_pages.value, n) || n < 0 || n > limits.pages_max)
    return fmt::format("pool {}: num_pages must be an integer in 0..{} (--pages-per-rank-max)",
                       shown(pool.name), limits.pages_max);
  pool.num_pages = static_cast<std::uint32_t>(n);
  pages_so_far += pool.num_pages;
  if (pages_so_far * sg_state_bytes_per_page > limits.bytes_max)
    return fmt::format(
        "pool {}: the pools up to this one declare {} pages, which take {} bytes to import, "
        "more than the {} bytes the memory budget leaves (--memory-max)",
        shown(pool.name), pages_so_far, pages_so_far * sg_state_bytes_per_page, limits.bytes_max);
  std::vector<listed> pages(pool.num_pages, listed::nowhere);
  if (std::string e = read_bound(key_to_index.value, limits, pool, pages); !e.empty()) return e;
  return read_free(free_pages.value, pool, pages);
}

}  // namespace

std::string decode_sglang_state(std::string_view bytes, const sg_state_limits& limits,
                                std::vector<sg_state_pool>& pools) {
  pools.clear();
  simdjson::dom::parser parser;
  element root;
  if (const auto error = parser.parse(bytes.data(), bytes.size(), true).get(root); error)
    return fmt::format("not valid JSON: {}", simdjson::error_message(error));
  simdjson::dom::object object;
  if (root.get_object().get(object) != simdjson::SUCCESS)
    return "the top level is not a JSON object";
  std::unordered_map<std::string, std::string> names;  // (rank, namespace) → the file's key
  std::uint64_t pages_so_far = 0;
  for (const simdjson::dom::key_value_pair kv : object) {
    if (pools.size() == limits.pools_max)
      return fmt::format("more than {} pools (--ranks-max)", limits.pools_max);
    sg_state_pool& pool = pools.emplace_back();
    pool.name = kv.key;
    if (std::string e = parse_name(kv.key, pool); !e.empty()) return e;
    const auto [it, fresh] = names.try_emplace(fmt::format("{}:{}", pool.rank, pool.ns), pool.name);
    if (!fresh)
      return fmt::format("pools {} and {} are both rank {} namespace {}", shown(it->second),
                         shown(pool.name), pool.rank, shown(pool.ns));
    if (std::string e = read_pool(kv.value, limits, pool, pages_so_far); !e.empty()) return e;
  }
  return {};
}

}  // namespace metad::api
