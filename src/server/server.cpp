// Wires the modules: one pinned thread per core, each with its own listener
// (SO_REUSEPORT), event loop and state; stop() drains them all.
#include "metad/server.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

#include "ha/probe.hpp"
#include "http/parser.hpp"
#include "metad/log.hpp"
#include "net/transport.hpp"
#include "persist/durability.hpp"
#include "persist/sglang_import.hpp"
#include "pipeline/connection.hpp"
#include "pipeline/endpoints.hpp"
#include "pipeline/node.hpp"
#include "pipeline/removal.hpp"
#include "pipeline/routes.hpp"
#include "pipeline/tenants.hpp"
#include "replica/replication.hpp"
#include "server/flags.hpp"
#include "server/ha_setup.hpp"
#include "smp/clock.hpp"
#include "smp/core.hpp"
#include "smp/cpus.hpp"
#include "smp/for_each_core.hpp"
#include "smp/request_task.hpp"

namespace metad {

using pipeline::core_state;
using pipeline::node;
using replica::replication;

static_assert(http::body_padding_bytes >= api::body_padding_bytes,
              "request bodies must be readable by simdjson without a copy");

namespace {

// The server's side of one core's event loop.
class core_runner final : public net::core_hooks {
 public:
  core_runner(node& nd, int index, replication* repl) : node_(nd), index_(index), repl_(repl) {}

  std::unique_ptr<net::connection_handler> open(net::waker& w) override {
    return std::make_unique<pipeline::connection>(node_, *node_.core[index_], w);
  }
  std::size_t poll() override {
    if (repl_ != nullptr) repl_->poll(index_);
    return node_.mailbox.drain(index_);
  }
  bool prepare_sleep() override { return node_.mailbox.prepare_sleep(index_); }
  void woke() override { node_.mailbox.woke(index_); }
  int wake_fd() override { return node_.mailbox.wake_fd(index_); }
  bool stopping() override { return node_.stopping.load(std::memory_order_relaxed); }
  void tick() override;
  bool take_flush(net::flush_job& job, bool retry_failed) override {
    if (!persist::take_flush(node_, *node_.core[index_], retry_failed, job)) return false;
    job.sync = node_.cfg.durable == durability::sync;
    flush_started_ns_ = smp::monotonic_ns();
    if (repl_ != nullptr) repl_->shipped(index_, job);  // the standby gets the same bytes
    return true;
  }
  void flush_done(long written, int synced) override {
    store::log_writer& log = node_.core[index_]->log;
    const bool was_failing = log.failing();
    persist::flush_done(node_, *node_.core[index_], written, synced);
    node_.core[index_]->flushes.record(smp::monotonic_ns() - flush_started_ns_, !log.failing());
    if (log.failing() && !was_failing) {
      // A short write (disk full) cancels the linked fdatasync: name the write's failure.
      const std::string cause = written < 0
                                    ? std::system_category().message(static_cast<int>(-written))
                                : synced == -ECANCELED ? std::string("short write: disk full?")
                                                       : std::system_category().message(-synced);
      log::error("log write failed ({}): mutating requests get 503 until it succeeds", cause);
    }
    if (!log.failing() && was_failing) log::info("log writes succeed again");
    if (repl_ != nullptr) repl_->flushed(index_);
  }
  bool may_exit() override {
    // Records of answered requests (none mode) go out before the core stops.
    const store::log_writer& log = node_.core[index_]->log;
    if (!log.idle() && !log.failing()) return false;
    if (stale_.running) return false;  // its walk may be waiting on another core
    if (!drained_) {
      drained_ = true;
      // The last core to drain wakes the others, which may be asleep waiting for it.
      if (node_.draining_cores.fetch_sub(1) == 1)
        for (int c = 0; c < node_.cores; ++c) node_.mailbox.wake(c);
    }
    return node_.draining_cores.load() == 0;
  }

 private:
  node& node_;
  int index_;
  replication* repl_;  // --repl-listen; null without
  bool drained_ = false;
  std::uint64_t flush_started_ns_ = 0;
  pipeline::stale_sweeper stale_;  // this core's background reclamation of stale keys
  // The periodic summary (core 0 only).
  std::uint64_t next_summary_ms_ = 0;
  std::uint64_t last_summary_ms_ = 0;
  std::uint64_t last_requests_ = 0;
  std::array<std::uint64_t, 4> last_pools_{};  // ranks, free pages, pages, keys
  bool summary_running_ = false;

  friend smp::request_task log_summary(core_runner& self);
};

// One info line with the load and the pools, summed over all cores; none when nothing
// happened since the last one (no request, pools as they were), so an idle server's log
// holds its last state instead of a line every interval.
smp::request_task log_summary(core_runner& self) {
  std::uint64_t requests = 0, ranks = 0, keys = 0, free_pages = 0, pages = 0;
  co_await smp::for_each_core(self.node_.mailbox, self.index_, smp::every_core, [&](int c) {
    const core_state& core = *self.node_.core[c];
    requests += core.metrics.total();
    core.for_each_space([&](const pipeline::vllm_space& sp) {
      ranks += sp.ranks.rank_count();
      keys += sp.directory.size();
      sp.ranks.for_each_rank([&](std::int64_t, const shard::rank_stats& st) {
        free_pages += static_cast<std::uint64_t>(st.free);
        pages += static_cast<std::uint64_t>(st.num_pages);
      });
    });
  });
  const std::uint64_t now = smp::monotonic_ms();
  const double seconds = static_cast<double>(now - self.last_summary_ms_) / 1000.0;
  const std::array<std::uint64_t, 4> pools{ranks, free_pages, pages, keys};
  // Expiry and reclamation change the pools without a request: those still show.
  if (requests != self.last_requests_ || pools != self.last_pools_)
    log::info("summary: {:.0f} req/s, {} ranks, {} of {} pages free, {} keys",
              seconds > 0 ? static_cast<double>(requests - self.last_requests_) / seconds : 0.0,
              ranks, free_pages, pages, keys);
  self.last_requests_ = requests;
  self.last_pools_ = pools;
  self.last_summary_ms_ = now;
  self.summary_running_ = false;
}

void core_runner::tick() {
  core_state& core = *node_.core[index_];
  if (index_ == 0) node_.memory.sample();
  persist::snapshot_tick(node_, core);
  // A standby's state changes only as the leader's log says (its expiries included).
  if (repl_ == nullptr || !repl_->standby()) {
    pipeline::expire_due(node_, core);
    pipeline::reclaim_stale_due(node_, core, stale_);
  }
  // Table growths left half done by inserts that stopped (see packed_map::advance_growth).
  core.for_each_space([](pipeline::vllm_space& sp) {
    sp.directory.advance_growth();
    sp.ranks.advance_growth();
  });
  const std::uint32_t interval = node_.cfg.summary_interval_ms;
  if (index_ != 0 || interval == 0 || summary_running_) return;
  if (log::threshold.load(std::memory_order_relaxed) < metad::log_level::info) return;
  const std::uint64_t now = smp::monotonic_ms();
  if (next_summary_ms_ == 0) {
    last_summary_ms_ = now;
    next_summary_ms_ = now + interval;
    return;
  }
  if (now < next_summary_ms_) return;
  next_summary_ms_ = now + interval;
  summary_running_ = true;
  log_summary(*this);
}

}  // namespace

struct server::impl {
  config cfg;
  std::unique_ptr<pipeline::node> node;
  std::vector<int> listeners;
  std::unique_ptr<ha::control> ha;    // --ha-etcd: the leader lease's control thread
  std::unique_ptr<replication> repl;  // --repl-listen
  std::mutex tenants_loading;         // load_tenants: one at a time
};

server::server(config cfg) : impl_(std::make_unique<impl>()) {
  if (const std::string error = flags::validate(cfg); !error.empty())
    throw std::runtime_error(error);
  if (cfg.cpus.empty()) cfg.cpus = smp::affinity_cpus(cfg.threads);
  if (cfg.cpus.size() > 1024) throw std::runtime_error("at most 1024 cores");
  impl_->cfg = std::move(cfg);
  impl_->node =
      std::make_unique<pipeline::node>(impl_->cfg, static_cast<int>(impl_->cfg.cpus.size()));
  // Before any core runs: the cores serve with a table from their first request on.
  if (!impl_->cfg.tenants_file.empty()) {
    if (const std::string error = load_tenants(); !error.empty())
      throw config_error("--tenants-file: " + error);
    if (impl_->cfg.auth_token.empty() && impl_->cfg.admin_token.empty())
      log::warn(
          "tenants: /metrics, /stats, /status.json and /ready answer no one: they take "
          "--auth-token-file's or --admin-token-file's token, not a tenant's");
  }
}

std::string server::load_tenants() {
  const std::lock_guard lock(impl_->tenants_loading);
  auto table = std::make_shared<pipeline::tenant_table>();
  if (std::string error =
          pipeline::load_tenants_file(impl_->cfg.tenants_file, pipeline::kPatterns, *table);
      !error.empty())
    return error;
  const pipeline::tenant* vllm = table->vllm_tenant();
  log::info("tenants: {} from {}; the unnamed vLLM state: {}", table->tenants.size(), table->path,
            vllm != nullptr ? "tenant " + vllm->name : std::string("no tenant's"));
  impl_->node->tenants.publish(std::move(table));
  return "";
}

bool server::reload_tenants() {
  if (impl_->cfg.tenants_file.empty()) return false;
  if (const std::string error = load_tenants(); !error.empty()) {
    log::error("tenants: {}: the tenants as loaded before stay in force", error);
    return false;
  }
  return true;
}

server::~server() {
  for (int fd : impl_->listeners) ::close(fd);
  if (!impl_->cfg.unix_path.empty()) ::unlink(impl_->cfg.unix_path.c_str());
}

void server::run() {
  config& cfg = impl_->cfg;
  pipeline::node& nd = *impl_->node;
  bool use_uring = cfg.io != io_mode::epoll;
  if (use_uring && !net::uring_available()) {
    if (cfg.io == io_mode::uring)
      throw std::runtime_error("--io uring: io_uring_setup is refused here");
    log::warn("io_uring is unavailable (io_uring_setup refused): using the epoll transport");
    use_uring = false;
  }
  // Listeners open only after recovery: a client that connects sees the recovered state.
  // With replication, etcd says first whether this node recovers its own state or
  // starts empty and copies the leader's.
  if (!cfg.ha_etcd.empty()) check_etcd();
  auto start_as = replication::start_as::primary;
  if (!cfg.repl_listen.empty()) {
    std::string error;
    nd.data = std::make_unique<store::data_dir>(cfg.data_dir);  // locked first (the probe)
    const auto role =
        ha::probe_start_role(ha_settings(cfg, cfg.port == 0 ? 1 : cfg.port, error), 30'000);
    if (role == ha::start_role::standby) start_as = replication::start_as::standby;
    if (start_as == replication::start_as::standby && !cfg.sglang_import_path.empty())
      throw std::runtime_error("--import-sglang-state: this node starts as a standby");
  }
  persist::recover(
      nd,
      cfg.sglang_import_path.empty() ? persist::before_commit_fn{} : persist::import_sglang_state,
      start_as == replication::start_as::standby);
  if (!cfg.tenants_file.empty()) pipeline::count_tenant_usage(nd);
  if (!cfg.repl_listen.empty()) impl_->repl = std::make_unique<replication>(nd, start_as);
  nd.memory.sample();
  log::info("memory budget {} bytes (--memory-max), {} in use", nd.memory.max(), nd.memory.used());
  if (nd.memory.used() > nd.memory.max())
    log::warn("already over the memory budget: no rank can be created or grown");

  // One TCP listener per core (SO_REUSEPORT spreads connections); the first picks the
  // port when it is 0. The unix socket, if any, is one listener all cores accept from.
  std::vector<std::vector<int>> listen_fds(static_cast<std::size_t>(nd.cores));
  std::uint16_t port = cfg.port;
  if (cfg.tcp) {
    for (auto& fds : listen_fds) {
      impl_->listeners.push_back(net::listen_tcp(cfg.host, port));
      port = net::local_port(impl_->listeners.back());
      fds.push_back(impl_->listeners.back());
    }
    log::info("listening on {}:{} with {} core(s), transport {}", cfg.host, port, nd.cores,
              use_uring ? "uring" : "epoll");
    const bool loopback = cfg.host == "127.0.0.1" || cfg.host == "::1" || cfg.host == "localhost";
    if (!loopback && cfg.auth_token.empty() && cfg.tenants_file.empty())
      log::warn(
          "listening on {} without --auth-token-file: anyone who can reach it can clear all state",
          cfg.host);
  }
  if (!cfg.unix_path.empty()) {
    impl_->listeners.push_back(net::listen_unix(cfg.unix_path));
    for (auto& fds : listen_fds) fds.push_back(impl_->listeners.back());
    log::info("listening on unix:{} with {} core(s), transport {}", cfg.unix_path, nd.cores,
              use_uring ? "uring" : "epoll");
  }
  if (impl_->listeners.empty())
    throw std::runtime_error("nothing to listen on: give --port or --unix");
  if (!cfg.ha_etcd.empty()) start_ha(port);

  std::vector<std::thread> threads;
  for (int i = 0; i < nd.cores; ++i) {
    threads.emplace_back([&, i] {
      const smp::core_scope as_core(i);  // this thread is core i for its whole life
      smp::pin_to(cfg.cpus[static_cast<std::size_t>(i)]);
      net::loop_options options;
      options.listen_fds = listen_fds[static_cast<std::size_t>(i)];
      options.idle_timeout_ms = cfg.idle_timeout_ms;
      options.header_timeout_ms = cfg.header_timeout_ms;
      options.drain_timeout_ms = cfg.drain_timeout_ms;
      options.connections_max = cfg.connections_per_core_max;
      options.stats = &nd.core[static_cast<std::size_t>(i)]->connections;
      core_runner hooks(nd, i, impl_->repl.get());
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
  // Drained: give the lease back at once, so that a node that may lead need not wait
  // for it to expire.
  if (impl_->ha) impl_->ha->stop(true);
  if (impl_->repl) impl_->repl->stop();
  for (auto& core : nd.core) persist::finish_snapshot(*core);
  log::info("stopped");
}

// Before anything depends on etcd: a member that refuses this node's TLS settings or
// password stops the start (config_error, exit 2) rather than leave the node retrying
// for ever; members that do not answer are the ha thread's to wait for, as always.
void server::check_etcd() {
  std::string error;
  const ha::config settings =
      ha_settings(impl_->cfg, impl_->cfg.port == 0 ? 1 : impl_->cfg.port, error);
  if (!error.empty()) throw config_error(error);
  const bool tls = settings.etcd.tls != nullptr;
  if (!tls && !settings.etcd.authenticates()) return;
  const auto check =
      ha::check_etcd_access(settings, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  switch (check.outcome) {
    case ha::access_check::verdict::ok:
      if (settings.etcd.authenticates()) {
        log::info("ha: etcd over TLS, authenticated as {}", settings.etcd.user);
      } else {
        log::info("ha: etcd over TLS");
      }
      return;
    case ha::access_check::verdict::refused:
      throw config_error(check.message);
    case ha::access_check::verdict::failed:
      log::warn("ha: no etcd member answered the start-up check ({}): going on", check.message);
      return;
  }
}

// After recovery and listening: until it is elected, the node answers the API with 503.
void server::start_ha(std::uint16_t port) {
  std::string error;
  ha::config settings = ha_settings(impl_->cfg, port, error);
  if (!error.empty()) throw std::runtime_error(error);
  if (impl_->cfg.ha_advertise.empty() &&
      (impl_->cfg.host == "0.0.0.0" || impl_->cfg.host == "::" || !impl_->cfg.tcp))
    log::warn("ha: other nodes' 503s will name this node as {}: set --ha-advertise",
              settings.advertise);
  log::info("ha: node {} of cluster {}, leader key value {}", settings.node, settings.cluster,
            settings.advertise);
  replication* repl = impl_->repl.get();
  if (repl == nullptr) {
    impl_->ha = std::make_unique<ha::control>(std::move(settings));
  } else {
    impl_->ha = std::make_unique<ha::control>(
        std::move(settings),
        [repl](ha::role from, ha::role to, std::int64_t epoch) { repl->on_role(from, to, epoch); },
        [repl](const std::optional<std::string>& sync) { return repl->may_campaign(sync); });
  }
  impl_->node->ha = impl_->ha.get();
  if (repl != nullptr) repl->start(*impl_->ha);
  impl_->ha->start();
}

int verify_data_dir(const std::string& path) { return persist::verify_data_dir(path); }

bool uring_usable() { return net::uring_available(); }

void server::stop() noexcept {
  pipeline::node& nd = *impl_->node;
  nd.stopping.store(true);
  for (int c = 0; c < nd.cores; ++c) nd.mailbox.wake(c);
}

}  // namespace metad
