// batch_allocate, batch_exists, keys/delete and get_locations bodies: good shapes and
// every bad shape of docs/api.md, with the exact detail.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "api/decode.hpp"
#include "api/encode.hpp"
#include "test_util.hpp"

namespace metad::api {
namespace {

using namespace api::testing;

// Bodies whose rank/keys shape is wrong, as batch_allocate and get_locations see them.
std::vector<keys_case> rank_and_keys_shape_errors() {
  std::vector<keys_case> cases;
  const std::string_view bodies[] = {
      "{}",
      R"({"keys":[]})",
      R"({"rank":null,"keys":[]})",
      R"({"rank":"1","keys":[]})",
      R"({"rank":1.0,"keys":[]})",
      R"({"rank":1e2,"keys":[]})",
      R"({"rank":-0.0,"keys":[]})",
      R"({"rank":true,"keys":[]})",
      R"({"rank":false,"keys":[]})",
      R"({"rank":9223372036854775808,"keys":[]})",
      R"({"rank":[1],"keys":[]})",
      R"({"rank":{"r":1},"keys":[]})",
      R"({"rank":3,"rank":null,"keys":[]})",
      R"({"rank":1,"keys":null})",
      R"({"rank":1,"keys":"k"})",
      R"({"rank":1,"keys":5})",
      R"({"rank":1,"keys":{"k":""}})",
      R"({"rank":1,"keys":["k"],"keys":{}})",
      R"({"rank":null,"keys":[1]})",
      R"({"RANK":1,"keys":[]})",
  };
  for (std::string_view b : bodies)
    cases.push_back({b, std::string(b), std::string(kNeedRankKeys)});
  return cases;
}

// ---------------------------------------------------------------------------------------
// batch_allocate

TEST(DecodeAllocate, AcceptsPairsAndBareKeys) {
  std::vector<keys_case> cases = {
      {"pairs", R"({"rank":0,"keys":[["k1",""],["k2",""]]})", "", 0, {"k1", "k2"}},
      {"bare keys", R"({"rank":-7,"keys":["a","b"]})", "", -7, {"a", "b"}},
      {"mixed, prefix dropped",
       R"({"rank":2,"keys":["a",["b","pre"],"c"]})",
       "",
       2,
       {"a", "b", "c"}},
      {"duplicates kept in order",
       R"({"rank":1,"keys":["a",["a",""],"b","a"]})",
       "",
       1,
       {"a", "a", "b", "a"}},
      {"missing keys is empty", R"({"rank":1})", "", 1, {}},
      {"empty keys", R"({"rank":1,"keys":[]})", "", 1, {}},
      {"field order free", R"({"keys":["x"],"rank":2})", "", 2, {"x"}},
      {"unknown fields ignored",
       R"({"rank":1,"keys":[],"extra":{"deep":[1,2.5,null]}})",
       "",
       1,
       {}},
      {"last duplicate rank wins", R"({"rank":"x","rank":3,"keys":[]})", "", 3, {}},
      {"last duplicate keys wins", R"({"rank":1,"keys":"bad","keys":["k"]})", "", 1, {"k"}},
      {"minimum int64 rank", R"({"rank":-9223372036854775808})", "", INT64_MIN, {}},
      {"maximum int64 rank", R"({"rank":9223372036854775807})", "", INT64_MAX, {}},
      {"negative zero rank", R"({"rank":-0})", "", 0, {}},
      {"empty key", R"({"rank":1,"keys":["",["",""]]})", "", 1, {"", ""}},
      {"escapes decoded",
       R"({"rank":1,"keys":["a\"b","caf\u00e9","\u0000","\/"]})",
       "",
       1,
       {"a\"b", "caf\xc3\xa9", std::string(1, '\0'), "/"}},
      {"hex keys",
       R"({"rank":1,"keys":[[")" + kHex32 + R"(",""],")" + kHex64 + R"("]})",
       "",
       1,
       {kHex32, kHex64}},
  };
  decoder d;
  for (const keys_case& c : cases) {
    allocate_cmd cmd;
    const error e = d.decode_allocate(body(c.body), cmd);
    EXPECT_FALSE(e) << c.what << ": " << e.detail;
    EXPECT_EQ(cmd.rank, c.rank) << c.what;
    EXPECT_EQ(strings(cmd.keys), c.keys) << c.what;
  }
}

TEST(DecodeAllocate, RefusesMalformedRequests) {
  std::vector<keys_case> cases = rank_and_keys_shape_errors();
  const std::pair<std::string_view, int> bad_keys[] = {
      {R"([1])", 0},
      {R"([null])", 0},
      {R"([true])", 0},
      {R"([{"k":"p"}])", 0},
      {R"([[]])", 0},
      {R"([["k"]])", 0},
      {R"([["k","p","x"]])", 0},
      {R"([["k",null]])", 0},
      {R"([["k",1]])", 0},
      {R"([[1,""]])", 0},
      {R"([[null,""]])", 0},
      {R"([[["k"],""]])", 0},
      {R"(["a",1])", 1},
      {R"(["a",["k"]])", 1},
      {R"([["a",""],["b",""],true])", 2},
      {R"(["a","b","c","d","e","f","g","h","i","j",1.5])", 10},
  };
  for (const auto& [keys, index] : bad_keys) {
    cases.push_back(
        {keys, R"({"rank":1,"keys":)" + std::string(keys) + "}", allocate_key_detail(index)});
  }
  decoder d;
  for (const keys_case& c : cases) {
    allocate_cmd cmd;
    const error e = d.decode_allocate(body(c.body), cmd);
    EXPECT_EQ(e.status, 400) << c.what;
    EXPECT_EQ(e.detail, c.detail) << c.what;
  }
}

TEST(DecodeKeys, KeysOverTheLimitAreRefusedOnEveryEndpoint) {
  decoder d;
  d.set_key_bytes_max(4);
  // Escapes count once decoded: "\u0041" is one byte.
  const std::string detail = "Key at index 1 is 5 bytes long; the limit is 4";
  allocate_cmd allocate;
  EXPECT_FALSE(d.decode_allocate(body(R"({"rank":1,"keys":["abcd",["\u0041bcd","long-prefix"]]})"),
                                 allocate));
  EXPECT_EQ(d.decode_allocate(body(R"({"rank":1,"keys":["abcd",["abcde",""]]})"), allocate).detail,
            detail);
  confirm_cmd confirm;
  EXPECT_EQ(
      d.decode_confirm(body(R"({"rank":1,"confirmations":[["a",0],["abcde",1]]})"), confirm).detail,
      detail);
  exists_cmd exists;
  EXPECT_EQ(d.decode_exists(body(R"({"keys":["","abcde"]})"), exists).detail, detail);
  delete_cmd remove;
  EXPECT_EQ(d.decode_delete(body(R"({"keys":["","abcde"]})"), remove).status, 400);
  locations_cmd locations;
  const error e = d.decode_locations(body(R"({"rank":0,"keys":["","abcde"]})"), locations);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.detail, detail);
  EXPECT_FALSE(d.decode_exists(body(R"({"keys":["abcd","\u0041bc"]})"), exists));
}

TEST(DecodeAllocate, KeysOutliveTheNextParse) {
  decoder d;
  allocate_cmd first;
  allocate_cmd second;
  ASSERT_FALSE(d.decode_allocate(body(R"({"rank":1,"keys":["first",["k",""]]})"), first));
  ASSERT_FALSE(d.decode_allocate(body(R"({"rank":2,"keys":["second","x","y"]})"), second));
  EXPECT_EQ(strings(first.keys), (strs{"first", "k"}));
  EXPECT_EQ(strings(second.keys), (strs{"second", "x", "y"}));
  allocate_cmd moved = std::move(first);
  EXPECT_EQ(strings(moved.keys), (strs{"first", "k"}));
}

TEST(DecodeAllocate, DecodesAFullSaveTask) {
  std::string text = R"({"rank":3,"keys":[)";
  strs expected;
  for (int i = 0; i < 128; ++i) {
    std::string key = kHex32;
    key.replace(0, std::to_string(i).size(), std::to_string(i));
    expected.push_back(key);
    text += (i ? "," : "") + std::string(R"([")") + key + R"(",""])";
  }
  text += "]}";
  decoder d;
  allocate_cmd cmd;
  ASSERT_FALSE(d.decode_allocate(body(text), cmd));
  EXPECT_EQ(cmd.rank, 3);
  EXPECT_EQ(strings(cmd.keys), expected);
}

// ---------------------------------------------------------------------------------------
// batch_exists and keys/delete: one body shape, so one table for both.

std::vector<keys_case> key_strings_accepted() {
  return {
      {"keys", R"({"keys":["a","b","a"]})", "", 0, {"a", "b", "a"}},
      {"missing keys is empty", "{}", "", 0, {}},
      {"empty keys", R"({"keys":[]})", "", 0, {}},
      {"other fields ignored", R"({"rank":"anything","keys":["k"]})", "", 0, {"k"}},
      {"last duplicate keys wins", R"({"keys":null,"keys":["k"]})", "", 0, {"k"}},
      {"empty key", R"({"keys":[""]})", "", 0, {""}},
      {"escapes decoded", R"({"keys":["a\"b","\u0000"]})", "", 0, {"a\"b", std::string(1, '\0')}},
      {"hex keys",
       R"({"keys":[")" + kHex32 + R"(",")" + kHex64 + R"("]})",
       "",
       0,
       {kHex32, kHex64}},
  };
}

std::vector<keys_case> key_strings_refused() {
  return {
      {"null keys", R"({"keys":null})", "Invalid keys format"},
      {"string keys", R"({"keys":"a"})", "Invalid keys format"},
      {"object keys", R"({"keys":{}})", "Invalid keys format"},
      {"number keys", R"({"keys":1})", "Invalid keys format"},
      {"bool keys", R"({"keys":true})", "Invalid keys format"},
      {"last duplicate keys wins", R"({"keys":[],"keys":false})", "Invalid keys format"},
      {"number element", R"({"keys":["a",1]})", string_key_detail(1)},
      {"pair element", R"({"keys":[["a",""]]})", string_key_detail(0)},
      {"null element", R"({"keys":[null]})", string_key_detail(0)},
      {"bool element", R"({"keys":[false]})", string_key_detail(0)},
      {"late bad element", R"({"keys":["a","b","c",{}]})", string_key_detail(3)},
      {"not an object", R"(["a"])", std::string(kNotObject)},
  };
}

// batch_exists and /keys/delete take the same body: each decoder against both tables.
template <typename Cmd, typename Decode>
void expect_key_strings_decoded(Decode decode) {
  decoder d;
  for (const keys_case& c : key_strings_accepted()) {
    Cmd cmd;
    const error e = decode(d, body(c.body), cmd);
    EXPECT_FALSE(e) << c.what << ": " << e.detail;
    EXPECT_EQ(strings(cmd.keys), c.keys) << c.what;
  }
  for (const keys_case& c : key_strings_refused()) {
    Cmd cmd;
    const error e = decode(d, body(c.body), cmd);
    EXPECT_EQ(e.status, 400) << c.what;
    EXPECT_EQ(e.detail, c.detail) << c.what;
  }
}

TEST(DecodeExists, AcceptsKeyListsAndRefusesMalformedRequests) {
  expect_key_strings_decoded<exists_cmd>(
      [](decoder& d, std::string_view b, exists_cmd& cmd) { return d.decode_exists(b, cmd); });
}

// POST /keys/inspect: batch_exists' body and errors, and a bounded batch.
TEST(DecodeInspect, AcceptsKeyListsAndRefusesMalformedRequests) {
  expect_key_strings_decoded<inspect_cmd>(
      [](decoder& d, std::string_view b, inspect_cmd& cmd) { return d.decode_inspect(b, cmd); });
}

TEST(DecodeInspect, RefusesMoreKeysThanTheLimit) {
  decoder d;
  auto keys_body = [](std::size_t n) {
    std::string text = R"({"keys":[)";
    for (std::size_t i = 0; i < n; ++i)
      text += (i == 0 ? "\"k" : ",\"k") + std::to_string(i) + "\"";
    return text + "]}";
  };
  inspect_cmd cmd;
  ASSERT_FALSE(d.decode_inspect(body(keys_body(kInspectKeysMax)), cmd));
  EXPECT_EQ(cmd.keys.size(), kInspectKeysMax);
  const error e = d.decode_inspect(body(keys_body(kInspectKeysMax + 1)), cmd);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.detail, "Too many keys: 257; an inspection takes at most 256");
  EXPECT_EQ(cmd.keys.size(), 0u);
  // A key over --key-bytes-max is refused as on every endpoint.
  d.set_key_bytes_max(4);
  EXPECT_EQ(d.decode_inspect(body(R"({"keys":["abcde"]})"), cmd).detail,
            "Key at index 0 is 5 bytes long; the limit is 4");
}

// The scheduler's hot path: all block keys of a 20k-token prompt.
TEST(DecodeExists, DecodesALongPrompt) {
  std::string text = R"({"keys":[)";
  strs expected;
  for (int i = 0; i < 1250; ++i) {
    std::string key = kHex32;
    const std::string n = std::to_string(i);
    key.replace(key.size() - n.size(), n.size(), n);
    expected.push_back(key);
    text += (i ? ",\"" : "\"") + key + "\"";
  }
  text += "]}";
  decoder d;
  exists_cmd cmd;
  for (int round = 0; round < 3; ++round) {  // the parser is reused
    ASSERT_FALSE(d.decode_exists(body(text), cmd));
    EXPECT_EQ(strings(cmd.keys), expected);
  }
}

// A body far above the parser's retained capacity, then small ones: the parser's buffers
// shrink back and keep working.
TEST(DecodeExists, DecodesSmallBodiesAfterAHugeOne) {
  std::string text = R"({"keys":[)";
  const int count = 100000;  // ~3.5 MB, like a 1.6M-token prompt
  for (int i = 0; i < count; ++i) text += (i ? ",\"" : "\"") + kHex32 + "\"";
  text += "]}";
  decoder d;
  exists_cmd cmd;
  ASSERT_FALSE(d.decode_exists(body(text), cmd));
  EXPECT_EQ(cmd.keys.size(), static_cast<std::size_t>(count));
  for (int round = 0; round < 2; ++round) {
    ASSERT_FALSE(d.decode_exists(body(R"({"keys":["a","b"]})"), cmd));
    EXPECT_EQ(strings(cmd.keys), (strs{"a", "b"}));
    EXPECT_TRUE(d.decode_exists(body(R"({"keys":["a",)"), cmd));
  }
  ASSERT_FALSE(d.decode_exists(body(text), cmd));
  EXPECT_EQ(cmd.keys.size(), static_cast<std::size_t>(count));
}

TEST(DecodeDelete, AcceptsKeyListsAndRefusesMalformedRequests) {
  expect_key_strings_decoded<delete_cmd>(
      [](decoder& d, std::string_view b, delete_cmd& cmd) { return d.decode_delete(b, cmd); });
}

// A refused body leaves the previous command as it was: the caller never runs it, but a
// half-filled key list would be a trap.
TEST(DecodeDelete, RefusedBodyLeavesTheCommandUnchanged) {
  decoder d;
  delete_cmd cmd;
  ASSERT_FALSE(d.decode_delete(body(R"({"keys":["kept"]})"), cmd));
  EXPECT_TRUE(d.decode_delete(body(R"({"keys":["a",1]})"), cmd));
  EXPECT_EQ(strings(cmd.keys), strs{"kept"});
}

TEST(DecodeDelete, KeysOutliveTheNextParse) {
  decoder d;
  delete_cmd first;
  exists_cmd second;
  ASSERT_FALSE(d.decode_delete(body(R"({"keys":["first","k"]})"), first));
  ASSERT_FALSE(d.decode_exists(body(R"({"keys":["second","x","y"]})"), second));
  EXPECT_EQ(strings(first.keys), (strs{"first", "k"}));
  EXPECT_EQ(strings(second.keys), (strs{"second", "x", "y"}));
}

// ---------------------------------------------------------------------------------------
// get_locations

TEST(DecodeLocations, AcceptsRankAndKeys) {
  const keys_case cases[] = {
      {"keys", R"({"rank":3,"keys":["a","b"]})", "", 3, {"a", "b"}},
      {"missing keys is empty", R"({"rank":-1})", "", -1, {}},
      {"duplicates kept", R"({"rank":0,"keys":["a","a"]})", "", 0, {"a", "a"}},
      {"last duplicate rank wins", R"({"rank":null,"keys":["a"],"rank":4})", "", 4, {"a"}},
  };
  decoder d;
  for (const keys_case& c : cases) {
    locations_cmd cmd;
    const error e = d.decode_locations(body(c.body), cmd);
    EXPECT_FALSE(e) << c.what << ": " << e.detail;
    EXPECT_EQ(cmd.rank, c.rank) << c.what;
    EXPECT_EQ(strings(cmd.keys), c.keys) << c.what;
  }
}

TEST(DecodeLocations, RefusesMalformedRequests) {
  std::vector<keys_case> cases = rank_and_keys_shape_errors();
  cases.push_back({"pair element", R"({"rank":1,"keys":[["a",""]]})", string_key_detail(0)});
  cases.push_back({"number element", R"({"rank":1,"keys":[1]})", string_key_detail(0)});
  cases.push_back({"null element", R"({"rank":1,"keys":["a",null]})", string_key_detail(1)});
  decoder d;
  for (const keys_case& c : cases) {
    locations_cmd cmd;
    const error e = d.decode_locations(body(c.body), cmd);
    EXPECT_EQ(e.status, 400) << c.what;
    EXPECT_EQ(e.detail, c.detail) << c.what;
  }
}

}  // namespace
}  // namespace metad::api
