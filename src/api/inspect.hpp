// POST /keys/inspect and SGLang's /{rank}/inspect: what the server holds for each key,
// as the pipeline gathered it from the cores, and the answers' encoders. Times are Unix
// epoch milliseconds; -1 encodes as null.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace metad::api {

// One rank's hold on a key.
struct inspect_hold {
  std::int64_t rank = 0;
  std::int64_t page = 0;
  bool confirmed = false;
  std::int64_t reserved_until_ms = -1;  // reserved: when the reservation expires (-1: never)
};

// One key of a vLLM inspection.
struct inspect_row {
  std::string_view key;
  bool present = false;   // in the completion directory (some rank confirmed it)
  bool complete = false;  // what batch_exists answers
  bool removing = false;  // a delete or eviction is under way
  std::int32_t tp_world_size = 0, confirmations = 0;
  std::int64_t incomplete_since_ms = -1;  // incomplete: its last confirmation
  std::int64_t last_used_ms = -1;
  std::int64_t leased_until_ms = -1;    // only while the lease runs
  std::span<const inspect_hold> holds;  // by rank
};

// {"keys":[{"key","exists","state","tp_world_size","confirmations","ranks":[{"rank",
// "page","state"("bound"|"reserved"),"reserved_until"}...],"incomplete_since",
// "last_used","leased_until"},...]}; state: "absent", "reserved", "incomplete",
// "complete" or "removing".
void encode_inspect(std::string& out, std::span<const inspect_row> rows);

// One key of an SGLang inspection (one pool).
struct sg_inspect_row {
  std::string_view key;
  std::int64_t page = -1;  // bound page
  std::int64_t leased_until_ms = -1;
  std::int64_t reserved_page = -1;  // in flight
  std::int64_t reserved_until_ms = -1;
  bool reserved_stale = false;
};

// {"keys":[{"key","exists","state"("bound"|"in_flight"|"absent"),"page","leased_until",
// "reserved_page","reserved_until","reserved_before_clear"},...]}
void encode_sglang_inspect(std::string& out, std::span<const sg_inspect_row> rows);

}  // namespace metad::api
