#include "shard/key_life.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "metad/assert.hpp"

namespace metad::shard {

key_life::key_life() { nodes_.emplace_back(); }  // the sentinel

std::uint32_t key_life::find(std::string_view key, const parsed_key& p) const {
  const std::uint32_t* v = keys_.find_value(key, p);
  return v == nullptr ? 0 : *v;
}

bool key_life::times(std::string_view key, const parsed_key& p, std::uint64_t& used,
                     std::uint64_t& lease_until) const {
  const std::uint32_t i = find(key, p);
  if (i == 0) return false;
  used = nodes_[i].used;
  lease_until = nodes_[i].lease_until;
  return true;
}

std::uint32_t key_life::insert(std::string_view key, const parsed_key& p) {
  std::uint32_t i = free_;
  if (i != 0) {
    free_ = nodes_[i].next;
    nodes_[i] = node{};
  } else {
    METAD_ASSERT(nodes_.size() < UINT32_MAX);
    i = static_cast<std::uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[i].key = keys_.insert(key, p, i);
  link_last(i);
  return i;
}

void key_life::drop(std::uint32_t i) {
  node& n = nodes_[i];
  unlink(i);
  keys_.erase(keys_.find(n.key));  // frees n.key.blob
  // Its lease ended, not yet swept: the node is freed when its entry is.
  if (n.lease_until != 0) {
    --leased_;
    n.key.blob = nullptr;
    n.prev = dead;
    return;
  }
  free_node(i);
}

void key_life::free_node(std::uint32_t i) {
  node& n = nodes_[i];
  n = node{};
  n.next = free_;
  free_ = i;
}

void key_life::unlink(std::uint32_t i) {
  node& n = nodes_[i];
  nodes_[n.prev].next = n.next;
  nodes_[n.next].prev = n.prev;
}

void key_life::link_first(std::uint32_t i) {
  const std::uint32_t first = nodes_[0].next;
  nodes_[i].prev = 0;
  nodes_[i].next = first;
  nodes_[first].prev = i;
  nodes_[0].next = i;
}

void key_life::link_last(std::uint32_t i) {
  const std::uint32_t last = nodes_[0].prev;
  nodes_[i].prev = last;
  nodes_[i].next = 0;
  nodes_[last].next = i;
  nodes_[0].prev = i;
}

void key_life::key_text(std::uint32_t i, std::string& out) const {
  dual_key_map<std::uint32_t>::key_text(nodes_[i].key, out);
}

void key_life::touch(std::string_view key, const parsed_key& p, std::uint64_t now) {
  std::uint32_t i = find(key, p);
  if (i == 0) {
    if (!lru_) return;
    i = insert(key, p);
  } else if (lru_) {  // without LRU the list stays in lease order
    unlink(i);
    link_last(i);
  }
  nodes_[i].used = now;
}

void key_life::lease(std::string_view key, const parsed_key& p, std::uint64_t now,
                     std::uint64_t until) {
  if (due(now)) sweep(now, 2);
  std::uint32_t i = find(key, p);
  if (i == 0) {
    i = insert(key, p);
  } else if (lru_) {
    unlink(i);
    link_last(i);
  }
  node& n = nodes_[i];
  n.used = now;
  if (n.lease_until == 0) {  // a new lease: counted and queued
    ++leased_;
    n.lease_until = until;
    if (leases_.empty() || leases_.back().until <= until) {
      leases_.push_back(lease_entry{until, i});
    } else {  // shorter than the last one granted: the queue would lose its order
      push_extended(lease_entry{until, i});
    }
  } else if (until > n.lease_until) {  // extended: re-queued when its entry comes due
    n.lease_until = until;
  }
}

void key_life::restore(std::string_view key, const parsed_key& p, std::uint64_t used, bool first) {
  std::uint32_t i = find(key, p);
  if (i == 0) i = insert(key, p);
  unlink(i);
  if (first) {
    link_first(i);
  } else {
    link_last(i);
  }
  nodes_[i].used = used;
}

bool key_life::leased(std::string_view key, std::uint64_t now) const {
  if (size() == 0) return false;
  parsed_key p;
  parse_key(key, p);
  const std::uint32_t i = find(key, p);
  return i != 0 && nodes_[i].lease_until > now;
}

bool key_life::ended_unswept(const lease_entry& e, std::uint64_t now) const {
  const node& n = nodes_[e.node];
  return n.prev != dead && n.lease_until <= now;
}

std::size_t key_life::leased_count(std::uint64_t now) const {
  // A lease ended by now has its entry due by now: among the queue's due front, or the
  // heap's due top (a subtree whose root is not due holds none).
  std::size_t ended = 0;
  for (std::size_t e = 0; e < leases_.size() && leases_[e].until <= now; ++e)
    ended += ended_unswept(leases_[e], now) ? 1 : 0;
  std::vector<std::size_t> due;
  if (!extended_.empty()) due.push_back(0);
  while (!due.empty()) {
    const std::size_t e = due.back();
    due.pop_back();
    if (e >= extended_.size() || extended_[e].until > now) continue;
    ended += ended_unswept(extended_[e], now) ? 1 : 0;
    due.push_back(2 * e + 1);
    due.push_back(2 * e + 2);
  }
  return leased_ - ended;
}

void key_life::forget(std::string_view key) {
  if (size() == 0) return;
  parsed_key p;
  parse_key(key, p);
  forget(key, p);
}

void key_life::forget(std::string_view key, const parsed_key& p) {
  if (size() == 0) return;
  if (const std::uint32_t i = find(key, p); i != 0) drop(i);
}

void key_life::oldest_used(std::uint64_t now, std::size_t n, std::vector<std::uint64_t>& out) {
  std::uint32_t i = nodes_[0].next;
  for (std::size_t seen = 0, limit = size(); i != 0 && n > 0 && seen < limit; ++seen) {
    const std::uint32_t next = nodes_[i].next;
    if (nodes_[i].lease_until > now) {
      unlink(i);  // as take_oldest would: a read is a use
      link_last(i);
    } else {
      out.push_back(nodes_[i].used);
      --n;
    }
    i = next;
  }
}

void key_life::push_extended(const lease_entry& e) {
  extended_.push_back(e);
  std::push_heap(extended_.begin(), extended_.end(), later{});
}

bool key_life::pop_due(std::uint64_t now, lease_entry& out) {
  const bool queued = !leases_.empty() && leases_.front().until <= now;
  const bool heaped = !extended_.empty() && extended_.front().until <= now;  // the heap's top
  if (queued && (!heaped || leases_.front().until <= extended_.front().until)) {
    out = leases_.front();
    leases_.pop_front();
    return true;
  }
  if (!heaped) return false;
  std::pop_heap(extended_.begin(), extended_.end(), later{});
  out = extended_.back();
  extended_.pop_back();
  return true;
}

void key_life::sweep(std::uint64_t now, std::size_t max) {
  lease_entry e{};
  for (std::size_t done = 0; done < max && pop_due(now, e); ++done) {
    node& n = nodes_[e.node];
    if (n.prev == dead) {  // the key left before its lease was found ended
      free_node(e.node);
      continue;
    }
    if (n.lease_until > now) {  // extended since: queued again by its new end
      push_extended(lease_entry{n.lease_until, e.node});
      continue;
    }
    n.lease_until = 0;  // ended
    --leased_;
    if (!lru_) drop(e.node);
  }
}

bool key_life::shrink_if_sparse() {
  const std::size_t n = size();
  if (nodes_.size() < shrink_nodes_min || n * 8 > nodes_.size() || n > shrink_keys_max)
    return false;
  // No lease entry queued: no node is leased (lease_until is 0 everywhere) or dead.
  if (!leases_.empty() || !extended_.empty()) return false;
  METAD_ASSERT(leased_ == 0);
  key_life fresh;
  fresh.lru_ = lru_;
  std::string text;
  parsed_key p;
  for (std::uint32_t i = nodes_[0].next; i != 0; i = nodes_[i].next) {
    key_text(i, text);
    parse_key(text, p);
    const std::uint32_t j = fresh.insert(text, p);  // appended: the order is kept
    fresh.nodes_[j].used = nodes_[i].used;
  }
  METAD_ASSERT(fresh.size() == n);
  *this = std::move(fresh);
  return true;
}

void key_life::clear() {
  keys_.clear();
  nodes_.clear();
  nodes_.emplace_back();
  free_ = 0;
  leases_.clear();
  extended_.clear();
  leased_ = 0;
}

std::string key_life::verify() const {
  const auto fail = [](std::string what) { return "key_life: " + what; };
  if (std::string e = keys_.verify(); !e.empty()) return fail(e);
  const std::size_t n = nodes_.size();
  if (n == 0) return fail("no sentinel node");
  // 0: not seen; 1: listed; 2: dead; 3: free.
  std::vector<std::uint8_t> state(n, 0);
  state[0] = 1;
  std::size_t listed = 0, leased = 0;
  std::uint32_t last = 0;
  for (std::uint32_t i = nodes_[0].next; i != 0; last = i, i = nodes_[i].next) {
    if (i >= n) return fail(fmt::format("list link to node {} of {}", i, n));
    if (state[i] != 0) return fail(fmt::format("node {} is listed twice (a cycle)", i));
    state[i] = 1;
    const node& nd = nodes_[i];
    if (nd.prev != last)
      return fail(fmt::format("node {}: prev {} but follows {}", i, nd.prev, last));
    if (++listed > keys_.size()) return fail("the list is longer than the key map");
    if (const auto e = keys_.find(nd.key); !e || *e.value() != i)
      return fail(fmt::format("node {}: its key does not name it in the key map", i));
    if (nd.lease_until != 0) {
      ++leased;
    } else if (!lru_) {
      return fail(fmt::format("node {}: listed without LRU tracking and without a lease", i));
    }
  }
  if (nodes_[0].prev != last) return fail("the sentinel's prev is not the last listed node");
  if (listed != keys_.size())
    return fail(fmt::format("{} nodes listed, {} keys mapped", listed, keys_.size()));
  if (leased != leased_)
    return fail(fmt::format("{} listed nodes leased, {} counted", leased, leased_));
  std::size_t dead_nodes = 0;
  for (std::size_t i = 1; i < n; ++i) {
    if (state[i] == 0 && nodes_[i].prev == dead) {
      if (nodes_[i].lease_until == 0)
        return fail(fmt::format("dead node {} has no lease entry", i));
      state[i] = 2;
      ++dead_nodes;
    }
  }
  std::size_t free_nodes = 0;
  for (std::uint32_t i = free_; i != 0; i = nodes_[i].next) {
    if (i >= n) return fail(fmt::format("free chain link to node {} of {}", i, n));
    if (state[i] != 0)
      return fail(fmt::format("free node {} is also listed, dead or free twice", i));
    if (nodes_[i].lease_until != 0) return fail(fmt::format("free node {} has a lease", i));
    state[i] = 3;
    ++free_nodes;
  }
  if (listed + dead_nodes + free_nodes + 1 != n)
    return fail(fmt::format("{} nodes: {} listed, {} dead, {} free (a node is lost)", n, listed,
                            dead_nodes, free_nodes));
  // Lease entries: exactly one per node with a lease, due no later than its end.
  std::vector<std::uint8_t> entries(n, 0);
  std::string e;
  const auto check_entry = [&](const lease_entry& le) {
    if (!e.empty()) return;
    if (le.node == 0 || le.node >= n) {
      e = fmt::format("a lease entry names node {} of {}", le.node, n);
    } else if (nodes_[le.node].lease_until == 0) {
      e = fmt::format("a lease entry names node {}, which has no lease", le.node);
    } else if (entries[le.node]++ != 0) {
      e = fmt::format("node {} has two lease entries", le.node);
    } else if (le.until > nodes_[le.node].lease_until) {
      e = fmt::format("node {}'s lease entry is due at {}, after its lease ends at {}", le.node,
                      le.until, nodes_[le.node].lease_until);
    }
  };
  for (std::size_t k = 0; k < leases_.size(); ++k) {
    if (k > 0 && leases_[k - 1].until > leases_[k].until)
      return fail(fmt::format("lease queue out of order at entry {}", k));
    check_entry(leases_[k]);
  }
  if (!std::is_heap(extended_.begin(), extended_.end(), later{}))
    return fail("the extended leases are not a min-heap by their ends");
  for (const lease_entry& le : extended_) check_entry(le);
  if (!e.empty()) return fail(e);
  for (std::size_t i = 1; i < n; ++i) {
    if (nodes_[i].lease_until != 0 && entries[i] == 0)
      return fail(fmt::format("node {} has a lease but no lease entry", i));
  }
  return {};
}

}  // namespace metad::shard
