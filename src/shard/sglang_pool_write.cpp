#include "shard/sglang_pool.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "metad/assert.hpp"
#include "shard/verify.hpp"

// sglang_pool's writes besides reserve: confirm_write (validated whole, then applied in
// order), delete_keys and clear. See the header for the rules.
namespace metad::shard {

namespace {

// The first page of `pages` outside 0..n-1, as an index, or npos.
constexpr std::size_t npos = ~std::size_t{0};
std::size_t out_of_range(std::span<const std::int64_t> pages, std::uint64_t n) {
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0 || static_cast<std::uint64_t>(pages[i]) >= n) return i;
  }
  return npos;
}

}  // namespace

bool sglang_pool::validate_confirm(std::span<const std::int64_t> pages,
                                   std::span<const std::int64_t> releases, std::string& detail) {
  const std::uint64_t n = num_pages();
  if (const std::size_t i = out_of_range(pages, n); i != npos) {
    detail = fmt::format(
        "Page {} at index {} of written_keys_to_confirm is out of range: the pool has {} pages",
        pages[i], i, n);
    return false;
  }
  if (const std::size_t i = out_of_range(releases, n); i != npos) {
    detail = fmt::format(
        "Page {} at index {} of pages_to_release is out of range: the pool has {} pages",
        releases[i], i, n);
    return false;
  }
  if (pages.empty() || releases.empty()) return true;
  sorted_.assign(pages.begin(), pages.end());
  std::sort(sorted_.begin(), sorted_.end());
  for (std::int64_t p : releases) {
    if (std::binary_search(sorted_.begin(), sorted_.end(), p)) {
      detail = fmt::format("Page {} is both confirmed and released", p);
      return false;
    }
  }
  return true;
}

void sglang_pool::apply_confirmation(std::string_view key, std::uint64_t page,
                                     sglang_confirm_stats& stats) {
  const probe k = make_probe(key);
  switch (pages_.state(page)) {
    case page_state::free:
      ++stats.skipped;
      return;
    case page_state::bound: {
      const std::uint32_t node_index = find(k);
      if (node_index == 0 || nodes_[node_index].page() != page) {
        ++stats.skipped;  // another key's page
        return;
      }
      bind_key(k, page, stats);  // the same binding: moves to the MRU end
      ++stats.bound;
      return;
    }
    case page_state::reserved: {
      const owner o = owners_.find(page);
      if (o.blob == nullptr && in_quarantine(page)) {
        ++stats.skipped;  // released, held for no key until its quarantine ends
        return;
      }
      if (o.blob != nullptr && key_blob::view(o.blob) != key) {
        ++stats.skipped;  // in flight for another key
        return;
      }
      if (o.blob != nullptr && o.epoch != epoch_) {
        free_in_flight(page);  // reserved before a clear: never bound (B17)
        ++stats.stale;
        return;
      }
      if (o.blob != nullptr) key_blob::destroy(const_cast<char*>(owners_.take(page).blob));
      pages_.bind(page);  // in flight for this key, or unowned
      bind_key(k, page, stats);
      ++stats.bound;
      return;
    }
  }
}

void sglang_pool::apply_release(std::uint64_t page, std::uint64_t quarantine_until,
                                sglang_confirm_stats& stats) {
  switch (pages_.state(page)) {
    case page_state::free:
      ++stats.release_noop;
      return;
    case page_state::bound:
      ++stats.release_refused;
      return;
    case page_state::reserved:
      if (in_quarantine(page)) {  // released already (a replay): it stays quarantined
        ++stats.release_noop;
        return;
      }
      ++stats.released;
      if (quarantine_until == 0) {
        free_in_flight(page);
      } else {
        quarantine(page, quarantine_until);
        ++stats.quarantined;
      }
      return;
  }
}

sglang_confirm_outcome sglang_pool::confirm(std::span<const std::string_view> keys,
                                            std::span<const std::int64_t> pages,
                                            std::span<const std::int64_t> releases,
                                            std::uint64_t now, std::string& detail,
                                            sglang_confirm_stats& stats,
                                            std::uint64_t quarantine_until) {
  METAD_ASSERT(keys.size() == pages.size());
  // Validate the whole request before changing anything (B9), expiry included.
  if (!validate_confirm(pages, releases, detail)) return sglang_confirm_outcome::bad_request;
  stats.expired = static_cast<std::uint32_t>(expire(now));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    apply_confirmation(keys[i], static_cast<std::uint64_t>(pages[i]), stats);
  }
  for (std::int64_t r : releases)
    apply_release(static_cast<std::uint64_t>(r), quarantine_until, stats);
  METAD_VERIFY_AFTER("sglang_pool::confirm", verify_size(), verify());
  return sglang_confirm_outcome::ok;
}

std::size_t sglang_pool::delete_keys(std::span<const std::string_view> keys) {
  std::size_t dropped = 0;
  for (std::string_view key : keys) {
    const std::uint32_t i = find(make_probe(key));
    if (i == 0) continue;
    const std::uint64_t page = drop_node(i);
    pages_.free_bound(page);
    free_.push(page);
    ++dropped;
  }
  METAD_VERIFY_AFTER("sglang_pool::delete_keys", verify_size(), verify());
  return dropped;
}

void sglang_pool::clear() {
  ++epoch_;
  release_keys();
  buckets_.clear();
  key_count_ = 0;
  nodes_.clear();
  nodes_.emplace_back();
  free_nodes_ = 0;
  // The free stack becomes [0..n-1] minus the pages still reserved (in flight,
  // quarantined or unowned), ascending: as runs between them, whatever n is. Unowned
  // pages (only after a restore) become free too, as in the reference.
  const std::uint64_t n = num_pages();
  std::vector<std::uint64_t> held;
  held.reserve(owners_.size() + quarantine_.size());
  owners_.for_each([&](std::uint64_t page, const owner&) { held.push_back(page); });
  for (const quarantined_page& q : quarantine_) held.push_back(q.page);
  std::sort(held.begin(), held.end());
  pages_ = sparse_pages(n);
  free_.clear();
  std::uint64_t lo = 0;
  for (std::uint64_t page : held) {
    pages_.take(page);
    free_.push_range(lo, page);
    lo = page + 1;
  }
  free_.push_range(lo, n);
  METAD_VERIFY_AFTER("sglang_pool::clear", verify_size(), verify());
}

}  // namespace metad::shard
