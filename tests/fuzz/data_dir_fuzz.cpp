// libFuzzer harness for recovery from a --data-dir: the files a restart reads (a former
// core's snapshot and log segment) are the input. Each input is written into a fresh
// data directory as generation 1 of one former core, and persist::recover replays it
// into a node of 1-3 cores, as a start-up does: store::check_group's checks (checksums,
// decoding, the torn-tail rule), the replayer (every record kind, snapshot_rank_slots'
// images laid out or loaded key by key), the directory rebuilt, the next generation
// written and committed.
//
// Recovery may refuse the files: a std::runtime_error is its answer to damage. Anything
// else is a finding: a crash, an assertion, a sanitizer report, another exception, a
// leaked file descriptor, or files it accepted into a state that is not consistent
// (pipeline::check_consistency: every shard structure's verify(), the directory's
// counts against the ranks' bindings). An accepted state is recovered a second time,
// from the generation the first recovery wrote: it must come back the same (what
// serialize_state writes is what the replay made).
//
// Input: byte 0 = options (below), bytes 1-2 = the snapshot's length (little-endian, cut
// to what follows), then the snapshot's bytes, then the log's. With kFixChecksums the
// checksum of every frame whose length fits in its file is computed again before the
// files are written, so that mutations reach the decoders and the replay instead of
// stopping at the checksum (the seeds set it).
#include <dirent.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "fuzz_input.hpp"
#include "metad/config.hpp"
#include "metad/log.hpp"
#include "persist/durability.hpp"
#include "pipeline/consistency.hpp"
#include "pipeline/node.hpp"
#include "store/record.hpp"

using namespace metad;

namespace {

namespace fs = std::filesystem;

// Byte 0. Bits 0-1: the recovering node's cores, (bits % 3) + 1.
constexpr std::uint8_t kFixChecksums = 1u << 2;
// --release-quarantine-ms 0: recovered quarantines end at once (and a snapshot that held
// one is not reused).
constexpr std::uint8_t kQuarantineOff = 1u << 3;
// The log is followed by an empty newer segment (core-0.log-2): its torn tail is then
// damage, not a crash's cut.
constexpr std::uint8_t kNewerSegment = 1u << 4;
// No snapshot file at all (the snapshot's bytes are ignored).
constexpr std::uint8_t kNoSnapshot = 1u << 5;
// --directory-cores 1 instead of 2: every key's directory slice on core 0.
constexpr std::uint8_t kOneDirectoryCore = 1u << 6;

constexpr std::uint64_t kNowMs = 1'000'000;

// Recovery holds state for pages a file names, within bounds the server sets: a vLLM
// rank's bitmaps reach its highest page held (up to 2^31: 512 MiB, set bit by bit), an
// SGLang pool's image may leave up to 2^28 pages listed nowhere (each taken one by one).
// Such a file costs seconds to minutes under ASan and gigabytes, not a crash; inputs that
// ask for more than this many pages are skipped, so that the fuzzer's time and memory go
// to everything else.
constexpr std::uint64_t kPagesMax = 1u << 20;

std::uint64_t page_cost(std::int64_t page) {
  return page < 0 ? 0 : static_cast<std::uint64_t>(page);
}

// The most pages a record makes recovery hold state for (see kPagesMax).
std::uint64_t pages_asked(const store::record& r) {
  using store::record_kind;
  std::uint64_t most = 0;
  switch (r.kind) {
    case record_kind::sg_snapshot_pool:
    case record_kind::sg_snapshot_pool_runs: {
      // The pages neither free nor listed: num_pages less the free ones and the keys'.
      std::uint64_t free = 0;
      if (r.kind == record_kind::sg_snapshot_pool) {
        free = r.releases.size();
      } else {
        for (std::size_t i = 0; i + 1 < r.releases.size(); i += 2)
          if (r.releases[i] >= 0 && r.releases[i + 1] > r.releases[i])
            free += static_cast<std::uint64_t>(r.releases[i + 1] - r.releases[i]);
      }
      const std::uint64_t listed = free + r.keys.size() + r.sg_flight_keys.size();
      const std::uint64_t pages = page_cost(r.num_pages);
      return pages > listed ? pages - listed : 0;
    }
    case record_kind::snapshot_rank_keys:
    case record_kind::snapshot_rank_slots:
      for (std::size_t i = 0; i < r.item_count(); ++i)
        most = std::max<std::uint64_t>(most, store::packed_item_at(r.items, i).value & 0x7FFFFFFFu);
      return most;
    case record_kind::snapshot_entry:
      return page_cost(r.page);
    default:
      if (r.kind >= record_kind::sg_initialize) return 0;  // SGLang's pages cost what is held
      for (const std::int64_t p : r.pages) most = std::max(most, page_cost(p));
      for (const std::int64_t p : r.releases) most = std::max(most, page_cost(p));
      return most;
  }
}

// Whether a file's frames (by their lengths; checksums aside) ask for more than kPagesMax.
bool too_costly(std::string_view bytes) {
  store::record r;
  bool costly = false;
  store::walk_frames(bytes, [&](std::string_view payload) {
    if (!costly && store::decode_payload(payload, r)) costly = pages_asked(r) > kPagesMax;
  });
  return costly;
}

// Where the data directories go: in memory where /dev/shm is there (recovery fsyncs
// every file it writes, which a disk would make the slowest part of a run).
const fs::path& base_path() {
  static const fs::path base = [] {
    std::error_code ec;
    return fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
               ? fs::path("/dev/shm")
               : fs::temp_directory_path();
  }();
  return base;
}
constexpr std::string_view kPrefix = "metad-data-dir-fuzz-";

// This process's own directory.
const std::string& data_path() {
  static const std::string path =
      (base_path() / (std::string(kPrefix) + std::to_string(::getpid()))).string();
  return path;
}

// Removes the directory at exit (it holds its own copy of the path: statics are
// destroyed in the reverse order of their construction).
struct cleanup {
  std::string path;
  ~cleanup() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The directories of runs that crashed (an abort skips the cleanup at exit): those whose
// process is gone.
void remove_stale_directories() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(base_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kPrefix)) continue;
    const long pid = std::strtol(name.c_str() + kPrefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      fs::remove_all(entry.path(), ec);
  }
}

// Every frame's checksum made right, as far as the length fields lead (a length that
// runs past the end leaves the rest as it is: a torn tail, or damage).
void fix_checksums(std::string& bytes) {
  std::size_t at = 0;
  while (bytes.size() - at >= 8) {
    std::uint32_t length = 0;
    std::memcpy(&length, bytes.data() + at, 4);
    if (bytes.size() - at - 8 < length) return;
    const std::uint32_t crc = store::crc32c(std::string_view(bytes).substr(at + 8, length));
    std::memcpy(bytes.data() + at + 4, &crc, 4);
    at += 8 + std::size_t{length};
  }
}

void write_file(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  fuzz::require(f != nullptr, "the data directory's files can be created", path);
  fuzz::require(
      std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fclose(f) == 0,
      "the data directory's files can be written", path);
}

// Generation 1 of one former core, as a stopped server leaves it.
void lay_out(std::uint8_t options, std::string_view snapshot, std::string_view log) {
  const std::string& dir = data_path();
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir + "/g1");
  write_file(dir + "/CURRENT", "1\n");
  if ((options & kNoSnapshot) == 0) write_file(dir + "/g1/core-0.snap-1", snapshot);
  write_file(dir + "/g1/core-0.log-1", log);
  if ((options & kNewerSegment) != 0) write_file(dir + "/g1/core-0.log-2", "");
}

int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

metad::config make_config(std::uint8_t options) {
  metad::config cfg;
  cfg.data_dir = data_path();
  cfg.log = metad::log_level::error;
  cfg.directory_cores = (options & kOneDirectoryCore) != 0 ? 1 : 2;
  if ((options & kQuarantineOff) != 0) cfg.release_quarantine_ms = 0;
  return cfg;
}

std::unique_ptr<pipeline::node> make_node(const metad::config& cfg, int cores) {
  auto nd = std::make_unique<pipeline::node>(cfg, cores);
  nd->clock = [] { return kNowMs * smp::kNsPerMs; };
  return nd;
}

// The node's state, one line a fact, sorted: what two recoveries of the same files must
// agree on (not the times of reservations, leases or recency).
std::string state_of(const pipeline::node& nd) {
  std::vector<std::string> lines;
  for (const auto& core : nd.core) {
    // Each tenant's vLLM state apart: its lines name it.
    core->for_each_space([&](const pipeline::vllm_space& sp) {
      const std::string t = sp.tenant.empty() ? "" : fmt::format("tenant {:?} ", sp.tenant);
      sp.ranks.for_each_rank([&](std::int64_t rank, const shard::rank_stats& s) {
        lines.push_back(
            fmt::format("{}rank {}: pages {} free {} reserved {} bound {} quarantined {}", t, rank,
                        s.num_pages, s.free, s.reserved, s.bound, s.quarantined));
      });
      sp.ranks.for_each_entry(
          [&](std::int64_t rank, std::string_view key, std::int64_t page, bool confirmed) {
            lines.push_back(fmt::format("{}rank {} key {:?} page {} {}", t, rank, std::string(key),
                                        page, confirmed ? "bound" : "reserved"));
          });
      sp.ranks.for_each_quarantine([&](std::int64_t rank, std::span<const std::int64_t> pages) {
        lines.push_back(fmt::format("{}rank {} quarantine {}", t, rank, fmt::join(pages, ",")));
      });
      sp.directory.for_each_key([&](std::string_view key, std::int32_t tp, std::int32_t count) {
        lines.push_back(fmt::format("{}key {:?} tp {} count {}", t, std::string(key), tp, count));
      });
    });
    for (const auto& entry : core->sg_tenants) {
      const std::string& tenant = entry.first;  // lambdas cannot capture bindings in C++20
      entry.second.for_each(
          [&](std::int64_t rank, std::string_view ns, const shard::sglang_pool& pool) {
            const shard::sglang_image image = pool.image();
            std::string line = fmt::format("pool {:?} {} {:?}: pages {} epoch {} free", tenant,
                                           rank, std::string(ns), image.num_pages, image.epoch);
            for (const auto& [lo, hi] : image.free) line += fmt::format(" {}-{}", lo, hi);
            line += " bound";
            for (const auto& [key, page] : image.bound) line += fmt::format(" {:?}={}", key, page);
            line += " in flight";
            for (const auto& f : image.reserved)
              line += fmt::format(" {:?}={}@{}", f.key, f.page, f.epoch);
            line += fmt::format(" quarantined {}", fmt::join(image.quarantined, ","));
            lines.push_back(std::move(line));
          });
    }
  }
  std::sort(lines.begin(), lines.end());
  return fmt::format("{}", fmt::join(lines, "\n"));
}

void check_state(const pipeline::node& nd, const char* which) {
  const std::string problem = pipeline::check_consistency(nd);
  if (!problem.empty()) {
    std::fprintf(stderr, "after the %s recovery:\n", which);
    fuzz::fail("a recovered node is consistent", problem);
  }
  std::int64_t ranks = 0;
  for (const auto& core : nd.core)
    core->for_each_space([&](const pipeline::vllm_space& sp) {
      ranks += static_cast<std::int64_t>(sp.ranks.rank_count());
    });
  fuzz::require(ranks == nd.worker_ranks.load(), "worker_ranks counts the recovered ranks");
}

// Recovers the directory into a node of `cores` cores: its state, none if it refused
// the files.
std::optional<std::string> recover(const metad::config& cfg, int cores, const char* which) {
  auto nd = make_node(cfg, cores);
  try {
    persist::recover(*nd);
  } catch (const std::runtime_error&) {
    return std::nullopt;  // the files were refused, as damage must be
  }
  check_state(*nd, which);
  return state_of(*nd);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  metad::log::threshold = metad::log_level::error;  // a torn tail is warned about, each time
  remove_stale_directories();
  static cleanup at_exit{data_path()};
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fuzz::header h(data, size);
  const std::uint8_t options = h.byte[0];
  const int cores = (options & 3) % 3 + 1;
  const std::size_t cut = std::min<std::size_t>(h.seed(), h.payload.size());
  std::string snapshot(h.payload.substr(0, cut)), log(h.payload.substr(cut));
  if ((options & kFixChecksums) != 0) {
    fix_checksums(snapshot);
    fix_checksums(log);
  }
  if (too_costly(snapshot) || too_costly(log)) return -1;  // not added to the corpus
  const int fds = open_fds();
  lay_out(options, snapshot, log);
  const metad::config cfg = make_config(options);
  if (const std::optional<std::string> first = recover(cfg, cores, "first")) {
    // The generation it wrote (a snapshot per core, empty logs) holds the same state.
    const std::optional<std::string> second = recover(cfg, cores, "second");
    if (second != first) {
      std::fprintf(stderr, "first recovery:\n%s\nsecond recovery:\n%s\n", first->c_str(),
                   second ? second->c_str() : "(refused the files)");
      fuzz::fail("the generation a recovery writes recovers to the same state");
    }
  }
  fuzz::require(open_fds() == fds, "recovery leaves no file descriptor open");
  return 0;
}
