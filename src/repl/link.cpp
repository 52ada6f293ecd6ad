#include "repl/link.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <system_error>

#include "metad/log.hpp"
#include "repl/protocol.hpp"
#include "repl/socket.hpp"

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

  // Link thread only from here on.
  struct stream {
    socket_fd fd;
    std::uint64_t id = 0;
    std::string out;  // taken from the channel's outbox, being written
    std::size_t written = 0;
  };
  struct unrouted {  // an accepted connection whose hello is not complete yet
    socket_fd fd;
    std::string bytes;  // all of it, handed to the core with the stream
    decoder d;          // fed each read's new bytes only
    clock::time_point since;
  };
  struct lingering {  // a closed stream delivering the core's last bytes
    socket_fd fd;
    std::string out;
    std::size_t written = 0;
    clock::time_point until;
    bool shut = false;  // everything written; waiting for the peer's end
  };
  mode current = mode::idle;
  std::string leader;
  std::vector<stream> streams;  // by core
  std::vector<unrouted> waiting;
  std::vector<lingering> closing;
  std::uint64_t next_id = 0;
  clock::time_point next_connect{}, connected_at{};
  std::chrono::milliseconds pause{0};

  impl(link_config c, std::vector<std::unique_ptr<channel>>& ch)
      : cfg(std::move(c)), channels(ch), streams(static_cast<std::size_t>(cfg.cores)) {}

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(event_fd, &one, sizeof one);
  }

  // Core c's channel gets a new stream on fd, with `first` bytes already received.
  void open_stream(int c, socket_fd fd, std::string first) {
    stream& s = streams[static_cast<std::size_t>(c)];
    end_stream(c);
    s.fd = std::move(fd);
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
    cfg.wake_core(c);
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
        closing.size() < kLingeringMax) {
      lingering l;
      l.fd = std::move(s.fd);
      l.out.assign(s.out, s.written);
      l.out += rest;
      l.until = clock::now() + kLingerTime;
      closing.push_back(std::move(l));
    }
    s.fd = socket_fd();
    release(s.out);
    s.written = 0;
    cfg.wake_core(c);
  }

  // One turn of a lingering connection (`revents` from poll); false once it is done.
  static bool linger(lingering& l, short revents) {
    if (clock::now() >= l.until) return false;
    if (!l.shut && (revents & POLLOUT)) {
      const ssize_t n = ::send(l.fd.get(), l.out.data() + l.written, l.out.size() - l.written,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      if (n > 0) l.written += static_cast<std::size_t>(n);
      if (l.written == l.out.size()) {
        // The peer reads all of it before our end: closing with its bytes unread here
        // would reset the connection, and a reset may discard what it has not read yet.
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
    for (int c = 0; c < cfg.cores; ++c)
      open_stream(c, std::move(fds[static_cast<std::size_t>(c)]), {});
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
      u.since = clock::now();
      waiting.push_back(std::move(u));
    }
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
    if (u.d.hello.core < static_cast<std::uint32_t>(cfg.cores)) {
      open_stream(static_cast<int>(u.d.hello.core), std::move(u.fd), std::move(u.bytes));
    } else if (cfg.answer_unroutable && closing.size() < kLingeringMax) {
      lingering l;  // delivered, then closed
      l.out = cfg.answer_unroutable(u.d.hello);
      if (l.out.empty() || l.out.size() > kLingerBytesMax) return true;
      l.fd = std::move(u.fd);
      l.until = clock::now() + kLingerTime;
      closing.push_back(std::move(l));
    }
    return true;
  }

  void run();
};

void link::impl::run() {
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
      fds.push_back({waiting[i].fd.get(), POLLIN, 0});
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
      fds.push_back({s.fd.get(), static_cast<short>(POLLIN | (s.out.empty() ? 0 : POLLOUT)), 0});
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
          if (!read_hello(u) || route(u)) routed.push_back(static_cast<std::size_t>(-3 - who));
        } else {
          stream& s = streams[static_cast<std::size_t>(who)];
          if (!s.fd.open() || s.fd.get() != fds[i].fd) continue;  // replaced meanwhile
          if (fds[i].revents & POLLOUT) {
            const ssize_t n = ::send(s.fd.get(), s.out.data() + s.written, s.out.size() - s.written,
                                     MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
              s.written += static_cast<std::size_t>(n);
              if (s.written == s.out.size()) {
                if (s.out.capacity() > kKeepCapacity)
                  release(s.out);
                else
                  s.out.clear();
                s.written = 0;
              }
            } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
              fail_stream(who);
              continue;
            }
          }
          if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
            std::string got;
            const bool open = read_into(s.fd.get(), got);
            if (!got.empty()) {
              channel& ch = *channels[static_cast<std::size_t>(who)];
              {
                std::lock_guard lock(ch.mutex_);
                ch.inbox_.append(got);
              }
              cfg.wake_core(who);
            }
            if (!open) fail_stream(who);
          }
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

void link::set_mode(mode m, const std::string& leader) {
  std::unique_lock lock(impl_->mode_mutex);
  impl_->asked_mode = m;
  impl_->asked_leader = leader;
  const std::uint64_t ticket = ++impl_->asked;
  impl_->wake();
  if (!impl_->thread.joinable()) return;  // not started: applied by the first turn
  impl_->mode_applied.wait(lock, [&] { return impl_->applied >= ticket; });
}

}  // namespace metad::repl
