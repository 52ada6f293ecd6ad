// End-to-end smoke test of hostile input at the HTTP layer: the offending connection
// gets a JSON error and is closed, and everyone else keeps being served. The full
// table of bad inputs lives in the Python suite and the parser's unit tests.
#include <gtest/gtest.h>

#include <string>

#include "metad_client.hpp"
#include "server_process.hpp"

namespace e2e {
namespace {

constexpr std::size_t kDefaultHeaderBytesMax = 64 * 1024;

// A request whose header block is larger than the server's default limit.
std::string oversize_header_request() {
  std::string request = "POST /keys/batch_exists HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  request += "X-Padding: " + std::string(kDefaultHeaderBytesMax + 1024, 'a') + "\r\n";
  request += "Content-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"keys\":[]}";
  return request;
}

const std::string kGarbageRequestLine = "\x16\x03\x01 definitely not http\r\n\r\n";

class BadInput : public ::testing::Test {
 protected:
  // Sends `bytes` on a new connection; expects `status` with a JSON detail, then a close.
  void expect_rejected_and_closed(const std::string& bytes, int status) {
    http_connection connection(server_.port());
    connection.try_send_all(bytes);  // the server may close before it has read everything
    const http_response response = connection.read_response();
    EXPECT_EQ(response.status, status) << response.describe();
    EXPECT_EQ(response.header("content-type"), "application/json");
    EXPECT_EQ(response.body.rfind("{\"detail\":\"", 0), 0u) << response.body;
    EXPECT_TRUE(connection.peer_closed()) << "the server must close after a " << status;
  }

  void expect_served(metad_client& client) {
    EXPECT_EQ(client.batch_exists({make_key(1)}), std::vector<bool>{false});
  }

  server_process server_{/*threads=*/2};
};

TEST_F(BadInput, OversizeHeaderGets431AndTheConnectionIsClosed) {
  expect_rejected_and_closed(oversize_header_request(), 431);
}

TEST_F(BadInput, GarbageRequestLineGets400AndTheConnectionIsClosed) {
  expect_rejected_and_closed(kGarbageRequestLine, 400);
}

TEST_F(BadInput, OtherConnectionsKeepBeingServed) {
  metad_client bystander(server_.port());
  expect_served(bystander);
  expect_rejected_and_closed(kGarbageRequestLine, 400);
  expect_served(bystander);
  expect_rejected_and_closed(oversize_header_request(), 431);
  expect_served(bystander);
  metad_client newcomer(server_.port());
  expect_served(newcomer);
}

}  // namespace
}  // namespace e2e
