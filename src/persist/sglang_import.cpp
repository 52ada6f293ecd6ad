// The reference SGLang server's state file into the default tenant (sglang_import.hpp):
// decoded and validated whole by api::decode_sglang_state before any pool is made, then
// each pool restored in bulk (shard::sglang_pool::restore, as a snapshot record is).
#include "persist/sglang_import.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/sglang_state.hpp"
#include "metad/log.hpp"
#include "shard/ownership.hpp"
#include "shard/page_pool.hpp"
#include "shard/rank_table.hpp"

namespace metad::persist {
namespace {

// The largest state file read (SGLang's server writes one JSON for all its pools: 1 GiB
// is millions of keys), and how many times its size reading and decoding it may take
// (the bytes, simdjson's document, the decoded keys): also bounded by --memory-max.
constexpr std::uint64_t kFileBytesMax = std::uint64_t{1} << 30;
constexpr std::uint64_t kReadFactor = 8;

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// The whole file, a regular file of at most `size_max` bytes (only its size as fstat
// tells it is read: a file that grows meanwhile is cut there, and the JSON then fails).
// Opened without blocking (a FIFO would wait for a writer forever). Throws
// std::runtime_error.
std::string read_file(const std::string& path, std::uint64_t size_max,
                      const std::string& size_why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    throw std::runtime_error(path + ": cannot read: " + std::strerror(error));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(path + ": cannot read: " + kind_of(st.st_mode) +
                             ", not a regular file; nothing imported");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > size_max) {
    ::close(fd);
    throw std::runtime_error(fmt::format(
        "{}: cannot read: {} bytes, more than the {} bytes an SGLang state file may have ({}); "
        "nothing imported",
        path, size, size_max, size_why));
  }
  std::string bytes;
  bytes.reserve(static_cast<std::size_t>(size));
  char buffer[1 << 16];
  while (bytes.size() < size) {
    const ssize_t n =
        ::read(fd, buffer, std::min<std::uint64_t>(sizeof buffer, size - bytes.size()));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      throw std::runtime_error(path + ": cannot read: " + std::strerror(error));
    }
    bytes.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return bytes;
}

shard::sglang_image image_of(api::sg_state_pool& pool) {
  shard::sglang_image image;
  image.num_pages = pool.num_pages;
  for (const std::uint32_t p : pool.free) image.push_free(p);
  pool.free = {};
  for (auto& [key, page] : pool.bound) image.bound.emplace_back(std::move(key), page);
  pool.bound = {};
  return image;
}

}  // namespace

bool import_sglang_state(pipeline::node& nd, const store::data_dir& dir) {
  const std::string& path = nd.cfg.sglang_import_path;
  if (dir.generation() != 0) {
    metad::log::info(
        "SGLang state file {} not imported: the data directory {} holds state already "
        "(generation {}), recovered above",
        path, dir.path(), dir.generation());
    return false;
  }
  // Bounded by --memory-max, as initialize is: the file (parsing it takes up to
  // kReadFactor times its size), the pools' tables while they are decoded, then the
  // pools themselves, charged before they are made.
  nd.memory.sample();
  const std::uint64_t used = nd.memory.used();
  const std::uint64_t left = nd.memory.max() > used ? nd.memory.max() - used : 0;
  const std::uint64_t size_max = std::min(kFileBytesMax, left / kReadFactor);
  const std::string size_why =
      size_max == kFileBytesMax
          ? fmt::format("at most {} bytes", kFileBytesMax)
          : fmt::format("reading takes {}x its size and --memory-max {} leaves {} bytes",
                        kReadFactor, nd.memory.max(), left);
  const std::string bytes = read_file(path, size_max, size_why);
  const std::int64_t pools_now = nd.sglang_pools.load();
  api::sg_state_limits limits;
  // The reference's file lists every free page of a pool, and reading it marks each page:
  // its pools stay within 2^31 - 1 pages (a pool created here afterwards may be larger).
  limits.pages_max = std::min<std::int64_t>(nd.cfg.pages_per_rank_max, shard::page_pool::held_max);
  limits.key_bytes_max = nd.cfg.key_bytes_max;
  limits.pools_max =
      static_cast<std::size_t>(std::max<std::int64_t>(nd.cfg.ranks_max - pools_now, 0));
  limits.bytes_max = left - bytes.size() * kReadFactor;
  std::vector<api::sg_state_pool> pools;
  if (std::string error = api::decode_sglang_state(bytes, limits, pools); !error.empty())
    throw std::runtime_error("SGLang state file " + path + ": " + error +
                             "; nothing imported (the file is left as it is)");
  std::uint64_t pool_bytes = 0;
  for (const api::sg_state_pool& pool : pools)
    pool_bytes += shard::rank_table::pool_bytes(pool.num_pages);
  if (!nd.memory.charge_kept(pool_bytes)) {
    nd.memory.refused_ranks.fetch_add(1, std::memory_order_relaxed);
    throw std::runtime_error(fmt::format(
        "SGLang state file {}: its {} pool(s) need {} bytes, over the memory budget "
        "(--memory-max {} bytes, {} in use); nothing imported (the file is left as it is)",
        path, pools.size(), pool_bytes, nd.memory.max(), nd.memory.used()));
  }
  std::uint64_t pages = 0, keys = 0, reclaimed = 0;
  for (api::sg_state_pool& pool : pools) {
    if (pool.free_and_bound > 0)
      metad::log::warn(
          "SGLang state file {}: pool '{}' lists {} page(s) both free and bound: kept bound", path,
          pool.name, pool.free_and_bound);
    pages += pool.num_pages;
    keys += pool.bound.size();
    reclaimed += pool.reclaimed;
    pipeline::core_state& core = *nd.core[shard::owner_of_rank(pool.rank, nd.cores)];
    std::string error;
    shard::sglang_pool restored(0, core.sg_config);
    if (!shard::sglang_pool::restore(image_of(pool), core.sg_config, restored, error))
      throw std::runtime_error("SGLang state file " + path + ": pool '" + pool.name +
                               "' cannot be restored: " + error);
    if (!core.sg_pools("", true)->adopt(pool.rank, pool.ns, std::move(restored)))
      throw std::runtime_error("SGLang state file " + path + ": pool '" + pool.name +
                               "' exists already");
    nd.sglang_pools.fetch_add(1);
  }
  metad::log::info(
      "imported SGLang state file {} into {}: {} pool(s), {} pages, {} keys bound, {} page(s) "
      "that the file listed nowhere (in flight when it was saved) free again; the file is "
      "not read again once this start has committed",
      path, dir.path(), pools.size(), pages, keys, reclaimed);
  return !pools.empty();
}

}  // namespace metad::persist
