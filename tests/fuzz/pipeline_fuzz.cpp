// libFuzzer harness for the whole sans-IO pipeline: one pipeline::node of 3 simulated
// cores lives across inputs (state is kept, like a long-running server); each input is one
// connection's bytes, delivered in pieces whose sizes come from the input, with cross-core
// work drained on this thread. After each input: every response is a well-formed
// HTTP/1.1 answer with an expected status and a JSON body, nothing follows a
// "connection: close", and the node is consistent (every page of every rank exactly
// one of free/reserved/bound, directory counts equal to the ranks' bindings, incomplete keys
// counted). Eviction, reservation expiry, stale-key reclamation and read leases are on, on a clock
// that moves 100 ms per input.
//
// Input: byte 0 = home core (mod 3) and options, bytes 1-2 = split seed, the rest = the
// bytes of one connection.
#include <simdjson.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_input.hpp"
#include "http/parser.hpp"
#include "metad/config.hpp"
#include "pipeline/connection.hpp"
#include "pipeline/consistency.hpp"
#include "pipeline/node.hpp"
#include "pipeline/removal.hpp"
#include "sim.hpp"

using namespace metad;

namespace {

constexpr int kCores = 3;
// State is dropped (through /clear) when it grows past these, so that the invariant check
// after each input stays fast.
constexpr std::size_t kRanksBeforeClear = 48;

metad::config make_config() {
  metad::config cfg;
  cfg.header_bytes_max = 8 * 1024;
  cfg.body_bytes_max = 256 * 1024;
  cfg.pages_per_rank_max = 1 << 16;
  cfg.evict = metad::eviction::lru;
  cfg.reservation_ttl_ms = 2'000;
  cfg.read_lease_ms = 300;
  cfg.incomplete_grace_ms = 1'000;
  return cfg;
}

struct world {
  world() {
    nd.clock = [this] { return now_ms * smp::kNsPerMs; };
  }
  metad::config cfg = make_config();
  pipeline::node nd{cfg, kCores};
  sim::counting_waker waker;
  pipeline::stale_sweeper sweepers[kCores];
  std::uint64_t inputs = 0;
  std::uint64_t now_ms = 1'000'000;
};

world& the_world() {
  static world w;
  return w;
}

// One connection: feeds `bytes` in pieces and returns everything it answered, and
// whether the connection ended closed.
std::string converse(world& w, int home, std::string_view bytes, fuzz::splitter& split,
                     bool& closed) {
  pipeline::connection x(w.nd, *w.nd.core[static_cast<std::size_t>(home)], w.waker);
  std::string answers;
  std::size_t at = 0;
  closed = false;
  while (at < bytes.size() && !closed) {
    const std::span<char> space = x.read_space();
    fuzz::require(!space.empty(), "read_space gives room");
    const std::size_t n = std::min({split.next_piece(), space.size(), bytes.size() - at});
    std::memcpy(space.data(), bytes.data() + at, n);
    at += n;
    bool woken = true;
    const net::flow flow = sim::settle(
        w.nd, x, home, w.waker, sim::as_core(home, [&] { return x.on_bytes(n); }),
        [&](std::string& output) {  // the transport sends, then goes on
          answers += output;
          output.clear();
        },
        woken, 64);
    fuzz::require(woken, "a parked request wakes its connection once");
    answers += x.output();
    x.output().clear();
    if (flow != net::flow::close) x.trim();
    closed = flow == net::flow::close;
  }
  for (int c = 0; c < w.nd.cores; ++c)
    fuzz::require(w.nd.mailbox.drain(c) == 0, "no work left in the mailbox after a connection");
  return answers;
}

bool known_status(int status) {
  switch (status) {
    case 100:
    case 200:
    case 204:
    case 400:
    case 404:
    case 405:
    case 409:
    case 413:
    case 431:
    case 501:
    case 505:
      return true;
    default:
      return false;
  }
}

std::size_t header_value(std::string_view head, std::string_view name, std::string_view& value) {
  const std::size_t at = head.find(name);
  if (at == std::string_view::npos) return 0;
  const std::size_t end = head.find("\r\n", at + name.size());
  value = head.substr(at + name.size(), end - at - name.size());
  return 1;
}

// Which of the requests in `bytes` are HEAD, in order, as a parser with the server's
// limits reads them (up to the first malformed one): their answers carry no body.
std::vector<bool> head_requests(std::string_view bytes) {
  const metad::config cfg = make_config();
  http::parser parser(http::limits{cfg.header_bytes_max, cfg.body_bytes_max});
  std::vector<bool> heads;
  std::size_t at = 0;
  for (;;) {
    const http::parse_status status = parser.next();
    if (status == http::parse_status::ready) {
      heads.push_back(parser.current().verb == http::method::head);
      parser.consume();
    } else if (status == http::parse_status::need_more && at < bytes.size()) {
      const std::span<char> space = parser.read_space();
      const std::size_t n = std::min(space.size(), bytes.size() - at);
      std::memcpy(space.data(), bytes.data() + at, n);
      at += n;
      parser.commit(n);
    } else {
      return heads;
    }
  }
}

// Checks the answers of one connection to `heads` (head_requests); returns whether the
// last said connection: close.
bool check_answers(std::string_view out, const std::vector<bool>& heads) {
  static simdjson::dom::parser json;
  bool said_close = false;
  std::size_t answered = 0;  // final answers so far (100 Continue is not one)
  while (!out.empty()) {
    fuzz::require(!said_close, "nothing follows connection: close", out.substr(0, 64));
    fuzz::require(out.starts_with("HTTP/1.1 ") && out.size() >= 12, "answer starts with HTTP/1.1",
                  out.substr(0, 64));
    const std::string_view code = out.substr(9, 3);
    int status = 0;
    for (char c : code) {
      fuzz::require(c >= '0' && c <= '9', "3-digit status", out.substr(0, 64));
      status = status * 10 + (c - '0');
    }
    fuzz::require(known_status(status), "expected status code", out.substr(0, 64));
    const bool answers_head = status != 100 && answered < heads.size() && heads[answered];
    if (status != 100) ++answered;
    const std::size_t head_end = out.find("\r\n\r\n");
    fuzz::require(head_end != std::string_view::npos, "answer head ends", out.substr(0, 64));
    const std::string_view head = out.substr(0, head_end + 2);
    out.remove_prefix(head_end + 4);
    said_close = head.find("\r\nconnection: close\r\n") != std::string_view::npos;
    std::string_view length_text;
    const bool has_length = header_value(head, "\r\ncontent-length: ", length_text) != 0;
    if (status == 100 || status == 204) {
      fuzz::require(!has_length, "100 and 204 carry no length", head);
      continue;
    }
    fuzz::require(has_length, "answers carry content-length", head);
    if (answers_head) continue;  // headers only
    // Every answer is JSON except a successful GET /metrics (Prometheus text) and the
    // status page GET / (HTML).
    const auto has = [&](std::string_view header) {
      return head.find(header) != std::string_view::npos;
    };
    const bool json_body = has("\r\ncontent-type: application/json\r\n");
    fuzz::require(json_body || (status == 200 && (has("\r\ncontent-type: text/plain") ||
                                                  has("\r\ncontent-type: text/html"))),
                  "answers are application/json", head);
    std::size_t length = 0;
    for (char c : length_text) {
      fuzz::require(c >= '0' && c <= '9', "numeric content-length", head);
      length = length * 10 + static_cast<std::size_t>(c - '0');
    }
    fuzz::require(length <= out.size(), "the whole body was written", head);
    const simdjson::padded_string body(out.substr(0, length));
    out.remove_prefix(length);
    if (!json_body) continue;
    simdjson::dom::object object;
    fuzz::require(json.parse(body).get_object().get(object) == simdjson::SUCCESS,
                  "body is a JSON object", std::string_view(body.data(), body.size()));
    if (status >= 400) {
      std::string_view detail;
      fuzz::require(object["detail"].get_string().get(detail) == simdjson::SUCCESS,
                    "errors carry a detail", std::string_view(body.data(), body.size()));
    }
    if (status == 405)
      fuzz::require(head.find("\r\nallow: ") != std::string_view::npos, "405 says what is allowed",
                    head);
  }
  return said_close;
}

void check_state(world& w) {
  const std::string problem = pipeline::check_consistency(w.nd);
  fuzz::require(problem.empty(), "node consistency", problem);
  std::size_t ranks = 0;
  for (const auto& core : w.nd.core) ranks += core->unnamed().ranks.rank_count();
  fuzz::require(static_cast<std::int64_t>(ranks) == w.nd.worker_ranks.load(),
                "worker_ranks counts the initialised ranks");
}

std::size_t rank_count(const world& w) {
  std::size_t ranks = 0;
  for (const auto& core : w.nd.core) ranks += core->unnamed().ranks.rank_count();
  return ranks;
}

void clear(world& w) {
  fuzz::splitter split(1);
  bool closed = false;
  const std::string out =
      converse(w, 0, "POST /clear HTTP/1.1\r\ncontent-length: 0\r\n\r\n", split, closed);
  fuzz::require(out == "HTTP/1.1 204 No Content\r\n\r\n", "clear answers 204", out);
  fuzz::require(rank_count(w) == 0 && w.nd.worker_ranks.load() == 0, "clear drops every rank");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  world& w = the_world();
  const fuzz::header h(data, size);
  if (rank_count(w) > kRanksBeforeClear || (h.byte[0] & 0x80) != 0) clear(w);
  fuzz::splitter split(h.seed());
  bool closed = false;
  const std::string out = converse(w, (h.byte[0] & 0x7f) % kCores, h.payload, split, closed);
  const bool said_close = check_answers(out, head_requests(h.payload));
  fuzz::require(said_close == closed, "connection: close is said iff the connection closes");
  check_state(w);
  // The loops' tick: expiry and lease sweeps, stale-key walks run to their end, then the
  // clock moves on.
  fuzz::require(sim::tick(w.nd, w.sweepers), "stale-key walks end");
  check_state(w);
  w.now_ms += 100;
  ++w.inputs;
  return 0;
}
