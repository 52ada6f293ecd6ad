// Fallback transport: standalone Asio with its default epoll reactor and C++20
// coroutines (never Asio's io_uring backend: see docs/architecture.md). Same flow as the uring
// loop: one coroutine per connection, a periodic sweep for timeouts, the mailbox's
// eventfd watched for cross-core wake-ups.
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <array>
#include <asio.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <chrono>
#include <vector>

#include "metad/log.hpp"
#include "net/accept_backoff.hpp"
#include "net/connection_list.hpp"
#include "net/connection_policy.hpp"
#include "net/input.hpp"
#include "net/transport.hpp"

namespace metad::net {
namespace {

using asio::awaitable;
using stream = asio::generic::stream_protocol;  // TCP and unix sockets alike
constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);
using clock = std::chrono::steady_clock;

class asio_loop;

std::uint64_t now_ms() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(clock::now().time_since_epoch())
          .count());
}

read_status status_of(const asio::error_code& ec, std::size_t bytes) {
  if (ec == asio::error::operation_aborted) return read_status::cancelled;
  return ec || bytes == 0 ? read_status::ended : read_status::data;
}

struct connection final : waker {
  stream::socket socket;
  asio::steady_timer parked;  // waits "forever" while the request is on another core
  std::size_t index = 0;
  connection_policy policy;  // owns the handler

  connection(stream::socket s, core_hooks& hooks, const policy_limits& limits)
      : socket(std::move(s)),
        parked(socket.get_executor(), clock::time_point::max()),
        policy(hooks.open(*this), *this, limits, now_ms()) {}
  void wake() override {
    if (policy.wake()) parked.cancel();
  }
  bool input_pending() override { return input_waiting(socket.native_handle()); }
};

class asio_loop {
 public:
  asio_loop(const loop_options& options, core_hooks& hooks)
      : options_(options),
        limits_(limits_of(options)),
        hooks_(hooks),
        stats_(options.stats),
        ctx_(ASIO_CONCURRENCY_HINT_UNSAFE),
        wake_(ctx_, ::dup(hooks.wake_fd())),
        tick_(ctx_) {
    acceptors_.reserve(options.listen_fds.size());  // accept loops hold references
    for (int fd : options.listen_fds) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
      acceptors_.emplace_back(
          ctx_, stream(addr.ss_family, addr.ss_family == AF_UNIX ? 0 : IPPROTO_TCP), ::dup(fd));
    }
  }

  void run() {
    for (auto& acceptor : acceptors_) asio::co_spawn(ctx_, accept_loop(acceptor), asio::detached);
    asio::co_spawn(ctx_, wake_loop(), asio::detached);
    asio::co_spawn(ctx_, tick_loop(), asio::detached);
    for (;;) {
      ctx_.poll();
      hooks_.poll();
      flush();
      if (!stopping_ && hooks_.stopping()) begin_stop();
      if (stopping_ && connections_.empty() && hooks_.may_exit()) break;
      if (hooks_.prepare_sleep()) {
        ctx_.run_one();
        hooks_.woke();
      }
    }
    asio::error_code ignored;
    wake_.cancel(ignored);
    tick_.cancel();
    ctx_.stop();
  }

 private:
  awaitable<void> accept_loop(asio::basic_socket_acceptor<stream>& acceptor) {
    while (!stopping_) {
      auto [ec, socket] = co_await acceptor.async_accept(use_tuple);
      if (ec) {
        if (ec == asio::error::operation_aborted) break;
        if (accept_backoff::out_of_descriptors(ec.value())) {
          backoff_.failed(now_ms(), ec.value());
          asio::steady_timer pause(ctx_, std::chrono::milliseconds(accept_backoff::pause_ms));
          co_await pause.async_wait(use_tuple);
          continue;
        }
        metad::log::warn("accept failed: {}", ec.message());
        continue;
      }
      if (stopping_ || connections_.size() >= options_.connections_max) {
        ++stats_->rejected;
        continue;  // the socket closes as it goes out of scope
      }
      ++stats_->accepted;
      socket.set_option(asio::ip::tcp::no_delay(true), ec);  // fails harmlessly on unix sockets
      auto* c = new connection(std::move(socket), hooks_, limits_);
      connections_.add(c);
      asio::co_spawn(ctx_, serve(c), asio::detached);
    }
  }

  // Carries out what the connection's policy decides; it starts each step by writing
  // what the handler wrote, in full.
  awaitable<void> serve(connection* c) {
    connection_policy& policy = c->policy;
    for (;;) {
      std::string& out = policy.handler().output();
      if (!out.empty()) {
        auto [ec, n] = co_await asio::async_write(c->socket, asio::buffer(out), use_tuple);
        out.clear();
        if (ec) policy.send_failed();
      }
      switch (policy.next()) {
        case action::read: {
          std::span<char> space = policy.handler().read_space();
          auto [ec, n] = co_await c->socket.async_read_some(
              asio::buffer(space.data(), space.size()), use_tuple);
          policy.read_done(status_of(ec, n), n, now_ms());
          break;
        }
        case action::park:
          if (policy.parking()) {
            c->parked.expires_at(clock::time_point::max());
            co_await c->parked.async_wait(use_tuple);
          }
          policy.resumed();
          break;
        case action::drain:  // the output was written in full above
          policy.drained();
          break;
        case action::linger: {
          asio::error_code ignored;
          c->socket.shutdown(stream::socket::shutdown_send, ignored);
          policy.linger_started(now_ms());  // the sweep enforces the deadline
          break;
        }
        case action::discard: {
          auto [ec, n] = co_await c->socket.async_read_some(asio::buffer(discard_), use_tuple);
          policy.discarded(ec || n == 0 ? read_status::ended : read_status::data);
          break;
        }
        case action::close:
          close(c);
          co_return;
      }
    }
  }

  awaitable<void> wake_loop() {
    std::uint64_t counter = 0;
    for (;;) {
      auto [ec, n] =
          co_await wake_.async_read_some(asio::buffer(&counter, sizeof counter), use_tuple);
      if (ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor) co_return;
    }
  }

  awaitable<void> tick_loop() {
    for (;;) {
      tick_.expires_after(std::chrono::milliseconds(250));
      auto [ec] = co_await tick_.async_wait(use_tuple);
      if (ec) co_return;
      sweep();
      retry_flush_ = true;
      hooks_.tick();
    }
  }

  // Group commit, synchronously: this transport blocks its core for the write and the
  // fdatasync (the uring transport submits both and keeps serving).
  void flush() {
    flush_job job;
    if (!hooks_.take_flush(job, std::exchange(retry_flush_, false))) return;
    long written = 0;
    while (static_cast<std::size_t>(written) < job.bytes) {
      const ssize_t n =
          ::pwrite(job.fd, job.data + written, job.bytes - static_cast<std::size_t>(written),
                   static_cast<off_t>(job.offset + static_cast<std::uint64_t>(written)));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        written = n < 0 ? -errno : written;
        break;
      }
      written += n;
    }
    const int synced =
        job.sync && written == static_cast<long>(job.bytes) && ::fdatasync(job.fd) != 0 ? -errno
                                                                                        : 0;
    hooks_.flush_done(written, synced);
  }

  void sweep() {
    const std::uint64_t now = now_ms();
    for (connection* c : connections_) {
      if (!c->policy.expired(now)) continue;
      ++stats_->timed_out;
      shut(c);
    }
  }

  void shut(connection* c) {
    if (!c->policy.shut()) return;
    asio::error_code ignored;
    c->socket.shutdown(stream::socket::shutdown_both, ignored);
    c->socket.cancel(ignored);
  }

  void close(connection* c) {
    connections_.remove(c);
    ++stats_->closed;
    delete c;
  }

  void begin_stop() {
    stopping_ = true;
    const std::uint64_t now = now_ms();
    asio::error_code ignored;
    for (auto& acceptor : acceptors_) acceptor.close(ignored);
    // Idle keep-alive connections are woken, not shut: a request may already be in the
    // socket; serve() answers it before closing.
    for (connection* c : connections_)
      if (c->policy.stop(now)) c->socket.cancel(ignored);
  }

  loop_options options_;
  policy_limits limits_;
  core_hooks& hooks_;
  loop_stats* stats_;
  asio::io_context ctx_;
  std::vector<asio::basic_socket_acceptor<stream>> acceptors_;
  accept_backoff backoff_;
  asio::posix::stream_descriptor wake_;
  asio::steady_timer tick_;
  connection_list<connection> connections_;
  std::array<char, 16 * 1024> discard_;  // lingering closes read into it, all at once
  bool stopping_ = false;
  bool retry_flush_ = false;
};

}  // namespace

void run_epoll_loop(const loop_options& options, core_hooks& hooks) {
  asio_loop loop(options, hooks);
  loop.run();
}

}  // namespace metad::net
