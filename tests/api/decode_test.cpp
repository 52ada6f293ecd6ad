// Request decoders: every good shape and every bad-body class of spec/api.md, with the
// exact status and detail.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "api/codec.hpp"
#include "test_util.hpp"

namespace api {
namespace {

using testing::body;
using testing::strings;
using strs = std::vector<std::string>;
using ints = std::vector<std::int64_t>;

constexpr std::int64_t kPagesMax = 268435456;

constexpr std::string_view kNeedRankKeys = "Invalid request format: need 'rank' and 'keys'";
constexpr std::string_view kNeedRankConfirmations =
    "Invalid request format: need 'rank' and 'confirmations'";
constexpr std::string_view kReleasesNotList =
    "Invalid request format: 'pages_to_release' must be a list of page numbers";
constexpr std::string_view kNotObject = "Invalid JSON body: expected an object";

std::string allocate_key_detail(int index) {
  return "Invalid key at index " + std::to_string(index) +
         ": expected a string or a [key, prefix_key] pair of strings";
}
std::string string_key_detail(int index) {
  return "Invalid key at index " + std::to_string(index) + ": expected a string";
}
std::string confirmation_detail(int index) {
  return "Invalid confirmation at index " + std::to_string(index) +
         ": expected [key, page] with a string key and a non-negative integer page";
}
std::string release_detail(int index) {
  return "Invalid page in pages_to_release at index " + std::to_string(index);
}

// ---------------------------------------------------------------------------------------
// Bodies every endpoint must refuse before reading any field.

using decode_fn = std::function<error(decoder&, std::string_view)>;

struct endpoint {
  std::string_view name;
  decode_fn decode;
};

const std::vector<endpoint>& endpoints() {
  static const std::vector<endpoint> all = {
      {"initialize",
       [](decoder& d, std::string_view b) {
         initialize_cmd cmd;
         return d.decode_initialize("1", b, kPagesMax, cmd);
       }},
      {"batch_allocate",
       [](decoder& d, std::string_view b) {
         allocate_cmd cmd;
         return d.decode_allocate(b, cmd);
       }},
      {"confirm_write",
       [](decoder& d, std::string_view b) {
         confirm_cmd cmd;
         return d.decode_confirm(b, cmd);
       }},
      {"batch_exists",
       [](decoder& d, std::string_view b) {
         exists_cmd cmd;
         return d.decode_exists(b, cmd);
       }},
      {"get_locations",
       [](decoder& d, std::string_view b) {
         locations_cmd cmd;
         return d.decode_locations(b, cmd);
       }},
  };
  return all;
}

struct invalid_json_case {
  std::string_view what;
  std::string body;
  std::string_view detail;  // empty: any "Invalid JSON body: ..." detail
};

// A body that every endpoint accepts, with `extra` spliced in as an unread field.
std::string with_extra(std::string_view extra) {
  return R"({"role":"worker","num_pages":4,"rank":1,"keys":[],"confirmations":[],"extra":)" +
         std::string(extra) + "}";
}

const std::vector<invalid_json_case>& invalid_json_cases() {
  static const std::vector<invalid_json_case> all = {
      {"empty body", "", "Invalid JSON body: empty body"},
      {"only whitespace", " \r\n\t", "Invalid JSON body: empty body"},
      {"unterminated object", R"({"rank":1,"keys":[])", ""},
      {"trailing comma", R"({"rank":1,"keys":[],})", ""},
      {"second document", R"({"rank":1,"keys":[]} {})", ""},
      {"trailing garbage", R"({"rank":1,"keys":[]}x)", ""},
      {"trailing NUL", std::string("{\"rank\":1,\"keys\":[]}\0", 21), ""},
      {"single quotes", R"({'rank':1})", ""},
      {"unquoted key", R"({rank:1})", ""},
      {"NaN in unread field", with_extra("NaN"), ""},
      {"Infinity in unread field", with_extra("Infinity"), ""},
      {"-Infinity in unread field", with_extra("-Infinity"), ""},
      {"nested syntax error in unread field", with_extra(R"([1,{"a":[2,}]])"), ""},
      {"bad literal in unread field", with_extra("tru"), "Invalid JSON body: invalid literal"},
      {"null typo in unread field", with_extra("nul"), "Invalid JSON body: invalid literal"},
      {"leading zero in unread field", with_extra("01"), "Invalid JSON body: invalid number"},
      {"bare minus in unread field", with_extra("-"), "Invalid JSON body: invalid number"},
      {"fraction without digits", with_extra("1."), "Invalid JSON body: invalid number"},
      {"integer beyond uint64", with_extra("99999999999999999999999"), ""},
      {"float overflow", with_extra("1e400"), ""},
      {"bad escape in unread string", with_extra(R"("\x")"), "Invalid JSON body: invalid string"},
      {"lone surrogate", with_extra(R"("\ud800")"), "Invalid JSON body: invalid string"},
      {"raw control character in string", with_extra("\"a\x01\""),
       "Invalid JSON body: unescaped control character in string"},
      {"invalid UTF-8 in string", with_extra("\"\xff\""), "Invalid JSON body: invalid UTF-8"},
      {"unclosed string", R"({"rank":1,"keys":["abc)", ""},
      {"nesting too deep", with_extra(std::string(5000, '[') + std::string(5000, ']')), ""},
      {"UTF-16 body", std::string("{\0}\0", 4), ""},
      {"top-level array", "[]", kNotObject},
      {"top-level string", R"("rank")", kNotObject},
      {"top-level number", "1", kNotObject},
      {"top-level null", "null", kNotObject},
      {"top-level true", "true", kNotObject},
  };
  return all;
}

TEST(DecodeAnyEndpoint, RefusesBodiesThatAreNotOneJsonObject) {
  decoder d;
  for (const endpoint& ep : endpoints()) {
    for (const invalid_json_case& c : invalid_json_cases()) {
      const body b(c.body);
      const error e = ep.decode(d, b);
      EXPECT_EQ(e.status, 400) << ep.name << ": " << c.what;
      if (c.detail.empty()) {
        EXPECT_TRUE(e.detail.starts_with("Invalid JSON body: ")) << ep.name << ": " << c.what
                                                                 << " → " << e.detail;
        EXPECT_GT(e.detail.size(), std::string_view("Invalid JSON body: ").size());
      } else {
        EXPECT_EQ(e.detail, c.detail) << ep.name << ": " << c.what;
      }
    }
  }
}

TEST(DecodeAnyEndpoint, AcceptsSurroundingWhitespaceAndAByteOrderMark) {
  decoder d;
  const std::string good = R"({"rank":1,"keys":[],"confirmations":[],"num_pages":1})";
  for (const endpoint& ep : endpoints()) {
    for (const std::string& text : {" \t\r\n" + good + "\n\r\t ", "\xEF\xBB\xBF" + good}) {
      const body b(text);
      EXPECT_FALSE(ep.decode(d, b)) << ep.name << ": " << text;
    }
  }
}

// A parse error in one request leaves the decoder usable for the next.
TEST(DecodeAnyEndpoint, DecoderRecoversAfterAnError) {
  decoder d;
  allocate_cmd cmd;
  EXPECT_TRUE(d.decode_allocate(body(R"({"rank":1,"keys":[)"), cmd));
  EXPECT_FALSE(d.decode_allocate(body(R"({"rank":1,"keys":["k"]})"), cmd));
  EXPECT_EQ(strings(cmd.keys), strs{"k"});
}

// ---------------------------------------------------------------------------------------
// initialize

struct initialize_case {
  std::string_view what;
  std::string_view rank_text;
  std::string_view body;
  init_kind kind;
  std::int64_t rank = 0;
  std::int64_t num_pages = 0;  // checked for workers only
};

TEST(DecodeInitialize, ClassifiesRoleAndNumPages) {
  using enum init_kind;
  const initialize_case cases[] = {
      {"worker", "0", R"({"num_pages":100,"role":"worker"})", worker, 0, 100},
      {"negative path rank", "-3", R"({"role":"worker","num_pages":1})", worker, -3, 1},
      {"plus-signed path rank", "+5", R"({"role":"worker","num_pages":1})", worker, 5, 1},
      {"role defaults to worker", "2", R"({"num_pages":10})", worker, 2, 10},
      {"num_pages at the limit", "1", R"({"num_pages":268435456})", worker, 1, kPagesMax},
      {"unknown fields ignored", "1", R"({"num_pages":3,"x":{"y":[null,1.5]}})", worker, 1, 3},
      {"escaped field name", "1", R"({"r\u006fle":"worker","num_pages":3})", worker, 1, 3},
      {"last duplicate role wins", "1",
       R"({"role":"scheduler","role":"worker","num_pages":5})", worker, 1, 5},
      {"last duplicate num_pages wins", "1", R"({"num_pages":0,"num_pages":6})", worker, 1, 6},
      {"scheduler", "0", R"({"num_pages":0,"role":"scheduler"})", scheduler, 0},
      {"scheduler without num_pages", "0", R"({"role":"scheduler"})", scheduler, 0},
      {"scheduler ignores a bad num_pages", "0", R"({"role":"scheduler","num_pages":"x"})",
       scheduler, 0},
      {"scheduler ignores a huge num_pages", "0",
       R"({"role":"scheduler","num_pages":9223372036854775807})", scheduler, 0},
      {"last duplicate role wins (scheduler)", "0",
       R"({"role":"worker","num_pages":5,"role":"scheduler"})", scheduler, 0},
      {"empty object", "1", "{}", invalid_parameters, 1},
      {"worker without num_pages", "1", R"({"role":"worker"})", invalid_parameters, 1},
      {"zero pages", "1", R"({"role":"worker","num_pages":0})", invalid_parameters, 1},
      {"negative pages", "1", R"({"role":"worker","num_pages":-1})", invalid_parameters, 1},
      {"minimum int64 pages", "1", R"({"num_pages":-9223372036854775808})", invalid_parameters,
       1},
      {"string pages", "1", R"({"role":"worker","num_pages":"10"})", invalid_parameters, 1},
      {"float pages", "1", R"({"role":"worker","num_pages":10.0})", invalid_parameters, 1},
      {"exponent pages", "1", R"({"role":"worker","num_pages":1e2})", invalid_parameters, 1},
      {"bool pages", "1", R"({"role":"worker","num_pages":true})", invalid_parameters, 1},
      {"null pages", "1", R"({"role":"worker","num_pages":null})", invalid_parameters, 1},
      {"list pages", "1", R"({"role":"worker","num_pages":[10]})", invalid_parameters, 1},
      {"object pages", "1", R"({"role":"worker","num_pages":{"n":1}})", invalid_parameters, 1},
      {"pages beyond int64", "1", R"({"num_pages":9223372036854775808})", invalid_parameters,
       1},
      {"last duplicate num_pages wins (zero)", "1", R"({"num_pages":5,"num_pages":0})",
       invalid_parameters, 1},
      {"capitalised role", "1", R"({"role":"Worker","num_pages":1})", invalid_parameters, 1},
      {"upper-case scheduler", "1", R"({"role":"SCHEDULER"})", invalid_parameters, 1},
      {"role with space", "1", R"({"role":"worker ","num_pages":1})", invalid_parameters, 1},
      {"empty role", "1", R"({"role":"","num_pages":1})", invalid_parameters, 1},
      {"null role", "1", R"({"role":null,"num_pages":1})", invalid_parameters, 1},
      {"number role", "1", R"({"role":1,"num_pages":1})", invalid_parameters, 1},
      {"list role", "1", R"({"role":["worker"],"num_pages":1})", invalid_parameters, 1},
      {"unknown role", "1", R"({"role":"prefill","num_pages":1})", invalid_parameters, 1},
  };
  decoder d;
  for (const initialize_case& c : cases) {
    initialize_cmd cmd;
    const error e = d.decode_initialize(c.rank_text, body(c.body), kPagesMax, cmd);
    EXPECT_FALSE(e) << c.what << ": " << e.detail;
    EXPECT_EQ(cmd.kind, c.kind) << c.what;
    EXPECT_EQ(cmd.rank, c.rank) << c.what;
    if (c.kind == init_kind::worker) {
      EXPECT_EQ(cmd.num_pages, c.num_pages) << c.what;
    }
  }
}

struct initialize_error_case {
  std::string_view what;
  std::string_view rank_text;
  std::string_view body;
  std::int64_t pages_max;
  std::string_view detail;
};

TEST(DecodeInitialize, RefusesBadRanksAndOversizedPools) {
  const initialize_error_case cases[] = {
      {"pages over the default limit", "1", R"({"num_pages":268435457})", kPagesMax,
       "num_pages exceeds the limit of 268435456"},
      {"maximum int64 pages", "1", R"({"role":"worker","num_pages":9223372036854775807})",
       kPagesMax, "num_pages exceeds the limit of 268435456"},
      {"pages over a configured limit", "1", R"({"num_pages":1001})", 1000,
       "num_pages exceeds the limit of 1000"},
      {"rank not a number", "abc", R"({"num_pages":1})", kPagesMax, "Invalid rank in path"},
      {"fractional rank", "1.0", R"({"num_pages":1})", kPagesMax, "Invalid rank in path"},
      {"empty rank", "", R"({"num_pages":1})", kPagesMax, "Invalid rank in path"},
      {"rank beyond int64", "9223372036854775808", R"({"num_pages":1})", kPagesMax,
       "Invalid rank in path"},
      {"bad rank checked before the body", "x", "{", kPagesMax, "Invalid rank in path"},
      {"bad body after a good rank", "1", R"({"role":"scheduler"} x)", kPagesMax, ""},
  };
  decoder d;
  for (const initialize_error_case& c : cases) {
    initialize_cmd cmd;
    const error e = d.decode_initialize(c.rank_text, body(c.body), c.pages_max, cmd);
    EXPECT_EQ(e.status, 400) << c.what;
    if (c.detail.empty()) {
      EXPECT_TRUE(e.detail.starts_with("Invalid JSON body: ")) << c.what << ": " << e.detail;
    } else {
      EXPECT_EQ(e.detail, c.detail) << c.what;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Shared table shape for the key-list endpoints.

struct keys_case {
  std::string_view what;
  std::string body;
  std::string detail;  // empty: success expected
  std::int64_t rank = 0;
  strs keys = {};
};

const std::string kHex32 = "0123456789abcdef0123456789abcdef";
const std::string kHex64 = kHex32 + kHex32;

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
  for (std::string_view b : bodies) cases.push_back({b, std::string(b), std::string(kNeedRankKeys)});
  return cases;
}

// ---------------------------------------------------------------------------------------
// batch_allocate

TEST(DecodeAllocate, AcceptsPairsAndBareKeys) {
  std::vector<keys_case> cases = {
      {"pairs", R"({"rank":0,"keys":[["k1",""],["k2",""]]})", "", 0, {"k1", "k2"}},
      {"bare keys", R"({"rank":-7,"keys":["a","b"]})", "", -7, {"a", "b"}},
      {"mixed, prefix dropped", R"({"rank":2,"keys":["a",["b","pre"],"c"]})", "", 2,
       {"a", "b", "c"}},
      {"duplicates kept in order", R"({"rank":1,"keys":["a",["a",""],"b","a"]})", "", 1,
       {"a", "a", "b", "a"}},
      {"missing keys is empty", R"({"rank":1})", "", 1, {}},
      {"empty keys", R"({"rank":1,"keys":[]})", "", 1, {}},
      {"field order free", R"({"keys":["x"],"rank":2})", "", 2, {"x"}},
      {"unknown fields ignored", R"({"rank":1,"keys":[],"extra":{"deep":[1,2.5,null]}})", "",
       1, {}},
      {"last duplicate rank wins", R"({"rank":"x","rank":3,"keys":[]})", "", 3, {}},
      {"last duplicate keys wins", R"({"rank":1,"keys":"bad","keys":["k"]})", "", 1, {"k"}},
      {"minimum int64 rank", R"({"rank":-9223372036854775808})", "", INT64_MIN, {}},
      {"maximum int64 rank", R"({"rank":9223372036854775807})", "", INT64_MAX, {}},
      {"negative zero rank", R"({"rank":-0})", "", 0, {}},
      {"empty key", R"({"rank":1,"keys":["",["",""]]})", "", 1, {"", ""}},
      {"escapes decoded", R"({"rank":1,"keys":["a\"b","caf\u00e9","\u0000","\/"]})", "", 1,
       {"a\"b", "caf\xc3\xa9", std::string(1, '\0'), "/"}},
      {"hex keys", R"({"rank":1,"keys":[[")" + kHex32 + R"(",""],")" + kHex64 + R"("]})", "", 1,
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
    cases.push_back({keys, R"({"rank":1,"keys":)" + std::string(keys) + "}",
                     allocate_key_detail(index)});
  }
  decoder d;
  for (const keys_case& c : cases) {
    allocate_cmd cmd;
    const error e = d.decode_allocate(body(c.body), cmd);
    EXPECT_EQ(e.status, 400) << c.what;
    EXPECT_EQ(e.detail, c.detail) << c.what;
  }
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
// confirm_write

struct confirm_case {
  std::string_view what;
  std::string body;
  std::string detail;  // empty: success expected
  std::int64_t rank = 0;
  strs keys = {};
  ints pages = {};
  ints releases = {};
};

TEST(DecodeConfirm, AcceptsConfirmationsAndReleases) {
  const confirm_case cases[] = {
      {"confirmations", R"({"rank":0,"confirmations":[["a",5],["b",0]]})", "", 0, {"a", "b"},
       {5, 0}},
      {"releases only", R"({"rank":1,"confirmations":[],"pages_to_release":[3,4,5]})", "", 1,
       {}, {}, {3, 4, 5}},
      {"both", R"({"rank":-2,"confirmations":[["k",1]],"pages_to_release":[2]})", "", -2,
       {"k"}, {1}, {2}},
      {"missing lists are empty", R"({"rank":1})", "", 1},
      {"empty lists", R"({"rank":1,"confirmations":[],"pages_to_release":[]})", "", 1},
      {"duplicates kept", R"({"rank":1,"confirmations":[["a",1],["a",1]],"pages_to_release":[7,7]})",
       "", 1, {"a", "a"}, {1, 1}, {7, 7}},
      {"largest page", R"({"rank":1,"confirmations":[["a",9223372036854775807]]})", "", 1,
       {"a"}, {INT64_MAX}},
      {"negative zero page", R"({"rank":1,"confirmations":[["a",-0]],"pages_to_release":[-0]})",
       "", 1, {"a"}, {0}, {0}},
      {"last duplicate field wins",
       R"({"rank":1,"confirmations":5,"pages_to_release":null,"confirmations":[["z",9]],"pages_to_release":[1]})",
       "", 1, {"z"}, {9}, {1}},
      {"unknown fields ignored", R"({"rank":1,"extra":[[1,2]],"confirmations":[["a",2]]})", "",
       1, {"a"}, {2}},
  };
  decoder d;
  for (const confirm_case& c : cases) {
    confirm_cmd cmd;
    cmd.pages = {99};  // stale contents are replaced
    cmd.releases = {99};
    const error e = d.decode_confirm(body(c.body), cmd);
    EXPECT_FALSE(e) << c.what << ": " << e.detail;
    EXPECT_EQ(cmd.rank, c.rank) << c.what;
    EXPECT_EQ(strings(cmd.keys), c.keys) << c.what;
    EXPECT_EQ(cmd.pages, c.pages) << c.what;
    EXPECT_EQ(cmd.releases, c.releases) << c.what;
  }
}

TEST(DecodeConfirm, RefusesMalformedRequests) {
  std::vector<confirm_case> cases;
  const std::string_view shape_bodies[] = {
      "{}",
      R"({"confirmations":[]})",
      R"({"rank":null,"confirmations":[]})",
      R"({"rank":"0","confirmations":[]})",
      R"({"rank":0.0,"confirmations":[]})",
      R"({"rank":1e0,"confirmations":[]})",
      R"({"rank":true,"confirmations":[]})",
      R"({"rank":9223372036854775808,"confirmations":[]})",
      R"({"rank":1,"confirmations":null})",
      R"({"rank":1,"confirmations":{}})",
      R"({"rank":1,"confirmations":"x"})",
      R"({"rank":1,"confirmations":1})",
      R"({"rank":null,"pages_to_release":3})",
      R"({"rank":1,"confirmations":{},"pages_to_release":3})",
  };
  for (std::string_view b : shape_bodies) {
    cases.push_back({b, std::string(b), std::string(kNeedRankConfirmations)});
  }
  const std::string_view release_shapes[] = {"null", "3", R"("1")", "{}", "true"};
  for (std::string_view r : release_shapes) {
    cases.push_back({r, R"({"rank":1,"confirmations":[],"pages_to_release":)" + std::string(r) + "}",
                     std::string(kReleasesNotList)});
  }
  // A malformed confirmation list element is reported even when the releases are fine.
  cases.push_back({"releases shape before elements",
                   R"({"rank":1,"confirmations":[1],"pages_to_release":3})",
                   std::string(kReleasesNotList)});

  const std::pair<std::string_view, int> bad_confirmations[] = {
      {R"(["a"])", 0},
      {R"([5])", 0},
      {R"([null])", 0},
      {R"([{"a":1}])", 0},
      {R"([[]])", 0},
      {R"([["a"]])", 0},
      {R"([["a",1,2]])", 0},
      {R"([[1,1]])", 0},
      {R"([[null,1]])", 0},
      {R"([["a","1"]])", 0},
      {R"([["a",-1]])", 0},
      {R"([["a",-9223372036854775808]])", 0},
      {R"([["a",1.0]])", 0},
      {R"([["a",1e2]])", 0},
      {R"([["a",true]])", 0},
      {R"([["a",null]])", 0},
      {R"([["a",[1]]])", 0},
      {R"([["a",9223372036854775808]])", 0},
      {R"([["a",1],["b",-1]])", 1},
      {R"([["a",1],["b",2],["c",2.5]])", 2},
  };
  for (const auto& [list, index] : bad_confirmations) {
    cases.push_back({list, R"({"rank":1,"confirmations":)" + std::string(list) + "}",
                     confirmation_detail(index)});
  }
  cases.push_back({"confirmation checked before releases",
                   R"({"rank":1,"confirmations":[["a",-1]],"pages_to_release":[-1]})",
                   confirmation_detail(0)});

  const std::pair<std::string_view, int> bad_releases[] = {
      {"[-1]", 0},       {R"(["1"])", 0}, {"[1.0]", 0},  {"[1e1]", 0},
      {"[true]", 0},     {"[null]", 0},   {"[[1]]", 0},  {"[9223372036854775808]", 0},
      {"[1,2,-1]", 2},   {"[0,{}]", 1},
  };
  for (const auto& [list, index] : bad_releases) {
    cases.push_back({list, R"({"rank":1,"pages_to_release":)" + std::string(list) + "}",
                     release_detail(index)});
  }
  decoder d;
  for (const confirm_case& c : cases) {
    confirm_cmd cmd;
    const error e = d.decode_confirm(body(c.body), cmd);
    EXPECT_EQ(e.status, 400) << c.what;
    EXPECT_EQ(e.detail, c.detail) << c.what;
  }
}

// ---------------------------------------------------------------------------------------
// batch_exists

TEST(DecodeExists, AcceptsKeyLists) {
  const keys_case cases[] = {
      {"keys", R"({"keys":["a","b","a"]})", "", 0, {"a", "b", "a"}},
      {"missing keys is empty", "{}", "", 0, {}},
      {"empty keys", R"({"keys":[]})", "", 0, {}},
      {"other fields ignored", R"({"rank":"anything","keys":["k"]})", "", 0, {"k"}},
      {"last duplicate keys wins", R"({"keys":null,"keys":["k"]})", "", 0, {"k"}},
      {"empty key", R"({"keys":[""]})", "", 0, {""}},
  };
  decoder d;
  for (const keys_case& c : cases) {
    exists_cmd cmd;
    const error e = d.decode_exists(body(c.body), cmd);
    EXPECT_FALSE(e) << c.what << ": " << e.detail;
    EXPECT_EQ(strings(cmd.keys), c.keys) << c.what;
  }
}

TEST(DecodeExists, RefusesMalformedRequests) {
  const keys_case cases[] = {
      {"null keys", R"({"keys":null})", "Invalid keys format"},
      {"string keys", R"({"keys":"a"})", "Invalid keys format"},
      {"object keys", R"({"keys":{}})", "Invalid keys format"},
      {"number keys", R"({"keys":1})", "Invalid keys format"},
      {"last duplicate keys wins", R"({"keys":[],"keys":false})", "Invalid keys format"},
      {"number element", R"({"keys":["a",1]})", string_key_detail(1)},
      {"pair element", R"({"keys":[["a",""]]})", string_key_detail(0)},
      {"null element", R"({"keys":[null]})", string_key_detail(0)},
      {"late bad element", R"({"keys":["a","b","c",{}]})", string_key_detail(3)},
  };
  decoder d;
  for (const keys_case& c : cases) {
    exists_cmd cmd;
    const error e = d.decode_exists(body(c.body), cmd);
    EXPECT_EQ(e.status, 400) << c.what;
    EXPECT_EQ(e.detail, c.detail) << c.what;
  }
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
}  // namespace api
