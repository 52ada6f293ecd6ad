// The gateway's JSON as captured from etcd 3.4.23: request bodies, int64 strings,
// omitted zero fields, base64 keys; endpoint URLs; the /sync rule; the ha flags.
#include "ha/etcd.hpp"

#include <gtest/gtest.h>

#include "ha/control.hpp"

using namespace metad;

namespace {

simdjson::dom::element parse(simdjson::dom::parser& parser, const std::string& text) {
  return parser.parse(text).value();
}

TEST(EtcdJson, CampaignTxnComparesCreateRevisionZeroAndReadsTheKeyBack) {
  simdjson::dom::parser parser;
  const auto doc = parse(parser, ha::json::campaign_txn("/x/leader", "{\"node\":\"a\"}", 42));
  EXPECT_EQ(std::string_view(doc["compare"].at(0)["key"]), "L3gvbGVhZGVy");
  EXPECT_EQ(std::string_view(doc["compare"].at(0)["target"]), "CREATE");
  EXPECT_EQ(std::string_view(doc["compare"].at(0)["create_revision"]), "0");
  const auto put = doc["success"].at(0)["request_put"];
  EXPECT_EQ(std::string_view(put["lease"]), "42");
  EXPECT_EQ(std::string_view(put["value"]), "eyJub2RlIjoiYSJ9");
  EXPECT_EQ(std::string_view(doc["success"].at(1)["request_range"]["key"]), "L3gvbGVhZGVy");
  EXPECT_EQ(std::string_view(doc["failure"].at(0)["request_range"]["key"]), "L3gvbGVhZGVy");
}

TEST(EtcdJson, FencedPutComparesTheEpoch) {
  simdjson::dom::parser parser;
  const auto doc = parse(parser, ha::json::fenced_put_txn("/x/leader", 17, "/x/sync", "v"));
  EXPECT_EQ(std::string_view(doc["compare"].at(0)["create_revision"]), "17");
  EXPECT_EQ(std::string_view(doc["compare"].at(0)["result"]), "EQUAL");
  EXPECT_EQ(std::string_view(doc["success"].at(0)["request_put"]["key"]), "L3gvc3luYw==");
  EXPECT_TRUE(doc["success"].at(0)["request_put"]["lease"].error());  // not bound to a lease
}

TEST(EtcdJson, ForeignKeyRemovalComparesTheModRevision) {
  simdjson::dom::parser parser;
  const auto doc = parse(parser, ha::json::delete_if_unchanged_txn("/x/leader", 55));
  EXPECT_EQ(std::string_view(doc["compare"].at(0)["key"]), "L3gvbGVhZGVy");
  EXPECT_EQ(std::string_view(doc["compare"].at(0)["target"]), "MOD");
  EXPECT_EQ(std::string_view(doc["compare"].at(0)["result"]), "EQUAL");
  EXPECT_EQ(std::string_view(doc["compare"].at(0)["mod_revision"]), "55");
  EXPECT_EQ(std::string_view(doc["success"].at(0)["request_delete_range"]["key"]), "L3gvbGVhZGVy");
  EXPECT_TRUE(doc["failure"].error());  // nothing to do when it changed
}

TEST(EtcdJson, ReadTxnAndWatchRequest) {
  simdjson::dom::parser parser;
  const auto read = parse(parser, ha::json::read_txn({"/a", "/b"}));
  EXPECT_EQ(read["success"].get_array().size(), 2u);
  EXPECT_TRUE(read["compare"].error());
  simdjson::dom::parser parser2;
  const auto watch = parse(parser2, ha::json::watch_create("/a", 9));
  EXPECT_EQ(std::string_view(watch["create_request"]["start_revision"]), "9");
}

TEST(EtcdJson, Int64FieldsAreStringsNumbersOrOmitted) {
  simdjson::dom::parser parser;
  const auto doc = parse(parser, R"({"a":"4111120383844005125","b":7,"c":"x","d":"","e":1.5,
                                     "f":"-3","g":"99999999999999999999"})");
  EXPECT_EQ(ha::json::int64_field(doc, "a"), 4111120383844005125);
  EXPECT_EQ(ha::json::int64_field(doc, "b"), 7);
  EXPECT_EQ(ha::json::int64_field(doc, "missing"), 0);  // the gateway omits zero values
  EXPECT_EQ(ha::json::int64_field(doc, "c"), std::nullopt);
  EXPECT_EQ(ha::json::int64_field(doc, "d"), std::nullopt);
  EXPECT_EQ(ha::json::int64_field(doc, "e"), std::nullopt);
  EXPECT_EQ(ha::json::int64_field(doc, "f"), -3);
  EXPECT_EQ(ha::json::int64_field(doc, "g"), std::nullopt);
}

TEST(EtcdJson, ParsesAKeyValueAsTheGatewayPrintsIt) {
  simdjson::dom::parser parser;
  const auto kv = ha::json::parse_kv(parse(
      parser, R"({"key":"L3gvbGVhZGVy","create_revision":"2","mod_revision":"3","version":"2",)"
              R"("value":"eyJub2RlIjoiYSJ9","lease":"4111120383844005127"})"));
  ASSERT_TRUE(kv);
  EXPECT_EQ(kv->key, "/x/leader");
  EXPECT_EQ(kv->value, "{\"node\":\"a\"}");
  EXPECT_EQ(kv->create_revision, 2);
  EXPECT_EQ(kv->mod_revision, 3);
  EXPECT_EQ(kv->version, 2);
  EXPECT_EQ(kv->lease, 4111120383844005127);
  // A DELETE event's kv: only key and mod_revision.
  simdjson::dom::parser parser2;
  const auto deleted =
      ha::json::parse_kv(parse(parser2, R"({"key":"L3gvbGVhZGVy","mod_revision":"5"})"));
  ASSERT_TRUE(deleted);
  EXPECT_EQ(deleted->lease, 0);
  EXPECT_EQ(deleted->create_revision, 0);
  simdjson::dom::parser parser3;
  EXPECT_FALSE(ha::json::parse_kv(parse(parser3, R"({"key":"not base64!"})")));
}

TEST(HaEndpoints, ParsesUrlLists) {
  auto list = ha::parse_endpoints("http://127.0.0.1:2379,http://etcd-b:2380/");
  ASSERT_TRUE(list);
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].host, "127.0.0.1");
  EXPECT_EQ((*list)[0].port, 2379);
  EXPECT_EQ((*list)[1].host, "etcd-b");
  EXPECT_EQ((*list)[1].port, 2380);
  for (const char* bad :
       {"", "127.0.0.1:2379", "ftp://a:1", "http://a", "http://a:0", "http://a:65536", "http://:1",
        "http://a:1,", "http://a:1/v3", "http://a:x"}) {
    EXPECT_FALSE(ha::parse_endpoints(bad)) << bad;
  }
}

TEST(HaSync, OnlyTheListedNodesMayCampaign) {
  EXPECT_TRUE(ha::listed_in_sync(std::nullopt, "a"));  // no /sync yet: bootstrap
  const std::string sync = R"({"epoch":5,"leader":"a","sync":["b","c"]})";
  EXPECT_TRUE(ha::listed_in_sync(sync, "a"));
  EXPECT_TRUE(ha::listed_in_sync(sync, "b"));
  EXPECT_TRUE(ha::listed_in_sync(sync, "c"));
  EXPECT_FALSE(ha::listed_in_sync(sync, "d"));
  EXPECT_FALSE(ha::listed_in_sync(std::string(R"({"epoch":5,"leader":"a","sync":[]})"), "b"));
  EXPECT_FALSE(ha::listed_in_sync(std::string("{not json"), "a"));
  EXPECT_FALSE(ha::listed_in_sync(std::string(R"({"leader":"x","sync":"b"})"), "b"));
}

TEST(HaConfig, SettingsAndDefaults) {
  ha::config c;
  EXPECT_EQ(c.timings.ttl, std::chrono::milliseconds(1000));
  EXPECT_EQ(c.timings.renew_interval, std::chrono::milliseconds(200));
  EXPECT_EQ(c.timings.margin, std::chrono::milliseconds(150));
  EXPECT_NE(ha::validate(c), "");
  c.etcd.endpoints = *ha::parse_endpoints("http://127.0.0.1:1,http://127.0.0.1:2");
  c.cluster = "prod-1";
  c.node = "a";
  EXPECT_EQ(ha::validate(c), "");
  EXPECT_EQ(c.etcd.size(), 2u);
  EXPECT_EQ(ha::leader_key(c.cluster), "/hf3fs-metad/prod-1/leader");
  EXPECT_EQ(ha::sync_key(c.cluster), "/hf3fs-metad/prod-1/sync");

  c.timings = {std::chrono::milliseconds(2000), std::chrono::milliseconds(300),
               std::chrono::milliseconds(250)};
  EXPECT_EQ(ha::validate(c), "");
  EXPECT_TRUE(ha::valid_name("prod-1.a_b"));
  EXPECT_FALSE(ha::valid_name("a/b"));
  EXPECT_FALSE(ha::valid_name(""));
  EXPECT_FALSE(ha::valid_name(std::string(65, 'a')));
  EXPECT_FALSE(ha::parse_endpoints("etcd:2379"));

  c.timings.ttl = std::chrono::milliseconds(1500);
  EXPECT_NE(ha::validate(c), "");  // etcd TTLs are whole seconds
  c.timings.ttl = std::chrono::milliseconds(1000);
  c.timings.renew_interval = std::chrono::milliseconds(900);
  EXPECT_NE(ha::validate(c), "");  // renew + margin must fit in the TTL
}

}  // namespace
