#include "repl/link.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <system_error>

#include "metad/log.hpp"
#include "repl/protocol.hpp"
#include "repl/socket.hpp"
#include "repl/tls.hpp"

namespace metad::repl {

namespace {
// Frees a string's memory (clear() keeps its capacity).
void release(std::string& s) { std::string().swap(s); }
}  // namespace

std::uint64_t channel::take(std::string& into) {
  std::lock_guard lock(mutex_);
  into.append(inbox_);
  inbox_.clear();
  return stream_;
}

std::uint64_t channel::take_last(std::string& into) {
  std::lock_guard lock(mutex_);
  const std::uint64_t stream = last_stream_;
  into.append(last_words_);
  release(last_words_);
  last_stream_ = 0;
  return stream;
}

void channel::send(std::uint64_t stream, std::string_view bytes) {
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    if (stream == 0 || stream != stream_) return;
    wake = outbox_.empty();
    outbox_.append(bytes);
  }
  if (wake) wake_link_();
}

void channel::close(std::uint64_t stream) {
  {
    std::lock_guard lock(mutex_);
    if (stream == 0 || stream != stream_) return;
    close_asked_ = true;
  }
  wake_link_();
}

std::uint64_t channel::current() const {
  std::lock_guard lock(mutex_);
  return stream_;
}

std::size_t channel::queued() const {
  std::lock_guard lock(mutex_);
  return outbox_.size();
}

bool split_host_port(std::string_view text, std::string& host, std::uint16_t& port) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  const std::string_view digits = text.substr(colon + 1);
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc{} || end != digits.data() + digits.size() || value > 65535) return false;
  in_addr probe{};
  host.assign(text.substr(0, colon));
  if (::inet_pton(AF_INET, host.c_str(), &probe) != 1) return false;
  port = static_cast<std::uint16_t>(value);
  return true;
}

namespace {

using clock = std::chrono::steady_clock;

// What an accepted connection may send before its hello is whole (a hello is under 600
// bytes): past it, or a first length beyond it, the connection is closed.
constexpr std::size_t kHelloBytesMax = 4096;
// A stream the core closed still delivers what the core queued last (a refusal, an
// answer) when that is at most this much: written, then the connection is shut down for
// writing and closed once the peer closes it too, or after kLingerTime. A larger
// remainder (a standby dropped for being behind) is discarded at once.
constexpr std::size_t kLingerBytesMax = 64 * 1024;
constexpr auto kLingerTime = std::chrono::seconds(1);
constexpr std::size_t kLingeringMax = 64;
// A buffer whose bytes are all written is given back past this capacity.
constexpr std::size_t kKeepCapacity = 1 << 20;
// Refused connections are logged at most once per this interval per reason, with the
// count of the others (a client looping on the port must not flood the log).
constexpr auto kComplaintInterval = std::chrono::seconds(10);

using tls_status = tls_stream::status;

using log::printable;  // a name or address a peer chose

// "HOST:PORT" of an accepted connection's peer.
std::string peer_address(int fd) {
  sockaddr_in a{};
  socklen_t length = sizeof a;
  char host[INET_ADDRSTRLEN] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &length) != 0 || a.sin_family != AF_INET)
    return "?";
  ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
  return fmt::format("{}:{}", host, ntohs(a.sin_port));
}

// One kind of refusal's log lines: the first at once, then at most one per interval,
// each saying how many it stands for.
struct complaint {
  clock::time_point next{};
  std::uint64_t quiet = 0;
  template <typename... Args>
  void operator()(fmt::format_string<Args...> format, Args&&... args) {
    const auto now = clock::now();
    if (now < next) {
      ++quiet;
      return;
    }
    std::string line = fmt::format(format, std::forward<Args>(args)...);
    if (quiet > 0) line += fmt::format(" ({} more since the last such line)", quiet);
    log::warn("{}", line);
    quiet = 0;
    next = now + kComplaintInterval;
  }
};

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// A connection to host:port within timeout_ms, non-blocking, TCP_NODELAY; closed on failure.
socket_fd connect_within(const std::string& host, std::uint16_t port, int timeout_ms) {
  socket_fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.open()) return s;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) return socket_fd();
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINPROGRESS) return socket_fd();
    pollfd p{s.get(), POLLOUT, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return socket_fd();
    int error = 0;
    socklen_t length = sizeof error;
    if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0)
      return socket_fd();
  }
  const int one = 1;
  ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

}  // namespace

struct link::impl {
  link_config cfg;
  std::vector<std::unique_ptr<channel>>& channels;
  socket_fd listener;
  int event_fd = -1;
  std::thread thread;
  std::atomic<bool> stopping{false};

  // Mode changes, asked by set_mode and applied by the link thread.
  std::mutex mode_mutex;
  std::condition_variable mode_applied;
  mode asked_mode = mode::idle;
  std::string asked_leader;
  std::uint64_t asked = 0, applied = 0;

  // Core c's channel has news: its loop wakes (an eventfd counter already non-zero,
  // EAGAIN, wakes it all the same).
  void wake_core(int c) const {
    if (static_cast<std::size_t>(c) >= cfg.wake_fds.size()) return;
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n =
        ::write(cfg.wake_fds[static_cast<std::size_t>(c)], &one, sizeof one);
  }

  // Link thread only from here on.
  struct stream {
    socket_fd fd;
    std::unique_ptr<tls_stream> tls;  // with TLS; its handshake may still be under way
    std::uint64_t id = 0;
    std::string out;  // taken from the channel's outbox, being written
    std::size_t written = 0;
    std::string peer;  // accept mode: the node whose hello opened it (proven with TLS)
    // TLS only: the session waits for the socket to be writable (a handshake step, or a
    // read that must send first), or a write waits for it to be readable.
    bool tls_wants_write = false, write_wants_read = false;
  };
  struct unrouted {  // an accepted connection whose hello is not complete yet
    socket_fd fd;
    std::unique_ptr<tls_stream> tls;  // with TLS: handshake, then the hello through it
    bool tls_wants_write = false;
    std::string from;   // the peer's address, for the log
    std::string bytes;  // all of it, handed to the core with the stream
    decoder d;          // fed each read's new bytes only
    clock::time_point since;
  };
  struct lingering {  // a closed stream delivering the core's last bytes
    socket_fd fd;
    std::unique_ptr<tls_stream> tls;
    std::string out;
    std::size_t written = 0;
    clock::time_point until;
    bool shut = false;  // everything written; waiting for the peer's end
  };
  mode current = mode::idle;
  std::string leader, leader_node;
  std::string asked_leader_node;
  complaint refused_handshake, refused_name, refused_taken, leader_handshake, refused_rate;
  double handshake_tokens = 0;
  clock::time_point tokens_at = clock::now();

  // One handshake from the rate's budget (link_config::handshakes_per_second); false if
  // none is left.
  bool take_handshake() {
    const auto now = clock::now();
    const double rate = cfg.handshakes_per_second;
    handshake_tokens = std::min(
        rate, handshake_tokens + std::chrono::duration<double>(now - tokens_at).count() * rate);
    tokens_at = now;
    if (handshake_tokens < 1) return false;
    handshake_tokens -= 1;
    return true;
  }
  std::vector<stream> streams;  // by core
  std::vector<unrouted> waiting;
  std::vector<lingering> closing;
  std::uint64_t next_id = 0;
  clock::time_point next_connect{}, connected_at{};
  std::chrono::milliseconds pause{0};

  impl(link_config c, std::vector<std::unique_ptr<channel>>& ch)
      : cfg(std::move(c)),
        channels(ch),
        handshake_tokens(cfg.handshakes_per_second),
        streams(static_cast<std::size_t>(cfg.cores)) {}

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(event_fd, &one, sizeof one);
  }

  // Core c's channel gets a new stream on fd (through `tls` if set), with `first` bytes
  // already received, from node `peer` (accept mode).
  void open_stream(int c, socket_fd fd, std::unique_ptr<tls_stream> tls, std::string first,
                   std::string peer = {}) {
    stream& s = streams[static_cast<std::size_t>(c)];
    end_stream(c);
    s.fd = std::move(fd);
    s.tls = std::move(tls);
    // A connecting session starts its handshake by writing.
    s.tls_wants_write = s.tls && !s.tls->established();
    s.write_wants_read = false;
    s.peer = std::move(peer);
    s.id = ++next_id;
    release(s.out);
    s.written = 0;
    channel& ch = *channels[static_cast<std::size_t>(c)];
    {
      std::lock_guard lock(ch.mutex_);
      ch.stream_ = s.id;
      ch.inbox_ = std::move(first);
      release(ch.outbox_);
      ch.close_asked_ = false;
    }
    wake_core(c);
  }

  // Ends core c's stream and gives its buffers' memory back. A stream the core closed
  // lingers to deliver its last bytes if they are few (kLingerBytesMax).
  void end_stream(int c) {
    stream& s = streams[static_cast<std::size_t>(c)];
    if (!s.fd.open()) return;
    channel& ch = *channels[static_cast<std::size_t>(c)];
    bool close_asked = false;
    std::string rest;
    {
      std::lock_guard lock(ch.mutex_);
      close_asked = ch.close_asked_;
      if (close_asked) rest.swap(ch.outbox_);
      // What arrived and the core has not taken yet is its peer's last words.
      ch.last_stream_ = ch.inbox_.empty() ? 0 : ch.stream_;
      ch.last_words_.swap(ch.inbox_);
      ch.stream_ = 0;
      release(ch.inbox_);
      release(ch.outbox_);
      ch.close_asked_ = false;
    }
    const std::size_t unwritten = s.out.size() - s.written + rest.size();
    if (close_asked && unwritten > 0 && unwritten <= kLingerBytesMax &&
        closing.size() < kLingeringMax && (!s.tls || s.tls->established())) {
      lingering l;
      l.fd = std::move(s.fd);
      l.tls = std::move(s.tls);
      l.out.assign(s.out, s.written);
      l.out += rest;
      l.until = clock::now() + kLingerTime;
      closing.push_back(std::move(l));
    }
    s.tls.reset();
    s.fd = socket_fd();
    s.peer.clear();
    release(s.out);
    s.written = 0;
    wake_core(c);
  }

  // One turn of a lingering connection (`revents` from poll); false once it is done.
  static bool linger(lingering& l, short revents) {
    if (clock::now() >= l.until) return false;
    if (!l.shut && (revents & POLLOUT)) {
      if (l.tls) {
        std::size_t n = 0;
        const tls_status st = l.tls->write(std::string_view(l.out).substr(l.written), n);
        if (st == tls_status::failed || st == tls_status::closed) return false;
        l.written += n;
      } else {
        const ssize_t n = ::send(l.fd.get(), l.out.data() + l.written, l.out.size() - l.written,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
        if (n > 0) l.written += static_cast<std::size_t>(n);
      }
      if (l.written == l.out.size()) {
        // The peer reads all of it before our end: closing with its bytes unread here
        // would reset the connection, and a reset may discard what it has not read yet.
        if (l.tls) l.tls->close_notify();
        ::shutdown(l.fd.get(), SHUT_WR);
        l.shut = true;
        release(l.out);
      }
    }
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
      char sink[4096];
      for (;;) {  // what the peer still sends is dropped; its end ends the linger
        const ssize_t n = ::recv(l.fd.get(), sink, sizeof sink, MSG_DONTWAIT);
        if (n > 0) continue;
        if (n == 0) return false;
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        return false;
      }
    }
    return true;
  }

  // A stream failed: in follow mode the whole set goes (and is connected again).
  void fail_stream(int c) {
    if (current != mode::follow) return end_stream(c);
    for (int i = 0; i < cfg.cores; ++i) end_stream(i);
    retry_later();
  }

  // The pause before the follower connects again: short after a set that lived, then
  // doubling up to 5 s while the leader keeps refusing (or is unreachable).
  void retry_later() {
    const auto now = clock::now();
    pause = now - connected_at > std::chrono::seconds(1)
                ? std::chrono::milliseconds(cfg.reconnect_pause_ms)
                : std::min<std::chrono::milliseconds>(pause * 2, std::chrono::seconds(5));
    next_connect = now + pause;
    connected_at = now;  // a failed connect counts as a set that did not live
  }

  void apply_mode() {
    std::lock_guard lock(mode_mutex);
    if (applied == asked) return;
    for (int c = 0; c < cfg.cores; ++c) end_stream(c);
    waiting.clear();
    closing.clear();
    current = asked_mode;
    leader = asked_leader;
    leader_node = asked_leader_node;
    next_connect = {};
    pause = std::chrono::milliseconds(cfg.reconnect_pause_ms);
    applied = asked;
    mode_applied.notify_all();
  }

  void connect_all() {
    if (clock::now() < next_connect) return;
    std::string host;
    std::uint16_t port = 0;
    if (!split_host_port(leader, host, port)) return;
    std::vector<socket_fd> fds;
    for (int c = 0; c < cfg.cores; ++c) {
      fds.push_back(connect_within(host, port, cfg.connect_timeout_ms));
      if (!fds.back().open()) return retry_later();
    }
    connected_at = clock::now();
    for (int c = 0; c < cfg.cores; ++c) {
      socket_fd& fd = fds[static_cast<std::size_t>(c)];
      std::unique_ptr<tls_stream> tls;
      if (cfg.tls)
        tls = std::make_unique<tls_stream>(*cfg.tls, fd.get(), tls_stream::role::connect,
                                           leader_node);
      open_stream(c, std::move(fd), std::move(tls), {});
    }
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      socket_fd s(fd);
      if (current != mode::accept || waiting.size() >= 64) continue;  // closed at once
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      unrouted u;
      u.fd = std::move(s);
      u.from = peer_address(fd);
      if (cfg.tls) {
        if (!take_handshake()) {  // closed at once
          count(refusal::rate);
          refused_rate("replication: refused a connection from {}: over {} TLS handshakes a second",
                       u.from, cfg.handshakes_per_second);
          continue;
        }
        u.tls = std::make_unique<tls_stream>(*cfg.tls, fd, tls_stream::role::accept);
      }
      u.since = clock::now();
      waiting.push_back(std::move(u));
    }
  }

  void count(refusal r) {
    if (cfg.refused) cfg.refused(r);
  }

  // Reads what fd holds into `into`; false at the end of the stream or on an error.
  static bool read_into(int fd, std::string& into) {
    char buffer[64 * 1024];
    for (;;) {
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
      if (n > 0) {
        into.append(buffer, static_cast<std::size_t>(n));
        if (static_cast<std::size_t>(n) < sizeof buffer) return true;
        continue;
      }
      if (n == 0) return false;
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
  }

  // An accepted connection's first bytes, read up to kHelloBytesMax + 1 (so that a peer
  // sending more is seen to): false at the end of the stream or on an error.
  static bool read_hello(unrouted& u) {
    if (u.tls) {
      std::string got;
      const tls_status st = u.tls->read(got, kHelloBytesMax + 1 - u.bytes.size());
      u.bytes += got;
      u.d.feed(got);
      u.tls_wants_write = st == tls_status::want_write;
      return st != tls_status::closed && st != tls_status::failed;
    }
    char buffer[kHelloBytesMax + 1];
    while (u.bytes.size() <= kHelloBytesMax) {
      const std::size_t room = kHelloBytesMax + 1 - u.bytes.size();
      const ssize_t n = ::recv(u.fd.get(), buffer, room, MSG_DONTWAIT);
      if (n > 0) {
        u.bytes.append(buffer, static_cast<std::size_t>(n));
        u.d.feed(std::string_view(buffer, static_cast<std::size_t>(n)));
        continue;
      }
      if (n == 0) return false;
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
    return true;
  }

  // Once its hello is whole, the core it names gets the stream (hello included: the
  // core answers it). True when routed or refused (closed when `u` goes): a first
  // message that is no hello, damaged, declares a body longer than a hello can be, or
  // more than kHelloBytesMax bytes before it is whole.
  bool route(unrouted& u) {
    if (u.bytes.size() >= 4) {
      std::uint32_t length = 0;
      std::memcpy(&length, u.bytes.data(), 4);
      if (length > kHelloBytesMax - kHeaderBytes) return true;
    }
    const decoder::status st = u.d.next();
    if (st == decoder::status::need_more) return u.bytes.size() > kHelloBytesMax;
    if (st != decoder::status::message || u.d.type != message_type::hello) return true;
    const hello& h = u.d.hello;
    if (u.tls && !u.tls->peer_names(h.node)) {
      // A node of the cluster claiming to be another (finding 1 of issue 30, with a
      // stolen or misissued certificate): it displaces nothing and learns nothing.
      count(refusal::name);
      refused_name(
          "replication: refused a stream from {}: its certificate names {}, its hello claims "
          "node {}",
          u.from, u.tls->peer_names_text(), printable(h.node));
      return true;
    }
    if (h.core >= static_cast<std::uint32_t>(cfg.cores)) {
      count(refusal::no_such_core);
      answer_and_close(u, refusal::no_such_core);
      return true;
    }
    // A new hello replaces a core's stream only when it comes from the node that holds
    // this node's streams: another client (a second standby, or one claiming another
    // name) waits until they have all ended.
    for (const stream& s : streams) {
      if (!s.fd.open() || s.peer == h.node) continue;
      count(refusal::taken);
      refused_taken(
          "replication: refused node {}'s stream for core {} from {}: node {}'s streams are "
          "live (a new hello replaces only its own node's)",
          printable(h.node), h.core, u.from, printable(s.peer));
      answer_and_close(u, refusal::taken);
      return true;
    }
    open_stream(static_cast<int>(h.core), std::move(u.fd), std::move(u.tls), std::move(u.bytes),
                h.node);
    return true;
  }

  // A refused hello's answer, delivered before its connection closes (if there is one).
  void answer_and_close(unrouted& u, refusal why) {
    if (!cfg.answer_refused || closing.size() >= kLingeringMax) return;
    lingering l;
    l.out = cfg.answer_refused(u.d.hello, why);
    if (l.out.empty() || l.out.size() > kLingerBytesMax) return;
    l.fd = std::move(u.fd);
    l.tls = std::move(u.tls);
    l.until = clock::now() + kLingerTime;
    closing.push_back(std::move(l));
  }

  // One turn of a connection waiting for its hello (TLS: its handshake first); true once
  // it is routed or refused (closed when `u` goes).
  bool on_waiting(unrouted& u) {
    if (u.tls && !u.tls->established()) {
      const tls_status st = u.tls->handshake();
      if (st == tls_status::want_read || st == tls_status::want_write) {
        u.tls_wants_write = st == tls_status::want_write;
        return false;
      }
      if (st != tls_status::ok) {
        count(refusal::handshake);
        refused_handshake("replication: refused a connection from {}: TLS: {}", u.from,
                          u.tls->error().empty() ? "the peer ended it" : u.tls->error());
        return true;
      }
      u.tls_wants_write = false;
    }
    return !read_hello(u) || route(u);
  }

  // Writes what core c's stream has to write; false if the stream failed.
  bool write_stream(stream& s) {
    std::size_t n = 0;
    if (s.tls) {
      const tls_status st = s.tls->write(std::string_view(s.out).substr(s.written), n);
      s.write_wants_read = st == tls_status::want_read;
      if (st == tls_status::failed || st == tls_status::closed) return false;
    } else {
      const ssize_t sent = ::send(s.fd.get(), s.out.data() + s.written, s.out.size() - s.written,
                                  MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      n = sent > 0 ? static_cast<std::size_t>(sent) : 0;
    }
    s.written += n;
    if (s.written == s.out.size()) {
      if (s.out.capacity() > kKeepCapacity)
        release(s.out);
      else
        s.out.clear();
      s.written = 0;
    }
    return true;
  }

  // Reads what core c's stream holds into `got`; false at its end or on an error.
  static bool read_stream(stream& s, std::string& got) {
    if (!s.tls) return read_into(s.fd.get(), got);
    // All of it: bytes left inside the session would not wake poll.
    const tls_status st = s.tls->read(got, static_cast<std::size_t>(-1));
    s.tls_wants_write = st == tls_status::want_write;
    return st == tls_status::want_read || st == tls_status::want_write;
  }

  // What poll waits for on core c's stream.
  static short stream_events(const stream& s) {
    if (s.tls && !s.tls->established())
      return static_cast<short>(s.tls_wants_write ? POLLOUT : POLLIN);
    const bool out = !s.out.empty() && !s.write_wants_read;
    return static_cast<short>(POLLIN | (out || s.tls_wants_write ? POLLOUT : 0));
  }

  // One poll result of core c's stream.
  void on_stream(int c, short revents) {
    stream& s = streams[static_cast<std::size_t>(c)];
    if (s.tls && !s.tls->established()) {
      const tls_status st = s.tls->handshake();
      if (st == tls_status::want_read || st == tls_status::want_write) {
        s.tls_wants_write = st == tls_status::want_write;
        return;
      }
      if (st != tls_status::ok) {
        leader_handshake("replication: TLS with the leader (node {} at {}) failed: {}",
                         printable(leader_node), leader,
                         s.tls->error().empty() ? "it ended the connection" : s.tls->error());
        return fail_stream(c);
      }
      s.tls_wants_write = false;
      revents = POLLIN | POLLOUT;  // the outbox may hold the hello: try both now
    }
    const bool try_write =
        (revents & POLLOUT) || (s.tls && s.write_wants_read && (revents & POLLIN));
    if (try_write && !s.out.empty() && !write_stream(s)) return fail_stream(c);
    if ((revents & (POLLIN | POLLHUP | POLLERR)) || (s.tls && s.tls_wants_write)) {
      std::string got;
      const bool open = read_stream(s, got);
      if (!got.empty()) {
        channel& ch = *channels[static_cast<std::size_t>(c)];
        {
          std::lock_guard lock(ch.mutex_);
          ch.inbox_.append(got);
        }
        wake_core(c);
      }
      if (!open) fail_stream(c);
    }
  }

  void run();
};

void link::impl::run() {
  // OpenSSL writes to the sockets with write(): a peer gone must be an EPIPE here, not a
  // SIGPIPE for the process (which an embedder may not ignore).
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  std::vector<pollfd> fds;
  // -1 event fd, -2 listener, -3 - i waiting[i], kClosing - i closing[i], else the core
  constexpr int kClosing = -1000;
  std::vector<int> owner;
  while (!stopping.load(std::memory_order_relaxed)) {
    apply_mode();
    if (current == mode::follow && !streams[0].fd.open()) connect_all();
    fds.clear();
    owner.clear();
    fds.push_back({event_fd, POLLIN, 0});
    owner.push_back(-1);
    if (listener.open()) {  // taken in accept mode, else closed at once
      fds.push_back({listener.get(), POLLIN, 0});
      owner.push_back(-2);
    }
    const auto now = clock::now();
    for (std::size_t i = 0; i < waiting.size();) {
      if (now - waiting[i].since > std::chrono::seconds(5)) {  // no hello: not a standby
        waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      fds.push_back({waiting[i].fd.get(),
                     static_cast<short>(POLLIN | (waiting[i].tls_wants_write ? POLLOUT : 0)), 0});
      owner.push_back(-3 - static_cast<int>(i));
      ++i;
    }
    for (std::size_t i = 0; i < closing.size();) {
      if (now >= closing[i].until) {
        closing.erase(closing.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      fds.push_back(
          {closing[i].fd.get(), static_cast<short>(POLLIN | (closing[i].shut ? 0 : POLLOUT)), 0});
      owner.push_back(kClosing - static_cast<int>(i));
      ++i;
    }
    for (int c = 0; c < cfg.cores; ++c) {
      stream& s = streams[static_cast<std::size_t>(c)];
      if (!s.fd.open()) continue;
      channel& ch = *channels[static_cast<std::size_t>(c)];
      bool close_asked = false;
      {
        std::lock_guard lock(ch.mutex_);
        close_asked = ch.close_asked_;
        // Only once the last batch is written: the outbox then holds what the peer has
        // not taken yet (the cores' back-pressure counts it), and the swap is O(1).
        if (!close_asked && s.out.empty() && !ch.outbox_.empty()) {
          s.out.swap(ch.outbox_);
          ch.outbox_.clear();
          s.written = 0;
        }
      }
      if (close_asked) {
        fail_stream(c);
        continue;
      }
      fds.push_back({s.fd.get(), stream_events(s), 0});
      owner.push_back(c);
    }
    if (::poll(fds.data(), fds.size(), 20) > 0) {
      std::vector<std::size_t> routed, done;
      const std::size_t lingering_before = closing.size();  // end_stream may add some
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        const int who = owner[i];
        if (who <= kClosing) {
          const auto at = static_cast<std::size_t>(kClosing - who);
          if (!linger(closing[at], fds[i].revents)) done.push_back(at);
        } else if (who == -1) {
          std::uint64_t count = 0;
          [[maybe_unused]] const auto n = ::read(event_fd, &count, sizeof count);
        } else if (who == -2) {
          accept_all();
        } else if (who <= -3) {
          unrouted& u = waiting[static_cast<std::size_t>(-3 - who)];
          if (on_waiting(u)) routed.push_back(static_cast<std::size_t>(-3 - who));
        } else {
          stream& s = streams[static_cast<std::size_t>(who)];
          if (!s.fd.open() || s.fd.get() != fds[i].fd) continue;  // replaced meanwhile
          on_stream(who, fds[i].revents);
        }
      }
      for (auto it = routed.rbegin(); it != routed.rend(); ++it)
        waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(*it));
      for (auto it = done.rbegin(); it != done.rend(); ++it)
        if (*it < lingering_before)
          closing.erase(closing.begin() + static_cast<std::ptrdiff_t>(*it));
    }
    if (cfg.each_turn) cfg.each_turn();
  }
  for (int c = 0; c < cfg.cores; ++c) end_stream(c);
}

link::link(link_config cfg) {
  for (int c = 0; c < cfg.cores; ++c) channels_.push_back(std::make_unique<channel>());
  impl_ = std::make_unique<impl>(std::move(cfg), channels_);
  impl_->event_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl_->event_fd < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  for (auto& ch : channels_) ch->wake_link_ = [this] { impl_->wake(); };
  if (!impl_->cfg.listen_host.empty()) {
    impl_->listener = listen_tcp(impl_->cfg.listen_host, impl_->cfg.listen_port);
    set_nonblocking(impl_->listener.get());
    port_ = bound_port(impl_->listener);
  }
}

link::~link() {
  stop();
  ::close(impl_->event_fd);
}

void link::start() {
  impl_->thread = std::thread([this] { impl_->run(); });
}

void link::stop() {
  if (!impl_->thread.joinable()) return;
  impl_->stopping = true;
  impl_->wake();
  impl_->thread.join();
}

void link::set_mode(mode m, const std::string& leader, const std::string& leader_node) {
  std::unique_lock lock(impl_->mode_mutex);
  impl_->asked_mode = m;
  impl_->asked_leader = leader;
  impl_->asked_leader_node = leader_node;
  const std::uint64_t ticket = ++impl_->asked;
  impl_->wake();
  if (!impl_->thread.joinable()) return;  // not started: applied by the first turn
  impl_->mode_applied.wait(lock, [&] { return impl_->applied >= ticket; });
}

}  // namespace metad::repl
