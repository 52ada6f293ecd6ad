// SGLang's HiCache API (docs/sglang-api.md) through the whole pipeline, byte-in/byte-out,
// on 1 and 3 simulated cores: the answers as SGLang's client sees them, the errors byte
// for byte, tenants, and the separation from vLLM's state.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "basic_sim_node.hpp"

namespace {

using sim_node = server_test::memory_node;  // in memory (tests/pipeline links no persist)

constexpr std::string_view kNoContent = "HTTP/1.1 204 No Content\r\n\r\n";

std::string json(std::string_view status_line, std::string_view body) {
  return fmt::format(
      "HTTP/1.1 {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{}", status_line,
      body.size(), body);
}
std::string ok(std::string_view body) { return json("200 OK", body); }
std::string bad(std::string_view detail) {
  return json("400 Bad Request", fmt::format(R"({{"detail":"{}"}})", detail));
}
std::string not_initialized(std::string_view rank, std::string_view ns) {
  return json("404 Not Found",
              fmt::format(R"({{"detail":"Rank {} namespace '{}' not initialized. Please call )"
                          R"(/{}/initialize first."}})",
                          rank, ns, rank));
}

class SglangPipeline : public ::testing::TestWithParam<int> {
 protected:
  // With --release-quarantine-ms 0: these tests assert the reference's page order
  // exactly, as SGLang's own tests do (the quarantine: sglang_replay_test.cpp).
  static metad::config reference_order(metad::config cfg) {
    cfg.release_quarantine_ms = 0;
    return cfg;
  }
  explicit SglangPipeline(metad::config cfg = {})
      : n_(reference_order(std::move(cfg)), GetParam()) {}

  std::string post(std::string_view path, std::string_view body) {
    return n_.send(fmt::format("POST {} HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{}", path,
                               body.size(), body));
  }
  std::string stats() { return n_.get("/stats"); }

  sim_node n_;
};

INSTANTIATE_TEST_SUITE_P(Cores, SglangPipeline, ::testing::Values(1, 3));

TEST_P(SglangPipeline, SaveThenLoadAsTheClientDoes) {
  EXPECT_EQ(post("/0/initialize", R"({"num_pages":4,"namespace":"kv"})"), kNoContent);
  EXPECT_EQ(post("/0/initialize", R"({"num_pages":4,"namespace":"kv"})"), kNoContent);
  // LIFO: the first reservation gets the highest page; a repeated key copies its answer.
  EXPECT_EQ(post("/0/reserve_and_allocate_page_indices",
                 R"({"keys":[["a",""],["b",""],["c",""],["a",""]],"namespace":"kv"})"),
            ok(R"({"indices":[[false,3],[false,2],[false,1],[false,3]]})"));
  // In flight: not visible yet.
  EXPECT_EQ(post("/0/exists", R"({"keys":["a","b"],"namespace":"kv"})"),
            ok(R"({"exists":[false,false]})"));
  // a and b written, c's write failed: released.
  EXPECT_EQ(post("/0/confirm_write",
                 R"({"written_keys_to_confirm":[["a",3],["b",2]],"pages_to_release":[1],)"
                 R"("namespace":"kv"})"),
            kNoContent);
  EXPECT_EQ(post("/0/exists", R"({"keys":["a","b","c","a"],"namespace":"kv"})"),
            ok(R"({"exists":[true,true,false,true]})"));
  EXPECT_EQ(post("/0/get_page_indices", R"({"keys":["b","c","a"],"namespace":"kv"})"),
            ok(R"({"indices":[2,null,3]})"));
  // A hit answers (true, page); the released page 1 is handed out first again.
  EXPECT_EQ(post("/0/reserve_and_allocate_page_indices",
                 R"({"keys":[["a",""],["d",""]],"namespace":"kv"})"),
            ok(R"({"indices":[[true,3],[false,1]]})"));
  EXPECT_EQ(post("/0/confirm_write", R"({"written_keys_to_confirm":[["d",1]],"namespace":"kv"})"),
            kNoContent);
  // Full: the LRU bound key (b: a was touched by the reserve, d confirmed after) is
  // evicted, but never a hit of the same batch.
  EXPECT_EQ(post("/0/reserve_and_allocate_page_indices",
                 R"({"keys":[["e",""],["f",""],["g",""]],"namespace":"kv"})"),
            ok(R"({"indices":[[false,0],[false,2],[false,3]]})"));
  EXPECT_EQ(post("/0/exists", R"({"keys":["a","b","d"],"namespace":"kv"})"),
            ok(R"({"exists":[false,false,true]})"));
  // Every page in flight but d's, which is a hit here: -1.
  EXPECT_EQ(post("/0/reserve_and_allocate_page_indices",
                 R"({"keys":[["d",""],["h",""]],"namespace":"kv"})"),
            ok(R"({"indices":[[true,1],[false,-1]]})"));
  // delete_keys frees d's page; clear keeps the pool registered.
  EXPECT_EQ(post("/0/delete_keys", R"({"keys":["d","zz"],"namespace":"kv"})"), kNoContent);
  EXPECT_EQ(post("/0/exists", R"({"keys":["d"]})"), ok(R"({"exists":[false]})"));
  EXPECT_EQ(post("/0/clear", R"({"namespace":"kv"})"), kNoContent);
  // Writes reserved before the clear do not bind after it.
  EXPECT_EQ(post("/0/confirm_write", R"({"written_keys_to_confirm":[["e",0]]})"), kNoContent);
  EXPECT_EQ(post("/0/exists", R"({"keys":["e"]})"), ok(R"({"exists":[false]})"));
  EXPECT_EQ(post("/0/get_page_indices", R"({"keys":["e"]})"), ok(R"({"indices":[null]})"));
}

TEST_P(SglangPipeline, EmptyPoolsAndBatches) {
  EXPECT_EQ(post("/5/initialize", R"({"num_pages":0})"), kNoContent);
  EXPECT_EQ(post("/5/reserve_and_allocate_page_indices", R"({"keys":[["a",""]]})"),
            ok(R"({"indices":[[false,-1]]})"));
  EXPECT_EQ(post("/5/reserve_and_allocate_page_indices", R"({"keys":[]})"),
            ok(R"({"indices":[]})"));
  EXPECT_EQ(post("/5/exists", R"({})"), ok(R"({"exists":[]})"));
  EXPECT_EQ(post("/5/get_page_indices", R"({"keys":[]})"), ok(R"({"indices":[]})"));
  EXPECT_EQ(post("/5/confirm_write", R"({})"), kNoContent);
  EXPECT_EQ(post("/5/clear", ""), kNoContent);  // an empty body is {}
}

TEST_P(SglangPipeline, NamespacesRanksAndRankSpellingsArePools) {
  EXPECT_EQ(post("/1/initialize", R"({"num_pages":2})"), kNoContent);
  EXPECT_EQ(post("/1/initialize", R"({"num_pages":8,"namespace":"mamba"})"), kNoContent);
  EXPECT_EQ(post("/+01/reserve_and_allocate_page_indices", R"({"keys":[["h_mamba",""]],)"
                                                           R"("namespace":"mamba"})"),
            ok(R"({"indices":[[false,7]]})"));
  EXPECT_EQ(post("/1/reserve_and_allocate_page_indices", R"({"keys":[["h",""]]})"),
            ok(R"({"indices":[[false,1]]})"));
  EXPECT_EQ(post("/2/exists", R"({"keys":["h"]})"), not_initialized("2", "kv"));
  EXPECT_EQ(post("/1/exists", R"({"keys":["h"],"namespace":"swa"})"), not_initialized("1", "swa"));
  EXPECT_EQ(post("/-9223372036854775808/initialize", R"({"num_pages":1})"), kNoContent);
  EXPECT_EQ(post("/-9223372036854775808/get_page_indices", R"({"keys":["x"]})"),
            ok(R"({"indices":[null]})"));
  for (int r = 0; r < 6; ++r) {  // ranks on every core
    const std::string path = fmt::format("/{}/", 100 + r);
    EXPECT_EQ(post(path + "initialize", R"({"num_pages":3})"), kNoContent);
    EXPECT_EQ(post(path + "reserve_and_allocate_page_indices", R"({"keys":[["k",""]]})"),
              ok(R"({"indices":[[false,2]]})"));
  }
}

TEST_P(SglangPipeline, ErrorsByteForByte) {
  // Every pool-first operation answers the missing pool's 404 before a body error.
  const char* pool_first[] = {"reserve_and_allocate_page_indices", "confirm_write", "delete_keys",
                              "clear", "get_page_indices"};
  for (const char* op : pool_first) {
    EXPECT_EQ(post(fmt::format("/7/{}", op), R"({"keys":5,"written_keys_to_confirm":5})"),
              not_initialized("7", "kv"))
        << op;
  }
  EXPECT_EQ(post("/+07/clear", R"({"namespace":"a\"b"})"),
            json("404 Not Found", R"({"detail":"Rank 7 namespace 'a\"b' not initialized. )"
                                  R"(Please call /7/initialize first."})"));
  // exists reads keys first.
  EXPECT_EQ(post("/7/exists", R"({"keys":"ab"})"), bad("Invalid keys format"));
  EXPECT_EQ(post("/7/exists", "{"), bad("Invalid JSON body: syntax error or trailing content"));
  EXPECT_EQ(post("/7/clear", R"({"namespace":5})"), bad("Invalid namespace"));
  EXPECT_EQ(post("/7/initialize", R"({"num_pages":"4"})"),
            bad("Invalid initialization parameters"));
  EXPECT_EQ(post("/7/initialize", R"({"num_pages":-1})"), bad("Invalid initialization parameters"));
  EXPECT_EQ(post("/7/initialize", R"({"num_pages":281474976710657})"),  // 2^48 + 1
            bad("Invalid initialization parameters"));
  EXPECT_EQ(post("/7/initialize", R"({"num_pages":true})"),
            bad("Invalid initialization parameters"));
  EXPECT_EQ(post("/7/initialize", R"({"num_pages":4,"namespace":""})"), bad("Invalid namespace"));
  EXPECT_EQ(post("/7/initialize", "[]"), bad("Invalid JSON body: expected an object"));
  EXPECT_EQ(post("/99999999999999999999/exists", "{}"), bad("Invalid rank in path"));
  EXPECT_EQ(post("/t/x1/exists", "{}"), bad("Invalid rank in path"));
  EXPECT_EQ(post("/x/exists", "{}"), json("404 Not Found", R"({"detail":"Not Found"})"));
  EXPECT_EQ(post("/7/exists/", "{}"), json("404 Not Found", R"({"detail":"Not Found"})"));
  EXPECT_EQ(n_.send("GET /7/exists HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 405 Method Not Allowed\r\ncontent-type: application/json\r\ncontent-length: "
            "31\r\nallow: POST\r\n\r\n{\"detail\":\"Method Not Allowed\"}");
  // Nothing above created a pool.
  EXPECT_EQ(stats().find("sglang"), std::string::npos);

  // With the pool: the body's errors, nothing changed.
  EXPECT_EQ(post("/7/initialize", R"({"num_pages":4})"), kNoContent);
  EXPECT_EQ(post("/7/reserve_and_allocate_page_indices", R"({"keys":[["a",""],5]})"),
            bad("Invalid key at index 1: expected a [key, prefix_key] pair of strings or a "
                "string"));
  EXPECT_EQ(post("/7/reserve_and_allocate_page_indices", R"({"keys":["a"]})"),
            ok(R"({"indices":[[false,3]]})"));
  EXPECT_EQ(post("/7/confirm_write", R"({"written_keys_to_confirm":[["a",4]]})"),
            bad("Page 4 at index 0 of written_keys_to_confirm is out of range: the pool has 4 "
                "pages"));
  EXPECT_EQ(
      post("/7/confirm_write", R"({"written_keys_to_confirm":[["a",3]],"pages_to_release":[3]})"),
      bad("Page 3 is both confirmed and released"));
  EXPECT_EQ(post("/7/confirm_write", R"({"written_keys_to_confirm":null})"),
            bad("Invalid request format: 'written_keys_to_confirm' must be a list of [key, page] "
                "pairs"));
  EXPECT_EQ(post("/7/delete_keys", R"({"keys":[1]})"), bad("Invalid keys format"));
  EXPECT_EQ(post("/7/get_page_indices", R"({"keys":{}})"), bad("Invalid keys format"));
  EXPECT_EQ(post("/7/exists", R"({"keys":["a"]})"), ok(R"({"exists":[false]})"));
  // Confirmations that do not fit the pool's state are skipped, still 204.
  EXPECT_EQ(post("/7/confirm_write", R"({"written_keys_to_confirm":[["b",3]]})"), kNoContent);
  EXPECT_EQ(post("/7/confirm_write", R"({"written_keys_to_confirm":[["a",3]]})"), kNoContent);
  EXPECT_EQ(post("/7/get_page_indices", R"({"keys":["a","b"]})"), ok(R"({"indices":[3,null]})"));
}

TEST_P(SglangPipeline, ReinitializeGrowsAndIgnoresSmaller) {
  EXPECT_EQ(post("/0/initialize", R"({"num_pages":2})"), kNoContent);
  EXPECT_EQ(post("/0/initialize", R"({"num_pages":4})"), kNoContent);  // grown: 2, 3 free
  EXPECT_EQ(post("/0/reserve_and_allocate_page_indices", R"({"keys":["a","b","c","d","e"]})"),
            ok(R"({"indices":[[false,3],[false,2],[false,1],[false,0],[false,-1]]})"));
  EXPECT_EQ(post("/0/initialize", R"({"num_pages":1})"), kNoContent);  // ignored
  const std::string s = stats();
  EXPECT_NE(s.find(R"("sglang":{"pools":[{"tenant":"","rank":0,"namespace":"kv","num_pages":4,)"
                   R"("free":0,"in_flight":4,"bound":0}],"pools_total":1,)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find(R"("smaller_reinitializations":1})"), std::string::npos) << s;
}

class SglangStrict : public SglangPipeline {
 protected:
  static metad::config strict() {
    metad::config cfg;
    cfg.strict_reinit = true;
    return cfg;
  }
  SglangStrict() : SglangPipeline(strict()) {}
};
INSTANTIATE_TEST_SUITE_P(Cores, SglangStrict, ::testing::Values(1, 3));

TEST_P(SglangStrict, SmallerReinitializationIsAConflict) {
  EXPECT_EQ(post("/3/initialize", R"({"num_pages":4,"namespace":"swa"})"), kNoContent);
  EXPECT_EQ(post("/3/initialize", R"({"num_pages":2,"namespace":"swa"})"),
            json("409 Conflict",
                 R"({"detail":"Rank 3 namespace 'swa' already initialized with 4 pages"})"));
  EXPECT_EQ(post("/3/initialize", R"({"num_pages":4,"namespace":"swa"})"), kNoContent);
}

TEST_P(SglangPipeline, TenantsAreSeparateStateSpaces) {
  EXPECT_EQ(post("/0/initialize", R"({"num_pages":2})"), kNoContent);
  EXPECT_EQ(post("/llama70b/0/exists", R"({"keys":["a"]})"), not_initialized("0", "kv"));
  EXPECT_EQ(post("/llama70b/0/initialize", R"({"num_pages":8})"), kNoContent);
  EXPECT_EQ(post("/llama70b/0/reserve_and_allocate_page_indices", R"({"keys":["a"]})"),
            ok(R"({"indices":[[false,7]]})"));
  EXPECT_EQ(post("/llama70b/0/confirm_write", R"({"written_keys_to_confirm":[["a",7]]})"),
            kNoContent);
  EXPECT_EQ(post("/llama70b/0/exists", R"({"keys":["a"]})"), ok(R"({"exists":[true]})"));
  EXPECT_EQ(post("/0/exists", R"({"keys":["a"]})"), ok(R"({"exists":[false]})"));
  EXPECT_EQ(post("/qwen/0/exists", R"({"keys":["a"]})"), not_initialized("0", "kv"));
  EXPECT_EQ(post("/0/clear", "{}"), kNoContent);
  EXPECT_EQ(post("/llama70b/0/get_page_indices", R"({"keys":["a"]})"), ok(R"({"indices":[7]})"));
  EXPECT_EQ(post("/llama70b/0/clear", "{}"), kNoContent);
  EXPECT_EQ(post("/llama70b/0/get_page_indices", R"({"keys":["a"]})"), ok(R"({"indices":[null]})"));
  const std::string s = stats();
  EXPECT_NE(s.find(R"({"tenant":"","rank":0,"namespace":"kv","num_pages":2,)"), std::string::npos);
  EXPECT_NE(s.find(R"({"tenant":"llama70b","rank":0,"namespace":"kv","num_pages":8,)"),
            std::string::npos);
}

TEST_P(SglangPipeline, VllmAndSglangStateNeverTouch) {
  EXPECT_EQ(post("/rank/0/initialize", R"({"num_pages":4,"role":"worker"})"),
            ok(R"({"message":"Rank 0 initialized with 4 pages"})"));
  EXPECT_EQ(post("/0/initialize", R"({"num_pages":4})"), kNoContent);
  EXPECT_EQ(post("/keys/batch_allocate", R"({"rank":0,"keys":[["k",""]]})"),
            ok(R"({"rank":0,"results":[["k",0]]})"));
  EXPECT_EQ(post("/keys/confirm_write", R"({"rank":0,"confirmations":[["k",0]]})"), kNoContent);
  EXPECT_EQ(post("/0/exists", R"({"keys":["k"]})"), ok(R"({"exists":[false]})"));
  EXPECT_EQ(post("/0/reserve_and_allocate_page_indices", R"({"keys":["k"]})"),
            ok(R"({"indices":[[false,3]]})"));
  EXPECT_EQ(post("/0/confirm_write", R"({"written_keys_to_confirm":[["k",3]]})"), kNoContent);
  // SGLang's clear leaves vLLM's key; vLLM's /clear leaves SGLang's pool.
  EXPECT_EQ(post("/0/clear", "{}"), kNoContent);
  EXPECT_EQ(post("/keys/batch_exists", R"({"keys":["k"]})"), ok(R"({"exists":[true]})"));
  EXPECT_EQ(post("/0/reserve_and_allocate_page_indices", R"({"keys":["k"]})"),
            ok(R"({"indices":[[false,3]]})"));
  EXPECT_EQ(post("/0/confirm_write", R"({"written_keys_to_confirm":[["k",3]]})"), kNoContent);
  EXPECT_EQ(post("/clear", ""), kNoContent);
  EXPECT_EQ(post("/keys/batch_exists", R"({"keys":["k"]})"), ok(R"({"exists":[false]})"));
  EXPECT_EQ(post("/0/get_page_indices", R"({"keys":["k"]})"), ok(R"({"indices":[3]})"));
  // vLLM's tp_world_size counts its own ranks only.
  EXPECT_EQ(n_.state().worker_ranks.load(), 0);
}

TEST_P(SglangPipeline, MetricsShowPoolsAndEndpoints) {
  EXPECT_EQ(post("/2/initialize", R"({"num_pages":4,"namespace":"a\"b"})"), kNoContent);
  EXPECT_EQ(post("/2/reserve_and_allocate_page_indices", R"({"keys":["x"],"namespace":"a\"b"})"),
            ok(R"({"indices":[[false,3]]})"));
  EXPECT_EQ(post("/t/2/exists", "{}"), not_initialized("2", "kv"));
  const std::string m = n_.get("/metrics");
  EXPECT_NE(m.find("hf3fs_metad_sglang_pools 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("hf3fs_metad_sglang_pool_pages{tenant=\"\",rank=\"2\",namespace=\"a\\\"b\","
                   "state=\"in_flight\"} 1\n"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(R"(endpoint="sglang_reserve",status="200"} 1)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(endpoint="sglang_tenant_exists",status="404"} 1)"), std::string::npos) << m;
}

class SglangTtl : public SglangPipeline {
 protected:
  static metad::config ttl() {
    metad::config cfg;
    cfg.reservation_ttl_ms = 1000;
    return cfg;
  }
  SglangTtl() : SglangPipeline(ttl()) {}
};
INSTANTIATE_TEST_SUITE_P(Cores, SglangTtl, ::testing::Values(1, 3));

TEST_P(SglangTtl, ReservationsOfDeadWritersExpire) {
  EXPECT_EQ(post("/4/initialize", R"({"num_pages":2})"), kNoContent);
  EXPECT_EQ(post("/4/reserve_and_allocate_page_indices", R"({"keys":["a","b"]})"),
            ok(R"({"indices":[[false,1],[false,0]]})"));
  EXPECT_EQ(post("/4/reserve_and_allocate_page_indices", R"({"keys":["c"]})"),
            ok(R"({"indices":[[false,-1]]})"));
  n_.now += 1001;
  n_.tick();
  EXPECT_NE(stats().find(R"("free":2,"in_flight":0)"), std::string::npos) << stats();
  // The dead writer's late confirm binds nothing that is not its own any more.
  EXPECT_EQ(post("/4/reserve_and_allocate_page_indices", R"({"keys":["c"]})"),
            ok(R"({"indices":[[false,0]]})"));
  EXPECT_EQ(post("/4/confirm_write", R"({"written_keys_to_confirm":[["a",1],["b",0]]})"),
            kNoContent);
  EXPECT_EQ(post("/4/get_page_indices", R"({"keys":["a","b"]})"), ok(R"({"indices":[null,null]})"))
      << stats();
}

class SglangAuth : public SglangPipeline {
 protected:
  static metad::config tokens() {
    metad::config cfg;
    cfg.auth_token = "user";
    cfg.admin_token = "admin";
    return cfg;
  }
  SglangAuth() : SglangPipeline(tokens()) {}
  std::string post_as(std::string_view token, std::string_view path, std::string_view body) {
    const std::string r = n_.send(
        fmt::format("POST {} HTTP/1.1\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\n\r\n{}",
                    path, token, body.size(), body));
    return r.substr(0, r.find("\r\n"));
  }
};
INSTANTIATE_TEST_SUITE_P(Cores, SglangAuth, ::testing::Values(1));

TEST_P(SglangAuth, DataNeedsTheTokenAndClearTheAdminToken) {
  EXPECT_EQ(post_as("x", "/0/initialize", R"({"num_pages":1})"), "HTTP/1.1 401 Unauthorized");
  EXPECT_EQ(post_as("user", "/0/initialize", R"({"num_pages":1})"), "HTTP/1.1 204 No Content");
  EXPECT_EQ(post_as("user", "/t/0/initialize", R"({"num_pages":1})"), "HTTP/1.1 204 No Content");
  EXPECT_EQ(post_as("user", "/0/delete_keys", "{}"), "HTTP/1.1 204 No Content");
  EXPECT_EQ(post_as("user", "/0/clear", "{}"), "HTTP/1.1 401 Unauthorized");
  EXPECT_EQ(post_as("user", "/t/0/clear", "{}"), "HTTP/1.1 401 Unauthorized");
  EXPECT_EQ(post_as("admin", "/0/clear", "{}"), "HTTP/1.1 204 No Content");
}

}  // namespace
