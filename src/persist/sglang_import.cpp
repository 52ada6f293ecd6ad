// The reference SGLang server's state file into the default tenant (sglang_import.hpp):
// decoded and validated whole by api::decode_sglang_state before any pool is made, then
// each pool restored in bulk (shard::sglang_pool::restore, as a snapshot record is).
#include "persist/sglang_import.hpp"

#include <fcntl.h>
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

namespace metad::persist {
namespace {

// The whole file. Throws std::runtime_error.
std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  std::string bytes;
  if (struct stat st{}; ::fstat(fd, &st) == 0 && st.st_size > 0)
    bytes.reserve(static_cast<std::size_t>(st.st_size));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
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
  image.free = std::move(pool.free);
  image.bound = std::move(pool.bound);
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
  const std::string bytes = read_file(path);
  const std::int64_t pools_now = nd.sglang_pools.load();
  api::sg_state_limits limits;
  limits.pages_max =
      std::min<std::int64_t>(nd.cfg.pages_per_rank_max, shard::sglang_pool::pages_max);
  limits.key_bytes_max = nd.cfg.key_bytes_max;
  limits.pools_max =
      static_cast<std::size_t>(std::max<std::int64_t>(nd.cfg.ranks_max - pools_now, 0));
  std::vector<api::sg_state_pool> pools;
  if (std::string error = api::decode_sglang_state(bytes, limits, pools); !error.empty())
    throw std::runtime_error("SGLang state file " + path + ": " + error +
                             "; nothing imported (the file is left as it is)");
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
