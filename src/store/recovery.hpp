// The file-walking half of recovery: each core's files of the committed generation
// checked once (checksums, decoding, the torn-tail rule) before anything is replayed,
// and the sizes the tables will need. What the records mean is the replayer's business
// (persist/replayer.cpp); this half knows only frames, kinds and files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "store/data_dir.hpp"
#include "store/record.hpp"

namespace metad::store {

struct log_position {
  std::size_t segment = 0, offset = 0;
  bool operator<(const log_position& o) const {
    return segment != o.segment ? segment < o.segment : offset < o.offset;
  }
};

// A file group after one full check, which one core does for each group before every
// core replays: the bytes holding its valid records, and where its last clear record is
// (everything before it is void).
struct checked_group {
  bool cleared = false;
  log_position clear_at;
  // Each tenant's last scoped clear (record.hpp, in_tenant) in the logs, by tenant ("":
  // the unnamed vLLM state): that tenant's vLLM records before it, the snapshot's too,
  // are void (recovery skips them, as it skips everything before a bare clear).
  std::unordered_map<std::string, log_position> tenant_cleared;
  // Whether `r`, at `at` (nullptr: in the snapshot), is void by a later scoped clear.
  bool voided(const record& r, const log_position* at) const;
  std::string_view snapshot;  // empty when a clear voids it
  std::vector<std::string_view> logs;
  const core_files* files = nullptr;
};

// Checks one former core's files. Only a torn write at the very end of its last log
// segment (nothing valid after it) is dropped, with a warning; any other damage throws
// std::runtime_error naming the file and offset: a log segment is complete before the
// next one is created, and a snapshot is renamed into place only once whole.
checked_group check_group(const core_files& f);

// Upper bounds on what the files hold, from a walk over their frame headers (no
// checksums, no decoding: a damaged frame only misguides the sizing; the replay proper
// finds the damage): keys per rank (snapshot entries plus logged allocations) and
// directory keys. Tables sized from them are rebuilt smaller when they overshot.
struct file_sizes {
  // A rank of one tenant's vLLM state ("": the unnamed one; record_kind::in_tenant).
  struct rank_of {
    std::string tenant;
    std::int64_t rank = 0;
    bool operator==(const rank_of&) const = default;
  };
  struct rank_hash {
    std::size_t operator()(const rank_of& r) const noexcept {
      return std::hash<std::string>()(r.tenant) ^ std::hash<std::int64_t>()(r.rank) * 31;
    }
  };
  std::unordered_map<rank_of, std::size_t, rank_hash> rank_keys;
  std::size_t directory_keys = 0;  // the unnamed state's
  // Ranks whose key table a snapshot holds as an image (snapshot_rank_slots): its buckets.
  std::unordered_map<rank_of, std::size_t, rank_hash> image_buckets;
  // Per file group: a snapshot in the compact form (32-hex keys packed) and no log
  // records after it. Recovery into as many cores links such a snapshot into the new
  // generation instead of writing the same state again.
  std::vector<bool> reusable;
};
file_sizes estimate_sizes(const std::vector<core_files>& files);

}  // namespace metad::store
