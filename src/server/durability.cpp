#include "server/durability.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "metad/log.hpp"
#include "server/sglang_durability.hpp"
#include "store/record.hpp"

namespace server {
namespace {

using key_counts = std::unordered_map<std::string, std::int32_t>;

// What one core learns while replaying, for the directory phase.
struct replay_output {
  // Confirmations of keys, by the core that owns the key now: one entry per (rank, key).
  std::vector<std::vector<std::string>> confirmed_by_owner;
  // tp_world_size of the keys this core owns (the smallest seen: the first confirmation).
  std::unordered_map<std::string, std::int32_t> tp;
  std::uint64_t records = 0;
};

struct position {
  std::size_t segment = 0, offset = 0;
};

// Quarantines replayed from the log end where the log says (quarantine_end); after
// recovery they all restart (rank_table::restart_quarantines).
constexpr std::uint64_t kQuarantinedUntilLogged = UINT64_MAX;

[[noreturn]] void corrupt(const std::string& path, std::size_t offset) {
  throw std::runtime_error("corrupt record in " + path + " at offset " + std::to_string(offset) +
                           ": refusing to start (move the file away to start without it)");
}

// What a file is: only the last log segment of a core may end in a torn write.
enum class file_kind { last_log, earlier_log, snapshot };

// Scans one file. The last log segment's torn tail (a crash mid-write) is dropped with a
// warning. Anything else is damage, which stops start-up: a log segment is complete
// before the next one is created, and a snapshot is renamed into place only once whole.
template <typename Visit>
void scan_file(const std::string& bytes, const std::string& path, Visit&& visit, bool warn,
               file_kind kind) {
  const store::scan_result result = store::scan(bytes, visit);
  if (result.status == store::scan_status::corrupt ||
      (result.status == store::scan_status::torn_tail && kind != file_kind::last_log))
    corrupt(path, result.bad_offset);
  if (result.status == store::scan_status::torn_tail && warn)
    metad::log::warn("{}: dropping a torn record at offset {} ({} bytes)", path, result.bad_offset,
                     bytes.size() - result.bad_offset);
}

// Everything before a file group's last clear record is void.
file_kind log_kind(const store::core_files& files, std::size_t segment) {
  return segment + 1 == files.logs.size() ? file_kind::last_log : file_kind::earlier_log;
}

bool last_clear(const store::core_files& files, position& at) {
  bool found = false;
  for (std::size_t s = 0; s < files.logs.size(); ++s) {
    scan_file(
        files.logs[s], files.log_paths[s],
        [&](const store::record& r, std::size_t offset) {
          if (r.kind != store::record_kind::clear) return;
          found = true;
          at = {s, offset};
        },
        false, log_kind(files, s));
  }
  return found;
}

class replayer {
 public:
  replayer(cluster& cl, int core, replay_output& out) : cl_(cl), core_(core), out_(out) {
    out_.confirmed_by_owner.resize(static_cast<std::size_t>(cl.cores));
  }

  void apply(const store::record& r) {
    shard::rank_table& ranks = cl_.core[core_]->ranks;
    switch (r.kind) {
      case store::record_kind::directory_key:
        if (cl_.key_owner(r.keys[0]) == core_) {
          ++out_.records;
          auto [it, added] = out_.tp.try_emplace(std::string(r.keys[0]), r.tp_world_size);
          if (!added) it->second = std::min(it->second, r.tp_world_size);
        }
        return;
      case store::record_kind::directory_remove:
        if (cl_.key_owner(r.keys[0]) == core_) {
          ++out_.records;
          out_.tp.erase(std::string(r.keys[0]));
        }
        return;
      case store::record_kind::clear:
        return;  // handled by starting after the last one
      default:
        break;
    }
    if (shard::owner_of_rank(r.rank, cl_.cores) != core_) return;
    ++out_.records;
    switch (r.kind) {
      case store::record_kind::initialize:
      case store::record_kind::snapshot_rank:
        ranks.initialize(r.rank, r.num_pages);
        break;
      case store::record_kind::allocate:
        // Reservations made in replay get a fresh TTL from now.
        indices_.clear();
        pages_.clear();
        ranks.allocate(r.rank, r.keys, now_, indices_, pages_);
        break;
      case store::record_kind::confirm:
      case store::record_kind::confirm_quarantined:
        indices_.clear();
        // A quarantine's end is a record of its own: until then its time does not matter.
        if (ranks.confirm(r.rank, r.keys, r.pages, r.releases,
                          r.kind == store::record_kind::confirm ? 0 : kQuarantinedUntilLogged,
                          detail_, indices_) != shard::confirm_outcome::ok)
          throw std::runtime_error("log replay: a logged confirm_write no longer applies: " +
                                   detail_);
        break;
      case store::record_kind::quarantine_end:
        if (!ranks.end_quarantine(r.rank, r.releases))
          throw std::runtime_error("log replay: the end of a quarantine on rank " +
                                   std::to_string(r.rank) + " no longer applies");
        break;
      case store::record_kind::snapshot_quarantine:
        if (!ranks.restore_quarantine(r.rank, r.releases, kQuarantinedUntilLogged))
          throw std::runtime_error("snapshot replay: quarantined pages of rank " +
                                   std::to_string(r.rank) + " cannot be restored");
        break;
      case store::record_kind::remove:
        indices_.clear();
        ranks.remove_confirmed(r.rank, r.keys, indices_);
        break;
      case store::record_kind::release:
        if (!ranks.release_reserved(r.rank, r.releases))
          throw std::runtime_error("log replay: an expiry of rank " + std::to_string(r.rank) +
                                   " no longer applies");
        break;
      case store::record_kind::snapshot_entry:
        if (!ranks.restore(r.rank, r.keys[0], r.page, r.confirmed, now_))
          throw std::runtime_error("snapshot replay: page " + std::to_string(r.page) + " of rank " +
                                   std::to_string(r.rank) + " cannot be restored");
        break;
      case store::record_kind::sg_initialize:
      case store::record_kind::sg_reserve:
      case store::record_kind::sg_confirm:
      case store::record_kind::sg_delete:
      case store::record_kind::sg_clear:
      case store::record_kind::sg_get:
      case store::record_kind::sg_expire:
      case store::record_kind::sg_snapshot_pool:
        if (std::string e = apply_sg_record(cl_, *cl_.core[core_], r); !e.empty())
          throw std::runtime_error("log replay: " + e);
        break;
      default:
        break;
    }
  }

  // After the last record: the keys this core's ranks hold confirmed, by the core
  // that owns each key's directory slice (which counts them).
  void collect_confirmed() {
    cl_.core[core_]->ranks.for_each_entry(
        [this](std::int64_t, std::string_view key, std::int64_t, bool confirmed) {
          if (!confirmed) return;
          const int owner = cl_.key_owner(key);
          out_.confirmed_by_owner[static_cast<std::size_t>(owner)].emplace_back(key);
        });
  }

 private:
  cluster& cl_;
  int core_;
  replay_output& out_;
  const std::uint64_t now_ = cl_.clock();
  std::vector<std::uint32_t> indices_;
  std::vector<std::int64_t> pages_;
  std::string detail_;
};

void replay_files(cluster& cl, int core, const std::vector<store::core_files>& files,
                  replay_output& out) {
  replayer r(cl, core, out);
  auto apply = [&](const store::record& rec, std::size_t) { r.apply(rec); };
  const bool warn = core == 0;  // one warning per torn file, not one per core
  for (const store::core_files& f : files) {
    position clear_at;
    const bool cleared = last_clear(f, clear_at);
    if (!cleared && !f.snapshot.empty())
      scan_file(f.snapshot, f.snapshot_path, apply, warn, file_kind::snapshot);
    for (std::size_t s = cleared ? clear_at.segment : 0; s < f.logs.size(); ++s) {
      if (cleared && s == clear_at.segment) {
        // Records after the clear only.
        scan_file(
            f.logs[s], f.log_paths[s],
            [&](const store::record& rec, std::size_t offset) {
              if (offset > clear_at.offset) r.apply(rec);
            },
            warn, log_kind(f, s));
      } else {
        scan_file(f.logs[s], f.log_paths[s], apply, warn, log_kind(f, s));
      }
    }
  }
  r.collect_confirmed();
}

void rebuild_directory(cluster& cl, int core, std::vector<replay_output>& outputs,
                       std::int32_t fallback_tp) {
  key_counts counts;
  for (replay_output& from : outputs)
    for (std::string& key : from.confirmed_by_owner[static_cast<std::size_t>(core)]) ++counts[key];
  const auto& tps = outputs[static_cast<std::size_t>(core)].tp;
  std::size_t guessed = 0;
  for (const auto& [key, count] : counts) {
    const auto it = tps.find(key);
    // A binding whose directory record did not reach the disk belonged to a confirm
    // that was never acknowledged; assume every rank had been initialised.
    if (it == tps.end()) ++guessed;
    cl.core[core]->directory.restore(key, it == tps.end() ? fallback_tp : it->second, count,
                                     cl.clock());
  }
  if (guessed)
    metad::log::warn("{} key(s) recovered without their tp_world_size record: assumed {}", guessed,
                     fallback_tp);
}

std::string serialize(const core_state& core) {
  std::string bytes;
  core.ranks.for_each_rank([&](std::int64_t rank, const shard::rank_stats& st) {
    store::append_snapshot_rank(bytes, rank, st.num_pages);
  });
  core.ranks.for_each_entry(
      [&](std::int64_t rank, std::string_view key, std::int64_t page, bool confirmed) {
        store::append_snapshot_entry(bytes, rank, page, confirmed, key);
      });
  core.ranks.for_each_quarantine([&](std::int64_t rank, std::span<const std::int64_t> pages) {
    store::append_snapshot_quarantine(bytes, rank, pages);
  });
  core.directory.for_each_key([&](std::string_view key, std::int32_t tp, std::int32_t) {
    store::append_directory_key(bytes, tp, key);
  });
  append_sg_snapshot(bytes, core);
  return bytes;
}

template <typename Work>
void on_every_core(cluster& cl, Work&& work) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(cl.cores));
  for (int c = 0; c < cl.cores; ++c) {
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

}  // namespace

namespace {

// What a replay found, for the log line and --verify-data-dir.
struct replay_summary {
  std::size_t file_groups = 0;
  std::int64_t ranks = 0;
  std::uint64_t keys = 0, records = 0;
};

// Replays the committed generation of `dir` into the cores' state and rebuilds the
// directory. Throws std::runtime_error naming the file and offset of damage.
replay_summary replay(cluster& cl, const store::data_dir& dir) {
  const std::vector<store::core_files> files = dir.load();
  std::vector<replay_output> outputs(static_cast<std::size_t>(cl.cores));
  on_every_core(cl,
                [&](int c) { replay_files(cl, c, files, outputs[static_cast<std::size_t>(c)]); });
  replay_summary sum;
  sum.file_groups = files.size();
  for (auto& core : cl.core) sum.ranks += static_cast<std::int64_t>(core->ranks.rank_count());
  cl.worker_ranks = sum.ranks;
  on_every_core(
      cl, [&](int c) { rebuild_directory(cl, c, outputs, static_cast<std::int32_t>(sum.ranks)); });
  for (auto& out : outputs) sum.records += out.records;
  for (auto& core : cl.core) sum.keys += core->directory.size();
  return sum;
}

}  // namespace

void recover(cluster& cl) {
  if (cl.cfg.data_dir.empty()) {
    metad::log::info("no --data-dir: state lives in memory only and is lost on restart");
    return;
  }
  cl.data = std::make_unique<store::data_dir>(cl.cfg.data_dir);
  store::data_dir& dir = *cl.data;
  const replay_summary sum = replay(cl, dir);
  // A recovered quarantine lasts its full time again (a client may retry across a
  // restart); with the quarantine off, those pages are free now.
  const std::uint64_t quarantine_until =
      cl.cfg.release_quarantine_ms == 0 ? 0 : cl.clock() + cl.cfg.release_quarantine_ms * kNsPerMs;
  for (auto& core : cl.core) core->ranks.restart_quarantines(quarantine_until);

  // The new generation: one snapshot and one empty log per current core.
  dir.begin_generation();
  const std::uint64_t generation = dir.next_generation();
  on_every_core(cl, [&](int c) {
    core_state& core = *cl.core[c];
    dir.write_snapshot(generation, c, 1, serialize(core));
    core.log_segment = 1;
    core.log.switch_segment(dir.create_log(generation, c, 1));
  });
  dir.commit_generation();
  for (auto& core : cl.core) core->publish_incomplete();  // incomplete keys restart their grace
  if (sum.keys > 0) cl.removal_floor = cl.clock() + cl.cfg.read_lease_ms * kNsPerMs;
  metad::log::info(
      "recovered {} from {} file group(s): {} ranks, {} keys, {} records replayed; "
      "durability {}",
      dir.path(), sum.file_groups, sum.ranks, sum.keys, sum.records,
      cl.cfg.durable == metad::durability::sync ? "sync" : "none");
}

int verify_data_dir(const std::string& path) {
  metad::config cfg;
  cfg.data_dir = path;
  cluster cl(cfg, 1);
  try {
    const store::data_dir dir(path, store::data_dir::access::read_only);
    const replay_summary sum = replay(cl, dir);
    std::int64_t pages = 0, bound = 0, reserved = 0;
    cl.core[0]->ranks.for_each_rank([&](std::int64_t, const shard::rank_stats& st) {
      pages += st.num_pages;
      bound += st.bound;
      reserved += st.reserved;
    });
    const shard::directory& directory = cl.core[0]->directory;
    std::printf(
        "%s: generation %llu, %zu file group(s), %llu records replayed\n"
        "ranks %lld, pages %lld, bound %lld, reserved %lld\n"
        "keys %llu (complete %llu, incomplete %zu)\nok\n",
        path.c_str(), static_cast<unsigned long long>(dir.generation()), sum.file_groups,
        static_cast<unsigned long long>(sum.records), static_cast<long long>(sum.ranks),
        static_cast<long long>(pages), static_cast<long long>(bound),
        static_cast<long long>(reserved), static_cast<unsigned long long>(sum.keys),
        static_cast<unsigned long long>(sum.keys - directory.incomplete_count()),
        directory.incomplete_count());
    return 0;
  } catch (const std::exception& e) {
    std::printf("%s: FAILED: %s\n", path.c_str(), e.what());
    return 1;
  }
}

namespace {

// The cut is durable: switch to the next segment and write its snapshot in the background.
void finish_cut(cluster& cl, core_state& core) {
  store::data_dir& dir = *cl.data;
  const std::uint64_t generation = dir.generation();
  const std::uint64_t segment = core.log_segment + 1;
  core.log.switch_segment(std::exchange(core.next_segment_fd, -1));
  core.log_segment = segment;
  core.snapshot_done.store(false, std::memory_order_relaxed);
  core.snapshot_writer = std::thread(
      [&core, &dir, generation, segment, bytes = std::exchange(core.snapshot_bytes, {})] {
        try {
          dir.write_snapshot(generation, core.index, segment, bytes);
          dir.remove_before(generation, core.index, segment);
          core.snapshot_failed = false;
        } catch (const std::exception& e) {
          metad::log::error("snapshot {} of core {}: {}", segment, core.index, e.what());
          core.snapshot_failed = true;
        }
        core.snapshot_done.store(true, std::memory_order_release);
      });
}

}  // namespace

void snapshot_tick(cluster& cl, core_state& core) {
  if (!cl.data) return;
  if (core.snapshot_writer.joinable()) {
    if (!core.snapshot_done.load(std::memory_order_acquire)) return;
    core.snapshot_writer.join();
    if (core.snapshot_failed)
      metad::log::error("snapshot of core {} failed: its older log segments are kept", core.index);
  }
  if (core.log.size() >= cl.cfg.snapshot_log_bytes && core.next_segment_fd < 0)
    core.snapshot_due = true;
}

bool take_flush(cluster& cl, core_state& core, bool retry_failed,
                store::log_writer::flush_job& job) {
  store::log_writer& log = core.log;
  if (core.snapshot_due && !log.failing() && !core.snapshot_writer.joinable()) {
    core.snapshot_due = false;
    try {
      core.next_segment_fd =
          cl.data->create_log(cl.data->generation(), core.index, core.log_segment + 1);
      core.snapshot_bytes = serialize(core);  // every change so far, pending ones included
    } catch (const std::exception& e) {
      metad::log::error("cannot start log segment {}: {}", core.log_segment + 1, e.what());
    }
    if (core.next_segment_fd >= 0 && log.idle()) finish_cut(cl, core);  // nothing to write first
  }
  if (!log.flush_due(retry_failed)) return false;
  job = log.begin_flush();
  return true;
}

void flush_done(cluster& cl, core_state& core, long written, int synced) {
  store::log_writer& log = core.log;
  log.end_flush(written, synced);
  if (core.next_segment_fd < 0) return;
  if (!log.failing()) {
    finish_cut(cl, core);
  } else {
    // The old segment's last write failed: its records (and any since) stay there, so
    // the state serialized at the cut would be wrong for the next segment. Try later.
    ::close(std::exchange(core.next_segment_fd, -1));
    core.snapshot_bytes.clear();
  }
}

void finish_snapshot(core_state& core) {
  if (core.snapshot_writer.joinable()) core.snapshot_writer.join();
}

}  // namespace server
