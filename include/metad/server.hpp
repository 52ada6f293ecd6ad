// Embedding API: run a server with a given config until stop() is called.
// run() blocks the calling thread; stop() may be called from any thread or a signal
// handler's helper thread.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "metad/config.hpp"

namespace metad {

// Reads a data directory without serving and reports what it holds, or its damage; the
// process's exit status (0 readable, 1 damaged). Safe beside no running server only.
int verify_data_dir(const std::string& path);

// Whether this process may create io_uring instances. Where it may not (an old kernel,
// io_uring disabled by sysctl, a seccomp filter such as Docker's default), --io auto
// serves on the epoll transport and --io uring refuses to start.
bool uring_usable();

// A start-up failure that is the configuration's fault, found only once the server
// meets the world (etcd refusing --ha-etcd-user's password, or its certificate failing
// --ha-etcd-ca): run() throws it; main exits 2, as for a bad flag.
struct config_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class server {
 public:
  explicit server(config cfg);  // throws std::runtime_error on bad config (flags::validate)
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  // Binds, spawns one pinned thread per core and serves until stop(). Throws on start-up
  // failure (port in use, ...).
  void run();
  // Stops accepting, lets in-flight requests finish, then makes run() return.
  void stop() noexcept;
  // --tenants-file: reads the file again (SIGHUP). A good file becomes the tenants table
  // at once (each core takes it at its next request); a bad one is logged and the old
  // table stays. False when the file was refused or there is no --tenants-file. Any
  // thread; one call at a time.
  bool reload_tenants();

 private:
  void start_ha(std::uint16_t port);
  // Reads cfg.tenants_file and publishes it; "" or why it was refused.
  std::string load_tenants();
  void check_etcd();

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace metad
