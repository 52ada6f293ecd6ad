// Recovery's replayer: applies decoded log and snapshot records to one core's state, as
// recovery does at start-up and as a hot standby does for the leader's log frames it
// receives; then the directory phase that recovery (and a promotion) runs once every
// record is in. A replayer is used by one thread at a time, on its core's state only.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pipeline/node.hpp"
#include "shard/packed_key.hpp"
#include "store/record.hpp"
#include "store/recovery.hpp"

namespace metad::persist {

// What one core learns while replaying, for the directory phase: the confirmed
// bindings of its ranks, by the core that owns each key's directory slice now (one entry
// per (rank, key)); 32-hex keys packed. (The tp_world_size of the keys a core owns goes
// straight into its directory: directory::restore_key.)
struct replay_output {
  std::vector<std::vector<shard::packed_key>> packed_by_owner;
  std::vector<std::vector<std::string>> others_by_owner;
  std::uint64_t records = 0;
};

// Quarantines replayed from the log end where the log says (quarantine_end); after
// recovery they all restart (rank_table::restart_quarantines).
inline constexpr std::uint64_t kQuarantinedUntilLogged = UINT64_MAX;

class replayer {
 public:
  // sizes: what the files hold, to size the tables before filling them (empty: unknown).
  replayer(pipeline::node& nd, int core, replay_output& out, const store::file_sizes& sizes);

  // One record, if it belongs to this core (its rank, or its key's directory slice).
  // clear records are not applied: recovery starts after the last one. Throws
  // std::runtime_error for a record that no longer applies.
  void apply(const store::record& r);

  // After the last record: the keys this core's ranks hold confirmed, by the core
  // that owns each key's directory slice (which counts them).
  void collect_confirmed();

  // The time reservations made from here on count their TTL from (recovery: when it
  // started; a hot standby: when each batch arrives, close to the leader's own time).
  void set_now(std::uint64_t now) { now_ = now; }

 private:
  void restore_rank_keys(const store::record& r, shard::rank_table& ranks);
  void restore_directory_keys(const store::record& r, shard::directory& directory);

  pipeline::node& node_;
  int core_;
  replay_output& out_;
  std::unordered_map<std::int64_t, std::size_t> expected_;
  std::uint64_t now_ = node_.clock();
  std::vector<std::uint32_t> indices_;
  std::vector<shard::rank_table::packed_binding> bindings_;
  std::vector<std::int64_t> pages_;
  std::string detail_;
};

// Counts every confirmed binding into the directory slice of the key's owner (each core
// reads the lists the others made for it, and frees them).
void rebuild_directory(pipeline::node& nd, int core, std::vector<replay_output>& outputs,
                       std::int32_t fallback_tp);

// Runs work(c) for every core c on a thread of its own, and rethrows the first error.
template <typename Work>
void on_every_core(pipeline::node& nd, Work&& work) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(nd.cores));
  for (int c = 0; c < nd.cores; ++c) {
    threads.emplace_back([&, c] {
      try {
        work(c);
      } catch (...) {
        errors[static_cast<std::size_t>(c)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace metad::persist
