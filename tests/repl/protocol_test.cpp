// The replication wire protocol: every message round-trips, a stream split at any byte
// decodes the same, and damage (truncation, checksums, lengths, trailing bytes) is
// refused rather than taken for a message.
#include "repl/protocol.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "store/record.hpp"

using namespace metad;

namespace {

using repl::decoder;

// Some log frames, exactly as a core's group commit would write them.
std::string log_bytes() {
  std::string out;
  store::append_initialize(out, 3, 64);
  const std::string_view keys[] = {"k1", "k2"};
  store::append_allocate(out, 3, keys);
  const std::int64_t pages[] = {0, 1};
  store::append_confirm(out, 3, 2, keys, pages, {});
  return out;
}

// One of each message, in one stream.
std::string stream(const std::string& frames) {
  std::string out;
  repl::encode(out, repl::hello{repl::kProtocolVersion, "prod", "node-b", 7, 2, 4, 3, 123});
  repl::encode(out, repl::answer{repl::answer_status::stream, 7, 2, 3, 123});
  repl::encode(out, repl::batch{7, 2, 3, 123, frames});
  repl::encode(out, repl::ack{7, 2, 3, 123 + frames.size()});
  repl::encode(out, repl::snapshot{7, 2, 3, 456, true, frames});
  return out;
}

// Decodes everything buffered, as a string per message (fields in order).
std::vector<std::string> drain(decoder& d, decoder::status& last) {
  std::vector<std::string> got;
  while ((last = d.next()) == decoder::status::message) {
    switch (d.type) {
      case repl::message_type::hello:
        got.push_back("hello " + std::to_string(d.hello.version) + " " + d.hello.cluster + " " +
                      d.hello.node + " " + std::to_string(d.hello.epoch) + " " +
                      std::to_string(d.hello.generation) + " " + std::to_string(d.hello.cores) +
                      " " + std::to_string(d.hello.core) + " " + std::to_string(d.hello.lsn));
        break;
      case repl::message_type::answer:
        got.push_back("answer " + std::to_string(static_cast<int>(d.answer.status)) + " " +
                      std::to_string(d.answer.epoch) + " " + std::to_string(d.answer.generation) +
                      " " + std::to_string(d.answer.core) + " " + std::to_string(d.answer.lsn));
        break;
      case repl::message_type::batch:
        got.push_back("batch " + std::to_string(d.batch.epoch) + " " +
                      std::to_string(d.batch.generation) + " " + std::to_string(d.batch.core) +
                      " " + std::to_string(d.batch.start_lsn) + " " + std::string(d.batch.bytes));
        break;
      case repl::message_type::snapshot:
        got.push_back("snapshot " + std::to_string(d.snapshot.epoch) + " " +
                      std::to_string(d.snapshot.generation) + " " +
                      std::to_string(d.snapshot.core) + " " + std::to_string(d.snapshot.lsn) + " " +
                      std::to_string(d.snapshot.last) + " " + std::string(d.snapshot.bytes));
        break;
      case repl::message_type::ack:
        got.push_back("ack " + std::to_string(d.ack.epoch) + " " +
                      std::to_string(d.ack.generation) + " " + std::to_string(d.ack.core) + " " +
                      std::to_string(d.ack.lsn));
        break;
    }
  }
  return got;
}

TEST(ReplProtocol, EveryMessageRoundTrips) {
  const std::string frames = log_bytes();
  decoder d;
  d.feed(stream(frames));
  decoder::status last{};
  const std::vector<std::string> got = drain(d, last);
  EXPECT_EQ(last, decoder::status::need_more);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0], "hello " + std::to_string(repl::kProtocolVersion) + " prod node-b 7 2 4 3 123");
  EXPECT_EQ(got[1], "answer 1 7 2 3 123");
  EXPECT_EQ(got[2], "batch 7 2 3 123 " + frames);  // the log bytes exactly as written
  EXPECT_EQ(got[3], "ack 7 2 3 " + std::to_string(123 + frames.size()));
  EXPECT_EQ(got[4], "snapshot 7 2 3 456 1 " + frames);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(ReplProtocol, WhatFollowsAMessageIsLeftUnread) {
  std::string bytes;
  repl::encode(bytes, repl::ack{7, 2, 3, 99});
  decoder d;
  d.feed(bytes + "next");
  ASSERT_EQ(d.next(), decoder::status::message);
  EXPECT_EQ(d.next(), decoder::status::need_more);
  EXPECT_EQ(d.unread(), "next");
}

TEST(ReplProtocol, AStreamSplitAtAnyByteDecodesTheSame) {
  const std::string bytes = stream(log_bytes());
  decoder whole;
  whole.feed(bytes);
  decoder::status last{};
  const std::vector<std::string> expected = drain(whole, last);
  for (std::size_t cut = 0; cut <= bytes.size(); ++cut) {
    decoder d;
    d.feed(std::string_view(bytes).substr(0, cut));
    std::vector<std::string> got = drain(d, last);
    ASSERT_EQ(last, decoder::status::need_more) << "cut at " << cut;
    d.feed(std::string_view(bytes).substr(cut));
    for (std::string& m : drain(d, last)) got.push_back(std::move(m));
    ASSERT_EQ(last, decoder::status::need_more);
    ASSERT_EQ(got, expected) << "cut at " << cut;
  }
}

TEST(ReplProtocol, OneByteAtATimeDecodesTheSame) {
  const std::string bytes = stream(log_bytes());
  decoder d;
  decoder::status last{};
  std::vector<std::string> got;
  for (char c : bytes) {
    d.feed(std::string_view(&c, 1));
    for (std::string& m : drain(d, last)) got.push_back(std::move(m));
    ASSERT_EQ(last, decoder::status::need_more);
  }
  EXPECT_EQ(got.size(), 5u);
}

TEST(ReplProtocol, ATruncatedStreamNeverYieldsItsLastMessage) {
  std::string bytes;
  repl::encode(bytes, repl::batch{1, 1, 0, 0, log_bytes()});
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    decoder d;
    d.feed(std::string_view(bytes).substr(0, cut));
    EXPECT_EQ(d.next(), decoder::status::need_more) << "cut at " << cut;
  }
}

TEST(ReplProtocol, AnyFlippedBitIsRefused) {
  std::string bytes;
  repl::encode(bytes, repl::ack{7, 2, 3, 99});
  for (std::size_t at = 0; at < bytes.size(); ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string damaged = bytes;
      damaged[at] = static_cast<char>(damaged[at] ^ (1 << bit));
      decoder d;
      d.feed(damaged);
      const decoder::status s = d.next();
      // A length made longer waits for bytes that never come; anything else is refused.
      EXPECT_NE(s, decoder::status::message) << "byte " << at << " bit " << bit;
    }
  }
}

TEST(ReplProtocol, ABadChecksumIsFinal) {
  std::string bytes;
  repl::encode(bytes, repl::ack{7, 2, 3, 99});
  bytes[bytes.size() - 1] ^= 1;
  std::string good;
  repl::encode(good, repl::ack{7, 2, 3, 100});
  decoder d;
  d.feed(bytes);
  EXPECT_EQ(d.next(), decoder::status::bad_checksum);
  d.feed(good);  // nothing after damage is trusted
  EXPECT_EQ(d.next(), decoder::status::bad_checksum);
}

TEST(ReplProtocol, LengthsOutOfBoundsAreRefusedBeforeBuffering) {
  for (std::uint32_t length : {0u, repl::kBodyBytesMax + 1, 0xFFFFFFFFu}) {
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &length, 4);
    decoder d;
    d.feed(bytes);
    EXPECT_EQ(d.next(), decoder::status::bad_length) << length;
  }
}

// A body with a valid checksum that is not a valid message: re-sealed after the change.
std::string sealed(std::string body) {
  std::string out(8, '\0');
  const auto length = static_cast<std::uint32_t>(body.size());
  const std::uint32_t crc = store::crc32c(body);
  std::memcpy(out.data(), &length, 4);
  std::memcpy(out.data() + 4, &crc, 4);
  return out + body;
}

// Every answer status, busy (a snapshot the leader's core cannot cut yet) included,
// decodes as itself; the one past busy does not (WellSealedNonsenseIsRefused: 9).
TEST(ReplProtocol, EveryAnswerStatusRoundTrips) {
  for (const auto status : {repl::answer_status::stream, repl::answer_status::need_snapshot,
                            repl::answer_status::wrong_epoch, repl::answer_status::refused,
                            repl::answer_status::busy}) {
    std::string out;
    repl::encode(out, repl::answer{status, 7, 2, 1, 0});
    decoder d;
    d.feed(out);
    ASSERT_EQ(d.next(), decoder::status::message);
    EXPECT_EQ(d.answer.status, status);
  }
  std::string out;
  repl::encode(out, repl::answer{repl::answer_status::busy, 7, 2, 1, 0});
  std::string body = out.substr(8);
  body[1] = '\x06';
  decoder d;
  d.feed(sealed(body));
  EXPECT_EQ(d.next(), decoder::status::bad_message);
}

TEST(ReplProtocol, WellSealedNonsenseIsRefused) {
  std::string ack;
  repl::encode(ack, repl::ack{7, 2, 3, 99});
  const std::string body = ack.substr(8);
  const std::string cases[] = {
      body + "x",                                                               // trailing bytes
      body.substr(0, body.size() - 1),                                          // a field cut short
      std::string(1, '\x09') + body.substr(1),                                  // an unknown type
      std::string(1, '\x02') + std::string(1, '\x09') + std::string(28, '\0'),  // bad status
  };
  for (const std::string& c : cases) {
    decoder d;
    d.feed(sealed(c));
    EXPECT_EQ(d.next(), decoder::status::bad_message);
  }
  std::string batch;  // a batch whose byte count runs past its body
  repl::encode(batch, repl::batch{1, 1, 0, 0, "abcd"});
  std::string b = batch.substr(8);
  const std::uint32_t too_many = 5;
  std::memcpy(b.data() + 1 + 8 + 8 + 4 + 8, &too_many, 4);
  decoder d;
  d.feed(sealed(b));
  EXPECT_EQ(d.next(), decoder::status::bad_message);
}

}  // namespace
