#include "shard/key_life.hpp"

#include "shard/check.hpp"

namespace shard {

key_life::key_life() { nodes_.emplace_back(); }  // the sentinel

std::uint32_t key_life::find(std::string_view key, const parsed_key& p) const {
  if (p.hex) {
    const std::uint32_t* v = hex_.find(p.packed, p.hash);
    return v == nullptr ? 0 : *v;
  }
  if (others_.size() == 0) return 0;
  const auto* s = others_.find(key, static_cast<std::uint32_t>(p.hash));
  return s == nullptr ? 0 : s->value;
}

std::uint32_t key_life::insert(std::string_view key, const parsed_key& p) {
  std::uint32_t i = free_;
  if (i != 0) {
    free_ = nodes_[i].next;
    nodes_[i] = node{};
  } else {
    SHARD_CHECK(nodes_.size() < UINT32_MAX);
    i = static_cast<std::uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  node& n = nodes_[i];
  if (p.hex) {
    n.packed = p.packed;
    hex_.insert_new(p.packed, p.hash, i);
  } else {
    n.blob = others_.insert_new(key, static_cast<std::uint32_t>(p.hash), i).key;
  }
  link_last(i);
  return i;
}

void key_life::drop(std::uint32_t i) {
  node& n = nodes_[i];
  if (n.lease_until != 0) --leased_;  // its lease ended, not yet swept
  unlink(i);
  if (n.blob == nullptr) {
    hex_.erase(hex_.find(n.packed, packed_hash(n.packed)));
  } else {
    const std::string_view key = key_blob::view(n.blob);
    others_.erase(*others_.find(key, table_hash(key)));  // frees n.blob
  }
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
  const node& n = nodes_[i];
  if (n.blob != nullptr) {
    out.assign(key_blob::view(n.blob));
  } else {
    out.resize(packed_key_chars);
    unpack_hex_key(n.packed, out.data());
  }
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
  if (!leases_.empty() && leases_.front().until <= now) sweep(now, 2);
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
    leases_.push_back(lease_entry{until, i});
    n.lease_until = until;
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

std::size_t key_life::leased_count(std::uint64_t now) const {
  std::size_t ended = 0;
  for (std::size_t e = 0; e < leases_.size() && leases_[e].until <= now; ++e) {
    const std::uint64_t until = nodes_[leases_[e].node].lease_until;
    if (until != 0 && until <= leases_[e].until) ++ended;  // not extended: ended
  }
  return leased_ - ended;
}

void key_life::forget(std::string_view key) {
  if (size() == 0) return;
  parsed_key p;
  parse_key(key, p);
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

void key_life::sweep(std::uint64_t now, std::size_t max) {
  for (std::size_t done = 0; done < max && !leases_.empty() && leases_.front().until <= now;
       ++done) {
    const lease_entry e = leases_.front();
    leases_.pop_front();
    node& n = nodes_[e.node];
    // An entry of a node dropped (and maybe reused) since is stale.
    if (n.lease_until == 0) continue;
    if (n.lease_until > e.until) {  // extended since: queued again with its new end
      leases_.push_back(lease_entry{n.lease_until, e.node});
      continue;
    }
    n.lease_until = 0;  // ended
    --leased_;
    if (!lru_) drop(e.node);
  }
}

void key_life::clear() {
  hex_.clear();
  others_.clear();
  nodes_.clear();
  nodes_.emplace_back();
  free_ = 0;
  leases_.clear();
  leased_ = 0;
}

}  // namespace shard
