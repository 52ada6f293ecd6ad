// Durability without sockets: requests through the pipeline with a data directory, the
// group commit driven by hand, then recovery into clusters of other core counts.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cctype>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <utility>

#include "former_format.hpp"
#include "pipeline/routes.hpp"
#include "pipeline/tenants.hpp"
#include "shard/packed_key.hpp"
#include "shard/packed_map.hpp"
#include "sim_node.hpp"
#include "store/record.hpp"

using namespace metad;

namespace {

namespace fs = std::filesystem;
using server_test::sim_node;
using shard::pack_hex_key;
using shard::packed_hash;
using shard::packed_key;

class Durability : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("metad-durability-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A TP=2 save of keys k0..k{n-1} on ranks 0 and 1, a reservation left open on rank 2
  // and a failed write released on rank 3.
  static void populate(sim_node& n, int keys) {
    for (int r = 0; r < 4; ++r)
      n.post("/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":64})");
    std::string list, confirmations;
    for (int i = 0; i < keys; ++i) {
      list += (i ? "," : "") + std::string("\"k") + std::to_string(i) + "\"";
      confirmations += (i ? "," : "") + std::string("[\"k") + std::to_string(i) + "\"," +
                       std::to_string(i) + "]";
    }
    for (int r = 0; r < 2; ++r) {
      n.post("/keys/batch_allocate",
             "{\"rank\":" + std::to_string(r) + ",\"keys\":[" + list + "]}");
      n.post("/keys/confirm_write",
             "{\"rank\":" + std::to_string(r) + ",\"confirmations\":[" + confirmations + "]}");
    }
    n.post("/keys/batch_allocate", R"({"rank":2,"keys":["open1","open2"]})");
    n.post("/keys/batch_allocate", R"({"rank":3,"keys":["failed1","failed2","kept"]})");
    n.post("/keys/confirm_write", R"({"rank":3,"confirmations":[],"pages_to_release":[0,1]})");
  }

  static std::string state_of(sim_node& n, int keys) {
    std::string list;
    for (int i = 0; i < keys; ++i)
      list += (i ? "," : "") + std::string("\"k") + std::to_string(i) + "\"";
    std::string s;
    for (int r = 0; r < 4; ++r) s += n.get("/rank/" + std::to_string(r)) + "\n";
    s += n.post("/keys/batch_exists", "{\"keys\":[" + list + "]}") + "\n";
    s += n.post("/keys/get_locations", "{\"rank\":1,\"keys\":[" + list + "]}") + "\n";
    s += n.post("/keys/batch_allocate", R"({"rank":2,"keys":["open2","open1","new"]})") + "\n";
    s += n.post("/keys/batch_allocate", R"({"rank":3,"keys":["kept","failed1"]})") + "\n";
    return s;
  }

  std::string dir_;
};

TEST_F(Durability, StateSurvivesARestartWithAnyCoreCount) {
  std::string expected;
  {
    sim_node reference(dir_ + "-reference", 1);  // the same history, never restarted
    populate(reference, 20);
    expected = state_of(reference, 20);
  }
  fs::remove_all(dir_ + "-reference");
  {
    sim_node n(dir_, 2);
    populate(n, 20);
  }
  {
    sim_node n(dir_, 3);  // three cores now own the ranks and keys two used to
    EXPECT_EQ(state_of(n, 20), expected);
  }
  sim_node again(dir_, 1);
  EXPECT_EQ(again.get("/rank/0"),
            R"({"num_pages":64,"free":44,"reserved":0,"bound":20,"incomplete":20})");
  EXPECT_EQ(again.get("/rank/2"),
            R"({"num_pages":64,"free":61,"reserved":3,"bound":0,"incomplete":0})");
}

TEST_F(Durability, SnapshotsReplaceOldSegmentsAndRecover) {
  {
    sim_node n(dir_, 2, 4096);  // snapshot every few KiB of log
    populate(n, 60);
  }
  std::size_t snapshots = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_))
    if (e.path().filename().string().find(".snap-") != std::string::npos) ++snapshots;
  EXPECT_GE(snapshots, 2u);
  sim_node n(dir_, 3);
  EXPECT_EQ(n.get("/rank/1"),
            R"({"num_pages":64,"free":4,"reserved":0,"bound":60,"incomplete":60})");
  EXPECT_EQ(n.get("/rank/2"),
            R"({"num_pages":64,"free":62,"reserved":2,"bound":0,"incomplete":0})");
}

// 40 rounds of 20 keys saved on rank 0 and deleted: about 40 KiB of log.
void churn(sim_node& n) {
  for (int round = 0; round < 40; ++round) {
    std::string list, confirmations;
    for (int i = 0; i < 20; ++i) {
      const std::string k = "\"r" + std::to_string(round) + "-" + std::to_string(i) + "\"";
      list += (i ? "," : "") + k;
      confirmations += (i ? ",[" : "[") + k + "," + std::to_string(i) + "]";
    }
    n.post("/keys/batch_allocate", "{\"rank\":0,\"keys\":[" + list + "]}");
    n.post("/keys/confirm_write", "{\"rank\":0,\"confirmations\":[" + confirmations + "]}");
    n.post("/keys/delete", "{\"keys\":[" + list + "]}");
  }
}

// --repl-retain-log-bytes keeps the newest log segments a snapshot made old. A segment is
// cut once it holds --snapshot-log-bytes, so it is always at least that large: with the
// two equal (the defaults: 256 MiB each) the newest old segment must still be kept.
TEST_F(Durability, ALeaderKeepsOldLogSegmentsWhenTheRetentionEqualsTheSegmentSize) {
  for (const std::uint64_t retain : {std::uint64_t{4096}, std::uint64_t{1} << 20}) {
    fs::remove_all(dir_);
    {
      metad::config cfg;
      cfg.data_dir = dir_;
      cfg.snapshot_log_bytes = 4096;
      cfg.repl_listen = "127.0.0.1:1";  // a node that may lead a standby
      cfg.repl_retain_log_bytes = retain;
      sim_node n(cfg, 1);
      n.post("/rank/0/initialize", R"({"num_pages":64})");
      churn(n);  // ~40 KiB of log: segments of ~4 KiB
    }
    std::uint64_t newest_snap = 0, oldest_log = UINT64_MAX;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (const auto at = name.find(".snap-"); at != std::string::npos)
        newest_snap = std::max<std::uint64_t>(newest_snap, std::stoull(name.substr(at + 6)));
      if (const auto at = name.find(".log-"); at != std::string::npos)
        oldest_log = std::min<std::uint64_t>(oldest_log, std::stoull(name.substr(at + 5)));
    }
    EXPECT_GE(newest_snap, 3u) << retain;
    EXPECT_LT(oldest_log, newest_snap) << "retain " << retain << ": no old segment kept";
  }
}

// The log segments kept for standbys hold on disk what they hold in bytes: the space the
// writer reserved past a segment's end (up to 16 MiB, log_writer::make_room) is given back
// when the next segment takes over, else each kept segment costs that much more.
TEST_F(Durability, KeptLogSegmentsHoldNoReservationPastTheirEnd) {
  {
    metad::config cfg;
    cfg.data_dir = dir_;
    cfg.snapshot_log_bytes = 4096;
    cfg.repl_listen = "127.0.0.1:1";
    cfg.repl_retain_log_bytes = 1 << 20;
    sim_node n(cfg, 1);
    n.post("/rank/0/initialize", R"({"num_pages":64})");
    churn(n);
  }
  std::uint64_t newest_snap = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    if (const auto at = name.find(".snap-"); at != std::string::npos)
      newest_snap = std::max<std::uint64_t>(newest_snap, std::stoull(name.substr(at + 6)));
  }
  std::size_t old = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    const auto at = name.find(".log-");
    if (at == std::string::npos || std::stoull(name.substr(at + 5)) >= newest_snap) continue;
    ++old;
    struct stat st {};
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    EXPECT_LE(static_cast<std::uint64_t>(st.st_blocks) * 512,
              (static_cast<std::uint64_t>(st.st_size) + 4095) / 4096 * 4096 + 4096)
        << name << ": " << st.st_size << " bytes";
  }
  EXPECT_GT(old, 0u);
}

TEST_F(Durability, ClearIsDurableToo) {
  {
    sim_node n(dir_, 2);
    populate(n, 5);
    n.post("/clear", "");
    n.post("/rank/9/initialize", R"({"num_pages":3})");
  }
  // Without tenants' states a clear is the bare record of old (older builds read it): no
  // record of the log is scoped to a tenant (record_kind::in_tenant).
  for (const auto& e : fs::recursive_directory_iterator(dir_)) {
    if (e.path().filename().string().find(".log-") == std::string::npos) continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string log{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    bool scoped = false;
    store::scan(log, [&](const store::record& r, std::size_t) { scoped = scoped || r.scoped; });
    EXPECT_FALSE(scoped) << e.path();
  }
  sim_node n(dir_, 2);
  EXPECT_EQ(n.get("/rank/0"), R"({"detail":"Rank 0 not initialized"})");
  EXPECT_EQ(n.get("/rank/9"), R"({"num_pages":3,"free":3,"reserved":0,"bound":0,"incomplete":0})");
}

// A log write that reached the file but whose fdatasync failed is not durable: the
// request is not acknowledged, and the records are written again once syncs succeed.
TEST_F(Durability, AFailedSyncIsNeverAcknowledged) {
  {
    sim_node n(dir_, 2);
    n.post("/rank/1/initialize", R"({"num_pages":4})");
    n.fail_sync = true;
    const std::string kStorage = "Storage unavailable";
    EXPECT_NE(n.post("/rank/2/initialize", R"({"num_pages":4})").find(kStorage), std::string::npos);
    EXPECT_NE(n.post("/keys/batch_allocate", R"({"rank":1,"keys":["a"]})").find(kStorage),
              std::string::npos);
    n.fail_sync = false;
    n.tick();  // the failed bytes are retried at the tick's pace
    EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":1,"keys":["b"]})"),
              R"({"rank":1,"results":[["b",1]]})");
  }
  sim_node n(dir_, 2);
  EXPECT_EQ(n.get("/rank/1"), R"({"num_pages":4,"free":2,"reserved":2,"bound":0,"incomplete":0})");
}

// A confirm whose log write fails is answered 503, yet its binding stays queued for the
// retried write: the directory counts it too, so live state is what a restart recovers,
// and the client's retry is answered 204 with the key complete (it used to stay
// incomplete until a restart).
TEST_F(Durability, AConfirmWhoseWriteFailedIsCountedAndItsRetrySucceeds) {
  const std::string kStorage = "Storage unavailable";
  std::string live;
  {
    sim_node n(dir_, 2);
    for (int r = 0; r < 2; ++r) {
      n.post("/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":4})");
      n.post("/keys/batch_allocate", "{\"rank\":" + std::to_string(r) + R"(,"keys":["k"]})");
    }
    EXPECT_EQ(n.post("/keys/confirm_write", R"({"rank":0,"confirmations":[["k",0]]})"), "");
    n.fail_sync = true;
    EXPECT_NE(
        n.post("/keys/confirm_write", R"({"rank":1,"confirmations":[["k",0]]})").find(kStorage),
        std::string::npos);
    n.fail_sync = false;
    n.tick();  // the failed bytes are retried at the tick's pace
    EXPECT_EQ(n.post("/keys/confirm_write", R"({"rank":1,"confirmations":[["k",0]]})"), "");
    EXPECT_EQ(n.post("/keys/batch_exists", R"({"keys":["k"]})"), R"({"exists":[true]})");
    live = n.get("/rank/1") + n.post("/keys/get_locations", R"({"rank":1,"keys":["k"]})");
    EXPECT_EQ(live, R"({"num_pages":4,"free":3,"reserved":0,"bound":1,"incomplete":0})"
                    R"({"locations":[0]})");
  }
  sim_node n(dir_, 2);
  EXPECT_EQ(n.get("/rank/1") + n.post("/keys/get_locations", R"({"rank":1,"keys":["k"]})"), live);
}

// Released pages are quarantined (see rank_table); the quarantine and its end are
// logged, so allocation after a restart takes the same pages, and a quarantine that was
// running at the restart lasts its full time again. The second restart reads the first
// one's snapshot.
TEST_F(Durability, QuarantinesSurviveRestartsFromTheLogAndFromSnapshots) {
  {
    sim_node n(dir_, 2);
    n.post("/rank/1/initialize", R"({"num_pages":4})");
    EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":1,"keys":["a","b"]})"),
              R"({"rank":1,"results":[["a",0],["b",1]]})");
    n.post("/keys/confirm_write", R"({"rank":1,"confirmations":[],"pages_to_release":[0]})");
    n.now += 5'000;
    n.tick();  // page 0's quarantine ends
    n.post("/keys/confirm_write", R"({"rank":1,"confirmations":[],"pages_to_release":[1]})");
  }
  for (int restart = 0; restart < 2; ++restart) {
    SCOPED_TRACE(restart == 0 ? "from the log" : "from the snapshot");
    sim_node n(dir_, 3);
    EXPECT_EQ(n.get("/rank/1"),
              R"({"num_pages":4,"free":4,"reserved":0,"bound":0,"incomplete":0})");
    if (restart == 1) {
      EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":1,"keys":["c","d","e","f"]})"),
                R"({"rank":1,"results":[["c",0],["d",2],["e",3],["f",1]]})")
          << "free pages lowest first, then the quarantined one";
    }
    EXPECT_EQ(pipeline::check_consistency(n.state()), "");
  }
}

// A worker re-initialising its rank with fewer pages (a lowered hf3fs_file_size) is
// answered 200: pages past the new end no longer exist, so the keys bound there lose
// that binding and are incomplete; one record, recovered the same way.
TEST_F(Durability, AShrinkUnbindsTheKeysPastTheNewEndAndSurvivesRestarts) {
  const std::string keys = R"({"keys":["k0","k1","k2","k3"]})";
  auto state = [&](sim_node& n) {
    return n.get("/rank/0") + "\n" + n.get("/rank/1") + "\n" + n.post("/keys/batch_exists", keys) +
           "\n" + n.post("/keys/get_locations", R"({"rank":0,"keys":["k0","k1","k2","k3"]})");
  };
  const std::string want = R"({"num_pages":4,"free":0,"reserved":0,"bound":4,"incomplete":2})"
                           "\n"
                           R"({"num_pages":2,"free":0,"reserved":0,"bound":2,"incomplete":0})"
                           "\n"
                           R"({"exists":[true,true,false,false]})"
                           "\n"
                           R"({"locations":[0,1,null,null]})";
  {
    sim_node n(dir_, 2);
    for (int r = 0; r < 2; ++r)
      n.post("/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":4})");
    for (int r = 0; r < 2; ++r) {
      const std::string rank = std::to_string(r);
      n.post("/keys/batch_allocate", R"({"rank":)" + rank + R"(,"keys":["k0","k1","k2","k3"]})");
      n.post("/keys/confirm_write",
             R"({"rank":)" + rank + R"(,"confirmations":[["k0",0],["k1",1],["k2",2],["k3",3]]})");
    }
    EXPECT_EQ(n.post("/rank/1/initialize", R"({"num_pages":2})"),
              R"({"message":"Rank 1 initialized with 2 pages"})");
    EXPECT_EQ(state(n), want);
    EXPECT_EQ(pipeline::check_consistency(n.state()), "");
  }
  for (int restart = 0; restart < 2; ++restart) {
    sim_node n(dir_, 3 - restart);
    EXPECT_EQ(state(n), want);
    EXPECT_EQ(pipeline::check_consistency(n.state()), "");
  }
}

// Restarting with --release-quarantine-ms 0 frees the quarantined pages for good: the
// new generation must then not reuse (hard-link) the snapshot that still lists them, or
// the next restart would replay later allocations against the wrong free pages.
TEST_F(Durability, TurningTheQuarantineOffFreesItsPagesForGood) {
  {
    sim_node n(dir_, 1);
    n.post("/rank/0/initialize", R"({"num_pages":4})");
    n.post("/keys/batch_allocate", R"({"rank":0,"keys":["a","b"]})");
    n.post("/keys/confirm_write", R"({"rank":0,"confirmations":[],"pages_to_release":[0]})");
  }
  { sim_node n(dir_, 1); }  // the next start finds a snapshot with nothing logged after it
  {
    metad::config cfg;
    cfg.data_dir = dir_;
    cfg.release_quarantine_ms = 0;
    sim_node n(cfg, 1);
    EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":0,"keys":["c"]})"),
              R"({"rank":0,"results":[["c",0]]})");
  }
  sim_node n(dir_, 1);
  EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":0,"keys":["c","d"]})"),
            R"({"rank":0,"results":[["c",0],["d",2]]})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

TEST_F(Durability, CorruptRecordInTheMiddleStopsStartUp) {
  {
    sim_node n(dir_, 1);
    populate(n, 5);
  }
  std::string log_path;
  for (const auto& e : fs::recursive_directory_iterator(dir_))
    if (e.path().filename().string().find(".log-") != std::string::npos &&
        fs::file_size(e.path()) > 64)
      log_path = e.path().string();
  ASSERT_FALSE(log_path.empty());
  {
    std::fstream f(log_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('\x7f');
  }
  try {
    sim_node n(dir_, 1);
    FAIL() << "start-up must refuse a corrupt log";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(log_path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset 0"), std::string::npos) << e.what();
  }
}

// Keys of 32 lowercase hex characters take the compact path (packed snapshot chunks,
// bulk-built tables); the same history must read the same after every kind of restart.
// wide_hex_keys: keys of the wide form's shapes too, mixed with 32-hex ones.
bool wide_hex_keys = false;

std::string hex_key(int i) {
  char text[33];
  std::snprintf(text, sizeof text, "%016x%016x", 0xabcdefu + static_cast<unsigned>(i),
                static_cast<unsigned>(i) * 2654435761u);
  if (!wide_hex_keys || i % 3 == 0) return text;
  // i % 3 == 1: 64 lowercase hex; 2: the previous key's text in uppercase (another key).
  if (i % 3 == 2) {
    std::string key = hex_key(i - 1);
    for (char& c : key) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return key;
  }
  char first[33];
  std::snprintf(first, sizeof first, "%016x%016x", static_cast<unsigned>(i) * 40503u,
                0x5eedu + static_cast<unsigned>(i));
  return std::string(first) + text;
}

// Requests of at most kBatch keys (the test node's request buffer is bounded).
constexpr int kBatch = 200;

std::string hex_list(int first, int end, int step = 1) {
  std::string list;
  for (int i = first; i < end; i += step) list += (i > first ? ",\"" : "\"") + hex_key(i) + "\"";
  return list;
}

std::string hex_state(sim_node& n, int keys) {
  std::string s;
  for (int r = 0; r < 4; ++r) s += n.get("/rank/" + std::to_string(r)) + "\n";
  for (int first = 0; first < keys; first += kBatch) {
    const std::string list = hex_list(first, std::min(keys, first + kBatch));
    s += n.post("/keys/batch_exists", "{\"keys\":[" + list + "]}") + "\n";
    for (int r = 0; r < 4; ++r)
      s += n.post("/keys/get_locations",
                  "{\"rank\":" + std::to_string(r) + ",\"keys\":[" + list + "]}") +
           "\n";
  }
  return s;
}

// Ranks 0-3 confirm keys [from, to) but rank 2 only the even ones (the odd keys stay
// incomplete). from: even.
void hex_save(sim_node& n, int from, int to) {
  for (int r = 0; r < 4; ++r) {
    const int step = r == 2 ? 2 : 1;
    for (int first = from; first < to; first += kBatch) {
      const int end = std::min(to, first + kBatch);
      const std::string reply =
          n.post("/keys/batch_allocate", "{\"rank\":" + std::to_string(r) + ",\"keys\":[" +
                                             hex_list(first, end, step) + "]}");
      std::string confirmations;
      for (int i = first; i < end; i += step) {
        const std::string key = hex_key(i);
        const std::size_t at = reply.find(key);
        ASSERT_NE(at, std::string::npos) << reply;
        const std::string page =
            reply.substr(at + key.size() + 2, reply.find(']', at) - at - key.size() - 2);
        confirmations += (i > first ? ",[\"" : "[\"") + key + "\"," + page + "]";
      }
      n.post("/keys/confirm_write",
             "{\"rank\":" + std::to_string(r) + ",\"confirmations\":[" + confirmations + "]}");
    }
  }
}

// Ranks 0-3 of 4096 pages confirm keys 0..n-1 (hex_save), and rank 3 holds reservations
// of two keys never confirmed.
void hex_populate(sim_node& n, int keys) {
  for (int r = 0; r < 4; ++r)
    n.post("/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":4096})");
  hex_save(n, 0, keys);
  n.post("/keys/batch_allocate",
         "{\"rank\":3,\"keys\":[\"" + hex_key(keys) + "\",\"" + hex_key(keys + 1) + "\"]}");
}

// hex_state of a one-core node that never restarted, filled by hex_populate (in `dir`,
// removed after).
// more: then keys [keys, more) saved too (hex_save).
std::string reference_hex_state(const std::string& dir, int keys, int more = 0) {
  std::string state;
  {
    sim_node reference(dir, 1);
    hex_populate(reference, keys);
    hex_save(reference, keys, std::max(keys, more));
    state = hex_state(reference, std::max(keys, more));
  }
  fs::remove_all(dir);
  return state;
}

TEST_F(Durability, HexKeysSurviveLogSnapshotAndCoreCountRestarts) {
  constexpr int kKeys = 3000;  // several growths of each table when replayed from the log
  const std::string expected = reference_hex_state(dir_ + "-reference", kKeys);
  {
    sim_node n(dir_, 2);
    hex_populate(n, kKeys);
  }
  {
    sim_node n(dir_, 2);  // from the log
    EXPECT_EQ(hex_state(n, kKeys), expected);
  }
  {
    sim_node n(dir_, 2);  // from the compact snapshots the previous start wrote (linked again)
    EXPECT_EQ(hex_state(n, kKeys), expected);
  }
  {
    sim_node n(dir_, 3);  // the snapshots of two cores read by three
    EXPECT_EQ(hex_state(n, kKeys), expected);
  }
  sim_node n(dir_, 1);
  EXPECT_EQ(hex_state(n, kKeys), expected);
}

// Snapshots hold the rank tables as images (issue 35: a restart lays each out again,
// with no lookup a key), or load one key by key when the log after the snapshot would
// make its table grow. Either way the state reads as a node's that never restarted;
// the recovery's log line says which way each table came back.
TEST_F(Durability, RankTablesComeBackFromTheirImagesOrKeyByKey) {
  constexpr int kFirst = 1000, kFew = 1050, kAll = 4000;
  const std::string expected = reference_hex_state(dir_ + "-reference", kFirst, kAll);
  const std::string few = reference_hex_state(dir_ + "-few", kFirst, kFew);
  // Starts a node of `cores` on the directory; its recovery's counts of rank tables laid
  // out from images and of images loaded key by key.
  auto images = [&](int cores, const std::function<void(sim_node&)>& then) {
    ::testing::internal::CaptureStderr();
    std::pair<int, int> counts{-1, -1};
    {
      sim_node n(dir_, cores);
      const std::string log = ::testing::internal::GetCapturedStderr();
      const std::size_t at = log.find(" rank table(s) laid out from images, ");
      EXPECT_NE(at, std::string::npos) << log;
      if (at != std::string::npos) {
        counts.first = std::stoi(log.substr(log.rfind('(', at) + 1));
        counts.second =
            std::stoi(log.substr(at + std::strlen(" rank table(s) laid out from images, ")));
      }
      then(n);
    }
    return counts;
  };
  auto nothing = [](sim_node&) {};
  {
    sim_node n(dir_, 2);
    hex_populate(n, kFirst);
  }
  // From the log: no image yet. The snapshots it writes hold one for each rank.
  EXPECT_EQ(images(2, nothing), std::make_pair(0, 0));
  std::size_t slot_records = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_)) {
    if (e.path().filename().string().find(".snap-") == std::string::npos) continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    store::scan(bytes, [&](const store::record& r, std::size_t) {
      slot_records += r.kind == store::record_kind::snapshot_rank_slots;
    });
  }
  EXPECT_GE(slot_records, 4u);
  // From the images, then a few keys more in the log: they fit the images' tables.
  EXPECT_EQ(images(2, [&](sim_node& n) { hex_save(n, kFirst, kFew); }), std::make_pair(4, 0));
  // The images and the log after them; then 2,950 keys more, which outgrow them.
  EXPECT_EQ(images(2,
                   [&](sim_node& n) {
                     EXPECT_EQ(hex_state(n, kFew), few);
                     hex_save(n, kFew, kAll);
                   }),
            std::make_pair(4, 0));
  EXPECT_EQ(images(2, [&](sim_node& n) { EXPECT_EQ(hex_state(n, kAll), expected); }),
            std::make_pair(0, 4));
  // The new images, by two cores and by three (each rank's image in one former core's file).
  EXPECT_EQ(images(2, [&](sim_node& n) { EXPECT_EQ(hex_state(n, kAll), expected); }),
            std::make_pair(4, 0));
  EXPECT_EQ(images(3, [&](sim_node& n) { EXPECT_EQ(hex_state(n, kAll), expected); }),
            std::make_pair(4, 0));
}

// A version-1 standby reads no rank image: the leader cuts its snapshot without them
// (serialize_state's images = false), and both forms hold the same state.
// A tenant's own rank tables (issue 34) go into snapshots as images too, scoped to the
// tenant, and a restart lays them out again as the unnamed state's; each tenant's state
// comes back apart.
TEST_F(Durability, TenantsRankTablesComeBackFromTheirImagesToo) {
  const auto publish = [](sim_node& n) {
    std::string text;
    for (const char* name : {"t", "u"}) {
      std::string hex;
      for (const unsigned char b : pipeline::token_sha256(std::string("token-") + name)) {
        static constexpr char kDigits[] = "0123456789abcdef";
        hex += kDigits[b >> 4];
        hex += kDigits[b & 15];
      }
      text += std::string(name) + " " + hex + (name[0] == 't' ? " vllm\n" : "\n");
    }
    auto table = std::make_shared<pipeline::tenant_table>();
    ASSERT_EQ(pipeline::parse_tenants(text, pipeline::kPatterns, *table), "");
    n.state().tenants.publish(std::move(table));
  };
  const auto as = [](sim_node& n, const std::string& tenant, const std::string& path,
                     const std::string& body) {
    const std::string answer =
        n.send("POST " + path + " HTTP/1.1\r\nauthorization: Bearer token-" + tenant +
               "\r\ncontent-length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    return answer.substr(answer.find("\r\n\r\n") + 4);
  };
  // Each tenant: ranks 0 and 1, keys [from, from + 600) saved on both.
  const auto fill = [&](sim_node& n, const std::string& tenant, int from) {
    for (int r = 0; r < 2; ++r) {
      as(n, tenant, "/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":4096})");
      for (int first = from; first < from + 600; first += kBatch) {
        const std::string reply = as(n, tenant, "/keys/batch_allocate",
                                     "{\"rank\":" + std::to_string(r) + ",\"keys\":[" +
                                         hex_list(first, first + kBatch) + "]}");
        const std::size_t list = reply.find("\"results\":[") + 11;
        as(n, tenant, "/keys/confirm_write",
           "{\"rank\":" + std::to_string(r) + ",\"confirmations\":[" +
               reply.substr(list, reply.rfind(']') - list) + "]}");
      }
    }
  };
  const auto state = [&](sim_node& n) {
    std::string out;
    for (const char* tenant : {"t", "u"})
      for (const int first : {0, 200, 600, 800})
        out +=
            as(n, tenant, "/keys/batch_exists", "{\"keys\":[" + hex_list(first, first + 3) + "]}") +
            as(n, tenant, "/keys/get_locations",
               "{\"rank\":1,\"keys\":[" + hex_list(first, first + 3) + "]}") +
            "\n";
    return out;
  };
  // The recovery's counts of rank tables laid out from images and loaded key by key.
  const auto images = [&](int cores, std::string* seen) {
    ::testing::internal::CaptureStderr();
    std::pair<int, int> counts{-1, -1};
    {
      sim_node n(dir_, cores);
      publish(n);
      const std::string log = ::testing::internal::GetCapturedStderr();
      constexpr std::string_view kLaid = " rank table(s) laid out from images, ";
      if (const std::size_t at = log.find(kLaid); at != std::string::npos)
        counts = {std::stoi(log.substr(log.rfind('(', at) + 1)),
                  std::stoi(log.substr(at + kLaid.size()))};
      if (seen != nullptr) *seen = state(n);
    }
    return counts;
  };
  std::string expected;
  {
    sim_node n(dir_, 2);
    publish(n);
    fill(n, "t", 0);    // the unnamed state
    fill(n, "u", 400);  // u's own: keys 400..599 in both, the same key names
    expected = state(n);
  }
  EXPECT_NE(expected.find(R"({"exists":[true,true,true]})"), std::string::npos) << expected;
  EXPECT_NE(expected.find(R"({"exists":[false,false,false]})"), std::string::npos) << expected;
  EXPECT_EQ(images(2, nullptr), std::make_pair(0, 0));  // from the log; then snapshots
  std::string seen;
  EXPECT_EQ(images(2, &seen), std::make_pair(4, 0));  // two ranks of t, two of u
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(images(3, &seen), std::make_pair(4, 0));
  EXPECT_EQ(seen, expected);
}

TEST_F(Durability, SnapshotsForAVersionOneStandbyHoldNoImage) {
  sim_node n(dir_, 1);
  hex_populate(n, 300);
  for (const bool images : {true, false}) {
    std::size_t slots = 0, keys = 0;
    persist::serialize_state(
        *n.state().core[0],
        [&](std::string_view piece) {
          store::scan(piece, [&](const store::record& r, std::size_t) {
            slots += r.kind == store::record_kind::snapshot_rank_slots ? r.item_count() : 0;
            keys += r.kind == store::record_kind::snapshot_rank_keys ? r.item_count() : 0;
          });
        },
        images);
    // Ranks 0, 1 and 3 bind 300 keys, rank 2 the even ones; rank 3 reserves 2 more.
    EXPECT_EQ(slots + keys, 300u * 3 + 150 + 2) << images;
    EXPECT_EQ(slots, images ? 300u * 3 + 150 : 0u);
  }
}

// A snapshot's image is data from disk: a key twice, a key outside its two buckets, or a
// page twice stops start-up with the file named, as any damage does; an image of another
// layout (a build whose table hash differs) loads key by key.
TEST_F(Durability, ImagesThatNoTableCouldHoldStopStartUp) {
  constexpr std::uint64_t kBuckets = 16;
  packed_key k1, k2;
  ASSERT_TRUE(pack_hex_key(hex_key(1), k1));
  ASSERT_TRUE(pack_hex_key(hex_key(2), k2));
  auto buckets_of = [&](const packed_key& k) {
    const std::uint64_t h = packed_hash(k);
    return std::pair<std::uint64_t, std::uint64_t>{((h & 0xFFFFFFFFu) * kBuckets) >> 32,
                                                   ((h >> 32) * kBuckets) >> 32};
  };
  struct item {
    packed_key key;
    std::uint64_t slot;
    std::uint32_t page;
  };
  // A snapshot of rank 0 (64 pages) whose table is the image of `items` (in slot order).
  auto start_with = [&](std::vector<item> items, std::uint32_t layout) {
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/g1");
    std::ofstream(dir_ + "/CURRENT") << "1\n";
    std::string snap;
    store::append_snapshot_rank(snap, 0, 64);
    std::vector<std::uint8_t> masks(kBuckets);
    const std::size_t frame = store::begin_rank_slots(snap, 0, layout, kBuckets, 0, kBuckets);
    for (const item& i : items) {
      masks[i.slot / 4] |= static_cast<std::uint8_t>(1u << (i.slot % 4));
      store::add_packed_item(snap, {i.key.lo, i.key.hi, i.page | 1u << 31});
    }
    store::end_rank_slots(snap, frame, masks);
    std::ofstream(dir_ + "/g1/core-0.snap-1", std::ios::binary) << snap;
    std::ofstream(dir_ + "/g1/core-0.log-1", std::ios::binary);
    return std::make_unique<sim_node>(dir_, 1);
  };
  const auto [a1, a2] = buckets_of(k1);
  const auto [c1, c2] = buckets_of(k2);
  // k1 and k2 in their first buckets (slot order; slot 1 if they share one).
  const std::uint64_t s1 = a1 * 4, s2 = c1 * 4 + (c1 == a1 ? 1 : 0);
  std::vector<item> good = {{k1, s1, 3}, {k2, s2, 9}};
  std::sort(good.begin(), good.end(), [](const item& x, const item& y) { return x.slot < y.slot; });
  for (const std::uint32_t layout : {shard::packed_map::image_layout, 999u}) {
    auto n = start_with(good, layout);
    EXPECT_EQ(n->get("/rank/0"),
              R"({"num_pages":64,"free":62,"reserved":0,"bound":2,"incomplete":0})");
    EXPECT_EQ(n->post("/keys/get_locations",
                      "{\"rank\":0,\"keys\":[\"" + hex_key(1) + "\",\"" + hex_key(2) + "\"]}"),
              R"({"locations":[3,9]})");
  }
  std::uint64_t wrong = 0;
  while (wrong == a1 || wrong == a2) ++wrong;
  const std::vector<std::vector<item>> bad = {
      {{k1, a1 * 4, 3}, {k1, a1 * 4 + 1, 4}},                              // twice, one bucket
      {{k1, std::min(a1, a2) * 4, 3}, {k1, std::max(a1, a2) * 4 + 1, 4}},  // twice, both
      {{k1, wrong * 4, 3}},                                                // not its bucket
      {{k1, s1, 3}, {k2, s2, 3}},                                          // a page twice
      {{k1, s1, 64}},                                                      // past the pages
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    try {
      auto n = start_with(bad[i], shard::packed_map::image_layout);
      ADD_FAILURE() << "case " << i << ": start-up must refuse the image";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be restored"), std::string::npos) << e.what();
    }
  }
  // An image that asks for a table far larger than its keys (here 2^32 buckets for one
  // key on a rank of 2^33 pages: 320 GiB) is not laid out: its key loads key by key.
  fs::remove_all(dir_);
  fs::create_directories(dir_ + "/g1");
  std::ofstream(dir_ + "/CURRENT") << "1\n";
  std::string snap;
  store::append_snapshot_rank(snap, 0, std::int64_t{1} << 33);
  const std::size_t frame = store::begin_rank_slots(snap, 0, shard::packed_map::image_layout,
                                                    std::uint64_t{1} << 32, 0, 1);
  store::add_packed_item(snap, {k1.lo, k1.hi, 3u | 1u << 31});
  store::end_rank_slots(snap, frame, std::vector<std::uint8_t>{1});
  std::ofstream(dir_ + "/g1/core-0.snap-1", std::ios::binary) << snap;
  std::ofstream(dir_ + "/g1/core-0.log-1", std::ios::binary);
  sim_node n(dir_, 1);
  EXPECT_EQ(n.post("/keys/get_locations", "{\"rank\":0,\"keys\":[\"" + hex_key(1) + "\"]}"),
            R"({"locations":[3]})");
}

// A rank's page count is data from disk too: none, fewer or more than a rank may have
// stops start-up (it was an assertion's abort), naming the rank.
TEST_F(Durability, ARankOfAPageCountOutOfRangeStopsStartUp) {
  for (const std::int64_t pages :
       {std::int64_t{0}, std::int64_t{-5}, (std::int64_t{1} << 48) + 1}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/g1");
    std::ofstream(dir_ + "/CURRENT") << "1\n";
    std::string snap, log;
    store::append_snapshot_rank(snap, 0, 16);
    store::append_initialize(log, 7, pages);
    std::ofstream(dir_ + "/g1/core-0.snap-1", std::ios::binary) << snap;
    std::ofstream(dir_ + "/g1/core-0.log-1", std::ios::binary) << log;
    try {
      sim_node n(dir_, 1);
      ADD_FAILURE() << pages << " pages: start-up must refuse the log";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 7 has " + std::to_string(pages) + " pages"),
                std::string::npos)
          << e.what();
    }
  }
}

// The same with 64-hex keys in both cases (the wide form; logged and snapshotted as
// strings) mixed with 32-hex ones: the uppercase key of a lowercase one's text is
// another key, after every kind of restart too.
TEST_F(Durability, WideHexKeysSurviveLogSnapshotAndCoreCountRestarts) {
  wide_hex_keys = true;
  ASSERT_EQ(hex_key(1).size(), 64u);
  ASSERT_NE(hex_key(1), hex_key(2));
  ASSERT_EQ(hex_key(2).size(), 64u);
  constexpr int kKeys = 900;
  const std::string expected = reference_hex_state(dir_ + "-reference", kKeys);
  {
    sim_node n(dir_, 2);
    hex_populate(n, kKeys);
    EXPECT_EQ(hex_state(n, kKeys), expected);
    // Case matters: key 5 is key 4's text in uppercase; rank 2 confirmed only key 4.
    std::string upper4 = hex_key(4);
    for (char& c : upper4) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(upper4, hex_key(5));
    EXPECT_EQ(
        n.post("/keys/batch_exists", "{\"keys\":[\"" + hex_key(4) + "\",\"" + hex_key(5) + "\"]}"),
        R"({"exists":[true,false]})");
  }
  {
    sim_node n(dir_, 2);  // from the log
    EXPECT_EQ(hex_state(n, kKeys), expected);
  }
  {
    sim_node n(dir_, 3);  // from the snapshots, by three cores
    EXPECT_EQ(hex_state(n, kKeys), expected);
  }
  wide_hex_keys = false;
}

// A data directory whose snapshot predates the compact records (one snapshot_entry per
// binding, one directory_key per key) still loads.
TEST_F(Durability, SnapshotOfTheFormerFormatStillLoads) {
  fs::create_directories(dir_ + "/g1");
  {
    std::ofstream(dir_ + "/CURRENT") << "1\n";
    const std::string snap = server_test::former_format_snapshot(hex_key);
    std::ofstream(dir_ + "/g1/core-0.snap-1", std::ios::binary) << snap;
    std::ofstream(dir_ + "/g1/core-0.log-1", std::ios::binary);
  }
  sim_node n(dir_, 2);
  EXPECT_EQ(n.get("/rank/0"),
            R"({"num_pages":16,"free":13,"reserved":0,"bound":3,"incomplete":1})");
  EXPECT_EQ(n.get("/rank/1"),
            R"({"num_pages":16,"free":14,"reserved":1,"bound":1,"incomplete":0})");
  EXPECT_EQ(n.post("/keys/batch_exists", "{\"keys\":[\"" + hex_key(1) + "\",\"" + hex_key(2) +
                                             "\",\"" + hex_key(3) + "\",\"odd key\"]}"),
            R"({"exists":[true,false,false,true]})");
  EXPECT_EQ(n.post("/keys/get_locations", "{\"rank\":1,\"keys\":[\"" + hex_key(1) + "\"]}"),
            R"({"locations":[5]})");
}

}  // namespace
