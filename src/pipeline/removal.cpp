#include "pipeline/removal.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "metad/assert.hpp"
#include "pipeline/endpoints.hpp"
#include "pipeline/walk.hpp"
#include "store/record.hpp"

namespace metad::pipeline {

void removal_job::seal(const node& nd) {
  keys.clear();
  std::uint32_t begin = 0;
  for (const std::uint32_t end : ends) {
    keys.emplace_back(bytes.data() + begin, end - begin);
    begin = end;
  }
  owner.resize(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i)
    owner[i] = static_cast<std::uint16_t>(nd.key_owner(keys[i]));
  bindings.assign(keys.size(), 0);
}

void removal_job::keep_members(const node& nd) {
  // In place: a kept key only moves towards the front.
  std::size_t bytes_kept = 0, kept = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!member[i]) continue;
    std::memmove(bytes.data() + bytes_kept, keys[i].data(), keys[i].size());
    bytes_kept += keys[i].size();
    ends[kept] = static_cast<std::uint32_t>(bytes_kept);
    used[kept] = used[i];
    ++kept;
  }
  bytes.resize(bytes_kept);
  ends.resize(kept);
  used.resize(kept);
  member.assign(kept, 1);
  seal(nd);
}

std::size_t expire_due(node& nd, core_state& core) {
  const std::uint64_t now = nd.clock();
  expire_sg_due(nd, core);  // SGLang's pools: not counted here (vLLM's ranks only)
  std::size_t freed = 0;
  core.for_each_space([&](vllm_space& sp) {
    sp.directory.sweep(now);
    shard::rank_table& ranks = sp.ranks;
    if (ranks.rank_count() == 0) return;
    // At most one record of each kind per rank (each scoped to the tenant: kScopeBytes),
    // of 8 bytes per page.
    if (core.journal.reserve((64 + 2 * kScopeBytes) * ranks.rank_count() +
                             8 * (ranks.reserved_pages() + ranks.quarantined_pages()))) {
      freed +=
          ranks.end_quarantines(now, [&](std::int64_t rank, std::span<const std::int64_t> pages) {
            core.journal.quarantine_end(sp.tenant, rank, pages);
          });
      if (nd.cfg.reservation_ttl_ms != 0)
        freed += ranks.expire(now, [&](std::int64_t rank, std::span<const std::int64_t> pages) {
          core.journal.release(sp.tenant, rank, pages);
        });
    }
    // Expiries, and the tick's backstop: whatever freed this space's pages is added back.
    settle_vllm_pages(nd, core, sp);
  });
  return freed;
}

namespace {

// for_each_core's `wanted` for a walk over the directory's slices.
auto directory_core(const node& nd) {
  return [&nd](int c) { return c < nd.directory_cores; };
}
// for_each_core for a removal walk: it ends early (returns false) on the first core
// where `job` is no longer valid (a /clear has begun since the walk began), unvisited.
template <typename Wanted, typename Visit>
smp::subtask<bool> valid_walk(node& nd, int first, Wanted wanted, Visit visit,
                              const removal_job& job) {
  return smp::for_each_core(nd.mailbox, first, wanted, [&nd, &job, visit](int c) mutable {
    if (!job.valid(nd)) return false;
    visit(c);
    return true;
  });
}

// Drops every binding of job.keys on each core's ranks, then settles the keys'
// directory slices (whose removals were begun). Ends on the core it was called on.
smp::subtask<std::size_t> remove_everywhere(node& nd, removal_job& job, removal_kind kind,
                                            bool& stored) {
  const int start = smp::this_core();
  std::size_t left = 0;
  if (job.keys.empty()) co_return 0;
  METAD_ASSERT(job.owner.size() == job.keys.size() && job.bindings.size() == job.keys.size());
  // Sized here (on the walk's first core) so that the walk grows nothing elsewhere.
  job.removed.reserve(job.keys.size());
  job.removed_keys.reserve(job.keys.size());
  job.ranks.reserve(256);
  job.core_has_keys.assign(static_cast<std::size_t>(nd.cores), 0);
  for (const std::uint16_t c : job.owner) job.core_has_keys[c] = 1;
  // Not for_each_core (nor below): the second walk goes on from the first one's last
  // core, rather than from `start` again.
  for (const int c : smp::walk_from(start, nd.cores)) {
    co_await nd.mailbox.hop_to(c);
    if (!job.valid(nd)) break;  // a /clear drops everything: nothing left to settle
    core_state& core = *nd.core[c];
    vllm_space* sp = core.find_space(job.space);
    if (sp == nullptr || sp->ranks.rank_count() == 0) continue;
    if (!core.journal.reserve(sp->ranks.rank_count() * record_bytes(job.keys, 0))) {
      stored = false;  // the bindings stay; the directory below keeps the keys' counts
      continue;
    }
    job.ranks.clear();
    sp->ranks.for_each_rank(
        [&job](std::int64_t rank, const shard::rank_stats&) { job.ranks.push_back(rank); });
    for (const std::int64_t rank : job.ranks) {
      job.removed.clear();
      const bool found = sp->ranks.remove_confirmed(rank, job.keys, job.removed);
      METAD_ASSERT(found);  // listed on this core a moment ago
      if (job.removed.empty()) continue;
      job.removed_keys.clear();
      for (const std::uint32_t i : job.removed) {
        ++job.bindings[i];
        job.removed_keys.push_back(job.keys[i]);
      }
      core.journal.remove(sp->tenant, rank, job.removed_keys);
    }
    settle_vllm_pages(nd, core, *sp);  // deletes, evictions, stale keys: pages freed here
    if (!co_await core.journal.durable()) stored = false;
  }
  for (const int c : smp::walk_from(start, nd.cores)) {
    if (!job.core_has_keys[static_cast<std::size_t>(c)]) continue;
    co_await nd.mailbox.hop_to(c);
    if (!job.valid(nd)) break;
    core_state& core = *nd.core[c];
    vllm_space& sp = core.space(job.space);
    // Without room the directory still settles; only the record of a key leaving is
    // lost, and recovery derives the directory from the bindings anyway.
    const bool logged = core.journal.reserve(record_bytes(job.keys, kKeyRecordBytes));
    const std::uint64_t now = nd.clock();
    for (std::size_t i = 0; i < job.keys.size(); ++i) {
      if (job.owner[i] != c || !sp.directory.finish_removal(job.keys[i], job.bindings[i], now))
        continue;
      ++left;
      ++(kind == removal_kind::evicted ? core.evicted_keys
         : kind == removal_kind::stale ? core.stale_keys
                                       : core.deleted_keys);
      if (logged) core.journal.directory_remove(sp.tenant, job.keys[i]);
    }
    core.publish_incomplete();  // a key confirmed again meanwhile stays, incomplete
    if (!co_await core.journal.durable()) stored = false;
  }
  co_await nd.mailbox.hop_to(start);
  METAD_ASSERT(left <= job.keys.size());
  co_return left;
}

// An eviction looks at no more than this many keys beyond the ones it needs: keys that
// hold no page on the short rank (other engines' ranks, say) are passed over — put behind
// the others, so that each is passed over once per round of the list — and beyond this
// the allocation answers -1 rather than walk on.
constexpr std::size_t kPassedOverMax = 4096;

// Takes (begins the removal of) the `want` least recently used evictable keys over all
// directory slices into `job`. Ends on the core it was called on. Returns how many.
smp::subtask<std::size_t> take_oldest(node& nd, std::uint64_t now, std::size_t want,
                                      removal_job& job) {
  const int at = smp::this_core();
  const std::size_t before = job.ends.size();
  job.quota.assign(static_cast<std::size_t>(nd.cores), 0);
  if (nd.directory_cores == 1) {
    job.quota[0] = static_cast<std::uint32_t>(want);
  } else {
    // How many each slice gives: the `want` oldest over all of them.
    job.oldest.clear();
    const bool valid = co_await valid_walk(
        nd, at, directory_core(nd),
        [&](int c) {
          job.times.clear();
          nd.core[c]->space(job.space).directory.oldest_used(now, want, job.times);
          for (const std::uint64_t t : job.times)
            job.oldest.emplace_back(t, static_cast<std::uint16_t>(c));
        },
        job);
    if (!valid) co_return 0;
    const std::size_t n = std::min(want, job.oldest.size());
    std::nth_element(job.oldest.begin(), job.oldest.begin() + static_cast<std::ptrdiff_t>(n),
                     job.oldest.end());
    for (std::size_t i = 0; i < n; ++i) ++job.quota[job.oldest[i].second];
  }
  co_await valid_walk(
      nd, at, [&job](int c) { return job.quota[static_cast<std::size_t>(c)] != 0; },
      [&](int c) {
        nd.core[c]->space(job.space).directory.take_least_recent(
            now, job.quota[static_cast<std::size_t>(c)],
            [&job](std::string_view key, std::uint64_t used) { job.add(key, used); });
      },
      job);
  co_return job.ends.size() - before;
}

// Calls off the removal of the candidates not kept for eviction: the passed-over ones
// (not members) behind the others, and — when the eviction is called off — the members
// back in front, in their order. Ends on the core it was called on.
smp::subtask<bool> put_back(node& nd, removal_job& job, bool members_too) {
  return valid_walk(
      nd, smp::this_core(), directory_core(nd),
      [&nd, &job, members_too](int c) {
        shard::directory& dir = nd.core[c]->space(job.space).directory;
        for (std::size_t i = 0; i < job.keys.size(); ++i)
          if (job.owner[i] == c && !job.member[i])
            dir.abort_removal(job.keys[i], job.used[i], false);
        if (!members_too) return;
        for (std::size_t i = job.keys.size(); i-- > 0;)
          if (job.owner[i] == c && job.member[i]) dir.abort_removal(job.keys[i], job.used[i], true);
      },
      job);
}

// Of the members, keeps the `need` least recently used (a last round may bring more).
void keep_oldest_members(removal_job& job, std::size_t need) {
  job.times.clear();
  for (std::size_t i = 0; i < job.keys.size(); ++i)
    if (job.member[i]) job.times.push_back(job.used[i]);
  if (job.times.size() <= need) return;
  std::nth_element(job.times.begin(), job.times.begin() + static_cast<std::ptrdiff_t>(need - 1),
                   job.times.end());
  const std::uint64_t cutoff = job.times[need - 1];
  for (std::size_t i = 0, kept = 0; i < job.keys.size(); ++i) {
    if (!job.member[i]) continue;
    if (job.used[i] > cutoff || kept == need) {
      job.member[i] = 0;
    } else {
      ++kept;
    }
  }
}

}  // namespace

smp::subtask<std::size_t> evict(node& nd, int space, std::int64_t rank, std::uint32_t need,
                                removal_job& job, bool& stored) {
  const int at = smp::this_core();  // the rank's owner
  const std::uint64_t now = nd.clock();
  if (need == 0 || now < nd.removal_floor || !job.begin(nd, space)) co_return 0;
  job.bytes.reserve((need + 64) * 40);
  job.ends.reserve(need + 64);
  job.used.reserve(need + 64);
  job.member.reserve(need + 64);
  job.times.reserve(need + 64);
  job.oldest.reserve(static_cast<std::size_t>(need) * static_cast<std::size_t>(nd.cores));
  // Gather the least recently used keys until `need` of them hold a page on this rank
  // (`at` owns it): only those are evicted.
  std::size_t members = 0;
  while (members < need && job.ends.size() < need + kPassedOverMax) {
    const std::size_t first = job.ends.size();
    // Each round asks for as many as all before it together: log rounds.
    const std::size_t want =
        std::min(std::max<std::size_t>(need - members, first), need + kPassedOverMax - first);
    const std::size_t taken = co_await take_oldest(nd, now, want, job);
    if (taken == 0 || !job.valid(nd)) break;  // nothing evictable is left
    job.seal(nd);
    job.pages.assign(taken, -1);
    nd.core[at]->space(space).ranks.confirmed_pages(
        rank, std::span<const std::string_view>(job.keys).subspan(first), job.pages);
    for (std::size_t i = 0; i < taken; ++i) {
      job.member[first + i] = job.pages[i] >= 0 ? 1 : 0;
      members += job.member[first + i];
    }
  }
  if (job.keys.empty()) co_return 0;
  // Not enough to serve the allocation: evict nothing (it answers -1).
  const bool enough = members >= need;
  if (enough) keep_oldest_members(job, need);
  if (!co_await put_back(nd, job, !enough) || !enough) co_return 0;
  job.keep_members(nd);
  const std::size_t left = co_await remove_everywhere(nd, job, removal_kind::evicted, stored);
  co_return left;
}

std::uint64_t stale_grace_ns(const node& nd) {
  return std::uint64_t{nd.cfg.incomplete_grace_ms} * smp::kNsPerMs;
}

bool incomplete_keys_older_than(const node& nd, std::uint64_t age_ns) {
  const std::uint64_t now = nd.clock();
  if (now < age_ns) return false;
  for (const auto& core : nd.core)
    if (core->oldest_incomplete.load(std::memory_order_relaxed) <= now - age_ns) return true;
  return false;
}

smp::subtask<std::size_t> reclaim_incomplete(node& nd, int space, int from, std::size_t want,
                                             std::uint64_t age_ns, removal_kind kind,
                                             removal_job& job, bool& stored,
                                             const std::int64_t* short_rank) {
  const int at = smp::this_core();  // short_rank's owner, if any
  const std::uint64_t now = nd.clock();
  if (now < age_ns || want == 0 || !job.begin(nd, space)) co_return 0;
  const std::uint64_t cutoff = now - age_ns;
  // For a short rank, look further than `want`: the oldest may hold no page on it.
  const std::size_t look = short_rank == nullptr ? want : want + kPassedOverMax;
  job.bytes.reserve(look * 40);
  job.ends.reserve(look);
  job.used.reserve(look);
  job.member.reserve(look);
  job.pages.reserve(look);
  auto slices = [from](int c) { return from < 0 || c == from; };
  co_await valid_walk(
      nd, at, slices,
      [&](int c) {
        core_state& core = *nd.core[c];
        core.space(space).directory.take_stale(
            cutoff, look - job.ends.size(),
            [&job](std::string_view key, std::uint64_t confirmed) { job.add(key, confirmed); });
        core.publish_incomplete();
      },
      job);
  if (job.ends.empty()) co_return 0;
  job.seal(nd);
  // A key that some rank still holds a reservation for has a writer at work (a lagging
  // rank): it stays, and is looked at again age_ns later. `member` marks them here.
  co_await valid_walk(
      nd, at, smp::every_core,
      [&](int c) { nd.core[c]->space(space).ranks.mark_reserved(job.keys, job.member); }, job);
  if (!job.valid(nd)) co_return 0;
  // For a short rank (`at` owns it), only the oldest `want` of those holding a page on
  // it; the others go back where they were. pages[i] >= 0: key i is taken.
  job.pages.assign(job.keys.size(), 0);
  if (short_rank != nullptr)
    nd.core[at]->space(space).ranks.confirmed_pages(*short_rank, job.keys, job.pages);
  for (std::size_t i = 0, taken = 0; i < job.keys.size(); ++i) {
    if (job.member[i] || job.pages[i] < 0 || taken == want) {
      job.pages[i] = -1;
    } else {
      ++taken;
    }
  }
  co_await valid_walk(
      nd, at, slices,
      [&](int c) {
        shard::directory& dir = nd.core[c]->space(space).directory;
        const std::uint64_t now_here = nd.clock();
        // In reverse, so that the keys put back in front regain their order.
        for (std::size_t i = job.keys.size(); i-- > 0;) {
          if (job.owner[i] != c || job.pages[i] >= 0) continue;
          dir.abort_stale(job.keys[i], job.used[i], !job.member[i], now_here);
        }
        nd.core[c]->publish_incomplete();
      },
      job);
  if (!job.valid(nd)) co_return 0;
  for (std::size_t i = 0; i < job.keys.size(); ++i) job.member[i] = job.pages[i] >= 0 ? 1 : 0;
  job.keep_members(nd);
  co_return co_await remove_everywhere(nd, job, kind, stored);
}

namespace {

// The most stale keys one background walk reclaims: bounded work per tick, as the
// other sweeps (a walk's log record and removal lists stay small).
constexpr std::size_t kStaleBatch = 1024;

smp::request_task stale_walk(node& nd, int space, int c, stale_sweeper& sweeper) {
  bool stored = true;
  co_await reclaim_incomplete(nd, space, c, kStaleBatch, stale_grace_ns(nd), removal_kind::stale,
                              sweeper.job, stored);
  sweeper.running = false;
}

}  // namespace

void reclaim_stale_due(node& nd, core_state& core, stale_sweeper& sweeper) {
  core.publish_incomplete();
  const std::uint64_t grace = stale_grace_ns(nd);
  const std::uint64_t now = nd.clock();
  if (sweeper.running || grace == 0 || now < grace || nd.stopping.load()) return;
  // One walk at a time: the space whose slice here holds the oldest incomplete key.
  int oldest_space = -1;
  std::uint64_t oldest = now - grace;
  core.for_each_space([&](const vllm_space& sp) {
    const std::uint64_t t = sp.directory.oldest_incomplete();
    if (t <= oldest) {
      oldest = t;
      oldest_space = sp.id;
    }
  });
  if (oldest_space < 0) return;
  sweeper.running = true;
  stale_walk(nd, oldest_space, core.index, sweeper);
}

namespace {
// A delete retries keys that another removal holds (an eviction's candidate may be put
// back) this many times.
constexpr int kDeletePasses = 4;

}  // namespace

smp::subtask<std::size_t> delete_keys(node& nd, int home, scratch& s, bool& stored) {
  const api::key_list& keys = s.remove.keys;
  removal_job& job = s.removal;
  std::size_t key_bytes = 0;
  for (const std::string_view k : keys.views()) key_bytes += k.size();
  plan_directory_walk(nd, keys.views(), nullptr, 0, s);
  // s.flags: 1 while a key is still to be tried (it was busy in another removal).
  s.flags.assign(keys.size(), 1);
  std::size_t deleted = 0;
  for (int pass = 0; pass < kDeletePasses; ++pass) {
    if (!job.begin(nd, s.space)) break;
    job.bytes.reserve(key_bytes);
    job.ends.reserve(keys.size());
    job.used.reserve(keys.size());
    job.member.reserve(keys.size());
    bool busy = false;
    const std::uint64_t now = nd.clock();
    co_await valid_walk(
        nd, home, needed_by(s),
        [&](int c) {
          shard::directory& dir = nd.core[c]->space(s.space).directory;
          for (const std::uint32_t i : walk_of(s, c)) {
            if (!s.flags[i]) continue;
            const auto r = dir.begin_removal(keys[i], now);
            if (r == shard::directory::removal::started) job.add(keys[i]);
            s.flags[i] = r == shard::directory::removal::busy ? 1 : 0;
            busy = busy || s.flags[i];
          }
        },
        job);
    job.seal(nd);
    deleted += co_await remove_everywhere(nd, job, removal_kind::deleted, stored);
    if (!busy) break;
  }
  co_return deleted;
}

}  // namespace metad::pipeline
