// The steps the endpoint coroutines share: which cores a key list needs, waiting for a
// core's log, sizing its records. Called on the core whose state they name.
#pragma once

#include <span>
#include <string_view>

#include "server/exchange.hpp"
#include "server/request_task.hpp"

namespace server {

// Marks, for each core, whether one of `keys` has its directory slice there, and
// remembers each key's owner.
inline void plan_directory_walk(const cluster& cl, std::span<const std::string_view> keys,
                                const std::uint32_t* only, std::size_t only_count, scratch& s) {
  s.core_needed.assign(static_cast<std::size_t>(cl.cores), 0);
  if (cl.cores == 1) {  // everything is here: no hashing
    s.key_owner.assign(keys.size(), 0);
    s.core_needed[0] = 1;
    return;
  }
  s.key_owner.resize(keys.size());
  auto mark = [&](std::size_t i) {
    const int owner = shard::owner_of_key(keys[i], cl.cores);
    s.key_owner[i] = static_cast<std::uint16_t>(owner);
    s.core_needed[static_cast<std::size_t>(owner)] = 1;
  };
  if (only == nullptr) {
    for (std::size_t i = 0; i < keys.size(); ++i) mark(i);
  } else {
    for (std::size_t j = 0; j < only_count; ++j) mark(only[j]);
  }
}

constexpr std::string_view kStorageFailed =
    "Storage unavailable: the data directory cannot be written (disk full or I/O error); "
    "nothing was changed or acknowledged, reads still work";

// After a change on `core` (on that core): waits until its log holds everything appended
// so far durably, in sync mode. Resumes with false if the disk failed first.
inline store::log_writer::wait_awaiter persisted(const cluster& cl, core_state& core) {
  const bool sync = cl.cfg.durable == metad::durability::sync;
  return core.log.durable_until(sync ? core.log.end() : 0);
}

// What a record of one key costs beside the key's length-prefixed bytes, at most: frame
// header, kind, tp_world_size (directory_key; directory_remove has less).
constexpr std::size_t kKeyRecordBytes = 8 + 1 + 4;

// An upper bound of the log bytes a request over `keys` appends (make_room).
inline std::uint64_t record_bytes(std::span<const std::string_view> keys, std::size_t extra_per_key,
                                  std::size_t extra = 0) {
  std::uint64_t bytes = 64 + extra;
  for (std::string_view key : keys) bytes += key.size() + 4 + extra_per_key;
  return bytes;
}

// Calls visit(c) on each core c for which wanted(c), in order from core `at`, on that
// core's thread, and comes back to `at`. Stops early (returns false) on the first core
// where valid() is false.
template <typename Wanted, typename Visit, typename Valid>
subtask<bool> on_cores(cluster& cl, int at, Wanted wanted, Visit visit, Valid valid) {
  const int start = at;
  bool ok = true;
  for (int step = 0; step < cl.cores && ok; ++step) {
    const int c = (start + step) % cl.cores;
    if (!wanted(c)) continue;
    co_await cl.mailbox.hop(at, c);
    at = c;
    ok = valid();
    if (ok) visit(c);
  }
  co_await cl.mailbox.hop(at, start);
  co_return ok;
}
// on_cores' `wanted`: the cores plan_directory_walk marked.
inline auto needed_by(const scratch& s) {
  return [&s](int c) { return s.core_needed[static_cast<std::size_t>(c)] != 0; };
}
inline bool always() { return true; }

}  // namespace server
