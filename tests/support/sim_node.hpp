// A whole node without sockets or threads (basic_sim_node.hpp) with the server's
// durability: recovery from --data-dir, the group commit, snapshot cuts (persist). For
// the tests of persist (tests/persist) and of the server (tests/server): their binaries
// link metad_persist.
#pragma once

#include "basic_sim_node.hpp"
#include "persist/durability.hpp"

namespace server_test {

// persist's calls, as the server's core loops make them.
struct durable {
  static void recover(pipeline::node& nd) { persist::recover(nd); }
  static void finish_snapshot(pipeline::core_state& core) { persist::finish_snapshot(core); }
  static void snapshot_tick(pipeline::node& nd, pipeline::core_state& core) {
    persist::snapshot_tick(nd, core);
  }
  static bool take_flush(pipeline::node& nd, pipeline::core_state& core, bool retry_failed,
                         store::log_writer::flush_job& job) {
    return persist::take_flush(nd, core, retry_failed, job);
  }
  static void flush_done(pipeline::node& nd, pipeline::core_state& core, long written, int synced) {
    persist::flush_done(nd, core, written, synced);
  }
};

using sim_node = basic_sim_node<durable>;

}  // namespace server_test
