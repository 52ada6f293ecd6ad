// Page lifecycle beyond the reference server: reservations that expire, keys deleted on
// request, stale incomplete keys reclaimed, and least-recently-used eviction when a
// rank's pool runs out. Expiry is local to a rank's core; delete, reclamation and
// eviction walk the cores that own the keys' directory slices and every core with
// ranks: begin at the directories (the key reads as missing from then on; leased keys
// are refused), drop the bindings on every rank, then settle the directories. Every
// change is logged where it happens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "pipeline/connection.hpp"
#include "smp/request_task.hpp"

namespace metad::pipeline {

// On core `core`'s thread, every loop tick and when an allocation comes up short:
// returns reservations past their deadline to the pool (logging them) and forgets ended
// leases. Returns how many reservations expired.
std::size_t expire_due(node& nd, core_state& core);

// On the owner core of `rank`, on which it ends: evicts, on every rank of vLLM space
// `space` (a tenant's own keys only), the
// `need` least recently used complete keys without a read lease that `rank` holds a page
// for — or nothing, if there are not that many. Returns how many keys left; `stored`
// turns false if a core's log could not take the change.
smp::subtask<std::size_t> evict(node& nd, int space, std::int64_t rank, std::uint32_t need,
                                removal_job& job, bool& stored);

// --incomplete-grace-ms in the clock's unit (0: stale keys are never reclaimed).
std::uint64_t stale_grace_ns(const node& nd);
// Whether some core's directory slice may hold an incomplete key last confirmed age_ns
// ago or earlier, as the cores last published it (a cheap check before a walk).
bool incomplete_keys_older_than(const node& nd, std::uint64_t age_ns);

// From the core it is called on, on which it ends: removes up to `want` incomplete keys of space
// `space` (a tenant's own keys only) in the
// directory slice of core `from` (-1: of every core, one slice after another) last confirmed age_ns
// ago or earlier, each slice's least recently confirmed first, for which no rank holds a
// reservation (a writer at work keeps its key, which is looked at again age_ns later). With age_ns
// the grace they are *stale*: no writer will complete them and no reader can use them, so their
// pages are freed on every rank, as a delete would; eviction also takes younger ones when nothing
// complete is left to evict. `kind` counts them. Returns how many keys left; `stored`
// turns false if a core's log could not take the change.
// With short_rank (owned by the calling core), only keys holding a page on that rank are taken (an
// eviction for it); the others keep their place.
smp::subtask<std::size_t> reclaim_incomplete(node& nd, int space, int from, std::size_t want,
                                             std::uint64_t age_ns, removal_kind kind,
                                             removal_job& job, bool& stored,
                                             const std::int64_t* short_rank = nullptr);

// One core's background reclamation: at most one walk at a time.
struct stale_sweeper {
  removal_job job;
  bool running = false;  // a walk is under way (the loop must not exit before it ends)
};
// On core `core`'s thread, every loop tick: publishes the core's oldest incomplete key
// and, if its slice holds stale keys, starts a walk that reclaims a bounded batch of
// them (it runs on while the loop serves; `sweeper.running` until it ends).
void reclaim_stale_due(node& nd, core_state& core, stale_sweeper& sweeper);

// POST /keys/delete's work, from `home`, on which it ends: removes s.remove.keys from
// every directory slice and rank, retrying (a few passes) keys that another removal
// holds. Returns how many keys left; `stored` turns false if a core's log could not take
// the change.
smp::subtask<std::size_t> delete_keys(node& nd, int home, scratch& s, bool& stored);

}  // namespace metad::pipeline
