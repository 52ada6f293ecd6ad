// Helpers for the sglang_pool tests: calls with plain string lists, answers as vectors.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shard/sglang_pool.hpp"

namespace metad::shard::sg_testing {

using strs = std::vector<std::string>;
using ints = std::vector<std::int64_t>;
using slots = std::vector<sglang_slot>;

// Expected reserve answers, written {{exists, page}, ...}.
inline slots S(std::initializer_list<std::pair<bool, std::int64_t>> list) {
  slots out;
  for (auto [e, p] : list) out.push_back({e, p});
  return out;
}

inline std::vector<std::string_view> views(const strs& keys) {
  return std::vector<std::string_view>(keys.begin(), keys.end());
}

inline slots reserve(sglang_pool& pool, const strs& keys, std::uint64_t now = 0,
                     sglang_reserve_stats* stats = nullptr) {
  slots out;
  const auto v = views(keys);
  const sglang_reserve_stats s = pool.reserve(v, now, out);
  if (stats != nullptr) *stats = s;
  EXPECT_EQ(pool.verify(), "");
  return out;
}

// confirm_write (its releases quarantined until quarantine_until, 0: none); returns the
// 400 detail ("" when accepted).
inline std::string confirm(sglang_pool& pool, const strs& keys, const ints& pages,
                           const ints& releases = {}, std::uint64_t now = 0,
                           sglang_confirm_stats* stats = nullptr,
                           std::uint64_t quarantine_until = 0) {
  std::string detail;
  sglang_confirm_stats s;
  const auto v = views(keys);
  const auto outcome = pool.confirm(v, pages, releases, now, detail, s, quarantine_until);
  if (stats != nullptr) *stats = s;
  EXPECT_EQ(pool.verify(), "");
  if (outcome == sglang_confirm_outcome::ok) {
    EXPECT_EQ(detail, "");
    return "";
  }
  EXPECT_NE(detail, "");
  return detail;
}

inline std::vector<bool> exists(const sglang_pool& pool, const strs& keys) {
  std::vector<std::uint8_t> out(keys.size());
  const auto v = views(keys);
  pool.exists(v, out);
  return std::vector<bool>(out.begin(), out.end());
}

inline ints get(sglang_pool& pool, const strs& keys, std::uint64_t now = 0) {
  ints out(keys.size());
  const auto v = views(keys);
  pool.get_page_indices(v, now, out);
  EXPECT_EQ(pool.verify(), "");
  return out;
}

inline std::size_t del(sglang_pool& pool, const strs& keys) {
  const auto v = views(keys);
  const std::size_t n = pool.delete_keys(v);
  EXPECT_EQ(pool.verify(), "");
  return n;
}

// Reserves then confirms every key: each ends bound. Returns their pages.
inline ints store(sglang_pool& pool, const strs& keys, std::uint64_t now = 0) {
  const slots answers = reserve(pool, keys, now);
  ints pages;
  strs written;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    pages.push_back(answers[i].page);
    if (!answers[i].exists && answers[i].page >= 0) written.push_back(keys[i]);
  }
  ints written_pages;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (!answers[i].exists && answers[i].page >= 0) written_pages.push_back(answers[i].page);
  EXPECT_EQ(confirm(pool, written, written_pages, {}, now), "");
  return pages;
}

// The free stack, bottom first (the top is handed out next), page by page.
inline std::vector<std::uint32_t> free_stack(const sglang_pool& pool) {
  std::vector<std::uint32_t> pages;
  for (const auto& [lo, hi] : pool.image().free)
    for (std::uint64_t p = lo; p < hi; ++p) pages.push_back(static_cast<std::uint32_t>(p));
  return pages;
}

}  // namespace metad::shard::sg_testing
