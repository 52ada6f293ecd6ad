// The file-walking half of recovery, on core_files built in memory: which damage is a
// torn tail to drop and which stops start-up, and where the last clear is.
#include "store/recovery.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "store/record.hpp"

using namespace metad;

namespace {

std::string two_records() {
  std::string log;
  store::append_initialize(log, 1, 8);
  store::append_initialize(log, 2, 8);
  return log;
}

// core_files views bytes it does not own (mapped files in the server): `logs` must
// outlive the group.
store::core_files group(const std::vector<std::string>& logs) {
  store::core_files f;
  for (std::size_t s = 0; s < logs.size(); ++s) {
    f.logs.push_back(logs[s]);
    f.log_paths.push_back("core-0.log-" + std::to_string(s + 1));
  }
  return f;
}

TEST(Recovery, ATornTailOfTheLastSegmentIsDroppedAndTheRestKept) {
  const std::string whole = two_records();
  const std::vector<std::string> logs = {whole, whole.substr(0, whole.size() - 3)};
  const store::core_files f = group(logs);
  const store::checked_group g = store::check_group(f);
  ASSERT_EQ(g.logs.size(), 2u);
  EXPECT_EQ(g.logs[0].size(), whole.size());
  std::string first;
  store::append_initialize(first, 1, 8);
  EXPECT_EQ(g.logs[1].size(), first.size()) << "the whole first record stays";
}

TEST(Recovery, ATornRecordInAnEarlierSegmentStopsStartUpNamingTheFile) {
  const std::string whole = two_records();
  const std::vector<std::string> logs = {whole.substr(0, whole.size() - 3), whole};
  const store::core_files f = group(logs);
  try {
    store::check_group(f);
    FAIL() << "an earlier segment is complete before the next one is created";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("core-0.log-1"), std::string::npos) << e.what();
  }
}

TEST(Recovery, DamageWithValidRecordsAfterItIsNeverATornTail) {
  std::string log = two_records();
  store::append_initialize(log, 3, 8);
  log[9] ^= 0x40;  // the first record's payload: its checksum fails, valid records follow
  const std::vector<std::string> logs = {log};
  const store::core_files f = group(logs);
  EXPECT_THROW(store::check_group(f), std::runtime_error);
}

TEST(Recovery, TheLastClearIsFoundAndVoidsTheSnapshot) {
  std::string first = two_records(), second;
  store::append_clear(second);
  store::append_initialize(second, 4, 8);
  store::append_clear(second);
  const std::vector<std::string> logs = {first, second};
  const std::string snapshot = two_records();
  store::core_files f = group(logs);
  f.snapshot = snapshot;
  f.snapshot_path = "core-0.snap-1";
  const store::checked_group g = store::check_group(f);
  EXPECT_TRUE(g.cleared);
  EXPECT_EQ(g.clear_at.segment, 1u);
  std::string upto;
  store::append_clear(upto);
  store::append_initialize(upto, 4, 8);
  EXPECT_EQ(g.clear_at.offset, upto.size());
  EXPECT_TRUE(g.snapshot.empty());
}

}  // namespace
