// sglang_pool against an obviously-correct model (vectors and maps, linear scans) over
// thousands of random operations per seed, with and without a release quarantine (and
// replayed releases): every answer must equal the model's, the pool's own check() must
// pass, and no page may ever be held by two keys. Seeds are printed; set SGLANG_SEED to
// replay one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "sglang_helpers.hpp"
#include "shard/sglang_pool.hpp"

namespace metad::shard {
namespace {

using namespace shard::sg_testing;

// A free stack, top at the end: pages [0, floor) ascending at the bottom (so that a pool
// of 2^40 pages costs nothing here either), then `above`.
struct model_stack {
  std::uint64_t floor = 0;
  std::vector<std::uint64_t> above;
  bool empty() const { return floor == 0 && above.empty(); }
  std::uint64_t size() const { return floor + above.size(); }
  void push_back(std::uint64_t p) { above.push_back(p); }
  std::uint64_t back() const { return above.empty() ? floor - 1 : above.back(); }
  void pop_back() {
    if (above.empty()) {
      --floor;
    } else {
      above.pop_back();
    }
  }
  void clear() {
    floor = 0;
    above.clear();
  }
  bool contains(std::uint64_t p) const {
    return p < floor || std::find(above.begin(), above.end(), p) != above.end();
  }
  // As sglang_image::free: maximal runs of consecutive pages, bottom first.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs() const {
    sglang_image img;
    if (floor > 0) img.free.emplace_back(0, floor);
    for (std::uint64_t p : above) img.push_free(p);
    return img.free;
  }
};

// The contract, written as plainly as possible.
struct model {
  struct reservation {
    std::string key;
    std::uint64_t epoch;
    std::uint64_t deadline;
    std::uint64_t serial;
  };
  std::uint64_t n = 0;
  std::uint64_t ttl = 0, lease = 0;
  std::uint64_t quarantine_for = 0;                                 // 0: releases free at once
  model_stack free;                                                 // top at the end
  std::vector<std::pair<std::uint64_t, std::uint64_t>> quarantine;  // (until, page), oldest first
  std::vector<std::pair<std::string, std::uint64_t>> lru;           // LRU first
  std::map<std::string, std::uint64_t> lease_until;
  std::map<std::uint64_t, reservation> in_flight;
  std::uint64_t epoch = 0;
  std::uint64_t serial = 0;

  model(std::uint64_t pages, std::uint64_t t, std::uint64_t l, std::uint64_t q)
      : n(pages), ttl(t), lease(l), quarantine_for(q) {
    free.floor = n;
  }
  int bound_index(const std::string& k) const {
    for (std::size_t i = 0; i < lru.size(); ++i)
      if (lru[i].first == k) return static_cast<int>(i);
    return -1;
  }
  bool page_bound(std::uint64_t p) const {
    for (const auto& e : lru)
      if (e.second == p) return true;
    return false;
  }
  bool page_free(std::uint64_t p) const { return free.contains(p); }
  bool quarantined(std::uint64_t p) const {
    for (const auto& q : quarantine)
      if (q.second == p) return true;
    return false;
  }
  std::vector<std::uint64_t> quarantined_pages() const {
    std::vector<std::uint64_t> out;
    for (const auto& q : quarantine) out.push_back(q.second);
    return out;
  }
  // The tick: quarantines due end, oldest first, onto the free stack.
  ints end_quarantines(std::uint64_t now) {
    ints ended;
    while (!quarantine.empty() && quarantine.front().first <= now) {
      free.push_back(quarantine.front().second);
      ended.push_back(quarantine.front().second);
      quarantine.erase(quarantine.begin());
    }
    return ended;
  }
  void touch(int i) {
    auto e = lru[i];
    lru.erase(lru.begin() + i);
    lru.push_back(e);
  }
  void expire(std::uint64_t now) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> due;  // (serial, page)
    for (const auto& [p, r] : in_flight)
      if (ttl != 0 && r.deadline <= now) due.push_back({r.serial, p});
    std::sort(due.begin(), due.end());
    for (auto [s, p] : due) {
      in_flight.erase(p);
      free.push_back(p);
    }
  }
  slots reserve(const strs& keys, std::uint64_t now) {
    expire(now);
    slots out(keys.size());
    std::set<std::string> hits, passed;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const int b = bound_index(keys[i]);
      if (b < 0) continue;
      out[i] = {true, lru[b].second};
      hits.insert(keys[i]);
      touch(b);
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (hits.count(keys[i])) continue;
      const auto first = std::find(keys.begin(), keys.end(), keys[i]) - keys.begin();
      if (static_cast<std::size_t>(first) != i) {
        out[i] = out[first];
        continue;
      }
      std::int64_t page = -1;
      if (!free.empty()) {
        page = free.back();
        free.pop_back();
      } else {
        while (!lru.empty()) {
          const std::string head = lru.front().first;
          if (hits.count(head) || passed.count(head)) break;
          if (lease_until[head] > now) {
            passed.insert(head);
            touch(0);
            continue;
          }
          page = lru.front().second;
          lease_until.erase(head);
          lru.erase(lru.begin());
          break;
        }
        if (page < 0 && !quarantine.empty()) {  // nothing evictable: the oldest quarantined
          page = quarantine.front().second;
          quarantine.erase(quarantine.begin());
        }
      }
      if (page >= 0) {
        const std::uint64_t d = ttl == 0 ? UINT64_MAX : now + ttl;
        in_flight[static_cast<std::uint64_t>(page)] = {keys[i], epoch, d, ++serial};
      }
      out[i] = {false, page};
    }
    return out;
  }
  void free_in_flight(std::uint64_t p) {
    in_flight.erase(p);
    free.push_back(p);
  }
  void bind(const std::string& k, std::uint64_t p) {
    const int b = bound_index(k);
    if (b >= 0) {
      if (lru[b].second != p) free.push_back(lru[b].second);
      lru.erase(lru.begin() + b);
    }
    lru.push_back({k, p});
  }
  std::string confirm(const strs& keys, const ints& pages, const ints& rel, std::uint64_t now) {
    for (auto p : pages)
      if (p < 0 || p >= n) return "range";
    for (auto p : rel)
      if (p < 0 || p >= n) return "range";
    for (auto p : rel)
      if (std::find(pages.begin(), pages.end(), p) != pages.end()) return "both";
    expire(now);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto p = static_cast<std::uint64_t>(pages[i]);
      if (page_free(p)) continue;
      if (page_bound(p)) {
        const int b = bound_index(keys[i]);
        if (b >= 0 && lru[b].second == p) touch(b);
        continue;
      }
      auto it = in_flight.find(p);
      if (it == in_flight.end()) continue;  // quarantined (no unowned pages without restore)
      if (it->second.key != keys[i]) continue;
      if (it->second.epoch != epoch) {
        free_in_flight(p);
        continue;
      }
      in_flight.erase(it);
      bind(keys[i], p);
    }
    for (auto r : rel) {
      const auto p = static_cast<std::uint64_t>(r);
      if (!in_flight.count(p)) continue;  // free, bound or quarantined: nothing changes
      if (quarantine_for == 0) {
        free_in_flight(p);
      } else {
        in_flight.erase(p);
        quarantine.push_back({now + quarantine_for, p});
      }
    }
    return "";
  }
  std::size_t del(const strs& keys) {
    std::size_t d = 0;
    for (const auto& k : keys) {
      const int b = bound_index(k);
      if (b < 0) continue;
      free.push_back(lru[b].second);
      lease_until.erase(k);
      lru.erase(lru.begin() + b);
      ++d;
    }
    return d;
  }
  void clear() {
    ++epoch;
    lru.clear();
    lease_until.clear();
    free.clear();
    std::uint64_t lowest_held = n;
    for (const auto& [p, r] : in_flight) lowest_held = std::min(lowest_held, p);
    for (const auto& q : quarantine) lowest_held = std::min(lowest_held, q.second);
    free.floor = lowest_held;
    for (std::uint64_t p = lowest_held; p < n; ++p)
      if (!in_flight.count(p) && !quarantined(p)) free.push_back(p);
  }
  ints get(const strs& keys, std::uint64_t now) {
    ints out;
    for (const auto& k : keys) {
      const int b = bound_index(k);
      if (b < 0) {
        out.push_back(-1);
        continue;
      }
      out.push_back(lru[b].second);
      if (lease != 0) lease_until[k] = std::max(lease_until[k], now + lease);
      touch(b);
    }
    return out;
  }
  std::vector<bool> exists(const strs& keys) const {
    std::vector<bool> out;
    for (const auto& k : keys) out.push_back(bound_index(k) >= 0);
    return out;
  }
  void grow(std::uint64_t to) {
    for (std::uint64_t p = n; p < to; ++p) free.push_back(p);
    n = to;
  }
};

// base > 0: the pool has base more pages at the bottom of its stack (2^40: a huge pool
// whose pages are numbered past 32 bits), which the model holds as one virtual run.
void run_seed(std::uint64_t seed, int ops, std::uint64_t base = 0) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  const std::uint64_t pages = base + pick(0, 12);
  const std::uint64_t ttl = pick(0, 1) ? pick(1, 40) : 0;
  const std::uint64_t lease = pick(0, 2) == 0 ? pick(1, 20) : 0;
  const std::uint64_t quarantine_for = pick(0, 2) == 0 ? 0 : pick(1, 30);
  sglang_pool pool(pages, sglang_config{ttl, lease});
  model m(pages, ttl, lease, quarantine_for);
  const auto key_count = pick(3, 24);
  // Keys of every shape the pool stores its own way: 32 or 64 hex digits, lower or upper
  // case (packed), mixed case and anything else (their bytes); some the same digits in
  // the other case, or a 64-hex key whose first half is another key (different keys).
  std::vector<std::string> names;
  auto hex = [&](std::size_t n) {
    std::string h;
    for (std::size_t i = 0; i < n; ++i) h.push_back("0123456789abcdef"[pick(0, 15)]);
    return h;
  };
  auto upper = [](std::string h) {
    for (char& c : h) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return h;
  };
  for (std::uint64_t i = 0; i <= key_count; ++i) {
    const auto shape = pick(0, 9);
    if (shape == 0) {
      names.push_back("k" + std::to_string(i));
    } else if (shape == 1) {
      names.push_back(hex(32));
    } else if (shape == 2) {
      names.push_back(upper(hex(32)));
    } else if (shape <= 4) {
      names.push_back(hex(64));
    } else if (shape == 5) {
      names.push_back(upper(hex(64)));
    } else if (shape == 6) {  // mixed case: not packed
      std::string h = hex(64);
      h[pick(0, 63)] = 'A';
      h[pick(0, 63)] = 'b';
      names.push_back(h);
    } else if (shape == 7 && !names.empty()) {  // an earlier key in the other case
      const std::string& e = names[pick(0, names.size() - 1)];
      names.push_back(upper(e) == e ? e + "x" : upper(e));
    } else if (shape == 8 && !names.empty()) {  // an earlier key's digits, extended
      names.push_back(names[pick(0, names.size() - 1)] + hex(32));
    } else {
      names.push_back(hex(pick(0, 1) ? 31 : 65));
    }
  }
  auto random_key = [&] { return names[pick(0, key_count)]; };
  auto random_keys = [&](std::size_t most) {
    strs keys(pick(0, most));
    for (auto& k : keys) k = random_key();
    return keys;
  };
  // Reservations handed out and not yet confirmed or released, for realistic confirms.
  std::vector<std::pair<std::string, std::int64_t>> outstanding;
  // Confirm requests already applied, replayed later (a client's retry, a proxy).
  std::vector<std::tuple<strs, ints, ints>> sent;
  std::uint64_t now = 0;
  for (int op = 0; op < ops; ++op) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " op " + std::to_string(op));
    now += pick(0, 3);
    const auto kind = pick(0, 99);
    if (kind < 35) {
      const strs keys = random_keys(6);
      const slots got = reserve(pool, keys, now);
      ASSERT_EQ(got, m.reserve(keys, now));
      for (std::size_t i = 0; i < keys.size(); ++i)
        if (!got[i].exists && got[i].page >= 0) outstanding.push_back({keys[i], got[i].page});
    } else if (kind < 65) {
      strs keys;
      ints conf, rel;
      while (!outstanding.empty() && pick(0, 3) != 0) {
        const std::size_t i = pick(0, outstanding.size() - 1);
        auto [k, p] = outstanding[i];
        outstanding.erase(outstanding.begin() + static_cast<std::ptrdiff_t>(i));
        if (pick(0, 4) == 0) {
          rel.push_back(p);
        } else {
          keys.push_back(pick(0, 9) == 0 ? random_key() : k);  // sometimes the wrong key
          conf.push_back(p);
        }
      }
      if (pick(0, 9) == 0) rel.push_back(static_cast<std::int64_t>(pick(base, pages + 1)));
      if (pick(0, 19) == 0 && pages > 0) {  // garbage: a random page for a random key
        keys.push_back(random_key());
        conf.push_back(static_cast<std::int64_t>(pick(pick(0, 1) ? 0 : base, pages - 1)));
      }
      if (pick(0, 29) == 0) rel.push_back(-1);
      if (!sent.empty() && pick(0, 3) == 0) {  // a replay instead
        std::tie(keys, conf, rel) = sent[pick(0, sent.size() - 1)];
      } else if (sent.size() < 8) {
        sent.emplace_back(keys, conf, rel);
      } else {
        sent[pick(0, sent.size() - 1)] = {keys, conf, rel};
      }
      const std::string expected = m.confirm(keys, conf, rel, now);
      const std::uint64_t until = quarantine_for == 0 ? 0 : now + quarantine_for;
      const std::string got = confirm(pool, keys, conf, rel, now, nullptr, until);
      ASSERT_EQ(got.empty(), expected.empty()) << got;
    } else if (kind < 80) {
      const strs keys = random_keys(6);
      ASSERT_EQ(get(pool, keys, now), m.get(keys, now));
    } else if (kind < 90) {
      const strs keys = random_keys(6);
      ASSERT_EQ(exists(pool, keys), m.exists(keys));
    } else if (kind < 94) {
      const strs keys = random_keys(2);
      ASSERT_EQ(del(pool, keys), m.del(keys));
    } else if (kind < 97) {  // the tick
      ints ended;
      pool.end_quarantines(now, &ended);
      ASSERT_EQ(ended, m.end_quarantines(now));
      pool.expire(now);
      m.expire(now);
    } else if (kind < 99) {
      pool.clear();
      m.clear();
    } else if (pool.num_pages() < base + 40) {
      const auto to = pool.num_pages() + pick(0, 4);
      pool.grow(to);
      m.grow(to);
    }
    ASSERT_EQ(pool.verify(), "");
    const sglang_image img = pool.image();
    ASSERT_EQ(img.free, m.free.runs());
    ASSERT_EQ(img.bound.size(), m.lru.size());
    for (std::size_t i = 0; i < m.lru.size(); ++i) ASSERT_EQ(img.bound[i], m.lru[i]);
    ASSERT_EQ(img.reserved.size(), m.in_flight.size());
    ASSERT_EQ(img.quarantined, m.quarantined_pages());
    ASSERT_EQ(pool.stats().free, m.free.size() + m.quarantine.size());
    // No page held twice across the four lists, and every page in one.
    std::set<std::uint64_t> held;
    for (const auto& b : img.bound) ASSERT_TRUE(held.insert(b.second).second);
    for (const auto& r : img.reserved) ASSERT_TRUE(held.insert(r.page).second);
    for (const auto p : img.quarantined) ASSERT_TRUE(held.insert(p).second);
    std::uint64_t free_pages = 0;
    for (const auto& [lo, hi] : img.free) {
      free_pages += hi - lo;
      auto it = held.lower_bound(lo);
      ASSERT_TRUE(it == held.end() || *it >= hi);
    }
    ASSERT_EQ(held.size() + free_pages, pool.num_pages());
  }
  // The image at the end restores a pool with the same future.
  std::string error;
  sglang_pool copy(0);
  ASSERT_TRUE(sglang_pool::restore(pool.image(), sglang_config{ttl, lease}, copy, error)) << error;
  ASSERT_EQ(copy.verify(), "");
  ASSERT_EQ(copy.image().free, pool.image().free);
  ASSERT_EQ(copy.image().quarantined, pool.image().quarantined);
}

TEST(SglangPoolRandom, AgreesWithTheModel) {
  std::uint64_t base = std::random_device{}();
  int seeds = 200;
  if (const char* s = std::getenv("SGLANG_SEED")) {
    base = std::strtoull(s, nullptr, 10);
    seeds = 1;
  }
  for (int i = 0; i < seeds; ++i) {
    const std::uint64_t seed = base + static_cast<std::uint64_t>(i);
    run_seed(seed, 3000);
    if (::testing::Test::HasFatalFailure()) {
      std::printf("failing seed: SGLANG_SEED=%llu\n", static_cast<unsigned long long>(seed));
      return;
    }
  }
  std::printf("seeds %llu..%llu passed\n", static_cast<unsigned long long>(base),
              static_cast<unsigned long long>(base + seeds - 1));
}

// The same with 2^40 pages below the model's: every page handed out is numbered past 32
// bits, the free stack's bottom is one run of 2^40 pages, and nothing is proportional to
// it (each seed runs in milliseconds).
TEST(SglangPoolRandom, HugePoolsAgreeWithTheModel) {
  const std::uint64_t base = std::random_device{}();
  for (int i = 0; i < 12; ++i) {
    const std::uint64_t seed = base + static_cast<std::uint64_t>(i);
    run_seed(seed, 1500, std::uint64_t{1} << 40);
    if (::testing::Test::HasFatalFailure()) {
      std::printf("failing seed (huge): %llu\n", static_cast<unsigned long long>(seed));
      return;
    }
  }
}

}  // namespace
}  // namespace metad::shard
