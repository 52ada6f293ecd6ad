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
                           pages_.bound_count(),
                           pages_.reserved_count() - in_flight - quarantined,
                           keys_.size(),
                           quarantined};
}

std::size_t sglang_pool::memory_bytes() const {
  return pages_.memory_bytes() + free_.memory_bytes() + keys_.memory_bytes() +
         nodes_.size() * sizeof(node) + owners_.size() * 2 * (sizeof(owner) + 8) +
         quarantine_.size() * (sizeof(quarantined_page) + 16);
}

std::string sglang_pool::check() const {
  if (std::string e = pages_.check(); !e.empty()) return "page_pool: " + e;
  const std::uint32_t n = num_pages();
  std::vector<std::uint8_t> seen(n, 0);
  std::string problem;
  if (free_.size() != pages_.free_count()) {
    return fmt::format("free stack holds {} pages, the pool {}", free_.size(), pages_.free_count());
  }
  free_.for_each([&](std::uint32_t p) {
    if (!problem.empty()) return;
    if (p >= n || seen[p] != 0 || pages_.state(p) != page_state::free) {
      problem = fmt::format("free stack page {} is out of range, repeated or not free", p);
    }
    if (p < n) seen[p] = 1;
  });
  if (!problem.empty()) return problem;
  std::size_t listed = 0;
  for (std::uint32_t i = nodes_[0].next, prev = 0; i != 0; prev = i, i = nodes_[i].next) {
    if (++listed > keys_.size()) return "LRU list longer than the key map";
    const node& nd = nodes_[i];
    if (nd.prev != prev) return fmt::format("LRU node {}: broken prev link", i);
    const std::string_view key = key_blob::view(nd.blob);
    if (find(key, table_hash(key)) != i) return fmt::format("LRU node {}: key map disagrees", i);
    if (nd.page >= n || seen[nd.page] != 0 || pages_.state(nd.page) != page_state::bound) {
      return fmt::format("key '{}': page {} out of range, shared or not bound", key, nd.page);
    }
    seen[nd.page] = 1;
  }
  if (listed != keys_.size() || listed != pages_.bound_count()) {
    return fmt::format("{} keys listed, {} in the map, {} pages bound", listed, keys_.size(),
                       pages_.bound_count());
  }
  owners_.for_each([&](std::uint32_t p, const owner& o) {
    if (!problem.empty()) return;
    if (p >= n || seen[p] != 0 || pages_.state(p) != page_state::reserved || o.blob == nullptr) {
      problem = fmt::format("in-flight page {} out of range, shared or not reserved", p);
    }
    if (p < n) seen[p] = 1;
  });
  if (!problem.empty()) return problem;
  if (in_quarantine_.size() != quarantine_.size()) {
    return fmt::format("{} pages quarantined, {} marked", quarantine_.size(),
                       in_quarantine_.size());
  }
  for (const quarantined_page& q : quarantine_) {
    const std::uint32_t p = q.page;
    if (p >= n || seen[p] != 0 || pages_.state(p) != page_state::reserved || !in_quarantine(p)) {
      return fmt::format("quarantined page {} out of range, shared, not reserved or not marked", p);
    }
    seen[p] = 1;
  }
  return problem;
}

sglang_image sglang_pool::image() const {
  sglang_image img;
  img.num_pages = num_pages();
  img.epoch = epoch_;
  img.free.reserve(free_.size());
  free_.for_each([&](std::uint32_t p) { img.free.push_back(p); });
  for (std::uint32_t i = nodes_[0].next; i != 0; i = nodes_[i].next) {
    img.bound.emplace_back(std::string(key_blob::view(nodes_[i].blob)), nodes_[i].page);
  }
  // Reservations with a deadline in their expiry order (each live once: serials are
  // unique), then the others by page.
  auto add = [&](std::uint32_t page, const owner& o) {
    img.reserved.push_back({page, std::string(key_blob::view(o.blob)), o.epoch, o.deadline});
  };
  for (const expiry_entry& e : expiry_) {
    if (live(e)) add(e.page, owners_.find(e.page));
  }
  std::vector<std::uint32_t> rest;
  owners_.for_each([&](std::uint32_t page, const owner& o) {
    if (o.deadline == no_deadline) rest.push_back(page);
  });
  std::sort(rest.begin(), rest.end());
  for (std::uint32_t page : rest) add(page, owners_.find(page));
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
  // Validate everything before building anything.
  std::vector<std::uint8_t> seen(img.num_pages, 0);
  auto claim = [&](std::uint32_t page, const char* list) {
    if (page >= img.num_pages) {
      error = fmt::format("{} page {} is out of range (num_pages {})", list, page, img.num_pages);
      return false;
    }
    if (seen[page] != 0) {
      error = fmt::format("{} page {} is listed twice", list, page);
      return false;
    }
    seen[page] = 1;
    return true;
  };
  for (std::uint32_t p : img.free) {
    if (!claim(p, "free")) return false;
  }
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
    if (r.deadline != no_deadline) {
      if (r.deadline < last_deadline) {
        error = fmt::format("reserved page {}: deadlines out of order", r.page);
        return false;
      }
      last_deadline = r.deadline;
    }
  }
  for (std::uint32_t p : img.quarantined) {
    if (!claim(p, "quarantined")) return false;
  }

  sglang_pool pool(0, config);
  pool.pages_.grow(img.num_pages);
  pool.epoch_ = img.epoch;
  // Every page starts free in page_pool; take the ones that are not.
  for (const auto& [key, page] : img.bound) {
    pool.pages_.take(page);
    pool.pages_.bind(page);
    sglang_confirm_stats unused;
    pool.bind_key(key, table_hash(key), page, unused);
  }
  for (const auto& r : img.reserved) {
    pool.pages_.take(r.page);
    const owner o{key_blob::make(r.key), r.epoch, r.deadline, ++pool.serial_};
    pool.owners_.insert(r.page, o);
    pool.push_expiry(r.page, o);
  }
  for (std::uint32_t p : img.quarantined) {
    pool.pages_.take(p);
    pool.quarantine(p, no_deadline);
  }
  for (std::uint32_t p = 0; p < img.num_pages; ++p) {
    if (seen[p] == 0) pool.pages_.take(p);  // unowned: neither free, bound nor in flight
  }
  for (std::uint32_t p : img.free) pool.free_.push(p);
  out = std::move(pool);
  return true;
}

}  // namespace metad::shard
