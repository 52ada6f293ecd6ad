#include <fmt/format.h>

#include "api/encode.hpp"
#include "api/inspect.hpp"
#include "api/text_detail.hpp"

namespace metad::api {
namespace {

using detail::append_int;

// -1 → null
void append_opt(std::string& out, std::int64_t value) {
  if (value < 0) {
    out.append("null");
  } else {
    append_int(out, value);
  }
}

void append_key(std::string& out, std::string_view key) {
  out.append(R"({"key":")");
  append_escaped(out, key);
  out.push_back('"');
}

std::string_view state_of(const inspect_row& r) {
  if (r.removing) return "removing";
  if (r.complete) return "complete";
  if (r.present) return "incomplete";
  return r.holds.empty() ? "absent" : "reserved";
}

}  // namespace

void encode_inspect(std::string& out, std::span<const inspect_row> rows) {
  out.append(R"({"keys":[)");
  bool first = true;
  for (const inspect_row& r : rows) {
    if (!first) out.push_back(',');
    first = false;
    append_key(out, r.key);
    out.append(r.complete ? R"(,"exists":true,"state":")" : R"(,"exists":false,"state":")");
    out.append(state_of(r));
    out.append(R"(","tp_world_size":)");
    append_int(out, r.tp_world_size);
    out.append(R"(,"confirmations":)");
    append_int(out, r.confirmations);
    out.append(R"(,"ranks":[)");
    bool first_hold = true;
    for (const inspect_hold& h : r.holds) {
      if (!first_hold) out.push_back(',');
      first_hold = false;
      out.append(R"({"rank":)");
      append_int(out, h.rank);
      out.append(R"(,"page":)");
      append_int(out, h.page);
      if (h.confirmed) {
        out.append(R"(,"state":"bound"})");
      } else {
        out.append(R"(,"state":"reserved","reserved_until":)");
        append_opt(out, h.reserved_until_ms);
        out.push_back('}');
      }
    }
    out.append(R"(],"incomplete_since":)");
    append_opt(out, r.incomplete_since_ms);
    out.append(R"(,"last_used":)");
    append_opt(out, r.last_used_ms);
    out.append(R"(,"leased_until":)");
    append_opt(out, r.leased_until_ms);
    out.push_back('}');
  }
  out.append("]}");
}

void encode_sglang_inspect(std::string& out, std::span<const sg_inspect_row> rows) {
  out.append(R"({"keys":[)");
  bool first = true;
  for (const sg_inspect_row& r : rows) {
    if (!first) out.push_back(',');
    first = false;
    append_key(out, r.key);
    if (r.page >= 0) {
      out.append(R"(,"exists":true,"state":"bound")");
    } else if (r.reserved_page >= 0) {
      out.append(R"(,"exists":false,"state":"in_flight")");
    } else {
      out.append(R"(,"exists":false,"state":"absent")");
    }
    out.append(R"(,"page":)");
    append_opt(out, r.page);
    out.append(R"(,"leased_until":)");
    append_opt(out, r.leased_until_ms);
    out.append(R"(,"reserved_page":)");
    append_opt(out, r.reserved_page);
    out.append(R"(,"reserved_until":)");
    append_opt(out, r.reserved_until_ms);
    out.append(r.reserved_stale ? R"(,"reserved_before_clear":true})"
                                : R"(,"reserved_before_clear":false})");
  }
  out.append("]}");
}

}  // namespace metad::api
