#include "persist/durability.hpp"

#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "metad/log.hpp"
#include "persist/replayer.hpp"
#include "pipeline/sglang_journal.hpp"
#include "shard/packed_key.hpp"
#include "shard/packed_map.hpp"
#include "shard/rank_table.hpp"
#include "store/record.hpp"
#include "store/recovery.hpp"

namespace metad::persist {

using pipeline::core_state;
using pipeline::node;

namespace {

void replay_files(node& nd, int core, const std::vector<store::checked_group>& groups,
                  const store::file_sizes& sizes, replay_output& out) {
  replayer r(nd, core, out, sizes);
  for (const store::checked_group& g : groups) {
    const store::core_files& f = *g.files;
    // segment: of the log (-1: the snapshot). A tenant's scoped clear voids its records
    // before it (checked_group::voided); it is not applied itself.
    auto replay = [&](std::string_view bytes, const std::string& path, std::size_t after,
                      std::ptrdiff_t segment) {
      if (!store::scan_checked(bytes, [&](const store::record& rec, std::size_t offset) {
            if (offset < after) return;
            const store::log_position at{static_cast<std::size_t>(segment), offset};
            if (g.voided(rec, segment < 0 ? nullptr : &at) ||
                (rec.kind == store::record_kind::clear && rec.scoped))
              return;
            r.apply(rec);
          }))
        throw std::runtime_error(path + " changed during recovery: refusing to start");
    };
    if (!g.snapshot.empty()) replay(g.snapshot, f.snapshot_path, 0, -1);
    for (std::size_t s = g.cleared ? g.clear_at.segment : 0; s < g.logs.size(); ++s) {
      // In the segment of the last clear, the records after it only.
      const bool from_clear = g.cleared && s == g.clear_at.segment;
      replay(g.logs[s], f.log_paths[s], from_clear ? g.clear_at.offset + 1 : 0,
             static_cast<std::ptrdiff_t>(s));
    }
  }
  r.collect_confirmed();
}

// A core's state as snapshot records, appended to `out`; spill(out) is called between
// records whenever out holds kSpillBytes or more (it may write and clear them). First
// the directory: 32-hex keys in snapshot_directory_keys chunks, any other as
// directory_key records. Then rank by rank: snapshot_rank, then its 32-hex keys: when its
// table can be dumped as laid out (packed_map::image_buckets), its bound keys as an image
// in snapshot_rank_slots chunks and its reserved ones after them, else all of them in
// snapshot_rank_keys chunks; then its other keys as snapshot_entry records. Then each
// rank's quarantined pages, then SGLang's pools.
constexpr std::size_t kSpillBytes = 4 << 20;

template <typename Spill>
void serialize_space(const pipeline::vllm_space& sp, std::string& out, Spill&& spill, bool images) {
  // A tenant's own state: each record scoped to it (store::record_kind::in_tenant).
  auto scope = [&](std::size_t at) { store::scope_to_tenant(out, at, sp.tenant); };
  auto end_packed = [&](std::size_t at) {
    store::end_packed(out, at);
    scope(at);
  };
  using binding = shard::rank_table::packed_binding;
  constexpr std::size_t ways = shard::packed_map::ways;
  std::int64_t rank_now = 0;
  std::size_t total = 0, left = 0, frame = 0, in_chunk = 0;
  // snapshot_rank_keys chunks of `keys` (the rank's reserved keys after its image).
  auto write_keys = [&](std::span<const binding> keys) {
    for (std::size_t from = 0; from < keys.size(); from += store::kPackedItemsMax) {
      if (out.size() >= kSpillBytes) spill(out);
      frame = store::begin_rank_keys(out, rank_now, keys.size());
      const std::size_t to = std::min(keys.size(), from + std::size_t{store::kPackedItemsMax});
      for (std::size_t i = from; i < to; ++i)
        store::add_packed_item(out, {keys[i].key.lo, keys[i].key.hi,
                                     keys[i].page | (keys[i].confirmed ? 1u << 31 : 0u)});
      end_packed(frame);
    }
  };
  // The image of the rank being written (buckets 0: none), its open chunk's first
  // bucket and masks, and its reserved keys (written after it).
  std::uint64_t buckets = 0, chunk_first = 0;
  bool chunk_open = false;
  std::vector<std::uint8_t> masks(store::kSlotBucketsMax);
  std::vector<binding> reserved;
  auto chunk_buckets = [&] {
    return static_cast<std::uint32_t>(
        std::min<std::uint64_t>(store::kSlotBucketsMax, buckets - chunk_first));
  };
  auto close_chunk = [&] {
    if (!chunk_open) return;
    store::end_rank_slots(out, frame, std::span(masks.data(), chunk_buckets()));
    scope(frame);
    chunk_open = false;
  };
  auto add_to_image = [&](const binding& b) {
    const std::uint64_t bucket = b.slot / ways;
    if (chunk_open && bucket >= chunk_first + store::kSlotBucketsMax) close_chunk();
    if (!chunk_open) {
      if (out.size() >= kSpillBytes) spill(out);
      chunk_first = bucket - bucket % store::kSlotBucketsMax;  // chunks start at multiples
      frame = store::begin_rank_slots(out, rank_now, shard::packed_map::image_layout, buckets,
                                      chunk_first, chunk_buckets());
      std::fill(masks.begin(), masks.end(), std::uint8_t{0});
      chunk_open = true;
    }
    masks[bucket - chunk_first] |= static_cast<std::uint8_t>(1u << (b.slot % ways));
    store::add_packed_item(out, {b.key.lo, b.key.hi, b.page | 1u << 31});
  };
  // The directory first: a standby that applies the snapshot as it arrives then finds
  // every key named when the ranks' bindings come to be counted (recovery counts them
  // at the end either way).
  const std::uint64_t keys = sp.directory.size();
  bool open = false;
  sp.directory.for_each_key([&](std::string_view key, std::int32_t tp, std::int32_t) {
    shard::packed_key packed;
    if (tp < 1 || !shard::pack_hex_key(key, packed)) {
      // Not inside a chunk: the directory visits its forms one after another (32-hex
      // keys, then 64-hex and other keys), so one may follow an unfinished chunk.
      if (open) {
        end_packed(frame);
        open = false;
        in_chunk = 0;
      }
      const std::size_t at = out.size();
      store::append_directory_key(out, tp, key);
      scope(at);
      return;
    }
    if (!open) {
      if (out.size() >= kSpillBytes) spill(out);
      frame = store::begin_directory_keys(out, keys);
      open = true;
    }
    store::add_packed_item(out, {packed.lo, packed.hi, static_cast<std::uint32_t>(tp)});
    if (++in_chunk < store::kPackedItemsMax) return;
    end_packed(frame);
    open = false;
    in_chunk = 0;
  });
  if (open) end_packed(frame);
  sp.ranks.for_each_rank_packed(
      [&](std::int64_t rank, const shard::rank_stats& st, std::size_t packed,
          std::size_t image_buckets) {
        if (out.size() >= kSpillBytes) spill(out);
        const std::size_t at = out.size();
        store::append_snapshot_rank(out, rank, st.num_pages);
        scope(at);
        rank_now = rank;
        total = left = packed;
        in_chunk = 0;
        buckets = packed > 0 && images ? image_buckets : 0;
        if (left > 0 && buckets == 0) frame = store::begin_rank_keys(out, rank, packed);
      },
      [&](const binding& b) {
        --left;
        if (buckets != 0) {
          if (b.confirmed)
            add_to_image(b);
          else
            reserved.push_back(b);
          if (left > 0) return;
          close_chunk();
          write_keys(reserved);
          reserved.clear();
          return;
        }
        store::add_packed_item(out, {b.key.lo, b.key.hi, b.page | (b.confirmed ? 1u << 31 : 0u)});
        if (++in_chunk < store::kPackedItemsMax && left > 0) return;
        end_packed(frame);
        if (out.size() >= kSpillBytes) spill(out);
        in_chunk = 0;
        if (left > 0) frame = store::begin_rank_keys(out, rank_now, total);
      },
      [&](std::string_view key, std::int64_t page, bool confirmed) {
        const std::size_t at = out.size();
        store::append_snapshot_entry(out, rank_now, page, confirmed, key);
        scope(at);
      });
  // Each rank's quarantined pages, oldest first (after every rank's header: replay
  // meets them with the rank initialised; disjoint from the keys' pages).
  sp.ranks.for_each_quarantine([&](std::int64_t rank, std::span<const std::int64_t> pages) {
    if (out.size() >= kSpillBytes) spill(out);
    const std::size_t at = out.size();
    store::append_snapshot_quarantine(out, rank, pages);
    scope(at);
  });
}

template <typename Spill>
void serialize(const core_state& core, std::string& out, Spill&& spill, bool images = true) {
  core.for_each_space(
      [&](const pipeline::vllm_space& sp) { serialize_space(sp, out, spill, images); });
  // SGLang's pools (independent of the vLLM state above), one image record each.
  if (out.size() >= kSpillBytes) spill(out);
  pipeline::append_sg_snapshot(out, core);
}

std::string serialize(const core_state& core) {
  std::string bytes;
  serialize(core, bytes, [](std::string&) {});
  return bytes;
}

}  // namespace

void serialize_state(const core_state& core, const std::function<void(std::string_view)>& piece,
                     bool images) {
  std::string buffer;
  auto spill = [&](std::string& out) {
    piece(out);
    out.clear();
  };
  serialize(core, buffer, spill, images);
  if (!buffer.empty()) piece(buffer);
}

namespace {

// What a replay found, for the log line and --verify-data-dir.
struct replay_summary {
  // The snapshot of core c, when it can serve the new generation as it is ("" if not).
  std::vector<std::string> reusable_snapshots;
  std::size_t file_groups = 0;
  std::int64_t ranks = 0;
  std::uint64_t keys = 0, records = 0;
};

// Milliseconds since `from`, and `from` moved to now (the phases of a recovery).
double lap(std::chrono::steady_clock::time_point& from) {
  const auto now = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - from).count();
  from = now;
  return ms;
}

// Replays the committed generation of `dir` into the cores' state and rebuilds the
// directory. Throws std::runtime_error naming the file and offset of damage.
replay_summary replay(node& nd, const store::data_dir& dir) {
  auto t = std::chrono::steady_clock::now();
  const std::vector<store::core_files> files = dir.load();
  const double load_ms = lap(t);
  const store::file_sizes sizes = store::estimate_sizes(files);
  replay_summary sum;
  if (files.size() == static_cast<std::size_t>(nd.cores)) {
    sum.reusable_snapshots.resize(files.size());
    for (std::size_t i = 0; i < files.size(); ++i)
      if (files[i].core == static_cast<int>(i) && sizes.reusable[i])
        sum.reusable_snapshots[i] = files[i].snapshot_path;
  }
  // Each file group is checked by one core, then replayed by every core from the bytes
  // found valid.
  std::vector<store::checked_group> groups(files.size());
  on_every_core(nd, [&](int c) {
    for (std::size_t i = static_cast<std::size_t>(c); i < files.size();
         i += static_cast<std::size_t>(nd.cores))
      groups[i] = store::check_group(files[i]);
  });
  const double check_ms = lap(t);
  std::vector<replay_output> outputs(static_cast<std::size_t>(nd.cores));
  on_every_core(
      nd, [&](int c) { replay_files(nd, c, groups, sizes, outputs[static_cast<std::size_t>(c)]); });
  const double replay_ms = lap(t);
  sum.file_groups = files.size();
  sum.ranks = count_worker_ranks(nd);
  on_every_core(nd, [&](int c) { rebuild_directory(nd, c, outputs); });
  std::uint64_t laid = 0, by_key = 0;
  for (auto& out : outputs) {
    sum.records += out.records;
    laid += out.images_laid;
    by_key += out.images_by_key;
  }
  for (auto& core : nd.core)
    core->for_each_space([&](const pipeline::vllm_space& sp) { sum.keys += sp.directory.size(); });
  metad::log::info(
      "recovery: files mapped in {:.0f} ms, checked in {:.0f} ms, replayed in {:.0f} ms "
      "({} rank table(s) laid out from images, {} image(s) loaded key by key), directory in "
      "{:.0f} ms",
      load_ms, check_ms, replay_ms, laid, by_key, lap(t));
  return sum;
}

}  // namespace

void recover(node& nd, const before_commit_fn& before_commit, bool discard) {
  if (nd.cfg.data_dir.empty()) {
    metad::log::info("no --data-dir: state lives in memory only and is lost on restart");
    return;
  }
  if (!nd.data) nd.data = std::make_unique<store::data_dir>(nd.cfg.data_dir);  // locks it
  store::data_dir& dir = *nd.data;
  replay_summary sum;
  if (discard)
    metad::log::info("recovery: {} starts empty (generation {} is dropped)", dir.path(),
                     dir.generation());
  else
    sum = replay(nd, dir);
  // A recovered quarantine lasts its full time again (a client may retry across a
  // restart); with the quarantine off, those pages are free now, and a core whose
  // state that changed cannot reuse the snapshot it was recovered from.
  const std::uint64_t quarantine_until =
      nd.cfg.release_quarantine_ms == 0 ? 0
                                        : nd.clock() + nd.cfg.release_quarantine_ms * smp::kNsPerMs;
  for (auto& core : nd.core) {
    const auto c = static_cast<std::size_t>(core->index);
    core->for_each_space([&](pipeline::vllm_space& sp) {
      if (quarantine_until == 0 && sp.ranks.quarantined_pages() > 0 &&
          c < sum.reusable_snapshots.size())
        sum.reusable_snapshots[c].clear();
      sp.ranks.restart_quarantines(quarantine_until);
    });
    pipeline::restart_sg_quarantines(nd, *core);
  }
  if (before_commit && before_commit(nd, dir)) sum.reusable_snapshots.clear();

  // The new generation: one snapshot and one empty log per current core. It needs room
  // the running server never needed: first give back what the last run's logs had
  // reserved past their ends (a crash leaves up to 16 MiB a core).
  auto t = std::chrono::steady_clock::now();
  if (const std::uint64_t freed = dir.release_log_reservations(); freed > 0)
    metad::log::info("recovery: {} bytes the last run's logs had reserved given back", freed);
  dir.begin_generation();
  const std::uint64_t generation = dir.next_generation();
  const auto linked = [&](int c) {
    const auto i = static_cast<std::size_t>(c);
    return i < sum.reusable_snapshots.size() && !sum.reusable_snapshots[i].empty();
  };
  std::vector<double> serialize_ms(static_cast<std::size_t>(nd.cores));
  try {
    on_every_core(nd, [&](int c) {
      core_state& core = *nd.core[c];
      auto at = std::chrono::steady_clock::now();
      if (linked(c)) {
        dir.link_snapshot(sum.reusable_snapshots[static_cast<std::size_t>(c)], generation, c, 1);
      } else {
        dir.write_snapshot(generation, c, 1, [&](const store::data_dir::piece_writer& write) {
          std::string buffer;
          buffer.reserve(kSpillBytes + (std::size_t{2} << 20));
          auto spill = [&](std::string& out) {
            write(out);
            out.clear();
          };
          serialize(core, buffer, spill);
          spill(buffer);
        });
      }
      serialize_ms[static_cast<std::size_t>(c)] = lap(at);
      core.log_segment = 1;
      core.log.switch_segment(dir.create_log(generation, c, 1));
      core.segments = {{1, core.log.segment_start()}};
    });
  } catch (const std::system_error& e) {
    if (e.code().value() != ENOSPC && e.code().value() != EDQUOT) throw;
    // The disk is too full for the new generation: say exactly how much room it needs.
    // The committed generation is untouched.
    dir.abandon_generation();
    // Each snapshot in whole blocks, and one block for CURRENT's replacement.
    const std::uint64_t block = dir.block_bytes();
    std::uint64_t needed = block;
    for (int c = 0; c < nd.cores; ++c) {
      if (linked(c)) continue;
      std::string buffer;
      std::uint64_t bytes = 0;
      serialize(*nd.core[c], buffer, [&](std::string& out) {
        bytes += out.size();
        out.clear();
      });
      bytes += buffer.size();
      needed += (bytes + block - 1) / block * block;
    }
    const std::uint64_t free = dir.free_bytes();
    throw std::runtime_error(fmt::format(
        "recovery: no room for the new generation g{} in {} ({}): its files need {} bytes and "
        "{} are free; free at least {} more bytes on that file system (or give it more "
        "space) and start again. Generation g{} is left as it was: nothing is lost",
        generation, dir.path(), e.what(), needed, free, needed > free ? needed - free : 0,
        dir.generation()));
  }
  const double write_ms = lap(t);
  dir.commit_generation();
  metad::log::info(
      "recovery: snapshots written in {:.0f} ms (the slowest core {:.0f} ms), committed in {:.0f} "
      "ms",
      write_ms, *std::max_element(serialize_ms.begin(), serialize_ms.end()), lap(t));
  ::malloc_trim(0);  // what recovery allocated and freed goes back to the system
  for (auto& core : nd.core) core->publish_incomplete();  // incomplete keys restart their grace
  if (sum.keys > 0) nd.removal_floor = nd.clock() + nd.cfg.read_lease_ms * smp::kNsPerMs;
  metad::log::info(
      "recovered {} from {} file group(s): {} ranks, {} keys, {} records replayed; "
      "durability {}",
      dir.path(), sum.file_groups, sum.ranks, sum.keys, sum.records,
      nd.cfg.durable == metad::durability::sync ? "sync" : "none");
}

namespace {

// --verify-data-dir's SGLang part: a total line, then one line per pool (tenant, rank,
// namespace order).
void print_sg_pools(const core_state& core) {
  struct row {
    std::string tenant;
    std::int64_t rank;
    std::string ns;
    shard::sglang_pool_stats stats;
  };
  std::vector<row> rows;
  for (const auto& entry : core.sg_tenants) {
    const std::string& tenant = entry.first;  // lambdas cannot capture bindings in C++20
    entry.second.for_each(
        [&](std::int64_t rank, std::string_view ns, const shard::sglang_pool& pool) {
          rows.push_back({tenant, rank, std::string(ns), pool.stats()});
        });
  }
  std::sort(rows.begin(), rows.end(), [](const row& a, const row& b) {
    return std::tie(a.tenant, a.rank, a.ns) < std::tie(b.tenant, b.rank, b.ns);
  });
  std::uint64_t pages = 0, bound = 0, in_flight = 0;
  for (const row& r : rows) {
    pages += r.stats.num_pages;
    bound += r.stats.bound;
    in_flight += r.stats.in_flight;
  }
  std::printf("sglang pools %zu, pages %llu, bound %llu, in flight %llu\n", rows.size(),
              static_cast<unsigned long long>(pages), static_cast<unsigned long long>(bound),
              static_cast<unsigned long long>(in_flight));
  for (const row& r : rows)
    std::printf(
        "sglang pool tenant '%s' rank %lld namespace '%s': pages %llu, bound %u, in flight "
        "%u, free %llu\n",
        r.tenant.c_str(), static_cast<long long>(r.rank), r.ns.c_str(),
        static_cast<unsigned long long>(r.stats.num_pages), r.stats.bound, r.stats.in_flight,
        static_cast<unsigned long long>(r.stats.free));
}

}  // namespace

int verify_data_dir(const std::string& path) {
  metad::config cfg;
  cfg.data_dir = path;
  node nd(cfg, 1);
  try {
    const store::data_dir dir(path, store::data_dir::access::read_only);
    const replay_summary sum = replay(nd, dir);
    std::int64_t pages = 0, bound = 0, reserved = 0;
    std::size_t incomplete = 0;
    nd.core[0]->for_each_space([&](const pipeline::vllm_space& sp) {
      sp.ranks.for_each_rank([&](std::int64_t, const shard::rank_stats& st) {
        pages += st.num_pages;
        bound += st.bound;
        reserved += st.reserved;
      });
      incomplete += sp.directory.incomplete_count();
    });
    std::printf(
        "%s: generation %llu, %zu file group(s), %llu records replayed\n"
        "ranks %lld, pages %lld, bound %lld, reserved %lld\n"
        "keys %llu (complete %llu, incomplete %zu)\n",
        path.c_str(), static_cast<unsigned long long>(dir.generation()), sum.file_groups,
        static_cast<unsigned long long>(sum.records), static_cast<long long>(sum.ranks),
        static_cast<long long>(pages), static_cast<long long>(bound),
        static_cast<long long>(reserved), static_cast<unsigned long long>(sum.keys),
        static_cast<unsigned long long>(sum.keys - incomplete), incomplete);
    print_sg_pools(*nd.core[0]);
    std::printf("ok\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("%s: FAILED: %s\n", path.c_str(), e.what());
    return 1;
  }
}

namespace {

// The cut is durable: switch to the next segment and write its snapshot in the background.
void finish_cut(node& nd, core_state& core) {
  store::data_dir& dir = *nd.data;
  const std::uint64_t generation = dir.generation();
  const std::uint64_t segment = core.log_segment + 1;
  core.log.switch_segment(std::exchange(core.next_segment_fd, -1));
  core.log_segment = segment;
  core.segments.emplace_back(segment, core.log.segment_start());
  // The segments the new snapshot makes old: the newest of them kept until they hold
  // --repl-retain-log-bytes (with --repl-listen; the oldest kept may pass it by less than
  // a segment), the rest removed with the snapshots. A segment is cut once it holds
  // --snapshot-log-bytes, so it is never smaller: "kept while they add up to at most the
  // bound" kept nothing at the defaults (256 MiB each).
  // A standby keeps none: no hello can resume from its files until it leads, and then
  // every standby needs a snapshot of the new epoch anyway.
  const std::uint64_t retain =
      nd.cfg.repl_listen.empty() || nd.repl.following.load() ? 0 : nd.cfg.repl_retain_log_bytes;
  std::size_t keep = core.segments.size() - 1;  // index of the oldest segment kept
  while (keep > 0 && core.segments.back().second - core.segments[keep].second < retain) --keep;
  core.segments.erase(core.segments.begin(),
                      core.segments.begin() + static_cast<std::ptrdiff_t>(keep));
  const std::uint64_t logs_before = core.segments.front().first;
  core.snapshot_done.store(false, std::memory_order_relaxed);
  core.snapshot_writer = std::thread([&core, &dir, generation, segment, logs_before,
                                      bytes = std::exchange(core.snapshot_bytes, {})] {
    try {
      dir.write_snapshot(generation, core.index, segment, bytes);
      dir.remove_before(generation, core.index, segment, logs_before);
      core.snapshot_failed = false;
    } catch (const std::exception& e) {
      metad::log::error("snapshot {} of core {}: {}", segment, core.index, e.what());
      core.snapshot_failed = true;
    }
    core.snapshot_done.store(true, std::memory_order_release);
  });
}

}  // namespace

void snapshot_tick(node& nd, core_state& core) {
  if (!nd.data) return;
  if (core.snapshot_writer.joinable()) {
    if (!core.snapshot_done.load(std::memory_order_acquire)) return;
    core.snapshot_writer.join();
    if (core.snapshot_failed)
      metad::log::error("snapshot of core {} failed: its older log segments are kept", core.index);
  }
  if (core.log.size() >= nd.cfg.snapshot_log_bytes && core.next_segment_fd < 0)
    core.snapshot_due = true;
}

bool take_flush(node& nd, core_state& core, bool retry_failed, store::log_writer::flush_job& job) {
  store::log_writer& log = core.log;
  if (core.snapshot_due && !log.failing() && !core.snapshot_writer.joinable()) {
    core.snapshot_due = false;
    try {
      core.next_segment_fd =
          nd.data->create_log(nd.data->generation(), core.index, core.log_segment + 1);
      core.snapshot_bytes = serialize(core);  // every change so far, pending ones included
    } catch (const std::exception& e) {
      metad::log::error("cannot start log segment {}: {}", core.log_segment + 1, e.what());
    }
    if (core.next_segment_fd >= 0 && log.idle()) finish_cut(nd, core);  // nothing to write first
  }
  if (!log.flush_due(retry_failed)) return false;
  job = log.begin_flush();
  return true;
}

void flush_done(node& nd, core_state& core, long written, int synced) {
  store::log_writer& log = core.log;
  log.end_flush(written, synced);
  if (core.next_segment_fd < 0) return;
  if (!log.failing()) {
    finish_cut(nd, core);
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

}  // namespace metad::persist
