// Recovery from the data directory at start-up and snapshots while serving. Recovery
// runs one thread per core: each reads every file the previous run left, replays the
// records of the ranks it now owns (any former core count), then the directory is
// rebuilt and a new generation — one snapshot and one empty log per core — is committed.
#pragma once

#include <functional>

#include "pipeline/node.hpp"

namespace metad::persist {

// Before any core serves. Throws std::runtime_error naming the file and offset of a
// corrupt record. before_commit, if set, runs after the replay and before the new
// generation is written, on the calling thread: what it adds to the cores' state (it
// returns true then) is in that generation's snapshots when recover returns.
using before_commit_fn = std::function<bool(pipeline::node&, const store::data_dir&)>;
// discard: the directory's committed state is not replayed but dropped (a standby
// that starts empty and copies the leader's state, docs/replication.md, "Catch-up and resume").
void recover(pipeline::node& nd, const before_commit_fn& before_commit = {}, bool discard = false);

// The core's state now as snapshot records (the snapshot files' format): piece(bytes)
// is called with whole records, a few MiB at a time, in order. On the core's thread.
// images: rank tables as images where they can be (else their keys one by one, as a
// version-1 standby reads them: repl::kProtocolVersion).
void serialize_state(const pipeline::core_state& core,
                     const std::function<void(std::string_view)>& piece, bool images = true);

// --verify-data-dir: replays the directory's committed state without serving or writing
// anything, prints what it holds (ranks, pages, bindings, keys, SGLang pools) or the damage
// (file and offset) on stdout. Returns the exit status: 0 readable (a torn tail is only
// warned about), 1 damaged or unreadable.
int verify_data_dir(const std::string& path);

// On core c's thread, each tick: marks a snapshot due when the log segment has grown
// past the limit, and reaps a background snapshot writer that finished.
void snapshot_tick(pipeline::node& nd, pipeline::core_state& core);

// The core's next group commit, if any (once per loop iteration, nothing in flight). A
// due snapshot cuts the log here: the state now is serialized as the next segment's
// snapshot, what is pending goes to the old segment as its last write, and the segment
// switches once that write is durable (a failed write calls the cut off).
bool take_flush(pipeline::node& nd, pipeline::core_state& core, bool retry_failed,
                store::log_writer::flush_job& job);
void flush_done(pipeline::node& nd, pipeline::core_state& core, long written, int synced);

// Waits for a running snapshot (shutdown).
void finish_snapshot(pipeline::core_state& core);

}  // namespace metad::persist
