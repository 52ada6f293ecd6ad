// Native liburing transport: one ring per core, created on that core's thread. Each
// connection is a coroutine that awaits single-shot recv/send completions; accepts are
// multishot; all submissions of an iteration go out in one io_uring_enter, or earlier
// when an answer among them has waited kSendHoldNs.
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <coroutine>
#include <ctime>
#include <system_error>
#include <utility>
#include <vector>

#include "metad/log.hpp"
#include "net/accept_backoff.hpp"
#include "net/connection_list.hpp"
#include "net/connection_policy.hpp"
#include "net/detached.hpp"
#include "net/input.hpp"
#include "net/transport.hpp"

namespace metad::net {
namespace {

std::uint64_t now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

read_status status_of(int recv_result) {
  if (recv_result > 0) return read_status::data;
  return recv_result == -ECANCELED ? read_status::cancelled : read_status::ended;
}

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000 +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

// An answer queued for sending waits for the end of the loop iteration, when all of the
// iteration's submissions go out in one io_uring_enter (one wake-up of a client that
// multiplexes its connections, where an answer each would wake it each time). Without
// a bound, the requests handled after it in the same iteration held it for their whole
// run: in the connector replay at 100 calls/s per stream, 1.7–8.3% of answers waited
// over 256 µs, and after a stall of the host up to 4% over 1 ms (the whole backlog was
// handled before anything was sent). So the queue is submitted as soon as its oldest
// answer has waited kSendHoldNs (checked after each completion): 0.08–0.16% then wait
// over 256 µs, none over 1 ms. Measured cost with clients that multiplex (wrk,
// metad-load): ~3% of CPU on get_locations, ~1 µs per fresh save pair, ~15% on
// batch_exists (each answer then wakes the client). Submitting before every request
// instead cost 20–35%.
constexpr std::uint64_t kSendHoldNs = 50'000;

// An idle connection keeps at most this much of its send buffer (a big answer's is
// given back once sent).
constexpr std::size_t kIdleBufferBytes = 64 * 1024;

// Every SQE's user_data points at one of these.
struct completion {
  void (*on_cqe)(completion* self, const io_uring_cqe& cqe) = nullptr;
};

class uring_loop;

// One listening socket with its multishot accept.
struct listener final : completion {
  uring_loop* loop = nullptr;
  int fd = -1;
  bool armed = false;
  bool paused = false;  // out of descriptors: re-armed by the next tick
};

// A completion of the loop's own (accept, wake-up, tick) that calls back into it.
struct loop_completion : completion {
  uring_loop* loop = nullptr;
  void (uring_loop::*handler)(const io_uring_cqe&) = nullptr;
  void bind(uring_loop* l, void (uring_loop::*h)(const io_uring_cqe&)) {
    loop = l;
    handler = h;
    on_cqe = [](completion* self, const io_uring_cqe& cqe) {
      auto* me = static_cast<loop_completion*>(self);
      (me->loop->*me->handler)(cqe);
    };
  }
};

struct connection final : waker {
  uring_loop& loop;
  int fd;
  // Sending runs beside the serve coroutine, so a response and the next recv go out in
  // the same submission: `sending` holds the bytes on their way, `sent` of them done.
  struct send_completion final : completion {
    connection* owner = nullptr;
  } send_done;
  std::string sending;
  std::size_t sent = 0;
  bool send_in_flight = false;
  std::coroutine_handle<> drain_waiter;  // serve() waiting for every byte to be sent
  completion* reading = nullptr;         // serve()'s pending recv, which a stop cancels
  std::coroutine_handle<> parked;        // the serve coroutine while waiting
  std::size_t index = 0;                 // position in the loop's connection list
  connection_policy policy;              // owns the handler

  connection(uring_loop& l, int f, core_hooks& hooks, const policy_limits& limits,
             std::uint64_t now)
      : loop(l), fd(f), policy(hooks.open(*this), *this, limits, now) {}
  void wake() override;
  bool input_pending() override { return input_waiting(fd); }
};

class uring_loop {
 public:
  uring_loop(const loop_options& options, core_hooks& hooks);
  ~uring_loop();
  void run();

  // One awaitable SQE.
  struct op final : completion {
    uring_loop& loop;
    int result = 0;
    std::coroutine_handle<> waiter;
    explicit op(uring_loop& l) : loop(l) {
      on_cqe = [](completion* self, const io_uring_cqe& cqe) {
        auto* me = static_cast<op*>(self);
        me->result = cqe.res;
        me->waiter.resume();
      };
    }
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) noexcept { waiter = h; }
    int await_resume() const noexcept { return result; }
  };

  io_uring_sqe* sqe(completion* c);
  void ready(connection* c) { ready_.push_back(c); }

  // co_await drained{c}: until nothing of c's output is left to send.
  struct drained {
    connection* c;
    bool await_ready() const noexcept { return !c->send_in_flight; }
    void await_suspend(std::coroutine_handle<> h) noexcept { c->drain_waiter = h; }
    void await_resume() const noexcept {}
  };

 private:
  detached serve(connection* c);
  void send_output(connection* c);
  // Submits the queued SQEs now if an answer among them has waited kSendHoldNs (or at
  // all, with `now`), instead of at the end of the iteration.
  void submit_held_sends(bool now = false);
  void on_send(connection* c, int result);
  void arm_accept(listener& l);
  void arm_wake();
  void arm_tick();
  void on_accept(listener& l, const io_uring_cqe& cqe);
  void on_wake(const io_uring_cqe& cqe);
  void on_tick(const io_uring_cqe& cqe);
  void open(int fd);
  void close(connection* c);
  void shut(connection* c);
  void sweep();
  void begin_stop();
  void maybe_flush();
  void on_write(const io_uring_cqe& cqe);
  void on_sync(const io_uring_cqe& cqe);

  loop_options options_;
  policy_limits limits_;
  core_hooks& hooks_;
  loop_stats* stats_;
  io_uring ring_{};
  connection_list<connection> connections_;
  std::vector<connection*> ready_;
  std::vector<listener> listeners_;
  loop_completion wake_done_, tick_done_, write_done_, sync_done_;
  bool flush_in_flight_ = false;
  bool flush_syncs_ = false;
  bool retry_flush_ = false;
  long flush_written_ = 0;
  completion ignored_;
  std::uint64_t wake_buffer_ = 0;
  std::array<char, 16 * 1024> discard_;  // lingering closes read into it, all at once
  __kernel_timespec tick_{};
  bool stopping_ = false;
  accept_backoff backoff_;
  std::uint64_t oldest_send_ns_ = 0;  // when the oldest unsubmitted send was queued; 0: none
  std::uint64_t now_ms_ = now_ms();
};

void connection::wake() {
  if (policy.wake()) loop.ready(this);
}

uring_loop::uring_loop(const loop_options& options, core_hooks& hooks)
    : options_(options), limits_(limits_of(options)), hooks_(hooks), stats_(options.stats) {
  io_uring_params params{};
  params.flags =
      IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN;
  int rc = io_uring_queue_init_params(4096, &ring_, &params);
  if (rc == -EINVAL) {  // older kernel: plain ring
    params = {};
    rc = io_uring_queue_init_params(4096, &ring_, &params);
  }
  if (rc < 0) throw std::system_error(-rc, std::generic_category(), "io_uring_queue_init");
  listeners_.resize(options.listen_fds.size());
  for (std::size_t i = 0; i < listeners_.size(); ++i) {
    listener& l = listeners_[i];
    l.loop = this;
    l.fd = options.listen_fds[i];
    l.on_cqe = [](completion* self, const io_uring_cqe& cqe) {
      auto* me = static_cast<listener*>(self);
      me->loop->on_accept(*me, cqe);
    };
  }
  wake_done_.bind(this, &uring_loop::on_wake);
  write_done_.bind(this, &uring_loop::on_write);
  sync_done_.bind(this, &uring_loop::on_sync);
  tick_done_.bind(this, &uring_loop::on_tick);
  ignored_.on_cqe = [](completion*, const io_uring_cqe&) {};
}

uring_loop::~uring_loop() { io_uring_queue_exit(&ring_); }

io_uring_sqe* uring_loop::sqe(completion* c) {
  io_uring_sqe* s = io_uring_get_sqe(&ring_);
  while (s == nullptr) {  // submission queue full: flush it
    io_uring_submit(&ring_);
    s = io_uring_get_sqe(&ring_);
  }
  io_uring_sqe_set_data(s, c);
  return s;
}

void uring_loop::arm_accept(listener& l) {
  io_uring_prep_multishot_accept(sqe(&l), l.fd, nullptr, nullptr, SOCK_CLOEXEC);
  l.armed = true;
}

void uring_loop::arm_wake() {
  io_uring_prep_read(sqe(&wake_done_), hooks_.wake_fd(), &wake_buffer_, sizeof wake_buffer_, 0);
}

void uring_loop::arm_tick() {
  tick_.tv_sec = 0;
  tick_.tv_nsec = 250'000'000;
  io_uring_prep_timeout(sqe(&tick_done_), &tick_, 0, 0);
}

void uring_loop::on_accept(listener& l, const io_uring_cqe& cqe) {
  if (!(cqe.flags & IORING_CQE_F_MORE)) l.armed = false;
  if (cqe.res >= 0) {
    open(cqe.res);
  } else if (accept_backoff::out_of_descriptors(-cqe.res)) {
    backoff_.failed(now_ms(), -cqe.res);
    // Until the tick (at most 250 ms; the multishot accept ends with its error).
    l.paused = !l.armed;
    return;
  } else if (cqe.res != -ECANCELED) {
    metad::log::warn("accept failed: {}", std::system_category().message(-cqe.res));
  }
  if (!l.armed && !stopping_) arm_accept(l);
}

void uring_loop::open(int fd) {
  if (stopping_ || connections_.size() >= options_.connections_max) {
    ++stats_->rejected;
    ::close(fd);
    return;
  }
  ++stats_->accepted;
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto* c = new connection(*this, fd, hooks_, limits_, now_ms_);
  c->send_done.owner = c;
  c->send_done.on_cqe = [](completion* self, const io_uring_cqe& cqe) {
    connection* owner = static_cast<connection::send_completion*>(self)->owner;
    owner->loop.on_send(owner, cqe.res);
  };
  connections_.add(c);
  serve(c);
}

void uring_loop::shut(connection* c) {
  if (!c->policy.shut()) return;
  ::shutdown(c->fd, SHUT_RDWR);  // the pending recv/send completes; serve() then closes
}

void uring_loop::close(connection* c) {
  connections_.remove(c);
  ++stats_->closed;
  ::close(c->fd);
  delete c;
}

// Starts sending what the handler wrote, unless a send is already on its way (its
// completion picks the new bytes up, keeping them in order).
void uring_loop::send_output(connection* c) {
  if (c->send_in_flight || c->policy.failed()) return;
  if (c->sent == c->sending.size()) {
    std::string& out = c->policy.handler().output();
    if (out.empty()) return;
    c->sending.clear();
    c->sending.swap(out);  // the handler gets the old buffer back, capacity and all
    c->sent = 0;
  }
  io_uring_prep_send(sqe(&c->send_done), c->fd, c->sending.data() + c->sent,
                     c->sending.size() - c->sent, MSG_NOSIGNAL);
  c->send_in_flight = true;
  if (oldest_send_ns_ == 0) oldest_send_ns_ = now_ns();
}

void uring_loop::submit_held_sends(bool now) {
  if (oldest_send_ns_ == 0 || (!now && now_ns() - oldest_send_ns_ < kSendHoldNs)) return;
  oldest_send_ns_ = 0;
  io_uring_submit(&ring_);
}

void uring_loop::on_send(connection* c, int result) {
  c->send_in_flight = false;
  if (result <= 0) {
    c->policy.send_failed();
    shut(c);  // serve() sees the failure through its recv
  } else {
    c->sent += static_cast<std::size_t>(result);
    send_output(c);
  }
  if (!c->send_in_flight && c->drain_waiter) std::exchange(c->drain_waiter, {}).resume();
}

// Carries out what the connection's policy decides; it starts each step by sending
// what the handler wrote.
detached uring_loop::serve(connection* c) {
  connection_policy& policy = c->policy;
  for (;;) {
    send_output(c);
    switch (policy.next()) {
      case action::read: {
        if (policy.idle() && !c->send_in_flight && c->sending.capacity() > kIdleBufferBytes) {
          std::string().swap(c->sending);
          // `sent` counts bytes of `sending`: left at the old size, the next send would
          // start past the end of the empty buffer (EFAULT, or heap bytes to the client).
          c->sent = 0;
        }
        std::span<char> space = policy.handler().read_space();
        op o(*this);
        io_uring_prep_recv(sqe(&o), c->fd, space.data(), space.size(), 0);
        c->reading = &o;
        const int n = co_await o;
        c->reading = nullptr;
        policy.read_done(status_of(n), n > 0 ? static_cast<std::size_t>(n) : 0, now_ms_);
        break;
      }
      case action::park:
        if (policy.parking()) co_await parked_awaiter{c->parked};
        policy.resumed();
        break;
      case action::drain:
        co_await drained{c};
        policy.drained();
        break;
      case action::linger:
        co_await drained{c};
        ::shutdown(c->fd, SHUT_WR);  // the sweep enforces the linger deadline
        policy.linger_started(now_ms_);
        break;
      case action::discard: {
        op o(*this);
        io_uring_prep_recv(sqe(&o), c->fd, discard_.data(), discard_.size(), 0);
        const int n = co_await o;
        policy.discarded(n > 0 ? read_status::data : read_status::ended);
        break;
      }
      case action::close:
        co_await drained{c};
        close(c);
        co_return;
    }
  }
}

void uring_loop::sweep() {
  for (connection* c : connections_) {
    if (!c->policy.expired(now_ms_)) continue;
    ++stats_->timed_out;
    shut(c);
  }
}

void uring_loop::on_wake(const io_uring_cqe&) { arm_wake(); }

void uring_loop::on_tick(const io_uring_cqe&) {
  submit_held_sends(true);  // the tick's lease and growth work may run for a while
  now_ms_ = now_ms();
  sweep();
  for (listener& l : listeners_) {
    if (!l.paused || stopping_) continue;
    l.paused = false;
    arm_accept(l);
  }
  retry_flush_ = true;
  hooks_.tick();
  arm_tick();
}

// Group commit: everything the requests of this iteration logged goes out in one write
// and one fdatasync, linked so the sync only runs after the write.
void uring_loop::maybe_flush() {
  flush_job job;
  if (flush_in_flight_ || !hooks_.take_flush(job, std::exchange(retry_flush_, false))) return;
  flush_in_flight_ = true;
  flush_syncs_ = job.sync;
  io_uring_sqe* write = sqe(&write_done_);
  io_uring_prep_write(write, job.fd, job.data, static_cast<unsigned>(job.bytes), job.offset);
  if (job.sync) {
    write->flags |= IOSQE_IO_LINK;
    io_uring_prep_fsync(sqe(&sync_done_), job.fd, IORING_FSYNC_DATASYNC);
  }
}

void uring_loop::on_write(const io_uring_cqe& cqe) {
  flush_written_ = cqe.res;
  if (flush_syncs_) return;  // the linked fsync reports
  flush_in_flight_ = false;
  hooks_.flush_done(flush_written_, 0);
}

void uring_loop::on_sync(const io_uring_cqe& cqe) {
  flush_in_flight_ = false;
  hooks_.flush_done(flush_written_, cqe.res);
}

void uring_loop::begin_stop() {
  stopping_ = true;
  for (listener& l : listeners_)
    if (l.armed) io_uring_prep_cancel64(sqe(&ignored_), reinterpret_cast<std::uint64_t>(&l), 0);
  // Idle keep-alive connections are woken, not shut: a request may already be in the
  // socket, or in a recv completion not yet handled; serve() answers it before closing.
  for (connection* c : connections_)
    if (c->policy.stop(now_ms_) && c->reading != nullptr)
      io_uring_prep_cancel64(sqe(&ignored_), reinterpret_cast<std::uint64_t>(c->reading), 0);
}

void uring_loop::run() {
  for (listener& l : listeners_) arm_accept(l);
  arm_wake();
  arm_tick();

  for (;;) {
    now_ms_ = now_ms();
    hooks_.poll();
    while (!ready_.empty()) {
      std::vector<connection*> batch;
      batch.swap(ready_);
      for (connection* c : batch) {
        std::coroutine_handle<> h = std::exchange(c->parked, {});
        if (h) h.resume();
        submit_held_sends();
      }
    }
    maybe_flush();
    if (!stopping_ && hooks_.stopping()) begin_stop();
    if (stopping_ && connections_.empty() && !flush_in_flight_ && hooks_.may_exit()) break;

    oldest_send_ns_ = 0;  // everything queued goes out now
    if (hooks_.prepare_sleep()) {
      io_uring_submit_and_wait(&ring_, 1);
      hooks_.woke();
    } else {
      io_uring_submit_and_get_events(&ring_);
    }
    unsigned head;
    io_uring_cqe* cqe;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      auto* c = static_cast<completion*>(io_uring_cqe_get_data(cqe));
      if (c) c->on_cqe(c, *cqe);
      submit_held_sends();
    }
    io_uring_cq_advance(&ring_, seen);
  }
}

}  // namespace

void run_uring_loop(const loop_options& options, core_hooks& hooks) {
  uring_loop loop(options, hooks);
  loop.run();
}

bool uring_available() {
  io_uring ring{};
  const int rc = io_uring_queue_init(2, &ring, 0);
  if (rc < 0) return false;
  io_uring_queue_exit(&ring);
  return true;
}

}  // namespace metad::net
