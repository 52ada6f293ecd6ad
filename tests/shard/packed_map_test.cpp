#include "shard/packed_map.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "shard/chunked_vector.hpp"
#include "shard/packed_key.hpp"
#include "shard/rank_keys.hpp"
#include "shard/zeroed_array.hpp"

namespace metad::shard {
namespace {

std::string hex_of(const packed_key& k) {
  std::string s(packed_key_chars, '\0');
  unpack_hex_key(k, s.data());
  return s;
}

TEST(PackedKey, RoundTripsLowercaseHexExactly) {
  std::mt19937_64 rng(11);
  for (int n = 0; n < 10000; ++n) {
    char text[33];
    std::snprintf(text, sizeof text, "%016llx%016llx", (unsigned long long)rng(),
                  (unsigned long long)rng());
    packed_key k;
    ASSERT_TRUE(pack_hex_key(text, k)) << text;
    packed_key scalar;
    ASSERT_TRUE(packed_detail::pack_scalar(text, scalar));
    ASSERT_EQ(k, scalar) << text;
    ASSERT_EQ(hex_of(k), text);
  }
  packed_key zero;
  ASSERT_TRUE(pack_hex_key(std::string(32, '0'), zero));
  EXPECT_EQ(zero, packed_key{});
  packed_key ones;
  ASSERT_TRUE(pack_hex_key(std::string(32, 'f'), ones));
  EXPECT_EQ(ones, (packed_key{~0ull, ~0ull}));
  EXPECT_EQ(hex_of(ones), std::string(32, 'f'));
}

TEST(PackedKey, RefusesEveryNonLowercaseHexCharacterAtEveryPosition) {
  const std::string base = "0123456789abcdef0123456789abcdef";
  for (std::size_t pos = 0; pos < base.size(); ++pos) {
    for (int c = 0; c < 256; ++c) {
      std::string key = base;
      key[pos] = static_cast<char>(c);
      const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
      packed_key k;
      ASSERT_EQ(pack_hex_key(key, k), hex) << pos << " " << c;
      ASSERT_EQ(packed_detail::pack_scalar(key.data(), k), hex) << pos << " " << c;
      if (hex) {
        ASSERT_EQ(hex_of(k), key);
      }
    }
  }
}

TEST(PackedKey, OnlyExactly32CharactersPack) {
  packed_key k;
  for (std::size_t len : {0, 1, 16, 31, 33, 64}) {
    EXPECT_FALSE(pack_hex_key(std::string(len, 'a'), k)) << len;
  }
  EXPECT_FALSE(pack_hex_key("0123456789ABCDEF0123456789ABCDEF", k));  // uppercase: another key
}

packed_key key_n(std::uint64_t n) { return packed_key{n * 0x9E3779B97F4A7C15ull, n}; }

TEST(PackedMap, InsertFindEraseAgreeWithStdMap) {
  packed_map map;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint32_t> model;
  std::mt19937 rng(5);
  for (int step = 0; step < 200000; ++step) {
    // key 0 is the all-zero key, whose bytes equal an empty slot's.
    const packed_key k = key_n(rng() % 20000);
    const auto mk = std::make_pair(k.lo, k.hi);
    std::uint32_t* v = map.find(k, packed_hash(k));
    auto it = model.find(mk);
    ASSERT_EQ(v != nullptr, it != model.end()) << step;
    if (v != nullptr) {
      ASSERT_EQ(*v, it->second);
      if (rng() % 3 == 0) {
        map.erase(v);
        model.erase(it);
      } else {
        *v = static_cast<std::uint32_t>(step) + 1;
        it->second = *v;
      }
    } else {
      map.insert_new(k, packed_hash(k), static_cast<std::uint32_t>(step) + 1);
      model[mk] = static_cast<std::uint32_t>(step) + 1;
    }
    ASSERT_EQ(map.size(), model.size());
  }
  std::size_t seen = 0;
  map.for_each([&](const packed_key& k, const std::uint32_t& v) {
    ++seen;
    EXPECT_EQ(model.at({k.lo, k.hi}), v);
    EXPECT_EQ(map.find(k, packed_hash(k)), &v);
  });
  EXPECT_EQ(seen, model.size());
  EXPECT_EQ(map.stash_size(), 0u);
}

TEST(PackedMap, StaysWithinItsLoadBoundsAsItGrows) {
  packed_map map;
  for (std::uint64_t n = 1; n <= 300000; ++n) {
    const packed_key k = key_n(n);
    map.insert_new(k, packed_hash(k), 1);
    if (map.capacity() >= 8192) {
      ASSERT_LE(map.size(), map.max_size()) << n;
      ASSERT_LE(map.max_size() * 10, map.capacity() * 9) << n;
      ASSERT_GE(map.size() * 100, map.capacity() * 71) << n;  // 0.9 / 1.25 after growth
    }
  }
  EXPECT_EQ(map.stash_size(), 0u);
  for (std::uint64_t n = 1; n <= 300000; ++n)
    ASSERT_NE(map.find(key_n(n), packed_hash(key_n(n))), nullptr);
}

std::uint64_t colliding_hash(const packed_key& k) noexcept {
  return k.lo < 1000 ? 0x1234567890abcdefull : packed_hash(k);
}

TEST(PackedMap, EqualHashesGoToTheStashAndStayFindable) {
  // 40 keys share one hash: 8 fit in their two buckets, the rest must still work.
  packed_map map(colliding_hash);
  auto find = [&](const packed_key& k) { return map.find(k, colliding_hash(k)); };
  auto small = [](std::uint64_t i) { return packed_key{i, i}; };
  for (std::uint32_t i = 1; i <= 40; ++i) map.insert_new(small(i), colliding_hash(small(i)), i);
  for (std::uint32_t i = 100; i < 1100; ++i) map.insert_new(key_n(i), colliding_hash(key_n(i)), i);
  EXPECT_GT(map.stash_size(), 0u);
  for (std::uint32_t i = 1; i <= 40; ++i) {
    const std::uint32_t* v = find(small(i));
    ASSERT_NE(v, nullptr) << i;
    EXPECT_EQ(*v, i);
  }
  std::size_t visited = 0;
  map.for_each([&](const packed_key& k, const std::uint32_t& v) {
    ++visited;
    EXPECT_EQ(find(k), &v);
  });
  EXPECT_EQ(visited, map.size());
  for (std::uint32_t i = 1; i <= 40; i += 2) map.erase(find(small(i)));
  for (std::uint32_t i = 1; i <= 40; ++i) {
    const std::uint32_t* v = find(small(i));
    if (i % 2 == 1) {
      EXPECT_EQ(v, nullptr) << i;
    } else {
      ASSERT_NE(v, nullptr) << i;
      EXPECT_EQ(*v, i);
    }
  }
  EXPECT_EQ(map.size(), 20u + 1000u);
  for (std::uint32_t i = 100; i < 1100; ++i) ASSERT_NE(find(key_n(i)), nullptr);
}

TEST(PackedMap, ClearAndMoveKeepOrDropEverything) {
  packed_map map;
  for (std::uint32_t i = 0; i < 1000; ++i) map.insert_new(key_n(i), packed_hash(key_n(i)), i + 1);
  packed_map moved(std::move(map));
  EXPECT_EQ(map.size(), 0u);
  EXPECT_EQ(map.find(key_n(5), packed_hash(key_n(5))), nullptr);
  EXPECT_EQ(*moved.find(key_n(5), packed_hash(key_n(5))), 6u);
  moved.clear();
  EXPECT_EQ(moved.size(), 0u);
  EXPECT_EQ(moved.memory_bytes(), 0u);
  EXPECT_EQ(moved.find(key_n(5), packed_hash(key_n(5))), nullptr);
}

// A large table grows in steps: the grown table takes inserts at once and the old one
// is moved over a few buckets per insert. Mid-growth every key must still be found
// (wherever it sits), erased and visited exactly once, and the move must end well
// before the grown table fills up.
TEST(PackedMap, GrowsIncrementallyAndStaysWholeMidGrowth) {
  packed_map map;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint32_t> model;
  std::uint64_t n = 0;
  auto insert = [&] {
    const packed_key k = key_n(++n);
    map.insert_new(k, packed_hash(k), static_cast<std::uint32_t>(n));
    model[{k.lo, k.hi}] = static_cast<std::uint32_t>(n);
  };
  auto check_all = [&] {
    for (const auto& [mk, v] : model) {
      const std::uint32_t* got =
          map.find(packed_key{mk.first, mk.second}, packed_hash(packed_key{mk.first, mk.second}));
      ASSERT_NE(got, nullptr);
      ASSERT_EQ(*got, v);
    }
    std::size_t seen = 0;
    map.for_each([&](const packed_key& k, const std::uint32_t& v) {
      ++seen;
      ASSERT_EQ(model.at({k.lo, k.hi}), v);
    });
    ASSERT_EQ(seen, model.size());
    ASSERT_EQ(map.size(), model.size());
  };
  int growths = 0;
  while (growths < 3) {
    // Fill until a growth of a table past the incremental threshold begins.
    std::size_t before = map.capacity();
    while (!map.growing()) {
      before = map.capacity();
      insert();
    }
    ASSERT_GT(before, packed_map::incremental_buckets * packed_map::ways);
    ++growths;
    const std::size_t old_buckets = before / packed_map::ways;
    check_all();
    // Erase every third key, wherever it lives now (old table or grown one).
    std::size_t i = 0;
    for (auto it = model.begin(); it != model.end();) {
      if (i++ % 3 == 0) {
        const packed_key k{it->first.first, it->first.second};
        map.erase(map.find(k, packed_hash(k)));
        it = model.erase(it);
      } else {
        ++it;
      }
    }
    check_all();
    // The move ends after at most old_buckets / migrate_per_insert more inserts.
    std::size_t inserts = 0;
    while (map.growing()) {
      insert();
      ++inserts;
    }
    EXPECT_LE(inserts, old_buckets / packed_map::migrate_per_insert + 1);
    EXPECT_LE(map.size(), map.max_size());
    check_all();
  }
  EXPECT_EQ(map.stash_size(), 0u);
}

// Inserts key_n(1), key_n(2), ... until a growth of a table of 8192 slots or more is
// under way; returns how many keys were inserted.
std::uint32_t fill_until_growing(packed_map& map) {
  std::uint32_t n = 0;
  while (!map.growing() || map.capacity() < 8192) {
    ++n;
    map.insert_new(key_n(n), packed_hash(key_n(n)), n);
  }
  return n;
}

TEST(PackedMap, AGrowthLeftBehindByInsertsFinishesOnTicks) {
  packed_map map;
  const std::uint32_t n = fill_until_growing(map);
  const std::size_t bytes_growing = map.memory_bytes();
  std::size_t ticks = 0;
  while (map.growing() && ticks < 1000) {
    map.advance_growth();
    ++ticks;
  }
  EXPECT_FALSE(map.growing());
  EXPECT_LE(ticks, map.capacity() / packed_map::ways / packed_map::tick_buckets + 1);
  EXPECT_LT(map.memory_bytes(), bytes_growing);  // the old table is gone
  for (std::uint32_t i = 1; i <= n; ++i) ASSERT_EQ(*map.find(key_n(i), packed_hash(key_n(i))), i);
}

TEST(PackedMap, MovesAndClearsMidGrowth) {
  packed_map map;
  const std::uint32_t n = fill_until_growing(map);
  packed_map moved(std::move(map));
  EXPECT_FALSE(map.growing());
  EXPECT_TRUE(moved.growing());
  for (std::uint32_t i = 1; i <= n; ++i) ASSERT_EQ(*moved.find(key_n(i), packed_hash(key_n(i))), i);
  moved.clear();
  EXPECT_FALSE(moved.growing());
  EXPECT_EQ(moved.memory_bytes(), 0u);
  EXPECT_EQ(moved.find(key_n(1), packed_hash(key_n(1))), nullptr);
  moved.insert_new(key_n(1), packed_hash(key_n(1)), 7);
  EXPECT_EQ(*moved.find(key_n(1), packed_hash(key_n(1))), 7u);
}

// Small arrays come from calloc (aligned to a cache line here), large ones are their own
// mapping; both read as zero, prefault faults in every page exactly once, and dropping a
// moved-out prefix keeps the rest intact.
TEST(ZeroedArray, IsZeroAlignedAndKeepsWhatIsNotDropped) {
  for (const std::size_t n : {std::size_t{100}, std::size_t{1} << 20}) {
    SCOPED_TRACE(n);
    zeroed_array<std::uint64_t> a(n);
    ASSERT_EQ(a.size(), n);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % 64, 0u);
    for (std::size_t i = 0; i < n; i += 97) ASSERT_EQ(a[i], 0u);
    const std::size_t pages = a.pages_left();
    EXPECT_GE(pages * zeroed_array<std::uint64_t>::page_bytes, n * sizeof(std::uint64_t));
    a.prefault(1);
    EXPECT_EQ(a.pages_left(), pages - 1);
    a.prefault(pages);
    EXPECT_EQ(a.pages_left(), 0u);
    for (std::size_t i = 0; i < n; ++i) a[i] = i + 1;
    a.drop_prefix(n / 2);
    for (std::size_t i = n / 2; i < n; ++i) ASSERT_EQ(a[i], i + 1);
    zeroed_array<std::uint64_t> b(std::move(a));
    EXPECT_EQ(a.size(), 0u);
    EXPECT_EQ(b[n - 1], n);
  }
}

TEST(ChunkedVector, ElementsNeverMoveAsItGrows) {
  chunked_vector<std::uint64_t, 4> v;  // blocks of 16
  std::vector<const std::uint64_t*> where;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    v.emplace_back() = i;
    where.push_back(&v[i]);
  }
  ASSERT_EQ(v.size(), 1000u);
  for (std::uint64_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(&v[i], where[i]);
    ASSERT_EQ(v[i], i);
  }
  chunked_vector<std::uint64_t, 4> moved(std::move(v));
  EXPECT_EQ(v.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(moved[999], 999u);
  moved.clear();
  EXPECT_EQ(moved.size(), 0u);
  EXPECT_EQ(moved.emplace_back(), 0u);  // value-initialised
}

// A snapshot's image of a table (issue 35): loaded slot by slot into a table of the same
// buckets, it is the same table (every key found with its value, in the same slot), and
// place_at refuses whatever an image of this layout could not hold.
TEST(PackedMap, AnImageLoadsIntoTheSameSlotsAndRefusesWhatNoImageHolds) {
  std::mt19937_64 rng(41);
  packed_map source;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint32_t> model;
  for (std::uint32_t i = 1; i <= 20000; ++i) {
    const packed_key k{rng(), rng()};
    source.insert_new(k, packed_hash(k), i);
    model[{k.lo, k.hi}] = i;
  }
  for (int i = 0; i < 3000 && source.growing(); ++i) source.advance_growth();
  ASSERT_FALSE(source.growing());
  const std::size_t buckets = source.image_buckets();
  ASSERT_GT(buckets, 0u);
  struct slot_entry {
    std::size_t slot;
    packed_key key;
    std::uint32_t value;
  };
  std::vector<slot_entry> image;
  source.for_each_slot([&](std::size_t slot, const packed_key& k, std::uint32_t v) {
    ASSERT_TRUE(image.empty() || slot > image.back().slot);  // in slot order
    image.push_back({slot, k, v});
  });
  ASSERT_EQ(image.size(), model.size());

  packed_map copy;
  copy.begin_image(buckets);
  for (const slot_entry& e : image) ASSERT_TRUE(copy.place_at(e.slot, e.key, e.value));
  EXPECT_EQ(copy.size(), source.size());
  EXPECT_EQ(copy.capacity(), source.capacity());
  for (const slot_entry& e : image) {
    const std::uint32_t* v = copy.find(e.key, packed_hash(e.key));
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(*v, (model[{e.key.lo, e.key.hi}]));
  }
  std::size_t n = 0;
  copy.for_each_slot([&](std::size_t slot, const packed_key& k, std::uint32_t v) {
    ASSERT_EQ(slot, image[n].slot);
    ASSERT_EQ(k, image[n].key);
    ASSERT_EQ(v, image[n].value);
    ++n;
  });
  EXPECT_EQ(n, image.size());

  // Refusals, each on a fresh image of the same table, changing nothing.
  auto fresh = [&](std::size_t placed) {
    packed_map m;
    m.begin_image(buckets);
    for (std::size_t i = 0; i < placed; ++i)
      EXPECT_TRUE(m.place_at(image[i].slot, image[i].key, image[i].value));
    return m;
  };
  const slot_entry& last = image.back();
  const auto [b1, b2] = std::pair{(packed_hash(last.key) & 0xFFFFFFFFu) * buckets >> 32,
                                  (packed_hash(last.key) >> 32) * buckets >> 32};
  {
    packed_map m = fresh(10);
    EXPECT_FALSE(m.place_at(image[5].slot, image[20].key, image[20].value));  // before the last
    EXPECT_FALSE(m.place_at(image[11].slot, image[11].key, 0));               // no value
    EXPECT_FALSE(m.place_at(buckets * packed_map::ways, image[11].key, 1));   // past the end
    EXPECT_EQ(m.size(), 10u);
  }
  {
    // Not one of its key's buckets.
    packed_map m = fresh(0);
    std::size_t wrong = 0;
    while (wrong == b1 || wrong == b2) ++wrong;
    EXPECT_FALSE(m.place_at(wrong * packed_map::ways, last.key, last.value));
    EXPECT_EQ(m.size(), 0u);
  }
  {
    // A key twice: in the same bucket, and in its other bucket (placed before).
    packed_map m = fresh(0);
    const std::size_t first = std::min(b1, b2), second = std::max(b1, b2);
    ASSERT_TRUE(m.place_at(first * packed_map::ways, last.key, 7));
    EXPECT_FALSE(m.place_at(first * packed_map::ways + 1, last.key, 8));
    if (first != second) {
      EXPECT_FALSE(m.place_at(second * packed_map::ways, last.key, 8));
    }
    EXPECT_EQ(m.size(), 1u);
  }
  {
    // Any other change closes the image.
    packed_map m = fresh(10);
    const packed_key other{rng(), rng()};
    m.insert_new(other, packed_hash(other), 99);
    EXPECT_FALSE(m.place_at(image[10].slot, image[10].key, image[10].value));
    EXPECT_EQ(m.size(), 11u);
  }
  // A table mid-growth, or with a test's own hash, has no image.
  packed_map test_hash([](const packed_key& k) noexcept { return k.lo; });
  EXPECT_EQ(test_hash.image_buckets(), 0u);
}

// find_sweep (recovery's directory counts) answers as find does, whichever bucket it
// reads first, in any order of keys, mid-growth too.
TEST(PackedMap, SweepsFindWhatFindFinds) {
  std::mt19937_64 rng(43);
  packed_map map;
  std::vector<packed_key> keys;
  auto check = [&] {
    std::vector<packed_key> asked = keys;
    for (int i = 0; i < 2000; ++i) asked.push_back({rng(), rng()});  // absent
    std::shuffle(asked.begin(), asked.end(), rng);
    for (const bool second : {false, true}) {
      for (std::size_t first = 0; first < asked.size(); first += packed_map::sweep_batch) {
        const std::size_t n = std::min(packed_map::sweep_batch, asked.size() - first);
        std::uint64_t hashes[packed_map::sweep_batch];
        std::uint32_t* found[packed_map::sweep_batch];
        for (std::size_t i = 0; i < n; ++i) hashes[i] = packed_hash(asked[first + i]);
        map.find_sweep(&asked[first], hashes, n, second, found);
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(found[i], map.find(asked[first + i], hashes[i])) << first + i;
      }
    }
  };
  check();  // empty
  while (!map.growing()) {
    const packed_key k{rng(), rng()};
    map.insert_new(k, packed_hash(k), static_cast<std::uint32_t>(keys.size() + 1));
    keys.push_back(k);
  }
  check();  // mid-growth
  for (int i = 0; i < 5000 && map.growing(); ++i) map.advance_growth();
  ASSERT_FALSE(map.growing());
  check();
}

TEST(EntryWord, KeepsEveryPageUpToTheLimit) {
  for (std::uint32_t page : {0u, 1u, 0x3FFFFFFFu, 0x40000000u, page_pool::held_max - 1}) {
    for (bool confirmed : {false, true}) {
      const std::uint32_t w = entry_word::make(page, confirmed);
      EXPECT_NE(w, 0u);
      EXPECT_EQ(entry_word::page(w), page);
      EXPECT_EQ(entry_word::confirmed(w), confirmed);
    }
  }
}

}  // namespace
}  // namespace metad::shard
