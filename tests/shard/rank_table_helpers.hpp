// Helpers shared by the rank_table tests: call an operation, collect its outputs.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "shard/rank_table.hpp"

namespace metad::shard::testing_helpers {

using keys_t = std::vector<std::string_view>;

struct allocation {
  std::vector<std::uint32_t> distinct;
  std::vector<std::int64_t> pages;
};

inline allocation allocate(rank_table& t, std::int64_t rank, const keys_t& keys) {
  allocation a;
  EXPECT_TRUE(t.allocate(rank, keys, 0, a.distinct, a.pages));
  EXPECT_EQ(a.distinct.size(), a.pages.size());
  return a;
}

inline std::vector<std::int64_t> pages_of(rank_table& t, std::int64_t rank, const keys_t& keys) {
  return allocate(t, rank, keys).pages;
}

struct confirmation {
  confirm_outcome outcome;
  std::string detail;
  std::vector<std::uint32_t> newly;
};

inline confirmation confirm(rank_table& t, std::int64_t rank, const keys_t& keys,
                            const std::vector<std::int64_t>& pages,
                            const std::vector<std::int64_t>& releases = {}) {
  confirmation c;
  c.outcome = t.confirm(rank, keys, pages, releases, 0, c.detail, c.newly);
  return c;
}

inline std::vector<std::int64_t> confirmed(const rank_table& t, std::int64_t rank,
                                           const keys_t& keys) {
  std::vector<std::int64_t> out(keys.size(), -7);
  EXPECT_TRUE(t.confirmed_pages(rank, keys, out));
  return out;
}

// {num_pages, free, reserved, bound}, comparable and printable.
inline std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t> stats_tuple(
    const rank_stats& s) {
  return {s.num_pages, s.free, s.reserved, s.bound};
}

using V = std::vector<std::int64_t>;
using U = std::vector<std::uint32_t>;

}  // namespace metad::shard::testing_helpers
