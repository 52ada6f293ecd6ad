// A core's snapshot in the form before the compact one (one snapshot_entry per binding,
// one directory_key per key), made by hand with store's appenders: ranks 0 and 1 of 16
// pages; key(1) bound on both (pages 3 and 5), key(2) on rank 0 (page 4), key(3)
// reserved on rank 1 (page 7), "odd key" bound on rank 0 (page 9); the directory names
// key(1) and key(2) with tp_world_size 2 and "odd key" with 1. For the tests that check
// it still loads (tests/persist) and data_dir_fuzz's seeds (tests/fuzz).
#pragma once

#include <string>

#include "store/record.hpp"

namespace server_test {

template <class Key>
std::string former_format_snapshot(Key&& key) {
  std::string snap;
  metad::store::append_snapshot_rank(snap, 0, 16);
  metad::store::append_snapshot_rank(snap, 1, 16);
  metad::store::append_snapshot_entry(snap, 0, 3, true, key(1));
  metad::store::append_snapshot_entry(snap, 1, 5, true, key(1));
  metad::store::append_snapshot_entry(snap, 0, 4, true, key(2));
  metad::store::append_snapshot_entry(snap, 1, 7, false, key(3));
  metad::store::append_snapshot_entry(snap, 0, 9, true, "odd key");
  metad::store::append_directory_key(snap, 2, key(1));
  metad::store::append_directory_key(snap, 2, key(2));
  metad::store::append_directory_key(snap, 1, "odd key");
  return snap;
}

}  // namespace server_test
