#include "shard/dual_key_map.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

// The two-form key store on its own: which keys take the packed form, lookups, erasure,
// handles and iteration of both forms, hex keys put in the other form, bulk loading.
namespace metad::shard {
namespace {

using map32 = dual_key_map<std::uint32_t>;

parsed_key parsed(std::string_view key) {
  parsed_key p;
  parse_key(key, p);
  return p;
}

const std::string lower = "0123456789abcdef0123456789abcdef";

// Keys that look like the packed form but are not exactly 32 lowercase hex characters.
std::vector<std::string> near_hex_keys() {
  std::string upper = lower;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  std::string mixed = lower;
  mixed[31] = 'F';
  std::string with_g = lower;
  with_g[7] = 'g';
  std::string with_nul = lower;
  with_nul[16] = '\0';
  std::string with_space = lower;
  with_space[0] = ' ';
  return {
      lower.substr(0, 31),         // 31 hex digits
      lower + "0",                 // 33 hex digits
      lower + lower,               // 64 (a SHA-256 in hex)
      upper,                       // upper-case hex is a different key
      mixed,                       // one upper-case digit
      "0x" + lower.substr(0, 30),  // 32 characters, prefixed
      with_g,                      // one non-hex letter
      with_nul,                    // an embedded NUL
      with_space,                  // a space
      std::string("\0", 1) + lower.substr(1),
      "",  // the empty key
      "k",
  };
}

TEST(DualKeyMap, ParsesExactly32LowercaseHexCharactersAsHex) {
  const parsed_key p = parsed(lower);
  EXPECT_TRUE(p.hex);
  EXPECT_EQ(p.hash, packed_hash(p.packed));
  char text[packed_key_chars];
  unpack_hex_key(p.packed, text);
  EXPECT_EQ(std::string_view(text, sizeof text), lower);
  EXPECT_TRUE(parsed(std::string(32, '0')).hex);
  EXPECT_TRUE(parsed(std::string(32, 'f')).hex);
  for (const std::string& k : near_hex_keys()) {
    SCOPED_TRACE(k);
    const parsed_key q = parsed(k);
    EXPECT_FALSE(q.hex);
    EXPECT_EQ(q.hash, table_hash(k));
  }
}

TEST(DualKeyMap, HexKeysArePackedAndEveryOtherKeyKeepsItsBytes) {
  map32 m;
  const std::vector<std::string> others = near_hex_keys();
  std::uint32_t value = 1;
  m.insert(lower, parsed(lower), value++);
  for (const std::string& k : others) m.insert(k, parsed(k), value++);
  EXPECT_EQ(m.size(), 1 + others.size());
  EXPECT_EQ(m.packed_size(), 1u);
  EXPECT_EQ(m.other_size(), others.size());
  EXPECT_EQ(m.hex_others(), 0u);

  const auto e = m.find(lower, parsed(lower));
  ASSERT_NE(e.word, nullptr);
  EXPECT_EQ(e.slot, nullptr);
  EXPECT_EQ(*e.word, 1u);
  value = 2;
  for (const std::string& k : others) {
    SCOPED_TRACE(k);
    const auto o = m.find(k, parsed(k));
    EXPECT_EQ(o.word, nullptr);
    ASSERT_NE(o.slot, nullptr);
    EXPECT_EQ(key_blob::view(o.slot->key), k);
    EXPECT_EQ(o.slot->value, value);
    const std::uint32_t* v = m.find_value(k, parsed(k));
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(*v, value++);
  }
  const std::string absent(32, 'a');
  EXPECT_FALSE(m.find(absent, parsed(absent)));
  EXPECT_EQ(m.find_value(absent, parsed(absent)), nullptr);
  // The all-zero key packs to the bytes of an empty slot: absent, then present.
  const std::string zeros(32, '0');
  EXPECT_FALSE(m.find(zeros, parsed(zeros)));
  m.insert(zeros, parsed(zeros), 99);
  EXPECT_EQ(*m.find(zeros, parsed(zeros)).word, 99u);
  m.erase(m.find(zeros, parsed(zeros)));
  EXPECT_FALSE(m.find(zeros, parsed(zeros)));
  EXPECT_EQ(m.find_value("absent", parsed("absent")), nullptr);
}

TEST(DualKeyMap, UpperAndLowerCaseHexAreDifferentKeys) {
  map32 m;
  std::string upper = lower;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  m.insert(lower, parsed(lower), 10);
  EXPECT_FALSE(m.find(upper, parsed(upper)));
  m.insert(upper, parsed(upper), 20);
  EXPECT_EQ(*m.find_value(lower, parsed(lower)), 10u);
  EXPECT_EQ(*m.find_value(upper, parsed(upper)), 20u);
  m.erase(m.find(lower, parsed(lower)));
  EXPECT_FALSE(m.find(lower, parsed(lower)));
  EXPECT_EQ(*m.find_value(upper, parsed(upper)), 20u);
  EXPECT_EQ(m.size(), 1u);
}

TEST(DualKeyMap, HandlesNameKeysOfBothFormsUntilTheyAreErased) {
  map32 m;
  const std::string plain = "block-17";
  const key_handle hex = m.insert(lower, parsed(lower), 1);
  const key_handle other = m.insert(plain, parsed(plain), 2);
  EXPECT_EQ(hex.blob, nullptr);
  EXPECT_EQ(hex.packed, parsed(lower).packed);
  ASSERT_NE(other.blob, nullptr);
  EXPECT_EQ(key_blob::view(other.blob), plain);

  EXPECT_EQ(*m.find(hex).word, 1u);
  EXPECT_EQ(m.find(other).slot->value, 2u);
  EXPECT_EQ(*m.find(hex).value(), 1u);
  EXPECT_EQ(*m.find(other).value(), 2u);
  EXPECT_EQ(m.find("absent", parsed("absent")).value(), nullptr);
  EXPECT_EQ(m.find(other).slot->key, other.blob);
  std::string text;
  map32::key_text(hex, text);
  EXPECT_EQ(text, lower);
  map32::key_text(other, text);
  EXPECT_EQ(text, plain);

  // The other form's heap copy stays put while the map grows around it.
  for (int i = 0; i < 1000; ++i) {
    const std::string k = "filler-" + std::to_string(i);
    m.insert(k, parsed(k), 100);
  }
  EXPECT_EQ(m.find(other).slot->key, other.blob);
  EXPECT_EQ(m.find(plain, parsed(plain)).slot->key, other.blob);

  m.erase(m.find(hex));
  m.erase(m.find(other));
  EXPECT_FALSE(m.find(lower, parsed(lower)));
  EXPECT_FALSE(m.find(plain, parsed(plain)));
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
  m.insert_packed(parsed(second), 7);
  EXPECT_EQ(m.hex_others(), 0u);
  // Absent from both forms, with no hex key in the other form: the packed form answers.
  EXPECT_FALSE(m.find(lower, parsed(lower)));
  const char* blob = m.insert_other(lower, parsed(lower), wide{70000, 1});
  EXPECT_EQ(key_blob::view(blob), lower);
  EXPECT_EQ(m.hex_others(), 1u);
  EXPECT_EQ(m.packed_size(), 1u);
  EXPECT_EQ(m.other_size(), 1u);

  const auto e = m.find(lower, parsed(lower));
  EXPECT_EQ(e.word, nullptr);
  ASSERT_NE(e.slot, nullptr);
  EXPECT_EQ(e.slot->value.a, 70000);
  EXPECT_EQ(m.find(key_handle{{}, blob}).slot, e.slot);
  EXPECT_EQ(m.find_packed(parsed(lower).packed, parsed(lower).hash), nullptr);
  EXPECT_EQ(*m.find(second, parsed(second)).word, 7u);
  const std::string absent(32, 'a');
  EXPECT_FALSE(m.find(absent, parsed(absent)));

  // A non-hex key in the other form does not count; erasing the hex one does.
  m.insert_other("plain", parsed("plain"), wide{1, 1});
  EXPECT_EQ(m.hex_others(), 1u);
  m.erase(m.find("plain", parsed("plain")));
  EXPECT_EQ(m.hex_others(), 1u);
  m.erase(m.find(lower, parsed(lower)));
  EXPECT_EQ(m.hex_others(), 0u);
  EXPECT_FALSE(m.find(lower, parsed(lower)));
  // The key may now take the packed form.
  m.insert_packed(parsed(lower), 3);
  EXPECT_EQ(*m.find(lower, parsed(lower)).word, 3u);
  EXPECT_EQ(m.size(), 2u);
  m.insert_other("x", parsed("x"), wide{2, 2});
  m.clear();
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(m.hex_others(), 0u);
  EXPECT_FALSE(m.find(lower, parsed(lower)));
}

TEST(DualKeyMap, IteratesEachFormOnce) {
  map32 m;
  std::map<std::string, std::uint32_t> want_packed, want_other;
  for (std::uint32_t i = 1; i <= 300; ++i) {
    std::string k = lower;
    for (int c = 0; c < 4; ++c)
      k[static_cast<std::size_t>(c)] = "0123456789abcdef"[(i >> (4 * c)) & 15];
    if (i % 3 == 0) k[5] = 'X';  // not hex
    m.insert(k, parsed(k), i);
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
    m.insert(keys.back(), parsed(keys.back()), i + 1);
  }
  m.set_bulk(false);
  m.shrink_to_fit();
  EXPECT_EQ(m.packed_size(), n);
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint32_t* v = m.find_value(keys[i], parsed(keys[i]));
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
    const parsed_key p = parsed(k);
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
  }
  std::size_t packed = 0;
  for (const auto& [k, v] : model) {
    const std::uint32_t* got = m.find_value(k, parsed(k));
    ASSERT_NE(got, nullptr) << k;
    EXPECT_EQ(*got, v);
    packed += parsed(k).hex ? 1 : 0;
  }
  EXPECT_EQ(m.packed_size(), packed);
  EXPECT_EQ(m.other_size(), model.size() - packed);
  EXPECT_EQ(m.hex_others(), 0u);
}

}  // namespace
}  // namespace metad::shard
