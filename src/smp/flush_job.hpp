// One group commit of a core's log, as the log hands it out and the core's loop performs
// it: write `bytes` of `data` at `offset` of `fd`, then fdatasync it if `sync`. The log
// (store::log_writer::begin_flush) fills the write and `lsn`; the server sets `sync` from
// --durability; the loop (net) reads only the write and `sync`.
#pragma once

#include <cstddef>
#include <cstdint>

namespace metad::smp {

struct flush_job {
  int fd = -1;
  const char* data = nullptr;
  std::size_t bytes = 0;
  std::uint64_t offset = 0;  // in the segment file
  std::uint64_t lsn = 0;     // the log position of data[0] (what a standby is sent)
  bool sync = true;
};

}  // namespace metad::smp
