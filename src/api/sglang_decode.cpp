// SGLang request decoders (docs/sglang-api.md): the simdjson DOM parser validates the whole
// body before any field is read (see decode.cpp); each field is then checked for the
// shape the contract's Fixes require. Runs on the core that owns the decoder.
#include "api/sglang_codec.hpp"

#include <fmt/format.h>

#include "api/json_detail.hpp"
#include "api/text_detail.hpp"

namespace metad::api {

using namespace detail;

namespace {

using simdjson::dom::element;

// The namespace field: absent → "kv"; else a string of 1..128 code points.
error read_namespace(const field& f, std::string& ns, bool& valid) {
  std::string_view text = kSglangDefaultNamespace;
  valid = false;
  if (f.present) {
    if (!get_string(f.value, text)) return bad_request(kSglangInvalidNamespace);
    const std::size_t n = code_points(text);
    if (n == 0 || n > kSglangNamespaceCharsMax) return bad_request(kSglangInvalidNamespace);
  }
  ns.assign(text);
  valid = true;
  return {};
}

}  // namespace

sglang_decoder::sglang_decoder() : parser_(std::make_unique<simdjson::dom::parser>()) {}
sglang_decoder::~sglang_decoder() = default;
sglang_decoder::sglang_decoder(sglang_decoder&&) noexcept = default;
sglang_decoder& sglang_decoder::operator=(sglang_decoder&&) noexcept = default;

error sglang_decoder::add_key(std::string_view key, std::size_t index) {
  if (key.size() > key_bytes_max_) [[unlikely]] {
    return bad_request(fmt::format("Key at index {} is {} bytes long; the limit is {}", index,
                                   key.size(), key_bytes_max_));
  }
  scratch_.push_back(key);
  return {};
}

error sglang_decoder::decode_initialize(std::string_view body, std::int64_t pages_max,
                                        sg_initialize_cmd& out) {
  out = sg_initialize_cmd{};
  simdjson::dom::object object;
  if (error e = parse_object(*parser_, body, object)) return e;
  const auto [num_pages, ns] = find_fields<2>(object, {"num_pages", "namespace"});
  const error ns_error = read_namespace(ns, out.ns, out.ns_valid);
  std::int64_t pages = 0;
  if (!num_pages.present || !get_int64(num_pages.value, pages) || pages < 0 || pages > pages_max) {
    return bad_request(kSglangInvalidInit);
  }
  if (ns_error) return ns_error;
  out.num_pages = pages;
  return {};
}

// One element of a keys list: a string, or (reserve) a [key, prefix_key] pair of strings.
error sglang_decoder::read_key(element value, bool prefixed, std::size_t index) {
  std::string_view key;
  if (get_string(value, key)) return add_key(key, index);
  if (!prefixed) return bad_request(kSglangInvalidKeys);
  element first;
  element second;
  std::string_view prefix;
  if (!get_pair(value, first, second) || !get_string(first, key) || !get_string(second, prefix)) {
    return bad_request(fmt::format(
        "Invalid key at index {}: expected a [key, prefix_key] pair of strings or a string",
        index));
  }
  return add_key(key, index);
}

error sglang_decoder::decode_keys(std::string_view body, bool keys_first, bool prefixed,
                                  sg_keys_cmd& out) {
  out.ns.clear();
  out.ns_valid = false;
  out.keys.clear();
  simdjson::dom::object object;
  if (error e = parse_object(*parser_, body, object)) return e;
  const auto [keys, ns] = find_fields<2>(object, {"keys", "namespace"});
  const error ns_error = read_namespace(ns, out.ns, out.ns_valid);
  if (ns_error && !keys_first) return ns_error;
  scratch_.clear();
  if (keys.present) {
    simdjson::dom::array list;
    if (keys.value.get_array().get(list) != simdjson::SUCCESS) {
      return bad_request(kSglangInvalidKeys);
    }
    std::size_t index = 0;
    for (element value : list) {
      if (error e = read_key(value, prefixed, index++)) return e;
    }
  }
  if (ns_error) return ns_error;
  out.keys.assign_within_one_buffer(scratch_);
  return {};
}

error sglang_decoder::decode_exists(std::string_view body, sg_keys_cmd& out) {
  return decode_keys(body, /*keys_first=*/true, /*prefixed=*/false, out);
}

error sglang_decoder::decode_delete_keys(std::string_view body, sg_keys_cmd& out) {
  return decode_keys(body, /*keys_first=*/false, /*prefixed=*/false, out);
}

error sglang_decoder::decode_get_page_indices(std::string_view body, sg_keys_cmd& out) {
  return decode_keys(body, /*keys_first=*/false, /*prefixed=*/false, out);
}

error sglang_decoder::decode_inspect(std::string_view body, sg_keys_cmd& out) {
  if (error e = decode_keys(body, /*keys_first=*/false, /*prefixed=*/false, out)) return e;
  return bound_inspection(out.keys);
}

error sglang_decoder::decode_reserve(std::string_view body, sg_keys_cmd& out) {
  return decode_keys(body, /*keys_first=*/false, /*prefixed=*/true, out);
}

error sglang_decoder::decode_confirm(std::string_view body, sg_confirm_cmd& out) {
  out.ns.clear();
  out.ns_valid = false;
  out.keys.clear();
  out.pages.clear();
  out.releases.clear();
  simdjson::dom::object object;
  if (error e = parse_object(*parser_, body, object)) return e;
  const auto [confirmations, releases, ns] =
      find_fields<3>(object, {"written_keys_to_confirm", "pages_to_release", "namespace"});
  if (error e = read_namespace(ns, out.ns, out.ns_valid)) return e;
  simdjson::dom::array confirm_list;
  if (confirmations.present &&
      confirmations.value.get_array().get(confirm_list) != simdjson::SUCCESS) {
    return bad_request(kSglangConfirmationsNotList);
  }
  simdjson::dom::array release_list;
  if (releases.present && releases.value.get_array().get(release_list) != simdjson::SUCCESS) {
    return bad_request(kSglangReleasesNotList);
  }
  scratch_.clear();
  if (confirmations.present) {
    std::size_t index = 0;
    for (element value : confirm_list) {
      element key_value;
      element page_value;
      std::string_view key;
      std::int64_t page = 0;
      if (!get_pair(value, key_value, page_value) || !get_string(key_value, key) ||
          !get_int64(page_value, page)) {
        return bad_request(fmt::format(
            "Invalid confirmation at index {}: expected [key, page] with a string key and an "
            "integer page",
            index));
      }
      if (error e = add_key(key, index++)) return e;
      out.pages.push_back(page);
    }
  }
  if (releases.present) {
    std::size_t index = 0;
    for (element value : release_list) {
      std::int64_t page = 0;
      if (!get_int64(value, page)) {
        return bad_request(fmt::format("Invalid page in pages_to_release at index {}", index));
      }
      out.releases.push_back(page);
      ++index;
    }
  }
  out.keys.assign_within_one_buffer(scratch_);
  return {};
}

error sglang_decoder::decode_clear(std::string_view body, sg_clear_cmd& out) {
  out = sg_clear_cmd{};
  if (body.empty()) {  // the old client sent no body; the reference then answers 500
    out.ns.assign(kSglangDefaultNamespace);
    out.ns_valid = true;
    return {};
  }
  simdjson::dom::object object;
  if (error e = parse_object(*parser_, body, object)) return e;
  const auto [ns] = find_fields<1>(object, {"namespace"});
  return read_namespace(ns, out.ns, out.ns_valid);
}

}  // namespace metad::api
