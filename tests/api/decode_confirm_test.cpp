// confirm_write bodies: confirmations, releases, and every bad shape of docs/api.md.
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
      {"confirmations",
       R"({"rank":0,"confirmations":[["a",5],["b",0]]})",
       "",
       0,
       {"a", "b"},
       {5, 0}},
      {"releases only",
       R"({"rank":1,"confirmations":[],"pages_to_release":[3,4,5]})",
       "",
       1,
       {},
       {},
       {3, 4, 5}},
      {"both",
       R"({"rank":-2,"confirmations":[["k",1]],"pages_to_release":[2]})",
       "",
       -2,
       {"k"},
       {1},
       {2}},
      {"missing lists are empty", R"({"rank":1})", "", 1},
      {"empty lists", R"({"rank":1,"confirmations":[],"pages_to_release":[]})", "", 1},
      {"duplicates kept",
       R"({"rank":1,"confirmations":[["a",1],["a",1]],"pages_to_release":[7,7]})",
       "",
       1,
       {"a", "a"},
       {1, 1},
       {7, 7}},
      {"largest page",
       R"({"rank":1,"confirmations":[["a",9223372036854775807]]})",
       "",
       1,
       {"a"},
       {INT64_MAX}},
      {"negative zero page",
       R"({"rank":1,"confirmations":[["a",-0]],"pages_to_release":[-0]})",
       "",
       1,
       {"a"},
       {0},
       {0}},
      {"last duplicate field wins",
       R"({"rank":1,"confirmations":5,"pages_to_release":null,)"
       R"("confirmations":[["z",9]],"pages_to_release":[1]})",
       "",
       1,
       {"z"},
       {9},
       {1}},
      {"unknown fields ignored",
       R"({"rank":1,"extra":[[1,2]],"confirmations":[["a",2]]})",
       "",
       1,
       {"a"},
       {2}},
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
    cases.push_back({r,
                     R"({"rank":1,"confirmations":[],"pages_to_release":)" + std::string(r) + "}",
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
      {"[-1]", 0},     {R"(["1"])", 0}, {"[1.0]", 0}, {"[1e1]", 0},
      {"[true]", 0},   {"[null]", 0},   {"[[1]]", 0}, {"[9223372036854775808]", 0},
      {"[1,2,-1]", 2}, {"[0,{}]", 1},
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

}  // namespace
}  // namespace metad::api
