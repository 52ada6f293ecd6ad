// The connections one loop holds: added and removed in O(1) (the last one takes a removed
// one's place), iterated for the stop and the deadline sweeps. Both transports use it;
// T is their connection type, which carries its own `std::size_t index`.
#pragma once

#include <cstddef>
#include <vector>

#include "metad/assert.hpp"

namespace metad::net {

template <typename T>
class connection_list {
 public:
  void add(T* c) {
    c->index = items_.size();
    items_.push_back(c);
  }
  // Unlinks c (the caller closes and frees it).
  void remove(T* c) {
    METAD_ASSERT(c->index < items_.size() && items_[c->index] == c);
    T* last = items_.back();
    items_[c->index] = last;
    last->index = c->index;
    items_.pop_back();
  }
  std::size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<T*> items_;
};

}  // namespace metad::net
