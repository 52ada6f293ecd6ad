#include "load/workload.hpp"

#include <algorithm>
#include <charconv>
#include <string_view>

#include "common/keys.hpp"
#include "load/http_client.hpp"

namespace bench {
namespace {

std::uint64_t key_id(int engine, int prompt, int block) {
  return (static_cast<std::uint64_t>(engine) << 48) | (static_cast<std::uint64_t>(prompt) << 24) |
         static_cast<std::uint64_t>(block);
}

std::uint64_t elapsed_ns(clock_type::time_point since) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - since).count());
}

void append_int(std::string& out, std::int64_t v) {
  char digits[24];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, v);
  out.append(digits, end);
}

// Per-stream random numbers (xorshift64*): cheap and without shared state.
struct rng {
  std::uint64_t state;
  std::uint64_t next() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1Dull;
  }
  int below(int n) { return n <= 0 ? 0 : static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

// Paces a stream at `rate` calls per second from a random phase, so streams do not
// fire in lockstep. Each task is timed from its intended start, so a stalled server
// shows up in the latency (no coordinated omission).
class pacer {
 public:
  pacer(double rate, clock_type::time_point start, rng& r) : next_(start) {
    if (rate > 0) {
      period_ = std::chrono::nanoseconds(static_cast<std::int64_t>(1e9 / rate));
      next_ += std::chrono::nanoseconds(static_cast<std::int64_t>(r.unit() * 1e9 / rate));
    }
  }
  // When the next call is due: now when back to back. `co_await` the loop until then.
  clock_type::time_point next(std::uint64_t& late_calls) {
    const clock_type::time_point now = clock_type::now();
    if (period_.count() == 0) return now;
    const clock_type::time_point intended = next_;
    next_ += period_;
    late_calls += now >= intended;
    return intended;
  }

 private:
  clock_type::time_point next_;
  std::chrono::nanoseconds period_{0};
};

// Appends ["k1","k2",...] or [["k1",""],...] for blocks [first, first + count).
void append_keys(std::string& out, int engine, int prompt, int first, int count, bool pairs) {
  out.push_back('[');
  for (int b = first; b < first + count; ++b) {
    if (b != first) out.push_back(',');
    out.append(pairs ? "[\"" : "\"");
    append_key(out, key_id(engine, prompt, b));
    out.append(pairs ? "\",\"\"]" : "\"");
  }
  out.push_back(']');
}

// Reads the pages of {"rank":r,"results":[["key",page],...]} in order. False if the
// body does not have exactly `expected` results.
bool parse_results(std::string_view body, std::size_t expected, std::vector<std::int64_t>& pages) {
  pages.clear();
  std::size_t at = body.find("\"results\"");
  if (at == std::string_view::npos) return false;
  while ((at = body.find("\",", at)) != std::string_view::npos) {
    at += 2;
    std::int64_t page = 0;
    const auto [end, ec] = std::from_chars(body.data() + at, body.data() + body.size(), page);
    if (ec != std::errc{}) return false;
    pages.push_back(page);
    at = static_cast<std::size_t>(end - body.data());
  }
  return pages.size() == expected;
}

std::uint64_t count_of(std::string_view body, std::string_view token) {
  std::uint64_t n = 0;
  for (std::size_t at = body.find(token); at != std::string_view::npos;
       at = body.find(token, at + token.size()))
    ++n;
  return n;
}

}  // namespace

void stream_stats::merge(const stream_stats& other) {
  for (int e = 0; e < ep_count; ++e) {
    latency[e].merge(other.latency[e]);
    errors[e] += other.errors[e];
    keys_asked[e] += other.keys_asked[e];
    keys_found[e] += other.keys_found[e];
  }
  alloc_results += other.alloc_results;
  pages_refused += other.pages_refused;
  failed_tasks += other.failed_tasks;
  late_calls += other.late_calls;
}

workload::workload(load_options opt) : opt_(std::move(opt)), saved_(opt_.engines * opt_.tp) {}

std::string workload::setup() {
  http_client c(opt_.host, opt_.port);
  if (opt_.clear && c.post("/clear", "{}") != 204) return "POST /clear did not answer 204";
  std::string body = "{\"num_pages\":" + std::to_string(opt_.pages) + ",\"role\":\"worker\"}";
  for (int r = 0; r < opt_.tp; ++r) {
    const int status = c.post("/rank/" + std::to_string(r) + "/initialize", body);
    if (status != 200)
      return "initialize of rank " + std::to_string(r) + ": " + std::to_string(status);
  }
  for (int e = 0; e < opt_.engines; ++e)
    if (c.post("/rank/0/initialize", R"({"num_pages":0,"role":"scheduler"})") != 200)
      return "scheduler initialize failed";
  return "";
}

stream_task workload::run_scheduler(event_loop& loop, int engine, clock_type::time_point start,
                                    stream_stats& out) {
  async_connection c(loop, opt_.host, opt_.port);
  rng r{key_id(engine, 0, 0) * 2 + 1};
  pacer pace(opt_.rate, start, r);
  const clock_type::time_point end = start + std::chrono::duration_cast<clock_type::duration>(
                                                 std::chrono::duration<double>(opt_.seconds));
  std::string body;
  body.reserve(static_cast<std::size_t>(opt_.prompt_blocks) * 36 + 64);
  co_await loop.sleep_until(start);
  while (clock_type::now() < end) {
    // A new request's prompt: one the engine saved (a hit) or the next one (a miss).
    int newest = 0;
    for (int k = 0; k < opt_.tp; ++k) newest = std::max(newest, saved(engine, k));
    const int prompt = r.below(std::min(newest + 1, opt_.prompts));
    body.assign("{\"keys\":");
    append_keys(body, engine, prompt, 0, opt_.prompt_blocks, false);
    body.push_back('}');
    const clock_type::time_point t = pace.next(out.late_calls);
    co_await loop.sleep_until(t);
    const int status = co_await c.post("/keys/batch_exists", body);
    out.latency[ep_exists].record(elapsed_ns(t));
    if (status != 200) {
      ++out.errors[ep_exists];
      continue;
    }
    out.keys_asked[ep_exists] += static_cast<std::uint64_t>(opt_.prompt_blocks);
    out.keys_found[ep_exists] += count_of(c.body(), "true");
  }
}

stream_task workload::run_saver(event_loop& loop, int engine, int rank,
                                clock_type::time_point start, stream_stats& out) {
  async_connection c(loop, opt_.host, opt_.port);
  rng r{key_id(engine, rank + 1, 7) * 2 + 1};
  pacer pace(opt_.rate, start, r);
  const clock_type::time_point end = start + std::chrono::duration_cast<clock_type::duration>(
                                                 std::chrono::duration<double>(opt_.seconds));
  const std::string rank_text = std::to_string(rank);
  std::string body;
  body.reserve(static_cast<std::size_t>(opt_.task_keys) * 60 + 128);
  std::vector<std::int64_t> pages;
  pages.reserve(static_cast<std::size_t>(opt_.task_keys));
  int prompt = 0;
  int first = 0;
  co_await loop.sleep_until(start);
  while (clock_type::now() < end) {
    const int count = std::min(opt_.task_keys, opt_.prompt_blocks - first);
    body.assign("{\"rank\":").append(rank_text).append(",\"keys\":");
    append_keys(body, engine, prompt, first, count, true);
    body.push_back('}');
    const clock_type::time_point t = pace.next(out.late_calls);
    co_await loop.sleep_until(t);
    int status = co_await c.post("/keys/batch_allocate", body);
    out.latency[ep_allocate].record(elapsed_ns(t));
    if (status != 200 || !parse_results(c.body(), static_cast<std::size_t>(count), pages)) {
      ++out.errors[ep_allocate];
      continue;  // retry the same task
    }
    // Success: bind every page we got. Failure (the 3FS write failed): confirm nothing
    // and hand back all the task's pages, hits included, as the connector does.
    out.alloc_results += static_cast<std::uint64_t>(count);
    const bool failed = r.unit() < opt_.fail_fraction;
    out.failed_tasks += failed;
    body.assign("{\"rank\":").append(rank_text).append(",\"confirmations\":[");
    bool any = false;
    for (int i = 0; i < count; ++i) {
      if (pages[static_cast<std::size_t>(i)] < 0) {
        ++out.pages_refused;
        continue;
      }
      if (failed) continue;
      if (any) body.push_back(',');
      any = true;
      body.append("[\"");
      append_key(body, key_id(engine, prompt, first + i));
      body.append("\",");
      append_int(body, pages[static_cast<std::size_t>(i)]);
      body.push_back(']');
    }
    body.append("],\"pages_to_release\":[");
    if (failed) {
      bool comma = false;
      for (std::int64_t p : pages) {
        if (p < 0) continue;
        if (comma) body.push_back(',');
        comma = true;
        append_int(body, p);
      }
    }
    body.append("]}");
    const clock_type::time_point t2 = clock_type::now();
    status = co_await c.post("/keys/confirm_write", body);
    out.latency[ep_confirm].record(elapsed_ns(t2));
    if (status != 204) ++out.errors[ep_confirm];
    first += count;
    if (first >= opt_.prompt_blocks) {
      first = 0;
      saved(engine, rank) = std::max(saved(engine, rank), prompt + 1);
      prompt = (prompt + 1) % opt_.prompts;
    }
  }
}

stream_task workload::run_loader(event_loop& loop, int engine, int rank,
                                 clock_type::time_point start, stream_stats& out) {
  async_connection c(loop, opt_.host, opt_.port);
  rng r{key_id(engine, rank + 1, 9) * 2 + 1};
  pacer pace(opt_.rate, start, r);
  const clock_type::time_point end = start + std::chrono::duration_cast<clock_type::duration>(
                                                 std::chrono::duration<double>(opt_.seconds));
  const std::string rank_text = std::to_string(rank);
  const int tasks_per_prompt = (opt_.prompt_blocks + opt_.task_keys - 1) / opt_.task_keys;
  std::string body;
  body.reserve(static_cast<std::size_t>(opt_.task_keys) * 36 + 128);
  co_await loop.sleep_until(start);
  while (clock_type::now() < end) {
    // Load a task's worth of blocks of a prompt this rank saved (a prefix-cache hit).
    const int prompt = r.below(std::max(1, saved(engine, rank)));
    const int first = r.below(tasks_per_prompt) * opt_.task_keys;
    const int count = std::min(opt_.task_keys, opt_.prompt_blocks - first);
    body.assign("{\"rank\":").append(rank_text).append(",\"keys\":");
    append_keys(body, engine, prompt, first, count, false);
    body.push_back('}');
    const clock_type::time_point t = pace.next(out.late_calls);
    co_await loop.sleep_until(t);
    const int status = co_await c.post("/keys/get_locations", body);
    out.latency[ep_locations].record(elapsed_ns(t));
    if (status != 200) {
      ++out.errors[ep_locations];
      continue;
    }
    out.keys_asked[ep_locations] += static_cast<std::uint64_t>(count);
    out.keys_found[ep_locations] += static_cast<std::uint64_t>(count) - count_of(c.body(), "null");
  }
}

}  // namespace bench
