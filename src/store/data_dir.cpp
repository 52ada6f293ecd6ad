#include "store/data_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <system_error>

namespace metad::store {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

void write_all(int fd, std::string_view bytes, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write " + path);
    }
    done += static_cast<std::size_t>(n);
  }
}

// "core-<c>.snap-<S>" / "core-<c>.log-<S>" → (c, kind, S)
bool parse_name(const std::string& name, int& core, std::string& kind, std::uint64_t& segment) {
  if (!name.starts_with("core-")) return false;
  const auto dot = name.find('.');
  const auto dash = name.rfind('-');
  if (dot == std::string::npos || dash == std::string::npos || dash < dot) return false;
  const std::string_view c(name.data() + 5, dot - 5);
  kind = name.substr(dot + 1, dash - dot - 1);
  const std::string_view s(name.data() + dash + 1, name.size() - dash - 1);
  if (kind != "snap" && kind != "log") return false;
  auto r1 = std::from_chars(c.data(), c.data() + c.size(), core);
  auto r2 = std::from_chars(s.data(), s.data() + s.size(), segment);
  return r1.ec == std::errc{} && r1.ptr == c.data() + c.size() && r2.ec == std::errc{} &&
         r2.ptr == s.data() + s.size();
}

}  // namespace

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open directory " + path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("fsync directory " + path);
}

data_dir::data_dir(std::string path, access mode) : path_(std::move(path)) {
  const std::string lock = path_ + "/LOCK";
  if (mode == access::read_only) {
    if (!fs::is_directory(path_)) throw std::runtime_error(path_ + ": not a directory");
    lock_fd_ = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
    if (lock_fd_ >= 0 && ::flock(lock_fd_, LOCK_SH | LOCK_NB) != 0)
      throw std::runtime_error(path_ +
                               " is in use by a running hf3fs-metad: stop it (or copy the "
                               "directory) first");
    generation_ = read_current();
    return;
  }
  std::error_code ec;
  fs::create_directories(path_, ec);
  if (ec) throw std::runtime_error("--data-dir " + path_ + ": " + ec.message());
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) fail("open " + lock);
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0)
    throw std::runtime_error("--data-dir " + path_ + " is in use by another hf3fs-metad");
  generation_ = read_current();
}

// CURRENT names the committed generation. Without it a directory is fresh only if no
// generation was ever written there: one missing, empty or unreadable CURRENT next to
// generation directories is damage, and starting empty would lose (and later delete)
// the fleet's whole index, so start-up stops and says how to mend it.
std::uint64_t data_dir::read_current() const {
  const std::string path = path_ + "/CURRENT";
  std::ifstream current(path);
  std::string text;
  std::getline(current, text);
  std::uint64_t g = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), g);
  if (ec == std::errc{} && end == text.data() + text.size() && g > 0) return g;
  std::vector<std::uint64_t> found;
  for (const auto& entry : fs::directory_iterator(path_)) {
    const std::string name = entry.path().filename().string();
    std::uint64_t n = 0;
    const auto r = std::from_chars(name.data() + 1, name.data() + name.size(), n);
    if (name.size() > 1 && name[0] == 'g' && r.ec == std::errc{} &&
        r.ptr == name.data() + name.size() && entry.is_directory())
      found.push_back(n);
  }
  if (found.empty() && !fs::exists(path)) return 0;  // a fresh directory
  std::sort(found.begin(), found.end());
  std::string listed;
  for (std::uint64_t n : found) listed += (listed.empty() ? "g" : ", g") + std::to_string(n);
  throw std::runtime_error(
      path + " is missing, empty or unreadable" +
      (found.empty() ? std::string() : " but generation directories exist (" + listed + ")") +
      ": refusing to start rather than start empty. Write the number of the last committed "
      "generation into it (the newest directory whose every core has a snapshot, e.g. `echo " +
      (found.empty() ? std::string("1") : std::to_string(found.back())) + " > " + path +
      "`), or move the g* directories and CURRENT away to start empty.");
}

data_dir::~data_dir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string data_dir::generation_dir(std::uint64_t generation) const {
  return path_ + "/g" + std::to_string(generation);
}

mapped_file::mapped_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("open " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("stat " + path);
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ != 0) {
    // MAP_POPULATE: the page tables are filled in one call, not a fault per page.
    void* at = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (at == MAP_FAILED) {
      ::close(fd);
      fail("mmap " + path);
    }
    data_ = static_cast<const char*>(at);
  }
  ::close(fd);
}

mapped_file::~mapped_file() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

std::vector<core_files> data_dir::load() const {
  std::vector<core_files> cores;
  if (generation_ == 0) return cores;
  const std::string dir = generation_dir(generation_);
  struct found {
    std::map<std::uint64_t, std::string> snaps, logs;
  };
  std::map<int, found> by_core;
  for (const auto& entry : fs::directory_iterator(dir)) {
    int core = 0;
    std::string kind;
    std::uint64_t segment = 0;
    if (!parse_name(entry.path().filename().string(), core, kind, segment)) continue;  // temp files
    (kind == "snap" ? by_core[core].snaps : by_core[core].logs)[segment] = entry.path().string();
  }
  for (auto& [core, f] : by_core) {
    core_files files;
    files.core = core;
    std::uint64_t from = 0;
    if (!f.snaps.empty()) {
      const auto newest = std::prev(f.snaps.end());
      from = newest->first;
      files.snapshot_path = newest->second;
      files.snapshot_file = mapped_file(newest->second);
      files.snapshot = files.snapshot_file.bytes();
    }
    for (const auto& [segment, path] : f.logs) {
      if (segment < from) continue;  // already inside the snapshot
      files.log_paths.push_back(path);
      files.log_files.emplace_back(path);
      files.logs.push_back(files.log_files.back().bytes());
    }
    cores.push_back(std::move(files));
  }
  return cores;
}

void data_dir::begin_generation() {
  const std::string next = generation_dir(generation_ + 1);
  std::error_code ec;
  fs::remove_all(next, ec);  // a generation that never got committed
  if (!fs::create_directory(next, ec) || ec)
    throw std::runtime_error("cannot create " + next + ": " + ec.message());
  sync_directory(path_);
}

void data_dir::write_snapshot(std::uint64_t generation, int core, std::uint64_t segment,
                              const std::string& bytes) const {
  write_snapshot(generation, core, segment, [&](const piece_writer& write) { write(bytes); });
}

void data_dir::write_snapshot(std::uint64_t generation, int core, std::uint64_t segment,
                              const std::function<void(const piece_writer&)>& produce) const {
  const std::string dir = generation_dir(generation);
  const std::string final_path =
      dir + "/core-" + std::to_string(core) + ".snap-" + std::to_string(segment);
  const std::string temp_path = final_path + ".tmp";
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open " + temp_path);
  try {
    produce([&](std::string_view piece) { write_all(fd, piece, temp_path); });
    if (::fdatasync(fd) != 0) fail("fdatasync " + temp_path);
  } catch (...) {
    ::close(fd);
    ::unlink(temp_path.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) fail("rename " + temp_path);
  sync_directory(dir);
}

void data_dir::link_snapshot(const std::string& path, std::uint64_t generation, int core,
                             std::uint64_t segment) const {
  const std::string dir = generation_dir(generation);
  const std::string final_path =
      dir + "/core-" + std::to_string(core) + ".snap-" + std::to_string(segment);
  if (::link(path.c_str(), final_path.c_str()) != 0) fail("link " + path + " to " + final_path);
  sync_directory(dir);
}

std::string data_dir::log_path(std::uint64_t generation, int core, std::uint64_t segment) const {
  return generation_dir(generation) + "/core-" + std::to_string(core) + ".log-" +
         std::to_string(segment);
}

int data_dir::create_log(std::uint64_t generation, int core, std::uint64_t segment) const {
  const std::string dir = generation_dir(generation);
  const std::string path = log_path(generation, core, segment);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open " + path);
  sync_directory(dir);
  return fd;
}

void data_dir::remove_before(std::uint64_t generation, int core, std::uint64_t segment,
                             std::uint64_t logs_before) const {
  const std::string dir = generation_dir(generation);
  for (const auto& entry : fs::directory_iterator(dir)) {
    int c = 0;
    std::string kind;
    std::uint64_t s = 0;
    if (parse_name(entry.path().filename().string(), c, kind, s) && c == core &&
        s < (kind == "snap" ? segment : logs_before))
      ::unlink(entry.path().c_str());
  }
  sync_directory(dir);
}

void data_dir::commit_generation() {
  const std::uint64_t next = generation_ + 1;
  const std::string temp = path_ + "/CURRENT.tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open " + temp);
  write_all(fd, std::to_string(next) + "\n", temp);
  if (::fdatasync(fd) != 0) fail("fdatasync " + temp);
  ::close(fd);
  if (::rename(temp.c_str(), (path_ + "/CURRENT").c_str()) != 0) fail("rename " + temp);
  sync_directory(path_);
  std::error_code ec;
  if (generation_ != 0) fs::remove_all(generation_dir(generation_), ec);
  generation_ = next;
}

void data_dir::abandon_generation() const {
  std::error_code ec;
  fs::remove_all(generation_dir(generation_ + 1), ec);
  sync_directory(path_);
}

std::uint64_t data_dir::release_log_reservations() const {
  if (generation_ == 0) return 0;
  std::uint64_t freed = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(generation_dir(generation_), ec)) {
    int core = 0;
    std::string kind;
    std::uint64_t segment = 0;
    if (!parse_name(entry.path().filename().string(), core, kind, segment) || kind != "log")
      continue;
    const int fd = ::open(entry.path().c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) continue;  // nothing given back; the start goes on
    struct stat before {};
    struct stat after {};
    // Blocks past the end exist only if the allocation is larger than the size.
    if (::fstat(fd, &before) == 0 &&
        static_cast<std::uint64_t>(before.st_blocks) * 512 >
            static_cast<std::uint64_t>(before.st_size) &&
        ::ftruncate(fd, before.st_size) == 0 && ::fstat(fd, &after) == 0 &&
        after.st_blocks < before.st_blocks)
      freed += static_cast<std::uint64_t>(before.st_blocks - after.st_blocks) * 512;
    ::close(fd);
  }
  return freed;
}

std::uint64_t data_dir::block_bytes() const {
  struct statvfs st {};
  if (::statvfs(path_.c_str(), &st) != 0 || st.f_frsize == 0) return 4096;
  return st.f_frsize;
}

std::uint64_t data_dir::free_bytes() const {
  struct statvfs st {};
  if (::statvfs(path_.c_str(), &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

}  // namespace metad::store
