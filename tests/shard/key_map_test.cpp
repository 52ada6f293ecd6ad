#include "shard/key_map.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "shard/ownership.hpp"

namespace metad::shard {
namespace {

TEST(KeyHash, IsStableAcrossRunsAndDependsOnEveryByte) {
  // Pinned values: the hash decides key ownership, so it must never change silently.
  EXPECT_EQ(key_hash(""), 0x60c06e5aa6716029ull);
  EXPECT_EQ(key_hash(std::string_view{}), 0x60c06e5aa6716029ull);
  EXPECT_EQ(key_hash("a"), 0x7790bddcdeb4d182ull);
  EXPECT_EQ(key_hash("abc"), 0xc0f4242343273606ull);
  EXPECT_EQ(key_hash("0123456789abcdef0123456789abcdef"), 0x4b81cda5620533e8ull);
  EXPECT_EQ(key_hash("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
            0x73ffe4287cff9e00ull);
  const std::string key(64, 'a');
  std::set<std::uint64_t> hashes;
  for (std::size_t len = 0; len <= key.size(); ++len) hashes.insert(key_hash({key.data(), len}));
  EXPECT_EQ(hashes.size(), key.size() + 1);
  for (std::size_t i = 0; i < key.size(); ++i) {
    std::string changed = key;
    changed[i] = 'b';
    EXPECT_NE(key_hash(changed), key_hash(key)) << i;
  }
  EXPECT_EQ(key_hash("0123456789abcdef0123456789abcdef"),
            key_hash(std::string("0123456789abcdef0123456789abcdef")));
}

// Recovery hands packed keys to their owners by key_hash of the packed form: it must be
// the hash of the text, for every key (the owner of a key is part of the on-disk contract).
TEST(KeyHash, OfAPackedKeyIsTheHashOfItsText) {
  std::mt19937_64 rng(23);
  std::vector<packed_key> keys = {
      {}, {~0ull, ~0ull}, {0x0123456789abcdefull, 0xfedcba9876543210ull}};
  for (int i = 0; i < 100000; ++i) keys.push_back({rng(), rng()});
  for (const packed_key& k : keys) {
    char text[packed_key_chars];
    unpack_hex_key(k, text);
    const std::string_view view(text, sizeof text);
    ASSERT_EQ(key_hash(k), key_hash(view)) << view;
    for (int cores : {2, 3, 8})
      ASSERT_EQ(owner_of_key(k, cores), owner_of_key(view, cores)) << view << " " << cores;
  }
  packed_key pinned;
  ASSERT_TRUE(pack_hex_key("0123456789abcdef0123456789abcdef", pinned));
  EXPECT_EQ(key_hash(pinned), 0x4b81cda5620533e8ull);
}

TEST(KeyHash, SpreadsHexKeysEvenlyOverCores) {
  std::mt19937_64 rng(7);
  for (int cores : {1, 2, 3, 8, 16, 64}) {
    std::vector<int> counts(cores, 0);
    const int n = 64000;
    char buf[33];
    for (int i = 0; i < n; ++i) {
      std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)rng(),
                    (unsigned long long)rng());
      const int owner = owner_of_key(buf, cores);
      ASSERT_GE(owner, 0);
      ASSERT_LT(owner, cores);
      ++counts[owner];
    }
    for (int c : counts) EXPECT_NEAR(c, n / cores, n / cores / 5 + 10) << cores;
  }
}

TEST(OwnerOfRank, IsNonNegativeForNegativeRanks) {
  EXPECT_EQ(owner_of_rank(0, 4), 0);
  EXPECT_EQ(owner_of_rank(5, 4), 1);
  EXPECT_EQ(owner_of_rank(-1, 4), 3);
  EXPECT_EQ(owner_of_rank(-4, 4), 0);
  EXPECT_EQ(owner_of_rank(-5, 4), 3);
  EXPECT_EQ(owner_of_rank(INT64_MIN, 3), static_cast<int>(((INT64_MIN % 3) + 3) % 3));
  EXPECT_EQ(owner_of_rank(INT64_MAX, 7), static_cast<int>(INT64_MAX % 7));
  EXPECT_EQ(owner_of_rank(-123, 1), 0);
}

TEST(KeyMap, InsertFindEraseAgreeWithStdMap) {
  key_map<std::uint32_t> map;
  std::map<std::string, std::uint32_t> model;
  std::mt19937 rng(1);
  for (int step = 0; step < 20000; ++step) {
    const std::string key = "k" + std::to_string(rng() % 2000);
    const auto h = table_hash(key);
    auto* s = map.find(key, h);
    auto it = model.find(key);
    ASSERT_EQ(s != nullptr, it != model.end()) << key;
    if (s != nullptr) {
      ASSERT_EQ(s->value, it->second);
      ASSERT_EQ(key_blob::view(s->key), key);
      if (rng() % 2) {
        map.erase(*s);
        model.erase(it);
      }
    } else {
      map.insert_new(key, h, static_cast<std::uint32_t>(step));
      model[key] = static_cast<std::uint32_t>(step);
    }
    ASSERT_EQ(map.size(), model.size());
  }
  std::size_t seen = 0;
  map.for_each([&](const auto& s) {
    ++seen;
    EXPECT_EQ(model.at(std::string(key_blob::view(s.key))), s.value);
  });
  EXPECT_EQ(seen, model.size());
}

TEST(KeyMap, CollidingHashesStayDistinct) {
  key_map<std::uint32_t> map;
  for (std::uint32_t i = 0; i < 100; ++i) map.insert_new("key" + std::to_string(i), 42, i);
  for (std::uint32_t i = 0; i < 100; i += 2) map.erase(*map.find("key" + std::to_string(i), 42));
  for (std::uint32_t i = 0; i < 100; ++i) {
    auto* s = map.find("key" + std::to_string(i), 42);
    if (i % 2) {
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(s->value, i);
    } else {
      EXPECT_EQ(s, nullptr);
    }
  }
}

TEST(KeyMap, EmptyAndBinaryKeysAreKeys) {
  key_map<std::uint32_t> map;
  const std::string binary("a\0b", 3);
  map.insert_new("", table_hash(""), 1);
  map.insert_new(binary, table_hash(binary), 2);
  EXPECT_EQ(map.find("", table_hash(""))->value, 1u);
  EXPECT_EQ(map.find(binary, table_hash(binary))->value, 2u);
  EXPECT_EQ(map.find("a", table_hash("a")), nullptr);
  key_map<std::uint32_t> moved(std::move(map));
  EXPECT_EQ(moved.size(), 2u);
  EXPECT_EQ(map.size(), 0u);
  EXPECT_EQ(moved.find(binary, table_hash(binary))->value, 2u);
}

TEST(PageOwners, TracksAndRemovesOwners) {
  page_owners owners;
  char a = 'a', b = 'b';
  std::map<std::uint32_t, char*> model;
  std::mt19937 rng(3);
  for (int step = 0; step < 20000; ++step) {
    const std::uint32_t page = rng() % 500;
    auto it = model.find(page);
    ASSERT_EQ(owners.find(page), it == model.end() ? nullptr : it->second);
    if (it == model.end()) {
      char* owner = step % 2 ? &a : &b;
      owners.insert(page, owner);
      model[page] = owner;
    } else {
      ASSERT_EQ(owners.take(page), it->second);
      model.erase(it);
    }
    ASSERT_EQ(owners.size(), model.size());
  }
  EXPECT_EQ(owners.take(100000), nullptr);
}

}  // namespace
}  // namespace metad::shard
