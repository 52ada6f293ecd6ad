#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "keys.hpp"
#include "rank_table_helpers.hpp"
#include "shard/directory.hpp"
#include "shard/dual_key_map.hpp"
#include "shard/packed_key.hpp"
#include "shard/rank_table.hpp"
#include "shard/wide_store.hpp"

// The hex shapes besides 32 lowercase characters (32 uppercase, 64 of one case): their
// packing, and the wide form of dual_key_map that stores them.
namespace metad::shard {
namespace {

using testing_helpers::as_parsed;

using wide_map = dual_key_map<std::uint32_t>;

std::string wide_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string wide_random_hex(std::mt19937_64& rng, std::size_t n, bool upper) {
  const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  std::string s(n, '0');
  for (char& c : s) c = digits[rng() & 15];
  return s;
}

std::string wide_unpacked(const std::string& key) {
  packed_key first, rest;
  const key_shape shape = pack_any_hex_key(key, first, rest);
  std::string out(shape_chars(shape), '\0');
  unpack_any_hex_key(shape, first, rest, out.data());
  return out;
}

const std::string sha_lower = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

TEST(WideKeys, PacksEveryHexShapeAndGivesTheExactKeyBack) {
  std::mt19937_64 rng(5);
  for (int n = 0; n < 2000; ++n) {
    for (const auto& [len, upper, shape] :
         {std::tuple{32u, false, key_shape::hex32}, std::tuple{32u, true, key_shape::hex32_upper},
          std::tuple{64u, false, key_shape::hex64},
          std::tuple{64u, true, key_shape::hex64_upper}}) {
      const std::string key = wide_random_hex(rng, len, upper);
      packed_key first, rest;
      ASSERT_EQ(pack_any_hex_key(key, first, rest), shape) << key;
      ASSERT_EQ(wide_unpacked(key), key);
      // The scalar and the vector (when built with AVX2) paths agree, half by half.
      packed_key scalar;
      ASSERT_TRUE(packed_detail::pack_scalar(key.data(), scalar, upper));
      ASSERT_EQ(scalar, first);
      if (len == 64) {
        ASSERT_TRUE(packed_detail::pack_scalar(key.data() + 32, scalar, upper));
        ASSERT_EQ(scalar, rest);
      } else {
        ASSERT_EQ(rest, packed_key{});
      }
      ASSERT_TRUE(packed_detail::pack32(key.data(), scalar, upper));
      ASSERT_EQ(scalar, first);
    }
  }
  // Digits only: both cases would pack; the lowercase shape is the one.
  packed_key first, rest;
  EXPECT_EQ(pack_any_hex_key(std::string(64, '7'), first, rest), key_shape::hex64);
  EXPECT_EQ(pack_any_hex_key(std::string(32, '7'), first, rest), key_shape::hex32);
}

TEST(WideKeys, MixedCaseWrongLengthsAndNonHexAreNotPacked) {
  packed_key first, rest;
  std::string mixed = sha_lower;
  mixed[63] = 'F';
  EXPECT_EQ(pack_any_hex_key(mixed, first, rest), key_shape::other);
  mixed = wide_upper(sha_lower);
  mixed[0] = 'a';
  EXPECT_EQ(pack_any_hex_key(mixed, first, rest), key_shape::other);
  // One half lowercase, the other uppercase: mixed.
  EXPECT_EQ(
      pack_any_hex_key(sha_lower.substr(0, 32) + wide_upper(sha_lower.substr(32)), first, rest),
      key_shape::other);
  for (std::size_t len : {0u, 1u, 31u, 33u, 48u, 63u, 65u, 96u, 128u}) {
    EXPECT_EQ(pack_any_hex_key(std::string(len, 'a'), first, rest), key_shape::other) << len;
    EXPECT_EQ(pack_any_hex_key(std::string(len, 'A'), first, rest), key_shape::other) << len;
  }
  // Every non-hex byte at every position of a 64-character key, in both cases.
  for (const std::string& base : {sha_lower, wide_upper(sha_lower)}) {
    for (std::size_t pos = 0; pos < base.size(); pos += 3) {
      for (int c = 0; c < 256; ++c) {
        const bool hex = (c >= '0' && c <= '9') ||
                         (base[10] == 'a' ? (c >= 'a' && c <= 'f') : (c >= 'A' && c <= 'F'));
        std::string key = base;
        key[pos] = static_cast<char>(c);
        ASSERT_EQ(pack_any_hex_key(key, first, rest) != key_shape::other, hex) << pos << " " << c;
        const bool upper = base[10] == 'A';
        packed_key half;
        ASSERT_EQ(packed_detail::pack_scalar(key.data() + (pos / 32) * 32, half, upper), hex);
        ASSERT_EQ(packed_detail::pack32(key.data() + (pos / 32) * 32, half, upper), hex);
      }
    }
  }
}

TEST(WideKeys, ParseGivesTheWideFormToTheOtherHexShapesOnly) {
  const std::string upper64 = wide_upper(sha_lower);
  const std::string upper32 = upper64.substr(0, 32);
  for (const std::string& k : {sha_lower, upper64, upper32}) {
    const parsed_key p = as_parsed(k);
    EXPECT_FALSE(p.hex) << k;
    EXPECT_TRUE(p.wide) << k;
    EXPECT_EQ(p.hash, packed_hash(p.packed));
  }
  EXPECT_EQ(as_parsed(sha_lower).shape, key_shape::hex64);
  EXPECT_EQ(as_parsed(upper64).shape, key_shape::hex64_upper);
  EXPECT_EQ(as_parsed(upper32).shape, key_shape::hex32_upper);
  // Keys differing only in case, or sharing a first half, have different index keys.
  EXPECT_NE(as_parsed(sha_lower).packed, as_parsed(upper64).packed);
  EXPECT_NE(as_parsed(sha_lower).packed,
            as_parsed(sha_lower.substr(0, 32) + std::string(32, '0')).packed);
  const parsed_key lower32 = as_parsed(sha_lower.substr(0, 32));
  EXPECT_TRUE(lower32.hex);
  EXPECT_FALSE(lower32.wide);
  std::string mixed = sha_lower;
  mixed[1] = 'A';
  EXPECT_FALSE(as_parsed(mixed).wide);
  EXPECT_EQ(as_parsed(mixed).hash, table_hash(mixed));
}

TEST(WideKeys, CasesAreDifferentKeysAndRoundTripThroughHandles) {
  wide_map m;
  const std::string upper64 = wide_upper(sha_lower);
  const std::string upper32 = upper64.substr(0, 32);
  const std::string lower32 = sha_lower.substr(0, 32);
  const std::string mixed64 = sha_lower.substr(0, 32) + upper64.substr(32);
  const std::vector<std::string> keys{sha_lower, upper64, upper32, lower32, mixed64};
  std::vector<key_handle> handles;
  for (std::uint32_t i = 0; i < keys.size(); ++i) {
    EXPECT_FALSE(m.find(keys[i], as_parsed(keys[i]))) << keys[i];
    handles.push_back(m.insert(keys[i], as_parsed(keys[i]), i + 1));
  }
  EXPECT_EQ(m.size(), 5u);
  EXPECT_EQ(m.wide_size(), 3u);
  EXPECT_EQ(m.packed_size(), 1u);
  EXPECT_EQ(m.other_size(), 1u);
  EXPECT_EQ(m.wide_others(), 0u);
  std::string text;
  for (std::uint32_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE(keys[i]);
    EXPECT_EQ(*m.find_value(keys[i], as_parsed(keys[i])), i + 1);
    EXPECT_EQ(*m.find(handles[i]).value(), i + 1);
    EXPECT_EQ(m.find(keys[i], as_parsed(keys[i])).word, m.find(handles[i]).word);
    wide_map::key_text(handles[i], text);
    EXPECT_EQ(text, keys[i]);
    for (std::uint32_t j = 0; j < keys.size(); ++j)
      EXPECT_EQ(handles[i].names(keys[j], as_parsed(keys[j])), i == j) << keys[j];
  }
  EXPECT_TRUE(handles[0].wide());
  EXPECT_FALSE(handles[3].wide());
  EXPECT_FALSE(handles[4].wide());
  std::map<std::string, std::uint32_t> seen;
  m.for_each_wide([&](const key_handle& h, const std::uint32_t& word) {
    wide_map::key_text(h, text);
    seen[text] = word;
  });
  EXPECT_EQ(seen,
            (std::map<std::string, std::uint32_t>{{sha_lower, 1}, {upper64, 2}, {upper32, 3}}));

  // Erasing one case leaves the other; the freed record is reused.
  const wide_record* freed = handles[0].record();
  m.erase(m.find(sha_lower, as_parsed(sha_lower)));
  EXPECT_FALSE(m.find(sha_lower, as_parsed(sha_lower)));
  EXPECT_EQ(*m.find_value(upper64, as_parsed(upper64)), 2u);
  const std::string other64(64, 'e');
  const key_handle again = m.insert(other64, as_parsed(other64), 9);
  EXPECT_EQ(again.record(), freed);
  wide_map::key_text(again, text);
  EXPECT_EQ(text, other64);
  EXPECT_EQ(m.size(), 5u);
  m.clear();
  EXPECT_EQ(m.size(), 0u);
  EXPECT_FALSE(m.find(upper64, as_parsed(upper64)));
}

// Another key with the same index key as `key`: its first half is chosen to make it so.
std::string colliding_key(const std::string& key, const packed_key& rest, key_shape shape) {
  const parsed_key p = as_parsed(key);
  const packed_key m = wide_mask(rest, shape);
  const packed_key first{p.packed.lo ^ m.lo, p.packed.hi ^ m.hi};
  std::string out(shape_chars(shape), '\0');
  unpack_any_hex_key(shape, first, rest, out.data());
  return out;
}

TEST(WideKeys, AWideKeyWhoseIndexKeyIsTakenGoesToTheOtherForm) {
  wide_map m;
  const std::string b = colliding_key(sha_lower, packed_key{1, 2}, key_shape::hex64);
  const std::string c = colliding_key(sha_lower, packed_key{}, key_shape::hex32_upper);
  ASSERT_EQ(as_parsed(b).packed, as_parsed(sha_lower).packed);
  ASSERT_EQ(as_parsed(c).packed, as_parsed(sha_lower).packed);
  ASSERT_EQ(c.size(), 32u);
  const key_handle ha = m.insert(sha_lower, as_parsed(sha_lower), 1);
  EXPECT_FALSE(m.find(b, as_parsed(b)));
  const key_handle hb = m.insert(b, as_parsed(b), 2);
  const key_handle hc = m.insert(c, as_parsed(c), 3);
  EXPECT_TRUE(ha.wide());
  EXPECT_FALSE(hb.wide());
  EXPECT_EQ(key_blob::view(hb.blob), b);
  EXPECT_EQ(key_blob::view(hc.blob), c);
  EXPECT_EQ(m.wide_others(), 2u);
  EXPECT_EQ(*m.find_value(sha_lower, as_parsed(sha_lower)), 1u);
  EXPECT_EQ(*m.find_value(b, as_parsed(b)), 2u);
  EXPECT_EQ(*m.find_value(c, as_parsed(c)), 3u);
  EXPECT_FALSE(ha.names(b, as_parsed(b)));
  EXPECT_TRUE(hb.names(b, as_parsed(b)));
  // The wide one leaves; the others stay found in the other form.
  m.erase(m.find(sha_lower, as_parsed(sha_lower)));
  EXPECT_EQ(*m.find_value(b, as_parsed(b)), 2u);
  m.erase(m.find(b, as_parsed(b)));
  EXPECT_EQ(m.wide_others(), 1u);
  EXPECT_FALSE(m.find(b, as_parsed(b)));
  EXPECT_EQ(*m.find_value(c, as_parsed(c)), 3u);
  // The index key is free: b now takes the wide form.
  EXPECT_TRUE(m.insert(b, as_parsed(b), 4).wide());
  EXPECT_EQ(*m.find_value(b, as_parsed(b)), 4u);
  EXPECT_EQ(*m.find_value(c, as_parsed(c)), 3u);
}

TEST(WideKeys, AgreesWithAModelThroughGrowth) {
  std::mt19937_64 rng(23);
  std::vector<std::string> universe;
  for (int i = 0; i < 3000; ++i) {
    universe.push_back(wide_random_hex(rng, 64, i % 3 == 1));
    universe.push_back(wide_upper(universe.back()));
    if (i % 4 == 0) universe.push_back(wide_random_hex(rng, 32, true));
  }
  wide_map m;
  std::map<std::string, std::uint32_t> model;
  for (int step = 0; step < 30000; ++step) {
    const std::string& k = universe[rng() % universe.size()];
    const parsed_key p = as_parsed(k);
    const auto e = m.find(k, p);
    const auto it = model.find(k);
    ASSERT_EQ(static_cast<bool>(e), it != model.end()) << k;
    if (e) {
      ASSERT_EQ(*e.value(), it->second);
      if (rng() % 3 == 0) {
        m.erase(e);
        model.erase(it);
      }
    } else {
      const auto v = static_cast<std::uint32_t>(step + 1);
      m.insert(k, p, v);
      model[k] = v;
    }
    if (step % 1000 == 0) m.advance_growth();
  }
  ASSERT_EQ(m.size(), model.size());
  std::map<std::string, std::uint32_t> seen;
  std::string text;
  m.for_each_wide([&](const key_handle& h, const std::uint32_t& word) {
    wide_map::key_text(h, text);
    seen[text] = word;
  });
  EXPECT_EQ(seen, model);
}

// Maps sharing one store (a core's ranks): each sees only its own keys and words, a key
// that several hold has one record (the first holder's word inline, the others' in
// their index), and a map that goes away releases what it held.
TEST(WideKeys, MapsSharingAStoreKeepOneRecordPerKeyAndTheirOwnWords) {
  std::mt19937_64 rng(41);
  std::vector<std::string> universe;
  for (int i = 0; i < 400; ++i) {
    universe.push_back(wide_random_hex(rng, 64, i % 2 == 1));
    if (i % 5 == 0) universe.push_back(wide_random_hex(rng, 32, true));
  }
  // A colliding pair: whichever comes second to the store takes the key_map form.
  universe.push_back(colliding_key(universe[0], packed_key{7, 9}, key_shape::hex64));
  wide_store store;
  constexpr int kMaps = 4;
  std::vector<std::unique_ptr<wide_map>> maps(kMaps);
  std::vector<std::map<std::string, std::uint32_t>> models(kMaps);
  const auto fresh = [&](int i) {
    maps[i] = std::make_unique<wide_map>();
    maps[i]->share(store);
    models[i].clear();
  };
  for (int i = 0; i < kMaps; ++i) fresh(i);
  const auto check = [&] {
    std::size_t held = 0;
    std::set<std::string> distinct;
    for (int i = 0; i < kMaps; ++i) {
      ASSERT_EQ(maps[i]->verify(), "") << i;
      ASSERT_EQ(maps[i]->size(), models[i].size()) << i;
      held += maps[i]->wide_size();
      std::map<std::string, std::uint32_t> seen;
      std::string text;
      maps[i]->for_each_wide([&](const key_handle& h, const std::uint32_t& word) {
        wide_map::key_text(h, text);
        seen[text] = word;
        distinct.insert(text);
      });
      maps[i]->for_each_other([&](const wide_map::other_slot& slot) {
        seen[std::string(key_blob::view(slot.key))] = slot.value;
      });
      ASSERT_EQ(seen, models[i]) << i;
    }
    std::size_t refs = 0;
    ASSERT_EQ(store.verify(refs), "");
    EXPECT_EQ(refs, held);
    EXPECT_EQ(store.size(), distinct.size());
  };
  for (int step = 0; step < 20000; ++step) {
    const int i = static_cast<int>(rng() % kMaps);
    const std::string& k = universe[rng() % universe.size()];
    const parsed_key p = as_parsed(k);
    const auto e = maps[i]->find(k, p);
    const auto it = models[i].find(k);
    ASSERT_EQ(static_cast<bool>(e), it != models[i].end()) << k;
    if (e) {
      ASSERT_EQ(*e.value(), it->second);
      if (rng() % 3 == 0) {
        maps[i]->erase(e);
        models[i].erase(it);
      }
    } else {
      const auto v = static_cast<std::uint32_t>(step + 1);
      const key_handle h = maps[i]->insert(k, p, v);
      models[i][k] = v;
      // Another map holding the key names the same record.
      for (int j = 0; j < kMaps && h.wide(); ++j) {
        const auto other = maps[j]->find(k, p);
        if (j != i && other) {
          EXPECT_EQ(other.record, h.record());
        }
      }
    }
    if (step % 997 == 0) {
      check();
      store.advance_growth();
    }
    if (step % 5003 == 5002) fresh(static_cast<int>(rng() % kMaps));  // one goes away
  }
  check();
  for (int i = 0; i < kMaps; ++i) maps[i]->clear();
  EXPECT_EQ(store.size(), 0u);
  maps.clear();
  EXPECT_EQ(store.maps(), 0u);
}

// The vLLM key store and the directory, with 64-hex keys of both cases.
TEST(WideKeys, RankTableAndDirectoryKeepCasesApartAndAnswerExactKeys) {
  using namespace testing_helpers;
  const std::string upper64 = wide_upper(sha_lower);
  const std::string upper32 = upper64.substr(0, 32);
  rank_table t;
  t.initialize(3, 10);
  EXPECT_EQ(pages_of(t, 3, {sha_lower, upper64, upper32}), (V{0, 1, 2}));
  EXPECT_EQ(pages_of(t, 3, {upper64, sha_lower}), (V{1, 0}));
  EXPECT_EQ(confirm(t, 3, {upper64}, {1}).outcome, confirm_outcome::ok);
  EXPECT_EQ(confirmed(t, 3, {sha_lower, upper64, upper32}), (V{-1, 1, -1}));
  const auto bad = confirm(t, 3, {sha_lower}, {2});
  EXPECT_EQ(bad.outcome, confirm_outcome::bad_request);
  EXPECT_EQ(bad.detail, "Page 2 is not reserved for key " + sha_lower + " on rank 3");
  EXPECT_EQ(t.check_invariants(), "");
  std::set<std::tuple<std::string, std::int64_t, bool>> entries;
  t.for_each_entry([&](std::int64_t, std::string_view key, std::int64_t page, bool c) {
    entries.emplace(std::string(key), page, c);
  });
  EXPECT_EQ(entries, (std::set<std::tuple<std::string, std::int64_t, bool>>{
                         {sha_lower, 0, false}, {upper64, 1, true}, {upper32, 2, false}}));
  EXPECT_EQ(confirm(t, 3, {}, {}, {0, 2}).outcome, confirm_outcome::ok);  // releases
  EXPECT_EQ(confirmed(t, 3, {sha_lower, upper64, upper32}), (V{-1, 1, -1}));
  EXPECT_EQ(t.check_invariants(), "");

  directory d;
  d.add_confirmation(sha_lower, 2, 0);
  d.add_confirmation(upper64, 1, 0);
  EXPECT_FALSE(d.complete(sha_lower));
  EXPECT_TRUE(d.complete(upper64));
  d.add_confirmation(sha_lower, 2, 0);
  EXPECT_TRUE(d.complete(sha_lower));
  std::set<std::tuple<std::string, std::int32_t, std::int32_t>> keys;
  d.for_each_key([&](std::string_view key, std::int32_t tp, std::int32_t count) {
    keys.emplace(std::string(key), tp, count);
  });
  EXPECT_EQ(keys, (std::set<std::tuple<std::string, std::int32_t, std::int32_t>>{{sha_lower, 2, 2},
                                                                                 {upper64, 1, 1}}));
}

}  // namespace
}  // namespace metad::shard
