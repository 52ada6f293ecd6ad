#include "server/endpoints.hpp"

#include <fmt/format.h>

namespace server {
namespace {

// Marks, for each core, whether one of `keys` has its directory slice there, and
// remembers each key's owner.
void plan_directory_walk(const cluster& cl, std::span<const std::string_view> keys,
                         const std::uint32_t* only, std::size_t only_count, scratch& s) {
  s.core_needed.assign(static_cast<std::size_t>(cl.cores), 0);
  s.key_owner.resize(keys.size());
  auto mark = [&](std::size_t i) {
    const int owner = shard::owner_of_key(keys[i], cl.cores);
    s.key_owner[i] = static_cast<std::uint16_t>(owner);
    s.core_needed[static_cast<std::size_t>(owner)] = 1;
  };
  if (only == nullptr) {
    for (std::size_t i = 0; i < keys.size(); ++i) mark(i);
  } else {
    for (std::size_t j = 0; j < only_count; ++j) mark(only[j]);
  }
}

// Drops core c's ranks and directory slice (on core c).
void clear_core(cluster& cl, int c) {
  core_state& core = *cl.core[c];
  cl.worker_ranks.fetch_sub(static_cast<std::int64_t>(core.ranks.rank_count()),
                            std::memory_order_relaxed);
  core.ranks.clear();
  core.directory.clear();
}

}  // namespace

request_task run_initialize(exchange& x) {
  cluster& cl = x.shared();
  int home = x.home().index;
  const api::initialize_cmd& cmd = x.work().init;
  int owner = shard::owner_of_rank(cmd.rank, cl.cores);
  co_await cl.mailbox.hop(home, owner);
  const shard::init_result r = cl.core[owner]->ranks.initialize(cmd.rank, cmd.num_pages);
  if (r.outcome == shard::init_outcome::created)
    cl.worker_ranks.fetch_add(1, std::memory_order_relaxed);
  co_await cl.mailbox.hop(owner, home);
  scratch& s = x.work();
  if (r.outcome == shard::init_outcome::shrink_refused) {
    s.detail = fmt::format("Rank {} already initialized with {} pages", cmd.rank, r.old_pages);
    x.respond_error(409, s.detail);
  } else {
    s.body.clear();
    api::encode_initialized(s.body, cmd.rank, cmd.num_pages);
    x.respond_json(200, s.body);
  }
  x.complete();
}

request_task run_allocate(exchange& x) {
  cluster& cl = x.shared();
  int home = x.home().index;
  scratch& s = x.work();
  const api::allocate_cmd& cmd = s.allocate;
  int owner = shard::owner_of_rank(cmd.rank, cl.cores);
  // Sized here so the owner core never grows (allocates) memory this core frees.
  s.indices.clear();
  s.indices.reserve(cmd.keys.size());
  s.pages.clear();
  s.pages.reserve(cmd.keys.size());
  co_await cl.mailbox.hop(home, owner);
  const bool found = cl.core[owner]->ranks.allocate(cmd.rank, cmd.keys.views(), s.indices, s.pages);
  co_await cl.mailbox.hop(owner, home);
  if (!found) {
    s.detail = fmt::format("Allocation failed: Rank {} not initialized", cmd.rank);
    x.respond_error(404, s.detail);
  } else {
    s.selected.clear();
    for (std::uint32_t i : s.indices) s.selected.push_back(cmd.keys[i]);
    s.body.clear();
    api::encode_allocation(s.body, cmd.rank, s.selected, s.pages);
    x.respond_json(200, s.body);
  }
  x.complete();
}

request_task run_confirm(exchange& x) {
  cluster& cl = x.shared();
  int home = x.home().index;
  scratch& s = x.work();
  const api::confirm_cmd& cmd = s.confirm;
  int owner = shard::owner_of_rank(cmd.rank, cl.cores);
  s.indices.clear();
  s.indices.reserve(cmd.keys.size());
  s.key_owner.reserve(cmd.keys.size());
  s.core_needed.reserve(static_cast<std::size_t>(cl.cores));
  s.detail.reserve(256);
  co_await cl.mailbox.hop(home, owner);
  const shard::confirm_outcome outcome = cl.core[owner]->ranks.confirm(
      cmd.rank, cmd.keys.views(), cmd.pages, cmd.releases, s.detail, s.indices);
  int at = owner;
  if (outcome == shard::confirm_outcome::ok && !s.indices.empty()) {
    // The rank's pages are bound; now count the confirmations in the directory, before
    // the 204 goes out (read-your-writes for batch_exists/get_locations).
    const auto tp_world_size =
        static_cast<std::int32_t>(cl.worker_ranks.load(std::memory_order_relaxed));
    plan_directory_walk(cl, cmd.keys.views(), s.indices.data(), s.indices.size(), s);
    for (int step = 0; step < cl.cores; ++step) {
      const int c = (owner + step) % cl.cores;
      if (!s.core_needed[static_cast<std::size_t>(c)]) continue;
      co_await cl.mailbox.hop(at, c);
      at = c;
      for (std::uint32_t i : s.indices)
        if (s.key_owner[i] == c) cl.core[c]->directory.add_confirmation(cmd.keys[i], tp_world_size);
    }
  }
  co_await cl.mailbox.hop(at, home);
  switch (outcome) {
    case shard::confirm_outcome::ok:
      x.respond_canned(http::canned::no_content);
      break;
    case shard::confirm_outcome::not_initialized:
      s.detail = fmt::format("Confirm failed: Rank {} not initialized", cmd.rank);
      x.respond_error(404, s.detail);
      break;
    case shard::confirm_outcome::bad_request:
      x.respond_error(400, s.detail);
      break;
  }
  x.complete();
}

request_task run_lookup(exchange& x, bool with_rank) {
  cluster& cl = x.shared();
  int home = x.home().index;
  scratch& s = x.work();
  const api::key_list& keys = with_rank ? s.locations.keys : s.exists.keys;
  const std::int64_t rank = s.locations.rank;
  s.flags.assign(keys.size(), 0);
  s.pages.assign(keys.size(), -1);
  plan_directory_walk(cl, keys.views(), nullptr, 0, s);
  int at = home;
  for (int step = 0; step < cl.cores; ++step) {
    const int c = (home + step) % cl.cores;
    if (!s.core_needed[static_cast<std::size_t>(c)]) continue;
    co_await cl.mailbox.hop(at, c);
    at = c;
    const shard::directory& dir = cl.core[c]->directory;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (s.key_owner[i] == c) s.flags[i] = dir.complete(keys[i]) ? 1 : 0;
  }
  bool found = true;
  if (with_rank) {
    // Completeness was read first: a confirm binds its pages before it counts them,
    // so a key seen complete has its page bound by now.
    int owner = shard::owner_of_rank(rank, cl.cores);
    co_await cl.mailbox.hop(at, owner);
    at = owner;
    found = cl.core[owner]->ranks.confirmed_pages(rank, keys.views(), s.pages);
  }
  co_await cl.mailbox.hop(at, home);
  s.body.clear();
  if (!with_rank) {
    api::encode_exists(s.body, s.flags);
    x.respond_json(200, s.body);
  } else if (!found) {
    s.detail = fmt::format("Failed to get key locations: Rank {} not initialized", rank);
    x.respond_error(404, s.detail);
  } else {
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (!s.flags[i]) s.pages[i] = -1;
    api::encode_locations(s.body, s.pages);
    x.respond_json(200, s.body);
  }
  x.complete();
}

request_task run_clear(exchange& x) {
  cluster& cl = x.shared();
  int home = x.home().index;
  int at = home;
  for (int step = 0; step < cl.cores; ++step) {
    const int c = (home + step) % cl.cores;
    co_await cl.mailbox.hop(at, c);
    at = c;
    clear_core(cl, c);
  }
  co_await cl.mailbox.hop(at, home);
  x.respond_canned(http::canned::no_content);
  x.complete();
}

request_task run_rank_info(exchange& x) {
  cluster& cl = x.shared();
  int home = x.home().index;
  scratch& s = x.work();
  const std::int64_t rank = s.init.rank;
  int owner = shard::owner_of_rank(rank, cl.cores);
  co_await cl.mailbox.hop(home, owner);
  const std::optional<shard::rank_stats> stats = cl.core[owner]->ranks.stats(rank);
  co_await cl.mailbox.hop(owner, home);
  s.body.clear();
  if (!stats) {
    s.detail = fmt::format("Rank {} not initialized", rank);
    x.respond_error(404, s.detail);
  } else {
    api::encode_rank_info(s.body, stats->num_pages, stats->free, stats->reserved, stats->bound);
    x.respond_json(200, s.body);
  }
  x.complete();
}

}  // namespace server

namespace server {

request_task run_metrics(exchange& x) {
  cluster& cl = x.shared();
  int home = x.home().index;
  scratch& s = x.work();
  metrics_snapshot& snap = s.snapshot;
  snap = metrics_snapshot{};
  snap.connections.assign(static_cast<std::size_t>(cl.cores), connection_counts{});
  // Rank lines are written on their owner cores into this home-owned buffer; reserving
  // keeps small deployments from allocating there (a scrape is not the hot path).
  s.detail.clear();
  s.detail.reserve(64 * 1024);
  int at = home;
  for (int step = 0; step < cl.cores; ++step) {
    const int c = (home + step) % cl.cores;
    co_await cl.mailbox.hop(at, c);
    at = c;
    const core_state& core = *cl.core[c];
    snap.requests.add(core.metrics);
    snap.keys += core.directory.size();
    snap.refused_releases += core.ranks.refused_releases();
    snap.hops += cl.mailbox.posted(c);
    snap.ranks += core.ranks.rank_count();
    const net::loop_stats& conn = core.connections;
    snap.connections[static_cast<std::size_t>(c)] = {conn.accepted - conn.closed, conn.accepted,
                                                     conn.rejected, conn.timed_out};
    core.ranks.for_each_rank([&](std::int64_t rank, const shard::rank_stats& st) {
      render_rank(s.detail, rank, st.num_pages, st.free, st.reserved, st.bound);
    });
  }
  co_await cl.mailbox.hop(at, home);
  s.body.clear();
  render_metrics(s.body, snap);
  render_rank_headers(s.body);
  s.body += s.detail;
  x.respond_metrics(s.body);
  x.complete();
}

}  // namespace server
