// The data directory's files. Layout:
//   DIR/CURRENT                    the committed generation G (text)
//   DIR/g<G>/core-<c>.snap-<S>     core c's state as of the start of its log segment S
//   DIR/g<G>/core-<c>.log-<S>      core c's log records after that
// A generation's core count is fixed; every start-up recovers the committed generation,
// writes generation G+1 (one snapshot per current core) and commits it by renaming
// CURRENT, so recovery works whatever the core count was.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace metad::store {

// A whole file mapped read-only (its pages come from the page cache: no copy, and
// nothing of it stays in the process once unmapped). Move-only.
class mapped_file {
 public:
  mapped_file() = default;
  explicit mapped_file(const std::string& path);  // throws std::system_error
  ~mapped_file();
  mapped_file(mapped_file&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  mapped_file& operator=(mapped_file&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  std::string_view bytes() const { return {data_, size_}; }

 private:
  const char* data_ = nullptr;
  std::size_t size_ = 0;
};

// What one former core left: its newest complete snapshot and the log segments after it.
struct core_files {
  int core = 0;
  std::string_view snapshot;  // bytes (empty: none), in snapshot_file
  std::string snapshot_path;
  std::vector<std::string_view> logs;  // bytes of each segment, oldest first, in log_files
  std::vector<std::string> log_paths;
  mapped_file snapshot_file;
  std::vector<mapped_file> log_files;
};

class data_dir {
 public:
  // exclusive: creates the directory if needed and takes an exclusive lock on it (a
  // second server on the same directory fails here). read_only: an existing directory,
  // shared-locked (fails while a server runs on it), for inspection; write nothing.
  // Throws std::runtime_error.
  enum class access : std::uint8_t { exclusive, read_only };
  explicit data_dir(std::string path, access mode = access::exclusive);
  ~data_dir();
  data_dir(const data_dir&) = delete;
  data_dir& operator=(const data_dir&) = delete;

  const std::string& path() const { return path_; }
  std::uint64_t generation() const { return generation_; }
  // Maps every core's files of the committed generation (none on a fresh directory).
  std::vector<core_files> load() const;

  // The next generation's directory (created empty; a leftover from a crash is wiped).
  void begin_generation();
  std::uint64_t next_generation() const { return generation_ + 1; }
  // Writes `bytes` as core c's snapshot S of generation `generation`: temporary file,
  // fsync, rename, directory fsync. Throws std::system_error.
  void write_snapshot(std::uint64_t generation, int core, std::uint64_t segment,
                      const std::string& bytes) const;
  // The same with the bytes produced in pieces (no whole copy in memory): produce(write)
  // calls write(piece) for each piece, in order.
  using piece_writer = std::function<void(std::string_view)>;
  void write_snapshot(std::uint64_t generation, int core, std::uint64_t segment,
                      const std::function<void(const piece_writer&)>& produce) const;
  // Makes `path` (a snapshot of the committed generation, whole and unchanged) core c's
  // snapshot S of `generation` too, by a hard link: no copy. Throws std::system_error.
  void link_snapshot(const std::string& path, std::uint64_t generation, int core,
                     std::uint64_t segment) const;
  // The path of core c's log segment S of `generation`.
  std::string log_path(std::uint64_t generation, int core, std::uint64_t segment) const;
  // Creates (empty, fsynced) log segment S of core c; returns its fd (O_WRONLY).
  int create_log(std::uint64_t generation, int core, std::uint64_t segment) const;
  // Removes core c's snapshots of `generation` older than `segment`, and its logs older
  // than `logs_before` (<= segment: a leader keeps some for its standbys to resume from).
  void remove_before(std::uint64_t generation, int core, std::uint64_t segment,
                     std::uint64_t logs_before) const;
  // Makes the next generation the committed one and deletes the old one.
  void commit_generation();
  // Removes the next generation's directory after a start that could not write it.
  void abandon_generation() const;

  // Gives back the disk space the committed generation's log segments hold past their
  // end: a log reserves room in chunks of up to 16 MiB (fallocate, the size kept), and
  // after a crash that reservation stays with the file. Truncates each to its own size:
  // not a byte of any file changes. Returns the bytes freed. Start-up, before the next
  // generation is written (it needs room the running server never needed).
  std::uint64_t release_log_reservations() const;
  // Bytes free to this process on the directory's file system (0 if unknown), and the
  // unit files take room in (4096 if unknown).
  std::uint64_t free_bytes() const;
  std::uint64_t block_bytes() const;

  std::string generation_dir(std::uint64_t generation) const;

 private:
  // The committed generation (0: a fresh directory). Throws std::runtime_error when
  // CURRENT is missing or unreadable but generations exist.
  std::uint64_t read_current() const;

  std::string path_;
  int lock_fd_ = -1;
  std::uint64_t generation_ = 0;
};

// fsyncs a directory so that renames and creations in it are durable.
void sync_directory(const std::string& path);

}  // namespace metad::store
