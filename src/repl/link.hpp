// The sockets of replication: one thread per node moves bytes between each core's
// stream (one TCP connection per core pair) and that core's channel. The cores run the
// protocol (protocol.hpp, session.hpp) on their own threads; this thread only reads,
// writes, accepts and connects, so a slow or silent peer never blocks a core.
//
// A link is in one of three modes, set by the server as the node's role changes:
// - idle: no streams (a node without a role yet, or one being promoted);
// - accept (a leader): connections from standbys are taken; the first message of each
//   (a hello) names the core whose channel gets the stream, replacing any older one;
// - follow (a standby): one connection per core to the address given, each core's
//   channel gets its stream, and the core says hello. When any of them ends, all are
//   closed and the set is connected again after a pause.
//
// Bounds against a hostile peer: an accepted connection may send at most 4 KiB before
// its hello is whole (a hello is under 600 bytes), parsed as it arrives. A stream a core
// closes still delivers the few bytes it queued last (up to 64 KiB, within 1 s: a
// refusal), and a standby's core hears what its leader sent before its end
// (channel::take_last). A stream's buffers are freed when it ends.
//
// Who may take a stream (accept mode): with TLS (link_config::tls, tls.hpp) only a peer
// whose certificate the cluster's CA signed and that names the node its hello claims;
// the standby, for its part, follows only a leader whose certificate names the node the
// leader key names. With or without TLS, while any stream of one node is live a hello
// from another node is refused (answered, e.g. busy): a new hello replaces a core's
// stream only when it comes from the node that holds the streams, so that a second
// client cannot displace the standby in the ack set.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace metad::repl {

class tls_context;
struct hello;

// Why the link refused a connection (accept mode).
enum class refusal : std::uint8_t {
  handshake,     // TLS: not TLS, no certificate, another CA's, or a broken handshake
  name,          // TLS: the certificate does not name the node its hello claims
  taken,         // another node's streams are live
  no_such_core,  // the hello names a core this node does not have
  rate,          // TLS: over link_config::handshakes_per_second
};
inline constexpr int kRefusals = 5;

// One core's bytes to and from its peer. The core calls take, send and close; the link
// thread fills the inbox and empties the outbox. Every connection is a new stream
// number: bytes of an older stream are dropped on both sides.
class channel {
 public:
  // Appends what arrived on the current stream to `into` and returns that stream's
  // number (0: no stream).
  std::uint64_t take(std::string& into);
  // The bytes that arrived on the latest stream that ended before take() had them (a
  // peer's last words before its end: a refusal); appended to `into`, with that stream's
  // number (0: none). Each ended stream's bytes are returned once.
  std::uint64_t take_last(std::string& into);
  // Queues bytes for the peer of stream `stream` (dropped if that stream has ended).
  void send(std::uint64_t stream, std::string_view bytes);
  // Ends stream `stream` (a protocol error, or the peer dropped from the sync set).
  void close(std::uint64_t stream);
  // The current stream's number (0: none); for close() from another thread.
  std::uint64_t current() const;
  // Bytes queued and not yet written (back-pressure: the core drops a peer past a bound).
  std::size_t queued() const;

 private:
  friend class link;
  mutable std::mutex mutex_;
  std::uint64_t stream_ = 0;
  std::string inbox_, outbox_;
  std::string last_words_;  // inbox_ of stream last_stream_, which ended
  std::uint64_t last_stream_ = 0;
  bool close_asked_ = false;
  std::function<void()> wake_link_;
};

struct link_config {
  int cores = 1;
  // accept mode: where standbys connect; empty host: no listener.
  std::string listen_host;
  std::uint16_t listen_port = 0;
  // Core c's wake eventfd (the one its event loop watches: smp::mailbox::wake_fd), which
  // the link thread writes when core c's channel has news: bytes, or a stream that began
  // or ended. Empty (tests): the cores are not woken, they poll.
  std::vector<int> wake_fds;
  // Called on the link thread every loop turn (at most ~20 ms apart).
  std::function<void()> each_turn;
  // accept mode: a hello the link refuses (refusal::taken or no_such_core) reaches no
  // channel; the bytes to answer it with before its connection closes (empty: none).
  // Link thread.
  std::function<std::string(const hello&, refusal)> answer_refused;
  // accept mode: each connection refused, whatever the reason (for /metrics). Link thread.
  std::function<void(refusal)> refused;
  // Mutual TLS on every stream (tls.hpp); null: plain TCP.
  std::shared_ptr<const tls_context> tls;
  // accept mode, TLS: handshakes started per second at most, with a burst of as many at
  // once (a standby connects one stream per core at once). A peer that has not proven
  // itself costs the link thread ~0.2 ms of CPU (P-256: key exchange, signature,
  // verifications), on the thread that ships every batch; past the rate connections are
  // closed on accept, and a real standby connects again after its pause, while the
  // streams already established go on.
  double handshakes_per_second = 64;
  int connect_timeout_ms = 200;
  int reconnect_pause_ms = 100;
};

class link {
 public:
  explicit link(link_config cfg);  // binds the listener; throws std::system_error
  ~link();
  link(const link&) = delete;
  link& operator=(const link&) = delete;

  void start();
  void stop();
  std::uint16_t port() const { return port_; }
  channel& at(int core) { return *channels_[static_cast<std::size_t>(core)]; }

  enum class mode : std::uint8_t { idle, accept, follow };
  // Changes mode; returns once every stream of the old mode is closed (the promotion's
  // "cut the old stream first"). follow needs the leader's HOST:PORT and, with TLS, its
  // node id (its certificate must name it).
  void set_mode(mode m, const std::string& leader = {}, const std::string& leader_node = {});

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::vector<std::unique_ptr<channel>> channels_;
  std::uint16_t port_ = 0;
};

// "HOST:PORT" → host and port; false if malformed.
bool split_host_port(std::string_view text, std::string& host, std::uint16_t& port);

}  // namespace metad::repl
