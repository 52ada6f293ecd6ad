// Wires the modules: one pinned thread per core, each with its own listener
// (SO_REUSEPORT), event loop and state; stop() drains them all.
#include "metad/server.hpp"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <stdexcept>
#include <thread>

#include "http/parser.hpp"
#include "metad/log.hpp"
#include "net/transport.hpp"
#include "server/cluster.hpp"
#include "server/exchange.hpp"

namespace server {

static_assert(http::body_padding_bytes >= simdjson::SIMDJSON_PADDING,
              "request bodies must be readable by simdjson without a copy");

cluster::cluster(const metad::config& config, int core_count)
    : cfg(config), cores(core_count), mailbox(core_count, 4096), draining_cores(core_count) {
  for (int i = 0; i < core_count; ++i) {
    core.push_back(std::make_unique<core_state>());
    core.back()->index = i;
  }
}

namespace {

// The server's side of one core's event loop.
class core_runner final : public net::core_hooks {
 public:
  core_runner(cluster& cl, int index) : cluster_(cl), index_(index) {}

  std::unique_ptr<net::connection_handler> open(net::waker& w) override {
    return std::make_unique<exchange>(cluster_, *cluster_.core[index_], w);
  }
  std::size_t poll() override { return cluster_.mailbox.drain(index_); }
  bool prepare_sleep() override { return cluster_.mailbox.prepare_sleep(index_); }
  void woke() override { cluster_.mailbox.woke(index_); }
  int wake_fd() override { return cluster_.mailbox.wake_fd(index_); }
  bool stopping() override { return cluster_.stopping.load(std::memory_order_relaxed); }
  bool may_exit() override {
    if (!drained_) {
      drained_ = true;
      // The last core to drain wakes the others, which may be asleep waiting for it.
      if (cluster_.draining_cores.fetch_sub(1) == 1)
        for (int c = 0; c < cluster_.cores; ++c) cluster_.mailbox.wake(c);
    }
    return cluster_.draining_cores.load() == 0;
  }

 private:
  cluster& cluster_;
  int index_;
  bool drained_ = false;
};

std::vector<int> affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
    metad::log::warn("cannot pin to CPU {}", cpu);
}

}  // namespace
}  // namespace server

namespace metad {

struct server::impl {
  config cfg;
  std::unique_ptr<::server::cluster> cluster;
  std::vector<int> listeners;
};

server::server(config cfg) : impl_(std::make_unique<impl>()) {
  if (cfg.cpus.empty()) cfg.cpus = ::server::affinity_cpus();
  if (cfg.cpus.size() > 1024) throw std::runtime_error("at most 1024 cores");
  impl_->cfg = std::move(cfg);
  impl_->cluster =
      std::make_unique<::server::cluster>(impl_->cfg, static_cast<int>(impl_->cfg.cpus.size()));
}

server::~server() {
  for (int fd : impl_->listeners) ::close(fd);
}

void server::run() {
  config& cfg = impl_->cfg;
  ::server::cluster& cl = *impl_->cluster;
  bool use_uring = cfg.io != io_mode::epoll;
  if (use_uring && !net::uring_available()) {
    if (cfg.io == io_mode::uring)
      throw std::runtime_error("--io uring: io_uring_setup is refused here");
    log::warn("io_uring is unavailable (io_uring_setup refused): using the epoll transport");
    use_uring = false;
  }
  // The first listener picks the port (it may be 0); the others share it.
  std::uint16_t port = cfg.port;
  for (int i = 0; i < cl.cores; ++i) {
    impl_->listeners.push_back(net::listen_tcp(cfg.host, port));
    port = net::local_port(impl_->listeners.back());
  }
  log::info("listening on {}:{} with {} core(s), transport {}", cfg.host, port, cl.cores,
            use_uring ? "uring" : "epoll");

  std::vector<std::thread> threads;
  for (int i = 0; i < cl.cores; ++i) {
    threads.emplace_back([&, i] {
      log::current_core = i;
      ::server::pin_to(cfg.cpus[static_cast<std::size_t>(i)]);
      net::loop_options options;
      options.listen_fd = impl_->listeners[static_cast<std::size_t>(i)];
      options.idle_timeout_ms = cfg.idle_timeout_ms;
      options.header_timeout_ms = cfg.header_timeout_ms;
      options.drain_timeout_ms = cfg.drain_timeout_ms;
      options.connections_max = cfg.connections_per_core_max;
      ::server::core_runner hooks(cl, i);
      try {
        if (use_uring)
          net::run_uring_loop(options, hooks);
        else
          net::run_epoll_loop(options, hooks);
      } catch (const std::exception& e) {
        log::error("core {} failed: {}", i, e.what());
        std::abort();  // a core without its loop would strand its ranks' requests
      }
    });
  }
  for (auto& t : threads) t.join();
  log::info("stopped");
}

void server::stop() noexcept {
  ::server::cluster& cl = *impl_->cluster;
  cl.stopping.store(true);
  for (int c = 0; c < cl.cores; ++c) cl.mailbox.wake(c);
}

}  // namespace metad
