// 64-hex keys (SHA-256, as SGLang sends them) in lowercase and uppercase are two
// different keys on both APIs, through the whole pipeline: the vLLM key store packs
// them (the wide form), SGLang's pools keep their bytes.
#include <gtest/gtest.h>

#include <string>

#include "basic_sim_node.hpp"

namespace {

using sim_node = server_test::memory_node;  // in memory (tests/pipeline links no persist)

const std::string wire_lower = "8d969eef6ecad3c29a3a629280e686cf0c3f5d5a86aff3ca12020c923adc6c92";
const std::string wire_upper = "8D969EEF6ECAD3C29A3A629280E686CF0C3F5D5A86AFF3CA12020C923ADC6C92";

TEST(WideKeysWire, UpperAndLowerCase64HexKeysAreDifferentKeysOnTheVllmApi) {
  sim_node n(metad::config{}, 2);
  for (int r = 0; r < 2; ++r)
    n.post("/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":4,"role":"worker"})");
  for (int r = 0; r < 2; ++r) {
    const std::string rank = std::to_string(r);
    EXPECT_EQ(n.post("/keys/batch_allocate", "{\"rank\":" + rank + ",\"keys\":[[\"" + wire_lower +
                                                 "\",\"\"],[\"" + wire_upper + "\",\"\"]]}"),
              "{\"rank\":" + rank + ",\"results\":[[\"" + wire_lower + "\",0],[\"" + wire_upper +
                  "\",1]]}");
    EXPECT_EQ(n.post("/keys/confirm_write", "{\"rank\":" + rank + ",\"confirmations\":[[\"" +
                                                wire_lower + "\",0]],\"pages_to_release\":[]}"),
              "");
  }
  EXPECT_EQ(
      n.post("/keys/batch_exists", "{\"keys\":[\"" + wire_lower + "\",\"" + wire_upper + "\"]}"),
      R"({"exists":[true,false]})");
  EXPECT_EQ(n.post("/keys/get_locations",
                   "{\"rank\":1,\"keys\":[\"" + wire_upper + "\",\"" + wire_lower + "\"]}"),
            R"({"locations":[null,0]})");
  const std::string inspect =
      n.post("/keys/inspect", "{\"keys\":[\"" + wire_upper + "\",\"" + wire_lower + "\"]}");
  EXPECT_NE(inspect.find(wire_upper), std::string::npos) << inspect;
  EXPECT_NE(inspect.find(wire_lower), std::string::npos) << inspect;
}

TEST(WideKeysWire, UpperAndLowerCase64HexKeysAreDifferentKeysOnTheSglangApi) {
  sim_node n(metad::config{}, 2);
  n.post("/0/initialize", R"({"num_pages":4})");
  const std::string got =
      n.post("/0/reserve_and_allocate_page_indices",
             "{\"keys\":[[\"" + wire_lower + "\",\"\"],[\"" + wire_upper + "\",\"\"]]}");
  EXPECT_EQ(got.rfind("{\"indices\":[[false,", 0), 0u) << got;
  const std::string page = got.substr(got.find("[false,") + 7, 1);
  n.post("/0/confirm_write",
         "{\"written_keys_to_confirm\":[[\"" + wire_lower + "\"," + page + "]]}");
  EXPECT_EQ(n.post("/0/exists", "{\"keys\":[\"" + wire_lower + "\",\"" + wire_upper + "\"]}"),
            R"({"exists":[true,false]})");
  EXPECT_EQ(
      n.post("/0/get_page_indices", "{\"keys\":[\"" + wire_upper + "\",\"" + wire_lower + "\"]}"),
      "{\"indices\":[null," + page + "]}");
}

}  // namespace
