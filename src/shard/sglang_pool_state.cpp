#include "shard/sglang_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "metad/assert.hpp"

// sglang_pool's whole-state views: counters, the consistency check, and the image a
// snapshot saves and restore() rebuilds the pool from.
namespace metad::shard {

sglang_pool_stats sglang_pool::stats() const {
  const auto in_flight = static_cast<std::uint32_t>(owners_.size());
  const auto quarantined = static_cast<std::uint32_t>(quarantine_.size());
  return sglang_pool_stats{pages_.num_pages(),
                           pages_.free_count() + quarantined,
                           in_flight,
                           static_cast<std::uint32_t>(pages_.bound_count()),
                           pages_.reserved_count() - in_flight - quarantined,
                           key_count_,
                           quarantined};
}

std::size_t sglang_pool::memory_bytes() const {
  std::size_t key_bytes = 0;  // heap copies of keys not packed
  for (std::size_t i = 1; i < nodes_.size(); ++i) {
    if (nodes_[i].shape == static_cast<std::uint8_t>(key_shape::other)) {
      key_bytes += sizeof(std::uint32_t) +
                   key_blob::view(reinterpret_cast<const char*>(nodes_[i].key[0])).size();
    }
  }
  return pages_.memory_bytes() + free_.memory_bytes() + buckets_.capacity() * 4 + key_bytes +
         nodes_.size() * sizeof(node) + owners_.size() * 2 * (sizeof(owner) + 8) +
         quarantine_.size() * (sizeof(quarantined_page) + 16);
}

namespace {

// Pages some structure holds, sorted: the first repeated one, or UINT64_MAX.
std::uint64_t first_repeat(std::vector<std::uint64_t>& pages) {
  std::sort(pages.begin(), pages.end());
  auto it = std::adjacent_find(pages.begin(), pages.end());
  return it == pages.end() ? UINT64_MAX : *it;
}

// Whether sorted, disjoint runs cover `page`.
bool in_runs(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& sorted,
             std::uint64_t page) {
  auto it = std::upper_bound(sorted.begin(), sorted.end(), std::make_pair(page, UINT64_MAX));
  return it != sorted.begin() && page < std::prev(it)->second;
}

// Sorts the runs; false if one is empty, out of 0..n-1, or two overlap. `total` gets
// the pages they cover.
bool sorted_disjoint(std::vector<std::pair<std::uint64_t, std::uint64_t>>& runs, std::uint64_t n,
                     std::uint64_t& total) {
  std::sort(runs.begin(), runs.end());
  total = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].first >= runs[i].second || runs[i].second > n) return false;
    if (i > 0 && runs[i].first < runs[i - 1].second) return false;
    total += runs[i].second - runs[i].first;
  }
  return true;
}

}  // namespace

std::string sglang_pool::check() const {
  if (std::string e = pages_.check(); !e.empty()) return "page states: " + e;
  const std::uint64_t n = num_pages();
  if (free_.size() != pages_.free_count()) {
    return fmt::format("free stack holds {} pages, the pool {}", free_.size(), pages_.free_count());
  }
  // The free stack's runs are disjoint, in range and hold no page that is not free; with
  // the counts equal, every free page is in it exactly once.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;
  runs.reserve(free_.run_count());
  free_.for_each_run([&](std::uint64_t lo, std::uint64_t hi) { runs.emplace_back(lo, hi); });
  std::uint64_t covered = 0;
  if (!sorted_disjoint(runs, n, covered) || covered != free_.size())
    return "free stack runs overlap, are empty or out of range";
  std::string problem;
  pages_.for_each_held([&](std::uint64_t p, page_state) {
    if (problem.empty() && in_runs(runs, p))
      problem = fmt::format("free stack page {} is not free", p);
  });
  if (!problem.empty()) return problem;
  std::vector<std::uint64_t> seen;  // pages held by a key, a reservation or the quarantine
  std::size_t listed = 0;
  for (std::uint32_t i = nodes_[0].next, prev = 0; i != 0; prev = i, i = nodes_[i].next) {
    if (++listed > key_count_) return "LRU list longer than the key map";
    const node& nd = nodes_[i];
    if (nd.prev != prev) return fmt::format("LRU node {}: broken prev link", i);
    if (nd.shape == free_shape) return fmt::format("LRU node {}: holds no key", i);
    // The key as a client would send it finds this node: packing round-trips.
    const std::string key = key_of(nd);
    if (find(make_probe(key)) != i) return fmt::format("LRU node {}: key map disagrees", i);
    if (nd.page() >= n || pages_.state(nd.page()) != page_state::bound) {
      return fmt::format("key '{}': page {} out of range or not bound", key, nd.page());
    }
    seen.push_back(nd.page());
  }
  if (listed != key_count_ || listed != pages_.bound_count()) {
    return fmt::format("{} keys listed, {} in the map, {} pages bound", listed, key_count_,
                       pages_.bound_count());
  }
  owners_.for_each([&](std::uint64_t p, const owner& o) {
    if (!problem.empty()) return;
    if (p >= n || pages_.state(p) != page_state::reserved || o.blob == nullptr) {
      problem = fmt::format("in-flight page {} out of range or not reserved", p);
    }
    seen.push_back(p);
  });
  if (!problem.empty()) return problem;
  if (in_quarantine_.size() != quarantine_.size()) {
    return fmt::format("{} pages quarantined, {} marked", quarantine_.size(),
                       in_quarantine_.size());
  }
  for (const quarantined_page& q : quarantine_) {
    const std::uint64_t p = q.page;
    if (p >= n || pages_.state(p) != page_state::reserved || !in_quarantine(p)) {
      return fmt::format("quarantined page {} out of range, not reserved or not marked", p);
    }
    seen.push_back(p);
  }
  if (const std::uint64_t p = first_repeat(seen); p != UINT64_MAX)
    return fmt::format("page {} is held twice", p);
  return problem;
}

std::string sglang_pool::verify() const {
  if (std::string e = check(); !e.empty()) return "sglang_pool: " + e;
  const auto fail = [](std::string what) { return "sglang_pool: " + what; };
  // The expiry queue: in deadline order, and exactly one live entry per reservation
  // with a deadline.
  std::size_t live_entries = 0;
  for (std::size_t k = 0; k < expiry_.size(); ++k) {
    const expiry_entry& e = expiry_[k];
    if (k > 0 && expiry_[k - 1].deadline > e.deadline)
      return fail(fmt::format("expiry entry {} is due before the one ahead of it", k));
    if (e.serial == 0 || e.serial > serial_)
      return fail(
          fmt::format("expiry entry {} has serial {}, past the last {}", k, e.serial, serial_));
    if (!live(e)) continue;
    ++live_entries;
    if (owners_.find(e.page).deadline != e.deadline)
      return fail(fmt::format("page {}'s expiry entry disagrees with its deadline", e.page));
  }
  std::size_t with_deadline = 0;
  std::string problem;
  owners_.for_each([&](std::uint64_t page, const owner& o) {
    if (!problem.empty()) return;
    if (o.epoch > epoch_) {
      problem =
          fmt::format("in-flight page {} has epoch {}, past the pool's {}", page, o.epoch, epoch_);
    } else if (o.serial > serial_) {
      problem =
          fmt::format("in-flight page {} has serial {}, past the last {}", page, o.serial, serial_);
    }
    with_deadline += o.deadline != no_deadline ? 1 : 0;
  });
  if (!problem.empty()) return fail(problem);
  if (live_entries != with_deadline)
    return fail(fmt::format("{} reservations with a deadline, {} live expiry entries",
                            with_deadline, live_entries));
  // The node pool: the sentinel, the listed nodes (check() counted them) and the free chain.
  std::size_t free_nodes = 0;
  for (std::uint32_t i = free_nodes_; i != 0; i = nodes_[i].next) {
    if (i >= nodes_.size() || ++free_nodes > nodes_.size())
      return fail("the free node chain leaves the nodes or loops");
  }
  if (1 + key_count_ + free_nodes != nodes_.size())
    return fail(fmt::format("{} nodes: 1 sentinel, {} listed, {} free (a node is lost)",
                            nodes_.size(), key_count_, free_nodes));
  return {};
}

sglang_image sglang_pool::image() const {
  sglang_image img;
  img.num_pages = num_pages();
  img.epoch = epoch_;
  img.free.reserve(free_.run_count());
  free_.for_each_run([&](std::uint64_t lo, std::uint64_t hi) { img.free.emplace_back(lo, hi); });
  for (std::uint32_t i = nodes_[0].next; i != 0; i = nodes_[i].next) {
    img.bound.emplace_back(key_of(nodes_[i]), nodes_[i].page());
  }
  // Reservations with a deadline in their expiry order (each live once: serials are
  // unique), then the others by page.
  auto add = [&](std::uint64_t page, const owner& o) {
    img.reserved.push_back({page, std::string(key_blob::view(o.blob)), o.epoch, o.deadline});
  };
  for (const expiry_entry& e : expiry_) {
    if (live(e)) add(e.page, owners_.find(e.page));
  }
  std::vector<std::uint64_t> rest;
  owners_.for_each([&](std::uint64_t page, const owner& o) {
    if (o.deadline == no_deadline) rest.push_back(page);
  });
  std::sort(rest.begin(), rest.end());
  for (std::uint64_t page : rest) add(page, owners_.find(page));
  img.quarantined.reserve(quarantine_.size());
  for (const quarantined_page& q : quarantine_) img.quarantined.push_back(q.page);
  return img;
}

bool sglang_pool::restore(const sglang_image& img, const sglang_config& config, sglang_pool& out,
                          std::string& error) {
  if (img.num_pages > pages_max) {
    error = fmt::format("num_pages {} exceeds {}", img.num_pages, pages_max);
    return false;
  }
  // Validate everything before building anything: the free runs are disjoint and in
  // range, and every listed page is in range and listed once (free runs included).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> free_runs = img.free;
  std::uint64_t free_total = 0;
  if (!sorted_disjoint(free_runs, img.num_pages, free_total)) {
    error = fmt::format("free pages out of range (num_pages {}) or listed twice", img.num_pages);
    return false;
  }
  std::vector<std::uint64_t> held;  // bound, in flight and quarantined pages
  auto claim = [&](std::uint64_t page, const char* list) {
    if (page >= img.num_pages) {
      error = fmt::format("{} page {} is out of range (num_pages {})", list, page, img.num_pages);
      return false;
    }
    if (in_runs(free_runs, page)) {
      error = fmt::format("{} page {} is listed twice", list, page);
      return false;
    }
    held.push_back(page);
    return true;
  };
  std::unordered_set<std::string_view> keys;
  for (const auto& [key, page] : img.bound) {
    if (!claim(page, "bound")) return false;
    if (!keys.insert(key).second) {
      error = fmt::format("bound key '{}' is listed twice", key);
      return false;
    }
  }
  std::uint64_t last_deadline = 0;
  for (const auto& r : img.reserved) {
    if (!claim(r.page, "reserved")) return false;
    // A reservation is of the pool's clear-epoch or an earlier one (a write that a clear
    // made stale); one of a later epoch could bind after a clear.
    if (r.epoch > img.epoch) {
      error = fmt::format("reserved page {}: epoch {} is past the pool's {}", r.page, r.epoch,
                          img.epoch);
      return false;
    }
    if (r.deadline != no_deadline) {
      if (r.deadline < last_deadline) {
        error = fmt::format("reserved page {}: deadlines out of order", r.page);
        return false;
      }
      last_deadline = r.deadline;
    }
  }
  for (std::uint64_t p : img.quarantined) {
    if (!claim(p, "quarantined")) return false;
  }
  std::vector<std::uint64_t> sorted_held = held;
  if (const std::uint64_t p = first_repeat(sorted_held); p != UINT64_MAX) {
    error = fmt::format("page {} is listed twice", p);
    return false;
  }
  const std::uint64_t unowned = img.num_pages - free_total - sorted_held.size();
  if (unowned > unowned_max) {
    error = fmt::format("{} pages are listed nowhere (more than {})", unowned, unowned_max);
    return false;
  }

  sglang_pool pool(0, config);
  pool.pages_.grow(img.num_pages);
  pool.epoch_ = img.epoch;
  // Every page starts free; take the ones that are not.
  for (const auto& [key, page] : img.bound) {
    pool.pages_.take(page);
    pool.pages_.bind(page);
    sglang_confirm_stats unused;
    pool.bind_key(make_probe(key), page, unused);
  }
  for (const auto& r : img.reserved) {
    pool.pages_.take(r.page);
    const owner o{key_blob::make(r.key), r.epoch, r.deadline, ++pool.serial_};
    pool.owners_.insert(r.page, o);
    pool.push_expiry(r.page, o);
  }
  for (std::uint64_t p : img.quarantined) {
    pool.pages_.take(p);
    pool.quarantine(p, no_deadline);
  }
  // Unowned: neither free, bound, in flight nor quarantined; the gaps between the free
  // runs less the pages listed.
  std::uint64_t lo = 0;
  std::size_t h = 0;
  auto take_gap = [&](std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t p = from; p < to; ++p) {
      while (h < sorted_held.size() && sorted_held[h] < p) ++h;
      if (h < sorted_held.size() && sorted_held[h] == p) continue;
      pool.pages_.take(p);
    }
  };
  for (const auto& [a, b] : free_runs) {
    if (a > lo) take_gap(lo, a);
    lo = b;
  }
  take_gap(lo, img.num_pages);  // the gaps hold at most unowned_max + held pages
  for (const auto& [a, b] : img.free) pool.free_.push_range(a, b);
  out = std::move(pool);
  return true;
}

}  // namespace metad::shard
