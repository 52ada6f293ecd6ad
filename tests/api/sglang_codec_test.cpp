// SGLang bodies (docs/sglang-api.md): good shapes, namespace defaults, and every bad shape
// with its exact detail; the answers byte for byte as the reference writes them.
#include "api/sglang_codec.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.hpp"

namespace metad::api {
namespace {

using namespace api::testing;

constexpr std::int64_t kCeiling = 268435456;

strs keys_of(const key_list& keys) {
  strs out;
  for (std::string_view k : keys.views()) out.emplace_back(k);
  return out;
}

struct bad_case {
  std::string body;
  std::string detail;
};

// ---------------------------------------------------------------------------------------
// initialize

TEST(SglangDecodeInitialize, ReadsNumPagesAndNamespace) {
  sglang_decoder d;
  sg_initialize_cmd cmd;
  ASSERT_FALSE(
      d.decode_initialize(body(R"({"num_pages":1024,"namespace":"mamba"})"), kCeiling, cmd));
  EXPECT_EQ(cmd.num_pages, 1024);
  EXPECT_EQ(cmd.ns, "mamba");
  ASSERT_FALSE(d.decode_initialize(body(R"({"num_pages":0})"), kCeiling, cmd));
  EXPECT_EQ(cmd.num_pages, 0);  // legal: test_empty_batch_and_zero_capacity
  EXPECT_EQ(cmd.ns, "kv");
  ASSERT_FALSE(d.decode_initialize(body(R"({"num_pages":268435456})"), kCeiling, cmd));
  EXPECT_EQ(cmd.num_pages, kCeiling);
}

TEST(SglangDecodeInitialize, RefusesBadNumPagesThenBadNamespace) {
  const std::string init(kSglangInvalidInit), ns(kSglangInvalidNamespace);
  const std::vector<bad_case> cases = {
      {"{}", init},
      {R"({"num_pages":null})", init},
      {R"({"num_pages":"4"})", init},
      {R"({"num_pages":4.0})", init},
      {R"({"num_pages":4e0})", init},
      {R"({"num_pages":true})", init},
      {R"({"num_pages":false})", init},
      {R"({"num_pages":-1})", init},
      {R"({"num_pages":268435457})", init},
      {R"({"num_pages":99999999999999999999999})", init},
      {R"({"num_pages":[4]})", init},
      {R"({"num_pages":"x","namespace":5})", init},  // num_pages is read first
      {R"({"num_pages":4,"namespace":null})", ns},
      {R"({"num_pages":4,"namespace":5})", ns},
      {R"({"num_pages":4,"namespace":""})", ns},
      {R"({"num_pages":4,"namespace":["kv"]})", ns},
      {R"({"num_pages":4,"namespace":")" + std::string(129, 'n') + "\"}", ns},
      {"[]", std::string(kNotObject)},
      {"", "Invalid JSON body: empty body"},
      {R"({"num_pages":4)", "Invalid JSON body: syntax error or trailing content"},
      {R"({"num_pages":4} x)", "Invalid JSON body: syntax error or trailing content"},
      {R"({"num_pages":NaN})", "Invalid JSON body: syntax error or trailing content"},
  };
  sglang_decoder d;
  for (const auto& c : cases) {
    sg_initialize_cmd cmd;
    const error e = d.decode_initialize(body(c.body), kCeiling, cmd);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.detail, c.detail) << c.body;
  }
}

TEST(SglangDecodeInitialize, NamespaceLimitCountsCharactersNotBytes) {
  sglang_decoder d;
  sg_initialize_cmd cmd;
  std::string ns;
  for (int i = 0; i < 128; ++i) ns += "\xC3\xA9";  // 128 x "é": 256 bytes
  ASSERT_FALSE(
      d.decode_initialize(body(R"({"num_pages":1,"namespace":")" + ns + "\"}"), kCeiling, cmd));
  EXPECT_EQ(cmd.ns, ns);
  ASSERT_FALSE(d.decode_initialize(body(R"({"num_pages":1,"namespace":"\u00e9"})"), kCeiling, cmd));
  EXPECT_EQ(cmd.ns, "\xC3\xA9");
  EXPECT_TRUE(
      d.decode_initialize(body(R"({"num_pages":1,"namespace":")" + ns + "e\"}"), kCeiling, cmd));
}

// ---------------------------------------------------------------------------------------
// exists, delete_keys, get_page_indices

using keys_decode = error (sglang_decoder::*)(std::string_view, sg_keys_cmd&);

class SglangStringKeys : public ::testing::TestWithParam<keys_decode> {};

TEST_P(SglangStringKeys, ReadsKeysAndDefaultsNamespace) {
  sglang_decoder d;
  sg_keys_cmd cmd;
  ASSERT_FALSE((d.*GetParam())(body(R"({"keys":["a","b","a"],"namespace":"kv"})"), cmd));
  EXPECT_EQ(keys_of(cmd.keys), (strs{"a", "b", "a"}));
  EXPECT_EQ(cmd.ns, "kv");
  ASSERT_FALSE((d.*GetParam())(body(R"({"keys":[]})"), cmd));
  EXPECT_TRUE(cmd.keys.views().empty());
  EXPECT_EQ(cmd.ns, "kv");
  ASSERT_FALSE((d.*GetParam())(body(R"({"namespace":"swa"})"), cmd));  // missing keys: []
  EXPECT_TRUE(cmd.keys.views().empty());
  EXPECT_EQ(cmd.ns, "swa");
  ASSERT_FALSE((d.*GetParam())(body(R"({"keys":["k\u0000\"x"],"extra":{"a":[1,2]}})"), cmd));
  EXPECT_EQ(keys_of(cmd.keys), (strs{std::string("k\0\"x", 4)}));
}

TEST_P(SglangStringKeys, RefusesKeysThatAreNotAListOfStrings) {
  const std::string keys(kSglangInvalidKeys);
  const std::vector<bad_case> cases = {
      {R"({"keys":null})", keys},       {R"({"keys":"ab"})", keys},
      {R"({"keys":{"a":1}})", keys},    {R"({"keys":[1]})", keys},
      {R"({"keys":["a",null]})", keys}, {R"({"keys":[true]})", keys},
      {R"({"keys":[["a",""]]})", keys}, {R"({"keys":["a"],"namespace":7})", "Invalid namespace"},
  };
  sglang_decoder d;
  for (const auto& c : cases) {
    sg_keys_cmd cmd;
    const error e = (d.*GetParam())(body(c.body), cmd);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.detail, c.detail) << c.body;
  }
}

TEST_P(SglangStringKeys, RefusesKeysOverTheLimit) {
  sglang_decoder d;
  d.set_key_bytes_max(3);
  sg_keys_cmd cmd;
  const error e = (d.*GetParam())(body(R"({"keys":["abc","abcd"]})"), cmd);
  EXPECT_EQ(e.detail, "Key at index 1 is 4 bytes long; the limit is 3");
}

INSTANTIATE_TEST_SUITE_P(ExistsDeleteGet, SglangStringKeys,
                         ::testing::Values(&sglang_decoder::decode_exists,
                                           &sglang_decoder::decode_delete_keys,
                                           &sglang_decoder::decode_get_page_indices,
                                           &sglang_decoder::decode_inspect));

TEST(SglangDecodeInspect, RefusesMoreKeysThanTheLimit) {
  sglang_decoder d;
  std::string text = R"({"namespace":"kv","keys":[)";
  for (std::size_t i = 0; i <= kInspectKeysMax; ++i)
    text += (i == 0 ? "\"k" : ",\"k") + std::to_string(i) + "\"";
  text += "]}";
  sg_keys_cmd cmd;
  const error e = d.decode_inspect(body(text), cmd);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.detail, "Too many keys: 257; an inspection takes at most 256");
  EXPECT_TRUE(cmd.ns_valid);  // the pool's 404 still comes first
}

TEST(SglangDecodeKeys, ExistsReportsKeysBeforeTheNamespaceOthersAfter) {
  sglang_decoder d;
  sg_keys_cmd cmd;
  const std::string both = R"({"keys":5,"namespace":null})";
  EXPECT_EQ(d.decode_exists(body(both), cmd).detail, kSglangInvalidKeys);
  EXPECT_FALSE(cmd.ns_valid);
  EXPECT_EQ(d.decode_delete_keys(body(both), cmd).detail, kSglangInvalidNamespace);
  EXPECT_EQ(d.decode_get_page_indices(body(both), cmd).detail, kSglangInvalidNamespace);
  // A keys error leaves a valid namespace readable, for the 404 the pool lookup gives first.
  EXPECT_TRUE(d.decode_get_page_indices(body(R"({"keys":5,"namespace":"mamba"})"), cmd));
  EXPECT_TRUE(cmd.ns_valid);
  EXPECT_EQ(cmd.ns, "mamba");
}

// ---------------------------------------------------------------------------------------
// reserve_and_allocate_page_indices

TEST(SglangDecodeReserve, ReadsPairsAndBareKeys) {
  sglang_decoder d;
  sg_keys_cmd cmd;
  ASSERT_FALSE(
      d.decode_reserve(body(R"({"keys":[["a",""],["b","a"],"c"],"namespace":"kv"})"), cmd));
  EXPECT_EQ(keys_of(cmd.keys), (strs{"a", "b", "c"}));
  EXPECT_EQ(cmd.ns, "kv");
  ASSERT_FALSE(d.decode_reserve(body(R"({"keys":["ab"]})"), cmd));
  EXPECT_EQ(keys_of(cmd.keys), (strs{"ab"}));  // a key, not "a" with prefix "b"
  ASSERT_FALSE(d.decode_reserve(body(R"({})"), cmd));
  EXPECT_TRUE(cmd.keys.views().empty());
}

TEST(SglangDecodeReserve, RefusesEveryOtherElement) {
  auto at = [](int i) {
    return "Invalid key at index " + std::to_string(i) +
           ": expected a [key, prefix_key] pair of strings or a string";
  };
  const std::vector<bad_case> cases = {
      {R"({"keys":[["a"]]})", at(0)},
      {R"({"keys":[["a","",""]]})", at(0)},
      {R"({"keys":[["a",null]]})", at(0)},
      {R"({"keys":[[1,""]]})", at(0)},
      {R"({"keys":[["a",""],5]})", at(1)},
      {R"({"keys":[["a",""],null]})", at(1)},
      {R"({"keys":[["a",""],[]]})", at(1)},
      {R"({"keys":[["a",""],{"k":""}]})", at(1)},
      {R"({"keys":"ab"})", std::string(kSglangInvalidKeys)},
      {R"({"keys":null})", std::string(kSglangInvalidKeys)},
      {R"({"keys":[1],"namespace":null})", std::string(kSglangInvalidNamespace)},
  };
  sglang_decoder d;
  for (const auto& c : cases) {
    sg_keys_cmd cmd;
    const error e = d.decode_reserve(body(c.body), cmd);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.detail, c.detail) << c.body;
  }
}

// ---------------------------------------------------------------------------------------
// confirm_write

TEST(SglangDecodeConfirm, ReadsConfirmationsAndReleases) {
  sglang_decoder d;
  sg_confirm_cmd cmd;
  ASSERT_FALSE(d.decode_confirm(
      body(
          R"({"written_keys_to_confirm":[["a",3],["b",2]],"pages_to_release":[1],"namespace":"kv"})"),
      cmd));
  EXPECT_EQ(keys_of(cmd.keys), (strs{"a", "b"}));
  EXPECT_EQ(cmd.pages, (ints{3, 2}));
  EXPECT_EQ(cmd.releases, (ints{1}));
  ASSERT_FALSE(d.decode_confirm(body("{}"), cmd));  // both default to []
  EXPECT_TRUE(cmd.keys.views().empty());
  EXPECT_TRUE(cmd.pages.empty());
  EXPECT_TRUE(cmd.releases.empty());
  EXPECT_EQ(cmd.ns, "kv");
  // Ranges are the pool's to check (it knows num_pages): any int64 passes here.
  ASSERT_FALSE(d.decode_confirm(
      body(R"({"written_keys_to_confirm":[["a",-1]],"pages_to_release":[999]})"), cmd));
  EXPECT_EQ(cmd.pages, (ints{-1}));
  EXPECT_EQ(cmd.releases, (ints{999}));
}

TEST(SglangDecodeConfirm, RefusesMalformedShapes) {
  auto conf = [](int i) {
    return "Invalid confirmation at index " + std::to_string(i) +
           ": expected [key, page] with a string key and an integer page";
  };
  auto rel = [](int i) { return "Invalid page in pages_to_release at index " + std::to_string(i); };
  const std::string not_list(kSglangConfirmationsNotList), rel_list(kSglangReleasesNotList);
  const std::vector<bad_case> cases = {
      {R"({"written_keys_to_confirm":null})", not_list},
      {R"({"written_keys_to_confirm":{"a":1}})", not_list},
      {R"({"written_keys_to_confirm":"a"})", not_list},
      {R"({"pages_to_release":null})", rel_list},
      {R"({"pages_to_release":3})", rel_list},
      {R"({"written_keys_to_confirm":[["a"]]})", conf(0)},
      {R"({"written_keys_to_confirm":[["a",1,2]]})", conf(0)},
      {R"({"written_keys_to_confirm":[[1,1]]})", conf(0)},
      {R"({"written_keys_to_confirm":[["a",1],["b","x"]]})", conf(1)},
      {R"({"written_keys_to_confirm":[["a",1.0]]})", conf(0)},
      {R"({"written_keys_to_confirm":[["a",true]]})", conf(0)},
      {R"({"written_keys_to_confirm":[["a",null]]})", conf(0)},
      {R"({"written_keys_to_confirm":[["a",99999999999999999999]]})", conf(0)},
      {R"({"written_keys_to_confirm":["a"]})", conf(0)},
      {R"({"pages_to_release":[1,"x"]})", rel(1)},
      {R"({"pages_to_release":[null]})", rel(0)},
      {R"({"pages_to_release":[1.5]})", rel(0)},
      {R"({"pages_to_release":[false]})", rel(0)},
      {R"({"written_keys_to_confirm":[],"namespace":""})", std::string(kSglangInvalidNamespace)},
  };
  sglang_decoder d;
  for (const auto& c : cases) {
    sg_confirm_cmd cmd;
    const error e = d.decode_confirm(body(c.body), cmd);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.detail, c.detail) << c.body;
  }
}

// ---------------------------------------------------------------------------------------
// clear

TEST(SglangDecodeClear, EmptyBodyIsTheDefaultNamespace) {
  sglang_decoder d;
  sg_clear_cmd cmd;
  ASSERT_FALSE(d.decode_clear(body(""), cmd));
  EXPECT_EQ(cmd.ns, "kv");
  ASSERT_FALSE(d.decode_clear(body("{}"), cmd));
  EXPECT_EQ(cmd.ns, "kv");
  ASSERT_FALSE(d.decode_clear(body(R"({"namespace":"indexer"})"), cmd));
  EXPECT_EQ(cmd.ns, "indexer");
  EXPECT_EQ(d.decode_clear(body(R"({"namespace":null})"), cmd).detail, kSglangInvalidNamespace);
  EXPECT_EQ(d.decode_clear(body("[]"), cmd).detail, kNotObject);
  EXPECT_EQ(d.decode_clear(body(" "), cmd).status, 400);
}

// ---------------------------------------------------------------------------------------
// Answers

TEST(SglangEncode, AnswersAreCompactLikeOrjson) {
  std::string out;
  const std::vector<std::uint8_t> exists = {0, 1, 0};
  const ints pages = {2, 0, -1};
  encode_sglang_reserved(out, exists, pages);
  EXPECT_EQ(out, R"({"indices":[[false,2],[true,0],[false,-1]]})");
  out.clear();
  struct slot {
    bool exists;
    std::int64_t page;
  };
  const std::vector<slot> slots = {{false, 7}, {true, 3}};
  encode_sglang_reserved(out, slots);
  EXPECT_EQ(out, R"({"indices":[[false,7],[true,3]]})");
  out.clear();
  encode_sglang_reserved(out, std::vector<slot>{});
  EXPECT_EQ(out, R"({"indices":[]})");
  out.clear();
  encode_sglang_page_indices(out, ints{2, -1, 0});
  EXPECT_EQ(out, R"({"indices":[2,null,0]})");
  out.clear();
  encode_sglang_page_indices(out, ints{});
  EXPECT_EQ(out, R"({"indices":[]})");
  out.clear();
  encode_exists(out, std::vector<std::uint8_t>{1, 0});
  EXPECT_EQ(out, R"({"exists":[true,false]})");
}

TEST(SglangEncode, ErrorDetailsMatchTheReference) {
  std::string out;
  encode_sglang_not_initialized(out, -3, "kv");
  EXPECT_EQ(
      out,
      R"({"detail":"Rank -3 namespace 'kv' not initialized. Please call /-3/initialize first."})");
  out.clear();
  encode_sglang_not_initialized(out, 0, "a\"b");
  EXPECT_EQ(
      out,
      R"({"detail":"Rank 0 namespace 'a\"b' not initialized. Please call /0/initialize first."})");
  out.clear();
  encode_sglang_already_initialized(out, 1, "mamba", 4096);
  EXPECT_EQ(out, R"({"detail":"Rank 1 namespace 'mamba' already initialized with 4096 pages"})");
}

}  // namespace
}  // namespace metad::api
