#include "repl/protocol.hpp"

#include <cstring>

#include "metad/assert.hpp"
#include "store/byte_reader.hpp"
#include "store/record.hpp"

namespace metad::repl {
namespace {

template <typename T>
void put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (x86-64), as store/
  out.append(bytes, sizeof(T));
}

void put_name(std::string& out, std::string_view s) {
  METAD_ASSERT(s.size() <= kNameBytesMax);  // names are checked when configured
  put<std::uint8_t>(out, static_cast<std::uint8_t>(s.size()));
  out.append(s);
}

// Reserves the header and writes the type; close() fills the header in.
std::size_t open(std::string& out, message_type type) {
  const std::size_t start = out.size();
  out.append(kHeaderBytes, '\0');
  out.push_back(static_cast<char>(type));
  return start;
}

void close(std::string& out, std::size_t start) {
  const std::string_view body(out.data() + start + kHeaderBytes, out.size() - start - kHeaderBytes);
  const auto length = static_cast<std::uint32_t>(body.size());
  const std::uint32_t crc = store::crc32c(body);
  std::memcpy(out.data() + start, &length, 4);
  std::memcpy(out.data() + start + 4, &crc, 4);
}

using reader = store::byte_reader;

// A name (cluster, node) prefixed by its length in one byte.
bool get_name(reader& in, std::string& name) {
  std::string_view view;
  if (!in.get_prefixed<std::uint8_t>(view)) return false;
  name.assign(view);
  return true;
}

}  // namespace

void encode(std::string& out, const hello& m) {
  const std::size_t at = open(out, message_type::hello);
  put(out, m.version);
  put_name(out, m.cluster);
  put_name(out, m.node);
  put(out, m.epoch);
  put(out, m.generation);
  put(out, m.cores);
  put(out, m.core);
  put(out, m.lsn);
  close(out, at);
}

void encode(std::string& out, const answer& m) {
  const std::size_t at = open(out, message_type::answer);
  put(out, static_cast<std::uint8_t>(m.status));
  put(out, m.epoch);
  put(out, m.generation);
  put(out, m.core);
  put(out, m.lsn);
  close(out, at);
}

void encode(std::string& out, const batch& m) {
  const std::size_t at = open(out, message_type::batch);
  put(out, m.epoch);
  put(out, m.generation);
  put(out, m.core);
  put(out, m.start_lsn);
  put(out, static_cast<std::uint32_t>(m.bytes.size()));
  out.append(m.bytes);
  close(out, at);
}

void encode(std::string& out, const snapshot& m) {
  const std::size_t at = open(out, message_type::snapshot);
  put(out, m.epoch);
  put(out, m.generation);
  put(out, m.core);
  put(out, m.lsn);
  put(out, static_cast<std::uint8_t>(m.last ? 1 : 0));
  put(out, static_cast<std::uint32_t>(m.bytes.size()));
  out.append(m.bytes);
  close(out, at);
}

void encode(std::string& out, const ack& m) {
  const std::size_t at = open(out, message_type::ack);
  put(out, m.epoch);
  put(out, m.generation);
  put(out, m.core);
  put(out, m.lsn);
  close(out, at);
}

void decoder::feed(std::string_view bytes) {
  if (consumed_ > 0) {  // what next() returned is no longer referenced
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(bytes);
}

decoder::status decoder::next() {
  if (failed_ != status::need_more) return failed_;
  const std::string_view rest(buffer_.data() + consumed_, buffer_.size() - consumed_);
  if (rest.size() < kHeaderBytes) return status::need_more;
  std::uint32_t length = 0, crc = 0;
  std::memcpy(&length, rest.data(), 4);
  std::memcpy(&crc, rest.data() + 4, 4);
  // Checked before waiting for the body: a damaged length must not make us buffer 4 GiB.
  if (length == 0 || length > kBodyBytesMax) return failed_ = status::bad_length;
  if (rest.size() - kHeaderBytes < length) return status::need_more;
  const std::string_view body = rest.substr(kHeaderBytes, length);
  if (store::crc32c(body) != crc) return failed_ = status::bad_checksum;
  const status s = decode_body(body);
  if (s != status::message) return failed_ = s;
  consumed_ += kHeaderBytes + length;
  return s;
}

decoder::status decoder::decode_body(std::string_view body) {
  type = static_cast<message_type>(body[0]);
  reader in(body.substr(1));
  bool ok = false;
  switch (type) {
    case message_type::hello:
      ok = in.get(hello.version) && get_name(in, hello.cluster) && get_name(in, hello.node) &&
           in.get(hello.epoch) && in.get(hello.generation) && in.get(hello.cores) &&
           in.get(hello.core) && in.get(hello.lsn) && in.done();
      break;
    case message_type::answer: {
      std::uint8_t s = 0;
      ok = in.get(s) && s >= static_cast<std::uint8_t>(answer_status::stream) &&
           s <= static_cast<std::uint8_t>(answer_status::busy) && in.get(answer.epoch) &&
           in.get(answer.generation) && in.get(answer.core) && in.get(answer.lsn) && in.done();
      answer.status = static_cast<answer_status>(s);
      break;
    }
    case message_type::batch:
      ok = in.get(batch.epoch) && in.get(batch.generation) && in.get(batch.core) &&
           in.get(batch.start_lsn) && in.get_prefixed<std::uint32_t>(batch.bytes) && in.done();
      break;
    case message_type::snapshot: {
      std::uint8_t last = 2;
      ok = in.get(snapshot.epoch) && in.get(snapshot.generation) && in.get(snapshot.core) &&
           in.get(snapshot.lsn) && in.get(last) && last <= 1 &&
           in.get_prefixed<std::uint32_t>(snapshot.bytes) && in.done();
      snapshot.last = last == 1;
      break;
    }
    case message_type::ack:
      ok = in.get(ack.epoch) && in.get(ack.generation) && in.get(ack.core) && in.get(ack.lsn) &&
           in.done();
      break;
  }
  return ok ? status::message : status::bad_message;
}

}  // namespace metad::repl
