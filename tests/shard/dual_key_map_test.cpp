#include "shard/dual_key_map.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "keys.hpp"

// The two-form key store on its own: which keys take the packed form, lookups, erasure,
// handles and iteration of both forms, hex keys put in the other form, bulk loading.
namespace metad::shard {
namespace {

using testing_helpers::as_parsed;

using map32 = dual_key_map<std::uint32_t>;

const std::string hex32 = "0123456789abcdef0123456789abcdef";

// Keys that look like the packed form but are not of a packed shape (32 lowercase hex
// characters; 32 uppercase or 64 of one case take the wide form: wide_keys_test.cpp).
std::vector<std::string> near_hex_keys() {
  std::string upper = hex32;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  std::string mixed = hex32;
  mixed[31] = 'F';
  std::string with_g = hex32;
  with_g[7] = 'g';
  std::string with_nul = hex32;
  with_nul[16] = '\0';
  std::string with_space = hex32;
  with_space[0] = ' ';
  return {
      hex32.substr(0, 31),         // 31 hex digits
      hex32 + "0",                 // 33 hex digits
      hex32 + hex32 + "0",         // 65 hex digits
      upper.substr(1),             // 31 upper-case hex digits
      mixed,                       // one upper-case digit
      "0x" + hex32.substr(0, 30),  // 32 characters, prefixed
      with_g,                      // one non-hex letter
      with_nul,                    // an embedded NUL
      with_space,                  // a space
      std::string("\0", 1) + hex32.substr(1),
      "",  // the empty key
      "k",
  };
}

TEST(DualKeyMap, ParsesExactly32LowercaseHexCharactersAsHex) {
  const parsed_key p = as_parsed(hex32);
  EXPECT_TRUE(p.hex);
  EXPECT_EQ(p.hash, packed_hash(p.packed));
  char text[packed_key_chars];
  unpack_hex_key(p.packed, text);
  EXPECT_EQ(std::string_view(text, sizeof text), hex32);
  EXPECT_TRUE(as_parsed(std::string(32, '0')).hex);
  EXPECT_TRUE(as_parsed(std::string(32, 'f')).hex);
  for (const std::string& k : near_hex_keys()) {
    SCOPED_TRACE(k);
    const parsed_key q = as_parsed(k);
    EXPECT_FALSE(q.hex);
    EXPECT_EQ(q.hash, table_hash(k));
  }
}

TEST(DualKeyMap, HexKeysArePackedAndEveryOtherKeyKeepsItsBytes) {
  map32 m;
  const std::vector<std::string> others = near_hex_keys();
  std::uint32_t value = 1;
  m.insert(hex32, as_parsed(hex32), value++);
  for (const std::string& k : others) m.insert(k, as_parsed(k), value++);
  EXPECT_EQ(m.size(), 1 + others.size());
  EXPECT_EQ(m.packed_size(), 1u);
  EXPECT_EQ(m.other_size(), others.size());
  EXPECT_EQ(m.hex_others(), 0u);

  const auto e = m.find(hex32, as_parsed(hex32));
  ASSERT_NE(e.word, nullptr);
  EXPECT_EQ(e.slot, nullptr);
  EXPECT_EQ(*e.word, 1u);
  value = 2;
  for (const std::string& k : others) {
    SCOPED_TRACE(k);
    const auto o = m.find(k, as_parsed(k));
    EXPECT_EQ(o.word, nullptr);
    ASSERT_NE(o.slot, nullptr);
    EXPECT_EQ(key_blob::view(o.slot->key), k);
    EXPECT_EQ(o.slot->value, value);
    const std::uint32_t* v = m.find_value(k, as_parsed(k));
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(*v, value++);
  }
  const std::string absent(32, 'a');
  EXPECT_FALSE(m.find(absent, as_parsed(absent)));
  EXPECT_EQ(m.find_value(absent, as_parsed(absent)), nullptr);
  // The all-zero key packs to the bytes of an empty slot: absent, then present.
  const std::string zeros(32, '0');
  EXPECT_FALSE(m.find(zeros, as_parsed(zeros)));
  m.insert(zeros, as_parsed(zeros), 99);
  EXPECT_EQ(*m.find(zeros, as_parsed(zeros)).word, 99u);
  m.erase(m.find(zeros, as_parsed(zeros)));
  EXPECT_FALSE(m.find(zeros, as_parsed(zeros)));
  EXPECT_EQ(m.find_value("absent", as_parsed("absent")), nullptr);
}

TEST(DualKeyMap, UpperAndLowerCaseHexAreDifferentKeys) {
  map32 m;
  std::string upper = hex32;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  m.insert(hex32, as_parsed(hex32), 10);
  EXPECT_FALSE(m.find(upper, as_parsed(upper)));
  m.insert(upper, as_parsed(upper), 20);
  EXPECT_EQ(*m.find_value(hex32, as_parsed(hex32)), 10u);
  EXPECT_EQ(*m.find_value(upper, as_parsed(upper)), 20u);
  m.erase(m.find(hex32, as_parsed(hex32)));
  EXPECT_FALSE(m.find(hex32, as_parsed(hex32)));
  EXPECT_EQ(*m.find_value(upper, as_parsed(upper)), 20u);
  EXPECT_EQ(m.size(), 1u);
}

TEST(DualKeyMap, HandlesNameKeysOfBothFormsUntilTheyAreErased) {
  map32 m;
  const std::string plain = "block-17";
  const key_handle hex = m.insert(hex32, as_parsed(hex32), 1);
  const key_handle other = m.insert(plain, as_parsed(plain), 2);
  EXPECT_EQ(hex.blob, nullptr);
  EXPECT_EQ(hex.packed, as_parsed(hex32).packed);
  ASSERT_NE(other.blob, nullptr);
  EXPECT_EQ(key_blob::view(other.blob), plain);

  EXPECT_EQ(*m.find(hex).word, 1u);
  EXPECT_EQ(m.find(other).slot->value, 2u);
  EXPECT_EQ(*m.find(hex).value(), 1u);
  EXPECT_EQ(*m.find(other).value(), 2u);
  EXPECT_EQ(m.find("absent", as_parsed("absent")).value(), nullptr);
  EXPECT_EQ(m.find(other).slot->key, other.blob);
  std::string text;
  map32::key_text(hex, text);
  EXPECT_EQ(text, hex32);
  map32::key_text(other, text);
  EXPECT_EQ(text, plain);

  // The other form's heap copy stays put while the map grows around it.
  for (int i = 0; i < 1000; ++i) {
    const std::string k = "filler-" + std::to_string(i);
    m.insert(k, as_parsed(k), 100);
  }
  EXPECT_EQ(m.find(other).slot->key, other.blob);
  EXPECT_EQ(m.find(plain, as_parsed(plain)).slot->key, other.blob);

  m.erase(m.find(hex));
  m.erase(m.find(other));
  EXPECT_FALSE(m.find(hex32, as_parsed(hex32)));
  EXPECT_FALSE(m.find(plain, as_parsed(plain)));
  EXPECT_EQ(m.size(), 1000u);
}

// The directory stores a hex key in the other form when its value does not fit a word.
struct wide {
  std::int32_t a;
  std::int32_t b;
};

TEST(DualKeyMap, AHexKeyPutInTheOtherFormIsFoundThereAndCounted) {
  dual_key_map<wide> m;
  const std::string second(32, 'e');
  m.insert_packed(as_parsed(second), 7);
  EXPECT_EQ(m.hex_others(), 0u);
  // Absent from both forms, with no hex key in the other form: the packed form answers.
  EXPECT_FALSE(m.find(hex32, as_parsed(hex32)));
  const char* blob = m.insert_other(hex32, as_parsed(hex32), wide{70000, 1});
  EXPECT_EQ(key_blob::view(blob), hex32);
  EXPECT_EQ(m.hex_others(), 1u);
  EXPECT_EQ(m.packed_size(), 1u);
  EXPECT_EQ(m.other_size(), 1u);

  const auto e = m.find(hex32, as_parsed(hex32));
  EXPECT_EQ(e.word, nullptr);
  ASSERT_NE(e.slot, nullptr);
  EXPECT_EQ(e.slot->value.a, 70000);
  EXPECT_EQ(m.find(key_handle{{}, blob}).slot, e.slot);
  EXPECT_EQ(m.find_packed(as_parsed(hex32).packed, as_parsed(hex32).hash), nullptr);
  EXPECT_EQ(*m.find(second, as_parsed(second)).word, 7u);
  const std::string absent(32, 'a');
  EXPECT_FALSE(m.find(absent, as_parsed(absent)));

  // A non-hex key in the other form does not count; erasing the hex one does.
  m.insert_other("plain", as_parsed("plain"), wide{1, 1});
  EXPECT_EQ(m.hex_others(), 1u);
  m.erase(m.find("plain", as_parsed("plain")));
  EXPECT_EQ(m.hex_others(), 1u);
  m.erase(m.find(hex32, as_parsed(hex32)));
  EXPECT_EQ(m.hex_others(), 0u);
  EXPECT_FALSE(m.find(hex32, as_parsed(hex32)));
  // The key may now take the packed form.
  m.insert_packed(as_parsed(hex32), 3);
  EXPECT_EQ(*m.find(hex32, as_parsed(hex32)).word, 3u);
  EXPECT_EQ(m.size(), 2u);
  m.insert_other("x", as_parsed("x"), wide{2, 2});
  m.clear();
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(m.hex_others(), 0u);
  EXPECT_FALSE(m.find(hex32, as_parsed(hex32)));
}

TEST(DualKeyMap, IteratesEachFormOnce) {
  map32 m;
  std::map<std::string, std::uint32_t> want_packed, want_other;
  for (std::uint32_t i = 1; i <= 300; ++i) {
    std::string k = hex32;
    for (int c = 0; c < 4; ++c)
      k[static_cast<std::size_t>(c)] = "0123456789abcdef"[(i >> (4 * c)) & 15];
    if (i % 3 == 0) k[5] = 'X';  // not hex
    m.insert(k, as_parsed(k), i);
    (i % 3 == 0 ? want_other : want_packed)[k] = i;
  }
  std::map<std::string, std::uint32_t> got_packed, got_other;
  char text[packed_key_chars];
  m.for_each_packed([&](const packed_key& k, const std::uint32_t& word) {
    unpack_hex_key(k, text);
    EXPECT_TRUE(got_packed.emplace(std::string(text, sizeof text), word).second);
  });
  m.for_each_other([&](const map32::other_slot& s) {
    EXPECT_TRUE(got_other.emplace(std::string(key_blob::view(s.key)), s.value).second);
  });
  EXPECT_EQ(got_packed, want_packed);
  EXPECT_EQ(got_other, want_other);
}

TEST(DualKeyMap, BulkLoadFindsEveryKeyAndShrinksAGuessThatWasHigh) {
  map32 m;
  constexpr std::uint32_t n = 50'000;
  m.reserve(4 * n);  // a high guess
  m.set_bulk(true);
  std::vector<std::string> keys;
  std::mt19937_64 rng(5);
  for (std::uint32_t i = 0; i < n; ++i) {
    char text[packed_key_chars];
    unpack_hex_key(packed_key{rng(), rng()}, text);
    keys.emplace_back(text, sizeof text);
    m.insert(keys.back(), as_parsed(keys.back()), i + 1);
  }
  m.set_bulk(false);
  m.shrink_to_fit();
  EXPECT_EQ(m.packed_size(), n);
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint32_t* v = m.find_value(keys[i], as_parsed(keys[i]));
    ASSERT_NE(v, nullptr) << i;
    ASSERT_EQ(*v, i + 1);
  }
}

// Random inserts, erases, value changes and growth steps, against a plain map: every
// key is found in its own form with its value, and erased keys are gone.
TEST(DualKeyMap, AgreesWithAModel) {
  std::mt19937_64 rng(11);
  map32 m;
  std::map<std::string, std::uint32_t> model;
  std::vector<std::string> universe;
  for (int i = 0; i < 6000; ++i) {
    char text[packed_key_chars];
    unpack_hex_key(packed_key{rng(), rng()}, text);
    std::string k(text, sizeof text);
    switch (i % 8) {
      case 5:
        k.pop_back();
        break;  // 31
      case 6:
        k.push_back('0');
        break;  // 33
      case 7:
        k[static_cast<std::size_t>(i) % 32] = 'Z';
        break;  // 32, not hex
      default:
        break;
    }
    universe.push_back(std::move(k));
  }
  for (int step = 0; step < 60'000; ++step) {
    const std::string& k = universe[rng() % universe.size()];
    const parsed_key p = as_parsed(k);
    const auto it = model.find(k);
    const auto e = m.find(k, p);
    ASSERT_EQ(static_cast<bool>(e), it != model.end()) << k;
    ASSERT_EQ(e.word != nullptr, e && p.hex) << k;
    if (it == model.end()) {
      const auto v = static_cast<std::uint32_t>(rng() % 1000 + 1);
      m.insert(k, p, v);
      model.emplace(k, v);
    } else if (rng() % 3 == 0) {
      ASSERT_EQ(*m.find_value(k, p), it->second);
      m.erase(e);
      model.erase(it);
    } else {
      *m.find_value(k, p) = it->second = static_cast<std::uint32_t>(rng() % 1000 + 1);
    }
    if (step % 97 == 0) m.advance_growth();
    ASSERT_EQ(m.size(), model.size());
    // verify() walks every key: after every step while the map is small, then every
    // 64th (the map holds a few thousand keys for most of the run).
    if (model.size() < 512 || step % 64 == 0) {
      ASSERT_EQ(m.verify(), "") << "step " << step;
    }
  }
  std::size_t packed = 0;
  for (const auto& [k, v] : model) {
    const std::uint32_t* got = m.find_value(k, as_parsed(k));
    ASSERT_NE(got, nullptr) << k;
    EXPECT_EQ(*got, v);
    packed += as_parsed(k).hex ? 1 : 0;
  }
  EXPECT_EQ(m.packed_size(), packed);
  EXPECT_EQ(m.other_size(), model.size() - packed);
  EXPECT_EQ(m.hex_others(), 0u);
}

}  // namespace
}  // namespace metad::shard
