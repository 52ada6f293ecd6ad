// The state one core owns: the page pools and key maps of its ranks (rank_table) and
// its slice of the key-completion directory (directory). Single-threaded by design:
// only the owning core calls these; other cores reach them through the mailbox.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shard {

// Rank r is owned by core r mod cores (non-negative for negative ranks too).
int owner_of_rank(std::int64_t rank, int cores);
// A stable 64-bit hash of a key; its directory slice is owned by core hash mod cores.
std::uint64_t key_hash(std::string_view key);
int owner_of_key(std::string_view key, int cores);

enum class init_outcome : std::uint8_t { created, unchanged, grown, shrink_refused };
struct init_result {
  init_outcome outcome;
  std::int64_t old_pages;  // the pool size before the call (0 if created)
};

enum class confirm_outcome : std::uint8_t { ok, not_initialized, bad_request };

struct rank_stats {
  std::int64_t num_pages, free, reserved, bound;
};

class rank_table {
 public:
  rank_table();
  ~rank_table();
  rank_table(rank_table&&) noexcept;
  rank_table& operator=(rank_table&&) noexcept;

  // num_pages > 0, already validated against the ceiling.
  init_result initialize(std::int64_t rank, std::int64_t num_pages);
  bool contains(std::int64_t rank) const;

  // batch_allocate on one rank. `keys` may repeat. For each distinct key, in order of
  // first occurrence, appends its index in `keys` to distinct_out and its page to
  // pages_out (-1: the pool cannot serve the batch). Returns false (nothing appended)
  // when the rank is not initialised.
  bool allocate(std::int64_t rank, std::span<const std::string_view> keys,
                std::vector<std::uint32_t>& distinct_out, std::vector<std::int64_t>& pages_out);

  // confirm_write on one rank: confirmation i binds keys[i] → pages[i]; then releases.
  // The whole request is validated first; on bad_request, `detail` says why and nothing
  // changed. On ok, newly_confirmed_out gets the indices i whose key this rank
  // confirmed for the first time (each key once), for the directory.
  confirm_outcome confirm(std::int64_t rank, std::span<const std::string_view> keys,
                          std::span<const std::int64_t> pages,
                          std::span<const std::int64_t> releases, std::string& detail,
                          std::vector<std::uint32_t>& newly_confirmed_out);

  // For each key, the page this rank has confirmed for it, or -1. False if the rank is
  // not initialised.
  bool confirmed_pages(std::int64_t rank, std::span<const std::string_view> keys,
                       std::span<std::int64_t> pages_out) const;

  std::optional<rank_stats> stats(std::int64_t rank) const;
  // Calls visit(rank, stats) for every rank, in no particular order (metrics).
  template <typename Visit>
  void for_each_rank(Visit&& visit) const {
    for_each_rank_impl(&visit, [](void* v, std::int64_t rank, const rank_stats& s) {
      (*static_cast<Visit*>(v))(rank, s);
    });
  }
  // Calls visit(rank, key, page, confirmed) for every reserved or bound page (snapshots).
  template <typename Visit>
  void for_each_entry(Visit&& visit) const {
    for_each_entry_impl(
        &visit, [](void* v, std::int64_t rank, std::string_view key, std::int64_t page,
                   bool confirmed) { (*static_cast<Visit*>(v))(rank, key, page, confirmed); });
  }
  // Recovery: puts `key` on `page` of an initialised rank, reserved or bound. False if
  // the rank is absent, the page is out of range or taken, or the key already has one.
  bool restore(std::int64_t rank, std::string_view key, std::int64_t page, bool confirmed);

  std::size_t rank_count() const;
  // Releases refused because the page was bound to a confirmed key (a metric).
  std::uint64_t refused_releases() const;
  void clear();

  // Full consistency check (tests, fuzzers): every page of every rank is exactly one of
  // free, reserved or bound, agreeing with the key map; no page belongs to two keys.
  // Returns an empty string when consistent, else a description of the first violation.
  std::string check_invariants() const;

 private:
  void for_each_rank_impl(void* visit, void (*call)(void*, std::int64_t, const rank_stats&)) const;
  void for_each_entry_impl(void* visit, void (*call)(void*, std::int64_t, std::string_view,
                                                     std::int64_t, bool)) const;

  struct impl;
  std::unique_ptr<impl> impl_;
};

class directory {
 public:
  directory();
  ~directory();
  directory(directory&&) noexcept;
  directory& operator=(directory&&) noexcept;

  // One more rank confirmed `key`. A new key records tp_world_size.
  void add_confirmation(std::string_view key, std::int32_t tp_world_size);
  // Confirmed by >= tp_world_size ranks.
  bool complete(std::string_view key) const;
  std::size_t size() const;
  // Calls visit(key, tp_world_size, count) for every key (snapshots).
  template <typename Visit>
  void for_each_key(Visit&& visit) const {
    for_each_key_impl(&visit,
                      [](void* v, std::string_view key, std::int32_t tp, std::int32_t count) {
                        (*static_cast<Visit*>(v))(key, tp, count);
                      });
  }
  // Recovery: sets a key's entry outright.
  void restore(std::string_view key, std::int32_t tp_world_size, std::int32_t count);
  void clear();

 private:
  void for_each_key_impl(void* visit,
                         void (*call)(void*, std::string_view, std::int32_t, std::int32_t)) const;

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace shard
