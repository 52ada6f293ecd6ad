// SGLang response encoders: compact JSON, byte-identical to the reference's (orjson, and
// FastAPI's {"detail": ...} errors). Pure functions appending to a caller's buffer: any
// core may call them.
#include "api/sglang_codec.hpp"
#include "api/text_detail.hpp"

#include <cstdlib>

#include <fmt/format.h>

namespace metad::api {

namespace {

using detail::append_int;

}  // namespace

void append_sglang_slot(std::string& out, bool exists, std::int64_t page) {
  out.append(exists ? "[true," : "[false,");
  append_int(out, page);
  out.push_back(']');
}

void encode_sglang_reserved(std::string& out, std::span<const std::uint8_t> exists,
                            std::span<const std::int64_t> pages) {
  if (exists.size() != pages.size()) std::abort();  // parallel arrays: a programming error
  out.reserve(out.size() + 14 + pages.size() * 30);
  out.append(R"({"indices":[)");
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (i != 0) out.push_back(',');
    append_sglang_slot(out, exists[i] != 0, pages[i]);
  }
  out.append("]}");
}

void encode_sglang_page_indices(std::string& out, std::span<const std::int64_t> pages) {
  out.reserve(out.size() + 14 + pages.size() * 21);
  out.append(R"({"indices":[)");
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (i != 0) out.push_back(',');
    if (pages[i] < 0) {
      out.append("null");
    } else {
      append_int(out, pages[i]);
    }
  }
  out.append("]}");
}

void encode_sglang_not_initialized(std::string& out, std::int64_t rank, std::string_view ns) {
  encode_error(out, fmt::format("Rank {} namespace '{}' not initialized. Please call "
                                "/{}/initialize first.",
                                rank, ns, rank));
}

void encode_sglang_already_initialized(std::string& out, std::int64_t rank, std::string_view ns,
                                       std::int64_t old_pages) {
  encode_error(out, fmt::format("Rank {} namespace '{}' already initialized with {} pages", rank,
                                ns, old_pages));
}

}  // namespace metad::api
