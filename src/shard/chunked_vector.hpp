// chunked_vector: a growable array kept in fixed blocks of 2^block_bits elements that
// never move. Indexing is a shift and a mask; growing allocates one block. A std::vector
// of millions of elements instead copies all of them when it grows, which stops its
// core for milliseconds (a vector of 2M 48-byte nodes: a 96 MB copy and 24k page faults).
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

namespace metad::shard {

template <class T, unsigned block_bits = 10>
class chunked_vector {
 public:
  static constexpr std::size_t block_size = std::size_t{1} << block_bits;

  chunked_vector() = default;
  chunked_vector(chunked_vector&& o) noexcept
      : blocks_(std::move(o.blocks_)), size_(std::exchange(o.size_, 0)) {}
  chunked_vector& operator=(chunked_vector&& o) noexcept {
    blocks_ = std::move(o.blocks_);
    size_ = std::exchange(o.size_, 0);
    return *this;
  }

  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return blocks_[i >> block_bits][i & (block_size - 1)]; }
  const T& operator[](std::size_t i) const {
    return blocks_[i >> block_bits][i & (block_size - 1)];
  }
  // Appends a value-initialised element.
  T& emplace_back() {
    if ((size_ & (block_size - 1)) == 0) blocks_.push_back(std::make_unique<T[]>(block_size));
    return (*this)[size_++];
  }
  // Drops every element and frees the blocks.
  void clear() {
    blocks_.clear();
    blocks_.shrink_to_fit();
    size_ = 0;
  }

 private:
  std::vector<std::unique_ptr<T[]>> blocks_;
  std::size_t size_ = 0;
};

}  // namespace metad::shard
