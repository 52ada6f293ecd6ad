// The data directory's files. Layout:
//   DIR/CURRENT                    the committed generation G (text)
//   DIR/g<G>/core-<c>.snap-<S>     core c's state as of the start of its log segment S
//   DIR/g<G>/core-<c>.log-<S>      core c's log records after that
// A generation's core count is fixed; every start-up recovers the committed generation,
// writes generation G+1 (one snapshot per current core) and commits it by renaming
// CURRENT, so recovery works whatever the core count was.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace store {

// What one former core left: its newest complete snapshot and the log segments after it.
struct core_files {
  int core = 0;
  std::string snapshot;  // bytes (empty: none)
  std::string snapshot_path;
  std::vector<std::string> logs;  // bytes of each segment, oldest first
  std::vector<std::string> log_paths;
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
  // Reads every core's files of the committed generation (none on a fresh directory).
  std::vector<core_files> load() const;

  // The next generation's directory (created empty; a leftover from a crash is wiped).
  void begin_generation();
  std::uint64_t next_generation() const { return generation_ + 1; }
  // Writes `bytes` as core c's snapshot S of generation `generation`: temporary file,
  // fsync, rename, directory fsync. Throws std::system_error.
  void write_snapshot(std::uint64_t generation, int core, std::uint64_t segment,
                      const std::string& bytes) const;
  // Creates (empty, fsynced) log segment S of core c; returns its fd (O_WRONLY).
  int create_log(std::uint64_t generation, int core, std::uint64_t segment) const;
  // Removes core c's snapshots and logs of `generation` older than `segment`.
  void remove_before(std::uint64_t generation, int core, std::uint64_t segment) const;
  // Makes the next generation the committed one and deletes the old one.
  void commit_generation();

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

}  // namespace store
