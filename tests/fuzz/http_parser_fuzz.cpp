// libFuzzer harness for http::parser: arbitrary bytes, delivered in pieces whose sizes
// come from the input, with every ready request consumed. Checks that nothing crashes or
// overflows, that each body is followed by readable padding, that views survive a buffer
// growth before consume(), and that the requests and the final outcome do not depend on
// how the bytes were split (compared with a run that feeds as much as fits at once).
//
// Input: byte 0 = limits and options, bytes 1-2 = split seed, the rest = the stream.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_input.hpp"
#include "http/parser.hpp"

using namespace metad;

namespace {

struct event {
  http::parse_status status;
  http::parse_error error = http::parse_error::none;
  http::method verb = http::method::other;
  std::string target;
  std::string body;
  bool keep_alive = false;
  bool http_1_0 = false;

  bool operator==(const event&) const = default;
};

http::limits limits_for(std::uint8_t mode) {
  static constexpr std::size_t header_max[] = {64 * 1024, 256, 1024, 8192};
  static constexpr std::size_t body_max[] = {32 * 1024 * 1024, 16, 300, 70000};
  return {header_max[mode & 3], body_max[(mode >> 2) & 3]};
}

volatile unsigned char sink;

void check_request(const http::request& r, const http::limits& lim) {
  fuzz::require(!r.target.empty() && r.target.front() == '/', "target starts with '/'");
  fuzz::require(r.target.find('?') == std::string_view::npos, "query string stripped");
  fuzz::require(r.body.size() <= lim.body_bytes_max, "body within the limit");
  fuzz::require(r.body.data() != nullptr, "body has storage");
  // simdjson reads up to body_padding_bytes past the end: touch them all (ASan checks).
  unsigned char acc = 0;
  for (std::size_t i = 0; i < r.body.size() + http::body_padding_bytes; ++i)
    acc ^= static_cast<unsigned char>(r.body.data()[i]);
  sink = acc;
}

event ready_event(const http::request& r) {
  return {http::parse_status::ready,
          http::parse_error::none,
          r.verb,
          std::string(r.target),
          std::string(r.body),
          r.keep_alive,
          r.http_1_0};
}

// Pulls every request the buffered bytes complete. Returns false once the parser failed.
bool drain(http::parser& p, const http::limits& lim, std::vector<event>& events,
           fuzz::splitter* options, bool grow_while_ready) {
  for (;;) {
    const http::parse_status status = p.next();
    (void)p.mid_request();
    if (status == http::parse_status::need_more) {
      (void)p.take_continue_request();
      return true;
    }
    if (status == http::parse_status::error) {
      fuzz::require(p.error() != http::parse_error::none, "error() names the error");
      fuzz::require(p.next() == http::parse_status::error, "a failed parser stays failed");
      events.push_back(event{status, p.error(), http::method::other, {}, {}, false, false});
      return false;
    }
    const http::request& r = p.current();
    check_request(r, lim);
    events.push_back(ready_event(r));
    if (grow_while_ready && options != nullptr && options->coin()) {
      // The transport may ask for room (growing the buffer) before it consumes.
      (void)p.read_space(options->next_piece() * 8);
      const event& before = events.back();
      const http::request& again = p.current();
      check_request(again, lim);
      fuzz::require(ready_event(again) == before, "views survive read_space before consume");
    }
    fuzz::require(p.next() == http::parse_status::ready, "ready until consume");
    p.consume();
  }
}

// Feeds `stream` in the splitter's pieces (or, without one, as much as fits each time).
std::vector<event> run(std::string_view stream, const http::limits& lim, fuzz::splitter* split,
                       fuzz::splitter* options, bool small_reads, bool grow_while_ready) {
  http::parser p(lim);
  std::vector<event> events;
  std::size_t at = 0;
  bool alive = true;
  while (alive && at < stream.size()) {
    const std::size_t want = split ? split->next_piece() : stream.size() - at;
    const std::span<char> space = small_reads ? p.read_space(1 + want % 97) : p.read_space();
    fuzz::require(!space.empty(), "read_space gives room");
    const std::size_t n = std::min({want, space.size(), stream.size() - at});
    std::memcpy(space.data(), stream.data() + at, n);
    p.commit(n);
    at += n;
    alive = drain(p, lim, events, options, grow_while_ready);
  }
  if (alive)
    events.push_back(event{http::parse_status::need_more,
                           http::parse_error::none,
                           http::method::other,
                           {},
                           {},
                           false,
                           false});
  return events;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fuzz::header h(data, size);
  const http::limits lim = limits_for(h.byte[0]);
  const bool grow_while_ready = (h.byte[0] & 0x10) != 0;
  const bool small_reads = (h.byte[0] & 0x20) != 0;

  fuzz::splitter split(h.seed());
  fuzz::splitter options(static_cast<std::uint16_t>(h.seed() ^ 0x5a5a));
  const std::vector<event> pieces =
      run(h.payload, lim, &split, &options, small_reads, grow_while_ready);
  const std::vector<event> whole = run(h.payload, lim, nullptr, nullptr, false, false);
  if (pieces != whole) {
    std::string detail = "pieces: " + std::to_string(pieces.size()) +
                         " events, whole: " + std::to_string(whole.size()) + " events";
    for (std::size_t i = 0; i < std::min(pieces.size(), whole.size()); ++i) {
      if (!(pieces[i] == whole[i])) {
        detail += "; first difference at event " + std::to_string(i) + " (status " +
                  std::to_string(int(pieces[i].status)) + "/" +
                  std::to_string(int(whole[i].status)) + ", error " +
                  std::to_string(int(pieces[i].error)) + "/" + std::to_string(int(whole[i].error)) +
                  ")";
        break;
      }
    }
    fuzz::fail("parse depends on how the bytes were split", detail);
  }
  return 0;
}
