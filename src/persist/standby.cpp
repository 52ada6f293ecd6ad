#include "persist/standby.hpp"

#include <stdexcept>

#include "metad/assert.hpp"
#include "pipeline/sglang_journal.hpp"
#include "store/record.hpp"

namespace metad::persist {

standby_core::standby_core(pipeline::node& nd, int core, std::uint64_t leader_lsn)
    : node_(nd),
      core_(core),
      log_(nd.core[core]->log),
      leader_base_(leader_lsn),
      local_base_(log_.end()),
      replayer_(nd, core, out_, store::file_sizes{}) {
  METAD_ASSERT(log_.idle());  // nothing of this node's own is queued in its log
}

void standby_core::receive(std::string_view frames) {
  // The log first: what is applied is also on its way to the disk, exactly as on the
  // leader (its state changes before its records are durable, never after).
  log_.pending().append(frames);
  pipeline::core_state& core = *node_.core[core_];
  replayer_.set_now(node_.clock());  // a reservation's TTL runs from about the leader's time
  const bool whole = store::scan_checked(frames, [&](const store::record& r, std::size_t) {
    if (r.kind == store::record_kind::clear) {
      // Recovery starts after a core's last clear; a live replay drops what came before
      // it. SGLang's pools outlive it: their images follow in the log (run_clear).
      core.ranks.clear();
      core.directory.clear();
      return;
    }
    replayer_.apply(r);
  });
  if (!whole) throw std::runtime_error("replication: frames that were checked no longer decode");
}

void promote_standby(pipeline::node& nd, std::vector<std::unique_ptr<standby_core>>& cores) {
  METAD_ASSERT(cores.size() == static_cast<std::size_t>(nd.cores));
  std::vector<replay_output> outputs(cores.size());
  for (std::size_t c = 0; c < cores.size(); ++c) {
    cores[c]->replay().collect_confirmed();
    outputs[c] = std::move(cores[c]->output());
  }
  std::int64_t ranks = 0;
  for (auto& core : nd.core) ranks += static_cast<std::int64_t>(core->ranks.rank_count());
  nd.worker_ranks = ranks;
  on_every_core(nd, [&](int c) {  // one thread per core, as recovery does
    rebuild_directory(nd, c, outputs, static_cast<std::int32_t>(ranks));
  });
  // As recovery does: quarantines last their full time again, keys are leased.
  const std::uint64_t quarantine_until =
      nd.cfg.release_quarantine_ms == 0 ? 0
                                        : nd.clock() + nd.cfg.release_quarantine_ms * smp::kNsPerMs;
  std::uint64_t keys = 0;
  for (auto& core : nd.core) {
    core->ranks.restart_quarantines(quarantine_until);
    pipeline::restart_sg_quarantines(nd, *core);
    core->publish_incomplete();
    keys += core->directory.size();
  }
  if (keys > 0) nd.removal_floor = nd.clock() + nd.cfg.read_lease_ms * smp::kNsPerMs;
}

}  // namespace metad::persist
