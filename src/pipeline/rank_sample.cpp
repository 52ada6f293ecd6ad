#include "pipeline/rank_sample.hpp"

#include <algorithm>

namespace metad::pipeline {
namespace {

bool lower_rank(const api::rank_info_row& a, const api::rank_info_row& b) {
  return a.rank < b.rank;
}

}  // namespace

void rank_sample::clear() {
  rows_.clear();
  pool_ = api::rank_pool{};
}

void rank_sample::add(const api::rank_info_row& row) {
  pool_.add(row);
  if (rows_.size() < kRankRowsMax) {
    rows_.push_back(row);
    std::push_heap(rows_.begin(), rows_.end(), lower_rank);
  } else if (row.rank < rows_.front().rank) {
    // Full: the row replaces the highest rank kept.
    std::pop_heap(rows_.begin(), rows_.end(), lower_rank);
    rows_.back() = row;
    std::push_heap(rows_.begin(), rows_.end(), lower_rank);
  }
}

std::span<const api::rank_info_row> rank_sample::sorted() {
  std::sort_heap(rows_.begin(), rows_.end(), lower_rank);
  return rows_;
}

}  // namespace metad::pipeline
