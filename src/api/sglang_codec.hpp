// SGLang HiCache API bodies (docs/sglang-api.md): simdjson DOM decoders for the seven request
// bodies, each malformed shape a 400 with the contract's detail, and compact encoders for
// the answers, byte-identical to the reference's (orjson). No server state is touched
// here. One decoder per core; its parser is reused across requests. Decoded commands own
// copies of their keys and namespace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "api/decode.hpp"
#include "api/encode.hpp"

namespace metad::api {

inline constexpr std::string_view kSglangDefaultNamespace = "kv";
inline constexpr std::size_t kSglangNamespaceCharsMax = 128;  // Unicode code points
inline constexpr std::string_view kSglangInvalidInit = "Invalid initialization parameters";
inline constexpr std::string_view kSglangInvalidNamespace = "Invalid namespace";
inline constexpr std::string_view kSglangInvalidKeys = "Invalid keys format";
inline constexpr std::string_view kSglangConfirmationsNotList =
    "Invalid request format: 'written_keys_to_confirm' must be a list of [key, page] pairs";
inline constexpr std::string_view kSglangReleasesNotList =
    "Invalid request format: 'pages_to_release' must be a list of page numbers";

// Every command carries its namespace. On an error for another field, `ns_valid` says
// whether `ns` was still read (so the caller can look the pool up and answer its 404
// first, for the operations whose reference checks the pool before the body's fields).
struct sg_initialize_cmd {
  std::int64_t num_pages = 0;
  std::string ns;
  bool ns_valid = false;
};
// exists, reserve_and_allocate_page_indices (prefix keys dropped), delete_keys and
// get_page_indices.
struct sg_keys_cmd {
  std::string ns;
  bool ns_valid = false;
  key_list keys;
};
struct sg_confirm_cmd {
  std::string ns;
  bool ns_valid = false;
  key_list keys;                       // confirmation i binds keys[i] ...
  std::vector<std::int64_t> pages;     // ... to pages[i] (any int64: the pool checks range)
  std::vector<std::int64_t> releases;  // pages_to_release (any int64)
};
struct sg_clear_cmd {
  std::string ns;
  bool ns_valid = false;
};

class sglang_decoder {
 public:
  sglang_decoder();
  ~sglang_decoder();
  sglang_decoder(sglang_decoder&&) noexcept;
  sglang_decoder& operator=(sglang_decoder&&) noexcept;

  // Keys longer than this (bytes, decoded) are refused with a 400.
  void set_key_bytes_max(std::size_t bytes) { key_bytes_max_ = bytes; }

  // Each `body` must have SIMDJSON_PADDING readable bytes after its end. Errors come in
  // the reference's reading order: initialize and exists read their main field first,
  // the other operations the namespace.
  // {"num_pages": int in 0..pages_max, "namespace": str = "kv"}
  error decode_initialize(std::string_view body, std::int64_t pages_max, sg_initialize_cmd& out);
  // {"keys": [str, ...] = [], "namespace": str = "kv"}
  error decode_exists(std::string_view body, sg_keys_cmd& out);
  // {"keys": [[key, prefix_key] or key, ...] = [], "namespace": str = "kv"}
  error decode_reserve(std::string_view body, sg_keys_cmd& out);
  // {"written_keys_to_confirm": [[key, page], ...] = [], "pages_to_release": [page, ...] =
  // [], "namespace": str = "kv"}
  error decode_confirm(std::string_view body, sg_confirm_cmd& out);
  // {"keys": [str, ...] = [], "namespace": str = "kv"}
  error decode_delete_keys(std::string_view body, sg_keys_cmd& out);
  // {"namespace": str = "kv"}; an empty body is {}.
  error decode_clear(std::string_view body, sg_clear_cmd& out);
  // {"keys": [str, ...] = [], "namespace": str = "kv"}
  error decode_get_page_indices(std::string_view body, sg_keys_cmd& out);
  // inspect (this server's, not the reference's): get_page_indices' body and errors, and
  // more than kInspectKeysMax keys → 400.
  error decode_inspect(std::string_view body, sg_keys_cmd& out);

 private:
  // A keys body; keys_first: report a keys error before a namespace error; prefixed: a
  // key may also be a [key, prefix_key] pair (reserve).
  error decode_keys(std::string_view body, bool keys_first, bool prefixed, sg_keys_cmd& out);
  error read_key(simdjson::dom::element value, bool prefixed, std::size_t index);
  error add_key(std::string_view key, std::size_t index);

  std::unique_ptr<simdjson::dom::parser> parser_;  // see api/decode.hpp
  std::vector<std::string_view> scratch_;
  std::size_t key_bytes_max_ = SIZE_MAX;
};

// reserve's answer, {"indices":[[false,2],[true,0],[false,-1]]}: one [exists, page] per
// request key. exists[i] != 0 when the key was already stored.
void encode_sglang_reserved(std::string& out, std::span<const std::uint8_t> exists,
                            std::span<const std::int64_t> pages);
// reserve's answer from any range of slots with `.exists` and `.page` (shard::sglang_slot).
template <class Slots>
void encode_sglang_reserved(std::string& out, const Slots& slots);
// exists' answer: encode_exists ({"exists":[true,false]}), shared with vLLM's.
// get_page_indices' answer, {"indices":[2,null]}: -1 → null.
void encode_sglang_page_indices(std::string& out, std::span<const std::int64_t> pages);
// 404 {"detail":"Rank {rank} namespace '{ns}' not initialized. Please call
// /{rank}/initialize first."}
void encode_sglang_not_initialized(std::string& out, std::int64_t rank, std::string_view ns);
// 409 with --strict-reinit: {"detail":"Rank {rank} namespace '{ns}' already initialized
// with {old} pages"}
void encode_sglang_already_initialized(std::string& out, std::int64_t rank, std::string_view ns,
                                       std::int64_t old_pages);

// Appends "[true,3]" or "[false,-1]" (for the template above).
void append_sglang_slot(std::string& out, bool exists, std::int64_t page);

template <class Slots>
void encode_sglang_reserved(std::string& out, const Slots& slots) {
  out.reserve(out.size() + 14 + std::size(slots) * 30);
  out.append(R"({"indices":[)");
  bool first = true;
  for (const auto& s : slots) {
    if (!first) out.push_back(',');
    first = false;
    append_sglang_slot(out, s.exists, s.page);
  }
  out.append("]}");
}

}  // namespace metad::api
