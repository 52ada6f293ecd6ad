// What /stats and /metrics show of the ranks: the rows of the kRankRowsMax lowest rank
// numbers, and sums over every rank so the ones left out still count. With 100k ranks
// the full lists were 7 MB (/stats) and 19 MB (/metrics), and sorting and writing them
// stalled the scraping core for up to 216 ms; any rank's own row stays one
// GET /rank/{rank} away.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "api/encode.hpp"

namespace metad::pipeline {

// Rows a /stats answer lists and ranks /metrics gives per-rank series, at most.
inline constexpr std::size_t kRankRowsMax = 1024;

// Fed every rank's row on the rank's owner core, the cores visited one after another
// (visit_cores), then read on the home core. Work per rank is a comparison and five
// additions (a heap step only while the row is among the lowest seen); memory is
// kRankRowsMax rows, however many ranks there are.
class rank_sample {
 public:
  void clear();
  void add(const api::rank_info_row& row);
  // The kept rows in ascending rank order; call once, after the last add.
  std::span<const api::rank_info_row> sorted();
  const api::rank_pool& pool() const { return pool_; }
  // Ranks added but not kept.
  std::size_t omitted() const { return pool_.ranks - rows_.size(); }

 private:
  std::vector<api::rank_info_row> rows_;  // a max-heap on rank until sorted()
  api::rank_pool pool_;
};

}  // namespace metad::pipeline
