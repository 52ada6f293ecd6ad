// The gateway's answers byte by byte: Content-Length, chunked with trailers (its error
// answers), until-close, keep-alive rules and malformed heads.
#include "ha/http_reader.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace metad;

namespace {

using state = ha::http_reader::state;

// Feeds `bytes` in pieces of `step` and returns the final state.
state feed_in_steps(ha::http_reader& r, const std::string& bytes, std::size_t step) {
  state s = r.current();
  for (std::size_t i = 0; i < bytes.size(); i += step) s = r.feed(bytes.substr(i, step));
  return s;
}

TEST(HttpReader, ReadsContentLengthBodyInAnySplit) {
  const std::string answer =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
      "11\r\n\r\n{\"TTL\":\"1\"}";
  for (std::size_t step = 1; step <= answer.size(); ++step) {
    ha::http_reader r;
    ASSERT_EQ(feed_in_steps(r, answer, step), state::done) << step;
    EXPECT_EQ(r.status(), 200);
    EXPECT_EQ(r.body(), "{\"TTL\":\"1\"}");
    EXPECT_TRUE(r.keep_alive());
  }
}

TEST(HttpReader, DecodesChunkedBodyAndSkipsTrailers) {
  // The shape of etcd's 404 for an unknown lease (a trailer after the last chunk).
  const std::string answer =
      "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\nTrailer: "
      "Grpc-Trailer-Content-Type\r\n"
      "\r\n6\r\n{\"a\":1\r\n3;ext=1\r\n,2}\r\n0\r\nGrpc-Trailer-Content-Type: "
      "application/grpc\r\n\r\n";
  for (std::size_t step = 1; step <= answer.size(); ++step) {
    ha::http_reader r;
    ASSERT_EQ(feed_in_steps(r, answer, step), state::done) << step;
    EXPECT_EQ(r.status(), 404);
    EXPECT_TRUE(r.chunked());
    EXPECT_EQ(r.body(), "{\"a\":1,2}");
  }
}

TEST(HttpReader, StreamsChunksAsTheyArrive) {
  ha::http_reader r;
  EXPECT_EQ(r.feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), state::body);
  EXPECT_EQ(r.feed("4\r\nab"), state::body);
  EXPECT_EQ(r.body(), "ab");
  r.body().clear();
  EXPECT_EQ(r.feed("c\n\r\n"), state::body);
  EXPECT_EQ(r.body(), "c\n");
  EXPECT_EQ(r.feed("0\r\n\r\n"), state::done);
}

TEST(HttpReader, UntilCloseBodyEndsAtEof) {
  ha::http_reader r;
  EXPECT_EQ(r.feed("HTTP/1.1 200 OK\r\n\r\nabc"), state::body);
  EXPECT_FALSE(r.keep_alive());
  EXPECT_EQ(r.feed_eof(), state::done);
  EXPECT_EQ(r.body(), "abc");
}

TEST(HttpReader, NoBodyFor204AndZeroLength) {
  ha::http_reader a;
  EXPECT_EQ(a.feed("HTTP/1.1 204 No Content\r\n\r\n"), state::done);
  ha::http_reader b;
  EXPECT_EQ(b.feed("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), state::done);
  EXPECT_EQ(b.body(), "");
}

TEST(HttpReader, KeepAliveFollowsVersionAndConnectionHeader) {
  ha::http_reader a;
  a.feed("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
  EXPECT_FALSE(a.keep_alive());
  ha::http_reader b;
  b.feed("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_FALSE(b.keep_alive());
  ha::http_reader c;
  c.feed("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n");
  EXPECT_TRUE(c.keep_alive());
}

TEST(HttpReader, EofBeforeTheEndIsAnError) {
  ha::http_reader a;
  a.feed("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab");
  EXPECT_EQ(a.feed_eof(), state::error);
  ha::http_reader b;
  b.feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab");
  EXPECT_EQ(b.feed_eof(), state::error);
  ha::http_reader c;
  c.feed("HTTP/1.1 200");
  EXPECT_EQ(c.feed_eof(), state::error);
}

TEST(HttpReader, RejectsMalformedAnswers) {
  const char* bad[] = {
      "HTTX/1.1 200 OK\r\n\r\n",
      "HTTP/1.1 2x0 OK\r\n\r\n",
      "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc",
      "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab",
  };
  for (const char* answer : bad) {
    ha::http_reader r;
    EXPECT_EQ(r.feed(answer), state::error) << answer;
    EXPECT_FALSE(r.error().empty());
  }
}

TEST(HttpReader, BoundsTheHead) {
  ha::http_reader r;
  std::string head = "HTTP/1.1 200 OK\r\nX: " + std::string(ha::http_reader::kHeadBytesMax, 'a');
  EXPECT_EQ(r.feed(head), state::error);
}

TEST(HttpReader, ResetStartsOver) {
  ha::http_reader r;
  r.feed("garbage\r\n\r\n");
  ASSERT_EQ(r.current(), state::error);
  r.reset();
  EXPECT_EQ(r.feed("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), state::done);
  EXPECT_EQ(r.body(), "ok");
}

}  // namespace
