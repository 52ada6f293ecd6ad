#include "persist/replayer.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "metad/assert.hpp"
#include "metad/log.hpp"
#include "persist/sglang_durability.hpp"
#include "pipeline/sglang_journal.hpp"
#include "store/record.hpp"

namespace metad::persist {

using pipeline::node;

replayer::replayer(node& nd, int core, replay_output& out, const store::file_sizes& sizes)
    : node_(nd), core_(core), out_(out) {
  out_.cores = static_cast<std::size_t>(nd.cores);
  // What the files hold of each rank of each tenant's vLLM state (by the space its name
  // has here).
  for (const auto& [of, keys] : sizes.rank_keys)
    if (shard::owner_of_rank(of.rank, nd.cores) == core)
      if (const int space = nd.tenants.space_of(of.tenant); space >= 0)
        expected_[{space, of.rank}] = keys;
  for (const auto& [of, buckets] : sizes.image_buckets)
    if (shard::owner_of_rank(of.rank, nd.cores) == core)
      if (const int space = nd.tenants.space_of(of.tenant); space >= 0)
        image_buckets_[{space, of.rank}] = buckets;
  bulk(node_.core[core_]->unnamed());
  node_.core[core_]->unnamed().directory.restore_reserve(sizes.directory_keys /
                                                         static_cast<std::size_t>(nd.cores));
  size_directory_ = sizes.directory_keys == 0;
}

int replayer::space_of(const store::record& r) {
  if (r.tenant.empty() || !store::is_vllm_kind(r.kind)) return 0;
  if (r.tenant == last_tenant_) return last_space_;
  const int space = node_.tenants.space_of(r.tenant);
  if (space < 0)
    throw std::runtime_error("replay: more tenants have vLLM state than this process can hold");
  last_tenant_.assign(r.tenant);
  last_space_ = space;
  return space;
}

void replayer::bulk(pipeline::vllm_space& sp) {
  const auto id = static_cast<std::size_t>(sp.id);
  if (id >= bulked_.size()) bulked_.resize(id + 1, false);
  if (bulked_[id]) return;
  bulked_[id] = true;
  sp.ranks.set_bulk(true);
}

void replayer::apply(const store::record& r) {
  space_ = space_of(r);
  pipeline::vllm_space& sp = node_.core[core_]->space(space_);
  bulk(sp);
  shard::rank_table& ranks = sp.ranks;
  shard::directory& directory = sp.directory;
  switch (r.kind) {
    case store::record_kind::directory_key:
      if (node_.key_owner(r.keys[0]) == core_) {
        ++out_.records;
        directory.restore_key(r.keys[0], r.tp_world_size);
      }
      return;
    case store::record_kind::directory_remove:
      if (node_.key_owner(r.keys[0]) == core_) {
        ++out_.records;
        directory.restore_forget(r.keys[0]);
      }
      return;
    case store::record_kind::snapshot_directory_keys:
      restore_directory_keys(r, directory);
      return;
    case store::record_kind::clear:
      return;  // handled by starting after the last one
    default:
      break;
  }
  if (shard::owner_of_rank(r.rank, node_.cores) != core_) return;
  ++out_.records;
  switch (r.kind) {
    case store::record_kind::initialize:
    case store::record_kind::snapshot_rank:
      // The server never logs a page count that initialize would not take (it asserts one).
      if (r.num_pages <= 0 || static_cast<std::uint64_t>(r.num_pages) > shard::page_pool::pages_max)
        throw std::runtime_error("replay: rank " + std::to_string(r.rank) + " has " +
                                 std::to_string(r.num_pages) + " pages, out of range");
      unbound_.clear();
      images_.erase({space_, r.rank});  // an image that follows is a new one
      if (ranks.initialize(r.rank, r.num_pages, tracking_ ? &unbound_ : nullptr).outcome ==
          shard::init_outcome::created) {
        // Sized for what the files hold, unless an image will lay the table out.
        const auto it = expected_.find({space_, r.rank});
        const auto image = image_buckets_.find({space_, r.rank});
        if (it != expected_.end() &&
            (image == image_buckets_.end() || !image_fits(r.rank, image->second)))
          ranks.reserve_keys(r.rank, it->second);
      }
      for (const std::string& key : unbound_) changed(space_, key, false);
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
      if (tracking_)
        for (const std::uint32_t i : indices_) changed(space_, r.keys[i], true);
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
      if (tracking_)
        for (const std::uint32_t i : indices_) changed(space_, r.keys[i], false);
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
      if (tracking_ && r.confirmed) changed(space_, r.keys[0], true);
      break;
    case store::record_kind::snapshot_rank_keys:
      restore_rank_keys(r, ranks);
      break;
    case store::record_kind::snapshot_rank_slots:
      restore_rank_slots(r, ranks);
      break;
    case store::record_kind::sg_initialize:
    case store::record_kind::sg_reserve:
    case store::record_kind::sg_confirm:
    case store::record_kind::sg_delete:
    case store::record_kind::sg_clear:
    case store::record_kind::sg_get:
    case store::record_kind::sg_expire:
    case store::record_kind::sg_snapshot_pool:
    case store::record_kind::sg_snapshot_pool_runs:
    case store::record_kind::sg_reserve_full:
    case store::record_kind::sg_reserve_capped:
    case store::record_kind::sg_confirm_quarantined:
    case store::record_kind::sg_quarantine_end:
    case store::record_kind::sg_snapshot_quarantine:
      if (std::string e = apply_sg_record(node_, *node_.core[core_], r); !e.empty())
        throw std::runtime_error("log replay: " + e);
      break;
    default:
      break;
  }
}

void replayer::end_bulk() {
  node_.core[core_]->for_each_space([&](pipeline::vllm_space& sp) {
    const auto id = static_cast<std::size_t>(sp.id);
    if (id < bulked_.size() && bulked_[id]) sp.ranks.set_bulk(false);
  });
  bulked_.clear();
}

void replayer::collect_confirmed() {
  end_bulk();
  const auto cores = static_cast<std::size_t>(node_.cores);
  node_.core[core_]->for_each_space([&](const pipeline::vllm_space& sp) {
    std::size_t bound = 0;
    sp.ranks.for_each_rank([&](std::int64_t, const shard::rank_stats& st) {
      bound += static_cast<std::size_t>(st.bound);
    });
    if (bound == 0) return;
    // Each owner's share, about half of it in each bucket's list (rank tables in slot order).
    const std::size_t share = cores == 1 ? bound : bound / cores * 9 / 8;
    for (std::size_t owner = 0; owner < cores; ++owner)
      for (auto& list : out_.to(sp.id, owner).gained_in) list.reserve(share * 5 / 8);
  });
  collect_bindings(/*lost=*/false);
}

void replayer::collect_bindings(bool lost, int space) {
  node_.core[core_]->for_each_space([&](const pipeline::vllm_space& sp) {
    if (space >= 0 && sp.id != space) return;
    std::size_t buckets = 0;  // of the rank being walked, when in slot order
    sp.ranks.for_each_rank_packed([&](std::int64_t, const shard::rank_stats&, std::size_t,
                                      std::size_t image_buckets) { buckets = image_buckets; },
                                  [&](const shard::rank_table::packed_binding& b) {
                                    if (!b.confirmed) return;
                                    if (lost)
                                      out_.to(sp.id, owner_of(b.key)).lost.push_back(b.key);
                                    else
                                      gain(sp.id, b.key, b.slot, buckets);
                                  },
                                  [&](std::string_view key, std::int64_t, bool confirmed) {
                                    if (!confirmed) return;
                                    binding_changes& to = out_.to(
                                        sp.id, static_cast<std::size_t>(node_.key_owner(key)));
                                    (lost ? to.lost_others : to.gained_others).emplace_back(key);
                                  });
  });
}

std::size_t replayer::owner_of(const shard::packed_key& key) const {
  return static_cast<std::size_t>(node_.key_owner(key));
}

void replayer::changed(int space, std::string_view key, bool gained) {
  binding_changes& to = out_.to(space, static_cast<std::size_t>(node_.key_owner(key)));
  shard::packed_key packed;
  if (key.size() == shard::packed_key_chars && shard::pack_hex_key(key, packed))
    (gained ? to.gained : to.lost).push_back(packed);
  else
    (gained ? to.gained_others : to.lost_others).emplace_back(key);
}

// A chunk of a rank's 32-hex keys, bulk-loaded; other cores' ranks are skipped unread.
void replayer::restore_rank_keys(const store::record& r, shard::rank_table& ranks) {
  const std::size_t count = r.item_count();
  bindings_.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    const store::packed_item item = store::packed_item_at(r.items, i);
    bindings_[i] = {{item.lo, item.hi}, item.value & 0x7FFFFFFFu, (item.value >> 31) != 0};
  }
  if (!ranks.restore_packed(r.rank, static_cast<std::size_t>(r.total), bindings_, now_))
    throw std::runtime_error("snapshot replay: a page of rank " + std::to_string(r.rank) +
                             " cannot be restored (out of range, taken, or a key twice)");
  gained(bindings_, 0);
}

bool replayer::image_fits(std::int64_t rank, std::size_t buckets) const {
  // A standby knows no file sizes: the rank's pages bound the table (begin_image).
  const auto it = expected_.find({space_, rank});
  if (it == expected_.end()) return expected_.empty();
  // Not past the load at which it would grow, nor under a quarter full (a table left
  // sparse by deletes is rebuilt smaller anyway; and a damaged file cannot ask for a
  // table larger than its keys).
  const std::size_t keys = it->second;
  return keys <= shard::packed_map::max_size_of(buckets) &&
         buckets <= std::max<std::size_t>(keys, 1024);
}

// A chunk of a rank's key table as it was laid out: into the slots it names when the
// image is of this build's layout and its table will not need to grow (with what the log
// adds), else key by key as snapshot_rank_keys are.
void replayer::restore_rank_slots(const store::record& r, shard::rank_table& ranks) {
  bindings_.resize(r.item_count());
  std::size_t k = 0;
  for (std::size_t i = 0; i < r.masks.size(); ++i) {
    const std::uint64_t first_slot = (r.first_bucket + i) * shard::packed_map::ways;
    for (unsigned m = static_cast<unsigned char>(r.masks[i]); m != 0; m &= m - 1, ++k) {
      const store::packed_item item = store::packed_item_at(r.items, k);
      bindings_[k] = {{item.lo, item.hi},
                      item.value & 0x7FFFFFFFu,
                      (item.value >> 31) != 0,
                      first_slot + static_cast<unsigned>(__builtin_ctz(m))};
    }
  }
  // An image holds bound keys only (its reserved keys follow as snapshot_rank_keys).
  for (const shard::rank_table::packed_binding& b : bindings_)
    if (!b.confirmed)
      throw std::runtime_error("snapshot replay: rank " + std::to_string(r.rank) +
                               "'s image holds a key that is not bound");
  const auto [it, first] = images_.try_emplace({space_, r.rank});
  image_load& image = it->second;
  if (first) {
    image.buckets = r.total;
    image.laid = r.layout == shard::packed_map::image_layout &&
                 image_fits(r.rank, static_cast<std::size_t>(r.total)) &&
                 ranks.begin_image(r.rank, static_cast<std::size_t>(r.total));
    ++(image.laid ? out_.images_laid : out_.images_by_key);
  } else if (image.buckets != r.total) {
    throw std::runtime_error("snapshot replay: rank " + std::to_string(r.rank) +
                             "'s image changes its number of buckets");
  }
  const auto expected = expected_.find({space_, r.rank});
  const bool ok =
      image.laid ? ranks.restore_image(r.rank, bindings_)
                 : ranks.restore_packed(r.rank, expected == expected_.end() ? 0 : expected->second,
                                        bindings_, now_);
  if (!ok)
    throw std::runtime_error("snapshot replay: a page of rank " + std::to_string(r.rank) +
                             " cannot be restored (out of range, taken, not bound, a key "
                             "twice, or not in one of its buckets)");
  gained(bindings_, static_cast<std::size_t>(r.total));
}

void replayer::gained(std::span<const shard::rank_table::packed_binding> bindings,
                      std::size_t buckets) {
  if (!tracking_) return;
  for (const shard::rank_table::packed_binding& b : bindings)
    if (b.confirmed) gain(space_, b.key, b.slot, buckets);
}

void replayer::gain(int space, const shard::packed_key& key, std::uint64_t slot,
                    std::size_t buckets) {
  binding_changes& to = out_.to(space, owner_of(key));
  if (buckets == 0) {
    to.gained.push_back(key);
    return;
  }
  const std::size_t first = shard::packed_map::buckets_of(shard::packed_hash(key), buckets).first;
  to.gained_in[slot / shard::packed_map::ways == first ? 0 : 1].push_back(key);
}

// A chunk of a former core's directory keys: those this core owns now. A directory not
// sized from the files (a standby's) is sized for the chunk's core's keys first.
void replayer::restore_directory_keys(const store::record& r, shard::directory& directory) {
  if (space_ == 0) {
    if (size_directory_ && directory.size() == 0)  // (under the table's bound of buckets)
      directory.restore_reserve(
          static_cast<std::size_t>(std::min<std::uint64_t>(r.total, std::uint64_t{1} << 32)));
    size_directory_ = false;
  }
  const std::size_t count = r.item_count();
  for (std::size_t i = 0; i < count; ++i) {
    const store::packed_item item = store::packed_item_at(r.items, i);
    const shard::packed_key key{item.lo, item.hi};
    if (owner_of(key) != static_cast<std::size_t>(core_)) continue;
    ++out_.records;
    directory.restore_key(key, static_cast<std::int32_t>(item.value));
  }
}

std::size_t binding_changes::apply(shard::directory& d, std::int32_t fallback_tp) const {
  std::size_t guessed = d.restore_count(gained, fallback_tp);
  guessed += d.restore_count(gained_in[0], fallback_tp, /*second=*/false);
  guessed += d.restore_count(gained_in[1], fallback_tp, /*second=*/true);
  for (const std::string& key : gained_others) guessed += d.restore_count(key, fallback_tp);
  d.restore_uncount(lost);
  for (const std::string& key : lost_others) d.restore_uncount(key);
  return guessed;
}

void binding_changes::clear() {
  gained.clear();
  gained_in[0].clear();
  gained_in[1].clear();
  lost.clear();
  gained_others.clear();
  lost_others.clear();
}

// Counts every confirmed binding into the directory slice of the key's owner (each core
// reads the lists the others made for it, and frees them), then finishes it.
void rebuild_directory(node& nd, int core, std::vector<replay_output>& outputs) {
  pipeline::core_state& here = *nd.core[core];
  const auto mine = static_cast<std::size_t>(core);
  std::size_t spaces = here.spaces.size();
  for (const replay_output& from : outputs) spaces = std::max(spaces, from.by_space.size());
  for (std::size_t id = 0; id < spaces; ++id) {
    bool any = here.find_space(static_cast<int>(id)) != nullptr;
    for (const replay_output& from : outputs)
      any = any || (id < from.by_space.size() && !from.by_space[id].empty());
    if (!any) continue;
    const int space = static_cast<int>(id);
    shard::directory& directory = here.space(space).directory;
    // A binding whose directory record did not reach the disk belonged to a confirm that
    // was never acknowledged; assume every rank of its space had been initialised.
    const auto fallback_tp = static_cast<std::int32_t>(nd.tenants.worker_ranks(space).load());
    std::size_t guessed = 0;
    for (replay_output& from : outputs) {
      if (id >= from.by_space.size() || from.by_space[id].empty()) continue;
      guessed += from.by_space[id][mine].apply(directory, fallback_tp);
      from.by_space[id][mine] = binding_changes{};  // its memory back
    }
    guessed += directory.restore_finish(nd.clock(), fallback_tp);
    if (guessed)
      metad::log::warn("{} key(s) recovered without their tp_world_size record: assumed {}",
                       guessed, fallback_tp);
  }
}

std::int64_t count_worker_ranks(node& nd) {
  std::vector<std::int64_t> ranks(static_cast<std::size_t>(nd.tenants.spaces()));
  for (auto& core : nd.core)
    core->for_each_space([&](const pipeline::vllm_space& sp) {
      if (static_cast<std::size_t>(sp.id) >= ranks.size()) ranks.resize(sp.id + 1u);
      ranks[static_cast<std::size_t>(sp.id)] += static_cast<std::int64_t>(sp.ranks.rank_count());
    });
  std::int64_t total = 0;
  for (std::size_t id = 0; id < ranks.size(); ++id) {
    nd.tenants.worker_ranks(static_cast<int>(id)) = ranks[id];
    total += ranks[id];
  }
  nd.worker_ranks = total;
  return total;
}

// --- a hot standby --------------------------------------------------------------------

binding_feed::binding_feed(int cores)
    : inboxes_(std::make_unique<inbox[]>(static_cast<std::size_t>(cores))) {}

void binding_feed::post(int owner, int space, binding_changes&& changes) {
  inbox& in = inboxes_[static_cast<std::size_t>(owner)];
  std::lock_guard lock(in.mutex);
  in.queued.emplace_back(space, std::move(changes));
}

void binding_feed::drain(int owner, pipeline::core_state& core) {
  inbox& in = inboxes_[static_cast<std::size_t>(owner)];
  std::vector<std::pair<int, binding_changes>> queued;
  {
    std::lock_guard lock(in.mutex);
    queued.swap(in.queued);
  }
  for (const auto& [space, changes] : queued)
    changes.apply(core.space(space).directory, shard::directory::unnamed_tp);
}

standby_core::standby_core(pipeline::node& nd, int core, std::uint64_t leader_lsn,
                           binding_feed& feed)
    : node_(nd),
      core_(core),
      log_(nd.core[core]->log),
      leader_base_(leader_lsn),
      local_base_(log_.end()),
      feed_(feed),
      replayer_(nd, core, out_, store::file_sizes{}) {
  METAD_ASSERT(log_.idle());  // nothing of this node's own is queued in its log
  replayer_.track_changes();
}

void standby_core::receive(std::string_view frames) {
  // The log first: what is applied is also on its way to the disk, exactly as on the
  // leader (its state changes before its records are durable, never after).
  log_.pending().append(frames);
  pipeline::core_state& core = *node_.core[core_];
  replayer_.set_now(node_.clock());  // a reservation's TTL runs from about the leader's time
  const bool whole = store::scan_checked(frames, [&](const store::record& r, std::size_t) {
    if (r.kind == store::record_kind::clear) {
      // Recovery starts after a core's last clear (a tenant's scoped clear: after its
      // last one, for that tenant's records); a live replay drops what came before it,
      // of every vLLM space for a bare clear (SGLang's pools outlive it: their images
      // follow in the log), of the tenant's own for a scoped one. Every confirmed binding
      // of this core's ranks there is lost (counted off in its owner's slice), and this
      // core's slice forgets every key's tp_world_size; the counts of other cores'
      // bindings stay until their own clear arrives.
      const int only = r.scoped ? replayer_.space_of(r) : -1;
      replayer_.collect_bindings(/*lost=*/true, only);
      core.for_each_space([&](pipeline::vllm_space& sp) {
        if (only < 0 || sp.id == only) sp.ranks.clear();
      });
      hand_over();  // the losses reach their owners before anything after the clear
      core.for_each_space([&](pipeline::vllm_space& sp) {
        if (only < 0 || sp.id == only) sp.directory.restore_forget_all();
      });
      return;
    }
    replayer_.apply(r);
  });
  if (!whole) throw std::runtime_error("replication: frames that were checked no longer decode");
  hand_over();
}

// This core's binding changes so far: its own slice's counted at once, the others' posted
// to their owners; then what the other cores posted here.
void standby_core::hand_over() {
  for (std::size_t space = 0; space < out_.by_space.size(); ++space) {
    for (std::size_t owner = 0; owner < out_.by_space[space].size(); ++owner) {
      binding_changes& changes = out_.by_space[space][owner];
      if (changes.empty()) continue;
      if (static_cast<int>(owner) == core_) {
        changes.apply(node_.core[core_]->space(static_cast<int>(space)).directory,
                      shard::directory::unnamed_tp);
        changes.clear();
      } else {
        feed_.post(static_cast<int>(owner), static_cast<int>(space), std::move(changes));
        changes = binding_changes{};
      }
    }
  }
  drain_feed();
}

void standby_core::drain_feed() { feed_.drain(core_, *node_.core[core_]); }

void promote_standby(pipeline::node& nd, std::vector<std::unique_ptr<standby_core>>& cores,
                     binding_feed& feed) {
  METAD_ASSERT(cores.size() == static_cast<std::size_t>(nd.cores));
  const auto began = std::chrono::steady_clock::now();
  const auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  const std::int64_t ranks = count_worker_ranks(nd);
  // Each core's slice: what other cores posted and it has not counted yet, then the
  // staged directory finished (O(keys)); one thread per core, as recovery does.
  std::vector<std::size_t> guessed(cores.size());
  on_every_core(nd, [&](int c) {
    const auto i = static_cast<std::size_t>(c);
    cores[i]->replay().end_bulk();
    feed.drain(c, *nd.core[c]);
    nd.core[c]->for_each_space([&](pipeline::vllm_space& sp) {
      guessed[i] += sp.directory.restore_finish(
          nd.clock(), static_cast<std::int32_t>(nd.tenants.worker_ranks(sp.id).load()));
    });
  });
  std::size_t assumed = 0;
  for (const std::size_t g : guessed) assumed += g;
  if (assumed)
    metad::log::warn("{} key(s) promoted without their tp_world_size record: assumed {}", assumed,
                     ranks);
  const double directory_ms = ms_since(began);
  // As recovery does: quarantines last their full time again, keys are leased.
  const std::uint64_t quarantine_until =
      nd.cfg.release_quarantine_ms == 0 ? 0
                                        : nd.clock() + nd.cfg.release_quarantine_ms * smp::kNsPerMs;
  std::uint64_t keys = 0;
  for (auto& core : nd.core) {
    core->for_each_space([&](pipeline::vllm_space& sp) {
      sp.ranks.restart_quarantines(quarantine_until);
      keys += sp.directory.size();
    });
    pipeline::restart_sg_quarantines(nd, *core);
    core->publish_incomplete();
  }
  if (keys > 0) nd.removal_floor = nd.clock() + nd.cfg.read_lease_ms * smp::kNsPerMs;
  // --tenants-file: each tenant's ranks=N and pages=N counts from the state replayed, as
  // after a restart (the standby served nothing: what it counted at its start is void).
  if (nd.tenants.enabled()) pipeline::count_tenant_usage(nd);
  // What promotion's time is made of (issue 35: it grows with the keys, no longer with
  // every binding).
  metad::log::info(
      "promotion: the directory of {} keys finished in {:.1f} ms, the rest done in {:.1f} ms", keys,
      directory_ms, ms_since(began) - directory_ms);
}

}  // namespace metad::persist
