// The whole request pipeline byte-in/byte-out, without sockets: an connection fed raw
// HTTP, its endpoint coroutines hopping between simulated cores that this one thread
// drains in turn.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>

#include "pipeline/connection.hpp"
#include "pipeline/node.hpp"
#include "sim.hpp"

using namespace metad;

namespace {

class Pipeline : public ::testing::TestWithParam<int> {
 protected:
  Pipeline() : node_(cfg_, GetParam()), x_(node_, *node_.core[0], waker_) {}

  // Feeds `bytes` to the connection, as much as it has room for at a time, and returns
  // everything it answers; does what a transport does on wait and drain.
  std::string send(std::string_view bytes) {
    std::string answers;
    drains_ = 0;
    for (std::size_t at = 0; at < bytes.size();) {
      std::span<char> space = x_.read_space();
      const std::size_t n = std::min(space.size(), bytes.size() - at);
      std::copy_n(bytes.data() + at, n, space.begin());
      at += n;
      bool woken = true;
      last_flow_ = sim::settle(
          node_, x_, 0, waker_, sim::as_core(0, [&] { return x_.on_bytes(n); }),
          [&](std::string& output) {  // as a transport: send it all, go on
            largest_unsent_ = std::max(largest_unsent_, output.size());
            answers += std::exchange(output, {});
            ++drains_;
          },
          woken, 100);
      EXPECT_TRUE(woken) << "a parked request must wake its connection, once";
    }
    largest_unsent_ = std::max(largest_unsent_, x_.output().size());
    return answers + std::exchange(x_.output(), {});
  }

  static std::string post(std::string_view path, std::string_view body) {
    return std::string("POST ") + std::string(path) +
           " HTTP/1.1\r\nhost: t\r\ncontent-length: " + std::to_string(body.size()) + "\r\n\r\n" +
           std::string(body);
  }
  static std::string json_200(std::string_view body) {
    return "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: " +
           std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
  }
  static std::string json_status(std::string_view status_line, std::string_view body) {
    return "HTTP/1.1 " + std::string(status_line) +
           "\r\ncontent-type: application/json\r\ncontent-length: " + std::to_string(body.size()) +
           "\r\n\r\n" + std::string(body);
  }
  static constexpr std::string_view kNoContent = "HTTP/1.1 204 No Content\r\n\r\n";

  metad::config cfg_;
  pipeline::node node_;
  sim::counting_waker waker_;
  pipeline::connection x_;
  net::flow last_flow_ = net::flow::read;
  int drains_ = 0;                  // flow::drain answers in the last send()
  std::size_t largest_unsent_ = 0;  // the most output held before it was taken
};

TEST_P(Pipeline, VllmSaveThenLoadRoundTripsAcrossCores) {
  EXPECT_EQ(send(post("/rank/0/initialize", R"({"num_pages":0,"role":"scheduler"})")),
            json_200(R"({"message":"Scheduler role does not require initialization"})"));
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(
        send(post("/rank/" + std::to_string(r) + "/initialize",
                  R"({"num_pages":4,"role":"worker"})")),
        json_200("{\"message\":\"Rank " + std::to_string(r) + " initialized with 4 pages\"}"));
  for (int r = 0; r < 2; ++r) {
    const std::string rank = std::to_string(r);
    EXPECT_EQ(send(post("/keys/batch_allocate",
                        "{\"rank\":" + rank + R"(,"keys":[["k1",""],["k2",""],["k1",""]]})")),
              json_200("{\"rank\":" + rank + R"(,"results":[["k1",0],["k2",1]]})"));
    EXPECT_EQ(send(post("/keys/batch_exists", R"({"keys":["k1","k2"]})")),
              json_200(R"({"exists":[false,false]})"));
    EXPECT_EQ(send(post("/keys/confirm_write",
                        "{\"rank\":" + rank +
                            R"(,"confirmations":[["k1",0],["k2",1]],"pages_to_release":[]})")),
              kNoContent);
  }
  EXPECT_EQ(send(post("/keys/batch_exists", R"({"keys":["k1","k2","k3","k1"]})")),
            json_200(R"({"exists":[true,true,false,true]})"));
  EXPECT_EQ(send(post("/keys/get_locations", R"({"rank":1,"keys":["k2","k3"]})")),
            json_200(R"({"locations":[1,null]})"));
  EXPECT_EQ(send("GET /rank/1 HTTP/1.1\r\n\r\n"),
            json_200(R"({"num_pages":4,"free":2,"reserved":0,"bound":2,"incomplete":0})"));
}

TEST_P(Pipeline, PipelinedRequestsAreAnsweredInOrder) {
  const std::string init = post("/rank/5/initialize", R"({"num_pages":2})");
  const std::string alloc = post("/keys/batch_allocate", R"({"rank":5,"keys":["a","b","c"]})");
  const std::string missing = post("/keys/get_locations", R"({"rank":6,"keys":["a"]})");
  EXPECT_EQ(send(init + alloc + missing),
            json_200(R"({"message":"Rank 5 initialized with 2 pages"})") +
                json_200(R"({"rank":5,"results":[["a",-1],["b",-1],["c",-1]]})") +
                json_status("404 Not Found",
                            R"({"detail":"Failed to get key locations: Rank 6 not initialized"})"));
  EXPECT_EQ(last_flow_, net::flow::read);
}

// While stopping, every request received is answered, and the last one says
// `connection: close` so that the client sends nothing more on the connection.
TEST_P(Pipeline, WhileStoppingTheLastReceivedRequestClosesTheConnection) {
  node_.stopping.store(true);
  const std::string init = post("/rank/5/initialize", R"({"num_pages":2})");
  const std::string alloc = post("/keys/batch_allocate", R"({"rank":5,"keys":["a"]})");
  const std::string_view body = R"({"rank":5,"results":[["a",0]]})";
  const std::string alloc_close =
      "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
      "content-length: " +
      std::to_string(body.size()) + "\r\nconnection: close\r\n\r\n" + std::string(body);
  EXPECT_EQ(send(init + alloc),
            json_200(R"({"message":"Rank 5 initialized with 2 pages"})") + alloc_close);
  EXPECT_EQ(last_flow_, net::flow::close);
}

// ... unless more has arrived in the socket: the transport reads and serves it first.
TEST_P(Pipeline, WhileStoppingARequestWithMoreInTheSocketKeepsTheConnection) {
  node_.stopping.store(true);
  waker_.pending = true;
  EXPECT_EQ(send(post("/rank/5/initialize", R"({"num_pages":2})")),
            json_200(R"({"message":"Rank 5 initialized with 2 pages"})"));
  EXPECT_EQ(last_flow_, net::flow::read);
}

// HEAD: GET's status and headers, content-length included, and no body (a body would be
// read as the start of the next answer); then the pipelined GET is answered in full.
TEST_P(Pipeline, HeadIsAnsweredWithoutABody) {
  EXPECT_EQ(send(post("/rank/3/initialize", R"({"num_pages":4})")),
            json_200(R"({"message":"Rank 3 initialized with 4 pages"})"));
  const std::string info = R"({"num_pages":4,"free":4,"reserved":0,"bound":0,"incomplete":0})";
  const std::string full = json_200(info);
  const std::string head_only = full.substr(0, full.size() - info.size());
  EXPECT_EQ(send("HEAD /rank/3 HTTP/1.1\r\n\r\nGET /rank/3 HTTP/1.1\r\n\r\n"), head_only + full);
  const std::string missing = send("HEAD /rank/9 HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(missing.starts_with("HTTP/1.1 404 Not Found\r\n")) << missing;
  EXPECT_TRUE(missing.ends_with("\r\n\r\n")) << missing;
  const std::string not_allowed = send("HEAD /clear HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(not_allowed.starts_with("HTTP/1.1 405 ")) << not_allowed;
  EXPECT_TRUE(not_allowed.ends_with("\r\n\r\n")) << not_allowed;
  EXPECT_NE(not_allowed.find("content-length: 31\r\n"), std::string::npos) << not_allowed;
  const std::string health = send("HEAD /health HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(health.starts_with("HTTP/1.1 200 OK\r\n")) << health;
  EXPECT_TRUE(health.ends_with("\r\n\r\n")) << health;
}

// A client that pipelines requests without reading: the connection stops taking
// requests once 1 MiB of answers is unsent (flow::drain), and goes on once they are sent.
TEST_P(Pipeline, PipelinedAnswersPastTheirBoundAreSentBeforeMoreAreTaken) {
  std::string pipelined;
  const std::string exists = post("/keys/batch_exists", R"({"keys":[]})");
  for (int i = 0; i < 60'000; ++i) pipelined += exists;  // ~1.9 MB of answers
  const std::string answers = send(pipelined);
  EXPECT_GT(drains_, 0);
  EXPECT_LT(largest_unsent_, (std::size_t{1} << 20) + 1024);
  const std::string one = json_200(R"({"exists":[]})");
  ASSERT_EQ(answers.size(), 60'000 * one.size());
  EXPECT_EQ(answers.substr(answers.size() - one.size()), one);
}

// After a big request, an idle connection gives its buffers back.
TEST_P(Pipeline, AnIdleConnectionGivesBackWhatABigRequestTook) {
  const std::size_t before = x_.buffer_bytes();
  std::string keys;
  for (int i = 0; i < 100'000; ++i) keys += fmt::format("{}\"{:032x}\"", i ? "," : "", i);
  const std::string answer = send(post("/keys/batch_exists", "{\"keys\":[" + keys + "]}"));
  ASSERT_TRUE(answer.starts_with("HTTP/1.1 200 OK")) << answer.substr(0, 200);
  EXPECT_GT(x_.buffer_bytes(), std::size_t{4} << 20);  // the keys, their views, the flags...
  x_.trim();
  EXPECT_LE(x_.buffer_bytes(), std::max<std::size_t>(before, 64 * 1024));
  // ... and it still serves.
  EXPECT_EQ(send(post("/keys/batch_exists", R"({"keys":["a"]})")),
            json_200(R"({"exists":[false]})"));
}

TEST_P(Pipeline, InvalidRequestsChangeNothing) {
  send(post("/rank/3/initialize", R"({"num_pages":3})"));
  EXPECT_EQ(
      send(post("/keys/batch_allocate", R"({"rank":3,"keys":["a",["b"]]})")),
      json_status(
          "400 Bad Request",
          R"({"detail":"Invalid key at index 1: expected a string or a [key, prefix_key] pair of strings"})"));
  EXPECT_EQ(
      send(post("/keys/confirm_write", R"({"rank":3,"confirmations":[["a",0]]})")).substr(0, 24),
      "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(send(post("/keys/batch_allocate", R"({"rank":3,"keys":["a"]})")),
            json_200(R"({"rank":3,"results":[["a",0]]})"));
  EXPECT_EQ(send(post("/rank/3/initialize", R"({"num_pages":"3"})")),
            json_status("400 Bad Request", R"({"detail":"Invalid initialization parameters"})"));
}

TEST_P(Pipeline, MalformedHttpIsAnsweredThenClosed) {
  EXPECT_EQ(send("BROKEN\r\n\r\n").substr(0, 24), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(last_flow_, net::flow::close);
}

TEST_P(Pipeline, ClearDropsEveryRankOnEveryCore) {
  for (int r = 0; r < 4; ++r)
    send(post("/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":1})"));
  EXPECT_EQ(node_.worker_ranks.load(), 4);
  EXPECT_EQ(send(post("/clear", "")), kNoContent);
  EXPECT_EQ(node_.worker_ranks.load(), 0);
  EXPECT_EQ(send("GET /rank/2 HTTP/1.1\r\n\r\n"),
            json_status("404 Not Found", R"({"detail":"Rank 2 not initialized"})"));
}

// The body of an answer (after its headers).
std::string body_of(const std::string& answer) {
  const std::size_t at = answer.find("\r\n\r\n");
  return at == std::string::npos ? std::string() : answer.substr(at + 4);
}

TEST_P(Pipeline, InspectReportsEveryStateAcrossCores) {
  for (int r = 0; r < 3; ++r)
    send(post("/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":4})"));
  // "done": bound on all 3 ranks; "half": bound on rank 0, reserved on rank 1; "held":
  // reserved on rank 2 only; "none": nowhere.
  for (int r = 0; r < 3; ++r)
    send(post("/keys/batch_allocate",
              "{\"rank\":" + std::to_string(r) + R"(,"keys":["done","half","held"]})"));
  for (int r = 0; r < 3; ++r)
    send(post("/keys/confirm_write",
              "{\"rank\":" + std::to_string(r) + R"(,"confirmations":[["done",0]]})"));
  send(post("/keys/confirm_write",
            R"({"rank":0,"confirmations":[["half",1]],"pages_to_release":[]})"));
  send(post("/keys/confirm_write", R"({"rank":0,"confirmations":[],"pages_to_release":[2]})"));
  send(post("/keys/confirm_write", R"({"rank":1,"confirmations":[],"pages_to_release":[2]})"));
  const std::string answer =
      send(post("/keys/inspect", R"({"keys":["done","half","held","none"]})"));
  ASSERT_EQ(answer.substr(0, 15), "HTTP/1.1 200 OK");
  const std::string b = body_of(answer);
  EXPECT_NE(b.find(R"({"key":"done","exists":true,"state":"complete","tp_world_size":3,)"
                   R"("confirmations":3,"ranks":[{"rank":0,"page":0,"state":"bound"},)"
                   R"({"rank":1,"page":0,"state":"bound"},{"rank":2,"page":0,"state":"bound"}],)"
                   R"("incomplete_since":null,)"),
            std::string::npos)
      << b;
  EXPECT_NE(b.find(R"({"key":"half","exists":false,"state":"incomplete","tp_world_size":3,)"
                   R"("confirmations":1,"ranks":[{"rank":0,"page":1,"state":"bound"},)"
                   R"({"rank":1,"page":1,"state":"reserved","reserved_until":)"),
            std::string::npos)
      << b;
  EXPECT_NE(b.find(R"({"key":"held","exists":false,"state":"reserved","tp_world_size":0,)"
                   R"("confirmations":0,"ranks":[{"rank":2,"page":2,"state":"reserved",)"),
            std::string::npos)
      << b;
  EXPECT_NE(b.find(R"({"key":"none","exists":false,"state":"absent","tp_world_size":0,)"
                   R"("confirmations":0,"ranks":[],"incomplete_since":null,"last_used":null,)"
                   R"("leased_until":null}]})"),
            std::string::npos)
      << b;
  // Inspecting changed nothing: no lease, no use.
  EXPECT_EQ(send(post("/keys/inspect", R"({"keys":["done","half","held","none"]})")).size(),
            answer.size());
  EXPECT_EQ(send(post("/keys/inspect", R"({"keys":"x"})")),
            json_status("400 Bad Request", R"({"detail":"Invalid keys format"})"));
}

TEST_P(Pipeline, LookupsAreCountedAsHitsAndMisses) {
  send(post("/rank/0/initialize", R"({"num_pages":4})"));
  send(post("/keys/batch_allocate", R"({"rank":0,"keys":["a","b"]})"));
  send(post("/keys/confirm_write", R"({"rank":0,"confirmations":[["a",0]]})"));
  send(post("/keys/batch_exists", R"({"keys":["a","b","c","a"]})"));    // 2 hits, 2 misses
  send(post("/keys/get_locations", R"({"rank":0,"keys":["a","b"]})"));  // 1, 1
  send(post("/keys/get_locations", R"({"rank":9,"keys":["a"]})"));      // 404: not counted
  send(post("/0/initialize", R"({"num_pages":2})"));
  send(post("/0/reserve_and_allocate_page_indices", R"({"keys":["x"]})"));
  send(post("/0/confirm_write", R"({"written_keys_to_confirm":[["x",1]]})"));
  send(post("/0/exists", R"({"keys":["x","y"]})"));                // 1, 1
  send(post("/0/get_page_indices", R"({"keys":["x","x","y"]})"));  // 2, 1
  send(post("/t/0/initialize", R"({"num_pages":2})"));
  send(post("/t/0/exists", R"({"keys":["x"]})"));  // tenant t: 0, 1
  const std::string m = send("GET /metrics HTTP/1.1\r\n\r\n");
  for (const std::string_view line : {
           R"(hf3fs_metad_lookup_keys_total{endpoint="batch_exists",result="hit"} 2)",
           R"(hf3fs_metad_lookup_keys_total{endpoint="batch_exists",result="miss"} 2)",
           R"(hf3fs_metad_lookup_keys_total{endpoint="get_locations",result="hit"} 1)",
           R"(hf3fs_metad_lookup_keys_total{endpoint="get_locations",result="miss"} 1)",
           R"(hf3fs_metad_lookup_keys_total{endpoint="sglang_exists",result="hit"} 1)",
           R"(hf3fs_metad_lookup_keys_total{endpoint="sglang_exists",result="miss"} 1)",
           R"(hf3fs_metad_lookup_keys_total{endpoint="sglang_get_page_indices",result="hit"} 2)",
           R"(hf3fs_metad_lookup_keys_total{endpoint="sglang_get_page_indices",result="miss"} 1)",
           R"(hf3fs_metad_lookup_keys_total{endpoint="sglang_exists",tenant="t",result="miss"} 1)",
           R"(hf3fs_metad_allocated_pages_total{api="vllm",source="free"} 2)",
           R"(hf3fs_metad_allocated_pages_total{api="sglang",source="free"} 1)",
       }) {
    EXPECT_NE(m.find(std::string(line) + "\n"), std::string::npos) << line;
  }
  const std::string status = body_of(send("GET /status.json HTTP/1.1\r\n\r\n"));
  EXPECT_NE(status.find(R"("hit":6,"miss":6})"), std::string::npos) << status;
  EXPECT_NE(status.find(R"("ranks":{"total":1,"pages":4,"free":2,"reserved":1,"bound":1,)"),
            std::string::npos)
      << status;
  const std::string page = send("GET / HTTP/1.1\r\n\r\n");
  EXPECT_EQ(page.substr(0, 15), "HTTP/1.1 200 OK");
  EXPECT_NE(page.find("content-type: text/html; charset=utf-8\r\n"), std::string::npos);
  EXPECT_NE(page.find("fetch(\"status.json\""), std::string::npos);
}

TEST_P(Pipeline, SglangInspectReportsBoundInFlightAndAbsent) {
  send(post("/0/initialize", R"({"num_pages":4})"));
  send(post("/0/reserve_and_allocate_page_indices", R"({"keys":["b","f"]})"));  // pages 3, 2
  send(post("/0/confirm_write", R"({"written_keys_to_confirm":[["b",3]]})"));
  const std::string b = body_of(send(post("/0/inspect", R"({"keys":["b","f","z"]})")));
  EXPECT_NE(b.find(R"({"key":"b","exists":true,"state":"bound","page":3,"leased_until":null,)"
                   R"("reserved_page":null,"reserved_until":null,"reserved_before_clear":false})"),
            std::string::npos)
      << b;
  EXPECT_NE(b.find(R"({"key":"f","exists":false,"state":"in_flight","page":null,)"
                   R"("leased_until":null,"reserved_page":2,"reserved_until":)"),
            std::string::npos)
      << b;
  EXPECT_NE(b.find(R"({"key":"z","exists":false,"state":"absent")"), std::string::npos) << b;
  EXPECT_EQ(
      send(post("/1/inspect", R"({"keys":["b"]})")),
      json_status(
          "404 Not Found",
          R"({"detail":"Rank 1 namespace 'kv' not initialized. Please call /1/initialize first."})"));
}

INSTANTIATE_TEST_SUITE_P(Cores, Pipeline, ::testing::Values(1, 3),
                         [](const auto& info) { return std::to_string(info.param) + "cores"; });

}  // namespace
