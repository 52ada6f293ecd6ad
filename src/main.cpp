// hf3fs-metad: flags → config → server. SIGINT/SIGTERM stop it cleanly (exit 0);
// bad flags print one line and exit 2. With --tenants-file, SIGHUP reads that file again.
// The flags are one table: src/server/flags.cpp.
#include <malloc.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "metad/config.hpp"
#include "metad/log.hpp"
#include "metad/server.hpp"
#include "server/flags.hpp"

int main(int argc, char** argv) {
  metad::flags::parsed flags;
  try {
    flags = metad::flags::parse(argc, argv);
  } catch (const metad::flags::usage_error& e) {
    std::fprintf(stderr, "hf3fs-metad: %s\n", e.what());
    return 2;
  }
  using action = metad::flags::parsed::action;
  switch (flags.what) {
    case action::help:
      std::fputs(metad::flags::usage().c_str(), stdout);
      return 0;
    case action::version:
      std::fputs(metad::flags::version().c_str(), stdout);
      return 0;
    case action::verify_data_dir:
      metad::log::threshold = metad::log_level::warn;
      return metad::verify_data_dir(flags.verify_dir);
    case action::serve:
      break;
  }
  const metad::config& cfg = flags.cfg;
  metad::log::threshold = cfg.log;
  // Key tables grow by reallocation: a fixed mmap threshold puts every big table in its
  // own mapping, so the old one goes back to the system when it is freed (glibc's
  // sliding threshold would otherwise keep them in the heap, as resident memory).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);

  // Signals are taken synchronously by one thread; every other thread blocks them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  // Without --tenants-file SIGHUP keeps its default action, as before.
  if (!cfg.tenants_file.empty()) sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGXFSZ, SIG_IGN);  // a file size limit makes writes fail (EFBIG), not kill us

  try {
    metad::server server(cfg);
    std::atomic<bool> finished{false};
    std::thread signal_thread([&] {
      const timespec poll_interval{0, 200'000'000};
      while (!finished.load()) {
        const int sig = sigtimedwait(&stop_signals, nullptr, &poll_interval);
        if (sig == SIGHUP) {
          metad::log::info("SIGHUP received: reading --tenants-file again");
          server.reload_tenants();
          continue;
        }
        if (sig > 0) {
          metad::log::info("{} received: draining", strsignal(sig));
          server.stop();
          return;
        }
      }
    });
    try {
      server.run();
    } catch (...) {
      finished = true;
      signal_thread.join();
      throw;
    }
    finished = true;
    signal_thread.join();
  } catch (const metad::config_error& e) {
    // The configuration is wrong (e.g. etcd refused --ha-etcd-user's password): a
    // restart cannot help (ha.conf: RestartPreventExitStatus=2).
    metad::log::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    metad::log::error("{}", e.what());
    return 1;
  }
  return 0;
}
