// Log-linear latency histogram (HdrHistogram-style): exact below 128 ns, then 64
// buckets per power of two (relative error < 1.6%), fixed storage, so recording a sample
// never allocates. One per (stream, endpoint), owned by the stream's thread; merged after.
#pragma once

#include <array>
#include <bit>
#include <cstdint>

namespace bench {

class histogram {
 public:
  static constexpr int sub_bits = 7;
  static constexpr int half = 1 << (sub_bits - 1);
  static constexpr int value_bits = 40;  // samples are clamped below 2^40 ns (~18 min)
  static constexpr int bucket_count = (value_bits - sub_bits + 2) * half;

  void record(std::uint64_t ns) {
    if (ns >= (std::uint64_t{1} << value_bits)) ns = (std::uint64_t{1} << value_bits) - 1;
    ++counts_[index_of(ns)];
    ++total_;
    if (ns > max_) max_ = ns;
  }

  void merge(const histogram& other) {
    for (int i = 0; i < bucket_count; ++i) counts_[i] += other.counts_[i];
    total_ += other.total_;
    if (other.max_ > max_) max_ = other.max_;
  }

  std::uint64_t count() const { return total_; }
  std::uint64_t max() const { return max_; }

  // The value at quantile q (0..1): the midpoint of the bucket holding that sample.
  std::uint64_t quantile(double q) const {
    if (total_ == 0) return 0;
    auto rank = static_cast<std::uint64_t>(q * static_cast<double>(total_) + 0.5);
    if (rank < 1) rank = 1;
    if (rank > total_) rank = total_;
    std::uint64_t seen = 0;
    for (int i = 0; i < bucket_count; ++i) {
      seen += counts_[i];
      if (seen >= rank) return midpoint_of(i);
    }
    return max_;
  }

  static int index_of(std::uint64_t v) {
    if (v < 2 * half) return static_cast<int>(v);
    const int m = std::bit_width(v) - sub_bits;
    return (m << (sub_bits - 1)) + static_cast<int>(v >> m);
  }
  static std::uint64_t midpoint_of(int index) {
    if (index < 2 * half) return static_cast<std::uint64_t>(index);
    const int m = (index >> (sub_bits - 1)) - 1;
    const auto top = static_cast<std::uint64_t>(index - (m << (sub_bits - 1)));
    return (top << m) + (std::uint64_t{1} << m) / 2;
  }

 private:
  std::array<std::uint64_t, bucket_count> counts_{};
  std::uint64_t total_ = 0;
  std::uint64_t max_ = 0;
};

}  // namespace bench
