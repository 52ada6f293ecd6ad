// Fallback transport: standalone Asio with its default epoll reactor and C++20
// coroutines (never Asio's io_uring backend: see design.md). Same flow as the uring
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
#include "net/input.hpp"
#include "net/transport.hpp"

namespace net {
namespace {

using asio::awaitable;
using stream = asio::generic::stream_protocol;  // TCP and unix sockets alike
constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);
using clock = std::chrono::steady_clock;
constexpr int kLingerMs = 1'000;
constexpr int kLingerReadsMax = 64;

class asio_loop;

struct connection final : waker {
  stream::socket socket;
  asio::steady_timer parked;  // waits "forever" while the request is on another core
  std::unique_ptr<connection_handler> handler;
  clock::time_point deadline;
  bool mid_request = false;
  bool waiting = false;
  bool woken = false;
  bool shut = false;
  bool reading = false;  // serve() awaits a read, which a stop cancels
  std::size_t index = 0;

  explicit connection(stream::socket s)
      : socket(std::move(s)), parked(socket.get_executor(), clock::time_point::max()) {}
  void wake() override {
    woken = true;
    if (waiting) parked.cancel();
  }
  bool input_pending() override { return input_waiting(socket.native_handle()); }
};

class asio_loop {
 public:
  asio_loop(const loop_options& options, core_hooks& hooks)
      : options_(options),
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
          backoff_.failed(
              static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                             std::chrono::steady_clock::now().time_since_epoch())
                                             .count()),
              ec.value());
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
      auto* c = new connection(std::move(socket));
      c->handler = hooks_.open(*c);
      c->deadline = clock::now() + std::chrono::milliseconds(options_.idle_timeout_ms);
      c->index = connections_.size();
      connections_.push_back(c);
      asio::co_spawn(ctx_, serve(c), asio::detached);
    }
  }

  awaitable<void> serve(connection* c) {
    flow next = flow::read;
    for (;;) {
      std::string& out = c->handler->output();
      if (!out.empty()) {
        auto [ec, n] = co_await asio::async_write(c->socket, asio::buffer(out), use_tuple);
        out.clear();
        if (ec) break;
      }
      if (next == flow::close) {
        // Lingering close, as in the uring loop: stop writing, drop the client's
        // remaining bytes until it closes or kLingerMs passes (the sweep cuts it).
        asio::error_code ignored;
        c->socket.shutdown(stream::socket::shutdown_send, ignored);
        c->deadline = clock::now() + std::chrono::milliseconds(kLingerMs);
        c->mid_request = true;
        for (int reads = 0; reads < kLingerReadsMax && !c->shut; ++reads) {
          auto [ec, n] = co_await c->socket.async_read_some(asio::buffer(discard_), use_tuple);
          if (ec || n == 0) break;
        }
        break;
      }
      if (next == flow::wait) {
        if (!c->woken) {
          c->waiting = true;
          c->parked.expires_at(clock::time_point::max());
          co_await c->parked.async_wait(use_tuple);
          c->waiting = false;
        }
        c->woken = false;
        next = c->handler->on_resume();
        continue;
      }
      if (next == flow::drain) {  // the output was written in full above
        next = c->handler->on_drained();
        continue;
      }
      // Stopping: an idle connection closes, unless the client sent more before it could
      // know (those requests are served first).
      if (stopping_ && !c->handler->mid_request() && !input_waiting(c->socket.native_handle()))
        break;
      if (!c->handler->mid_request()) c->handler->trim();
      std::span<char> space = c->handler->read_space();
      c->reading = true;
      auto [ec, n] =
          co_await c->socket.async_read_some(asio::buffer(space.data(), space.size()), use_tuple);
      c->reading = false;
      // begin_stop() cancelled the read: look at the socket again.
      if (ec == asio::error::operation_aborted && !c->shut) continue;
      if (ec || n == 0 || c->shut) break;
      next = c->handler->on_bytes(n);
      const bool mid = c->handler->mid_request();
      if (!mid) {
        c->deadline = clock::now() + std::chrono::milliseconds(options_.idle_timeout_ms);
      } else if (!c->mid_request) {
        c->deadline = clock::now() + std::chrono::milliseconds(options_.header_timeout_ms);
      }
      c->mid_request = mid;
    }
    close(c);
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
    const auto now = clock::now();
    const bool draining_over = stopping_ && now >= stop_deadline_;
    for (connection* c : connections_) {
      if (c->waiting) continue;
      if (draining_over || now >= c->deadline) {
        if (!c->shut) ++stats_->timed_out;
        shut(c);
      }
    }
  }

  void shut(connection* c) {
    if (c->shut) return;
    c->shut = true;
    asio::error_code ignored;
    c->socket.shutdown(stream::socket::shutdown_both, ignored);
    c->socket.cancel(ignored);
  }

  void close(connection* c) {
    connection* last = connections_.back();
    connections_[c->index] = last;
    last->index = c->index;
    connections_.pop_back();
    ++stats_->closed;
    delete c;
  }

  void begin_stop() {
    stopping_ = true;
    stop_deadline_ = clock::now() + std::chrono::milliseconds(options_.drain_timeout_ms);
    asio::error_code ignored;
    for (auto& acceptor : acceptors_) acceptor.close(ignored);
    // Idle keep-alive connections are woken, not shut: a request may already be in the
    // socket; serve() answers it before closing.
    for (connection* c : connections_)
      if (c->reading && !c->mid_request) c->socket.cancel(ignored);
  }

  loop_options options_;
  core_hooks& hooks_;
  loop_stats* stats_;
  asio::io_context ctx_;
  std::vector<asio::basic_socket_acceptor<stream>> acceptors_;
  accept_backoff backoff_;
  asio::posix::stream_descriptor wake_;
  asio::steady_timer tick_;
  std::vector<connection*> connections_;
  std::array<char, 16 * 1024> discard_;  // lingering closes read into it, all at once
  bool stopping_ = false;
  bool retry_flush_ = false;
  clock::time_point stop_deadline_;
};

}  // namespace

void run_epoll_loop(const loop_options& options, core_hooks& hooks) {
  asio_loop loop(options, hooks);
  loop.run();
}

}  // namespace net
