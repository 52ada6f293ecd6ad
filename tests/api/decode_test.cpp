// Request decoding common to all endpoints (whole-body JSON validation) and
// /rank/{rank}/initialize, with the exact status and detail of docs/api.md.
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
      {"keys/delete",
       [](decoder& d, std::string_view b) {
         delete_cmd cmd;
         return d.decode_delete(b, cmd);
       }},
      {"keys/inspect",
       [](decoder& d, std::string_view b) {
         inspect_cmd cmd;
         return d.decode_inspect(b, cmd);
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
      {"malformed number beside a big one", with_extra("[99999999999999999999999,01]"),
       "Invalid JSON body: invalid number"},
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
        EXPECT_TRUE(e.detail.starts_with("Invalid JSON body: "))
            << ep.name << ": " << c.what << " → " << e.detail;
        EXPECT_GT(e.detail.size(), std::string_view("Invalid JSON body: ").size());
      } else {
        EXPECT_EQ(e.detail, c.detail) << ep.name << ": " << c.what;
      }
    }
  }
}

// Valid JSON whatever simdjson's number range: Python's json.loads takes them.
TEST(DecodeAnyEndpoint, AcceptsNumbersBeyond64BitsInUnreadFields) {
  decoder d;
  for (const endpoint& ep : endpoints()) {
    for (std::string_view big : {"99999999999999999999999", "-9223372036854775809", "1e400",
                                 "[18446744073709551616,\"1e999\",-1e999]"}) {
      const body b(with_extra(big));
      EXPECT_EQ(ep.decode(d, b).status, 0) << ep.name << ": " << big;
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
      {"last duplicate role wins", "1", R"({"role":"scheduler","role":"worker","num_pages":5})",
       worker, 1, 5},
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
      {"minimum int64 pages", "1", R"({"num_pages":-9223372036854775808})", invalid_parameters, 1},
      {"string pages", "1", R"({"role":"worker","num_pages":"10"})", invalid_parameters, 1},
      {"float pages", "1", R"({"role":"worker","num_pages":10.0})", invalid_parameters, 1},
      {"exponent pages", "1", R"({"role":"worker","num_pages":1e2})", invalid_parameters, 1},
      {"bool pages", "1", R"({"role":"worker","num_pages":true})", invalid_parameters, 1},
      {"null pages", "1", R"({"role":"worker","num_pages":null})", invalid_parameters, 1},
      {"list pages", "1", R"({"role":"worker","num_pages":[10]})", invalid_parameters, 1},
      {"object pages", "1", R"({"role":"worker","num_pages":{"n":1}})", invalid_parameters, 1},
      {"pages beyond int64", "1", R"({"num_pages":9223372036854775808})", invalid_parameters, 1},
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

}  // namespace
}  // namespace metad::api
