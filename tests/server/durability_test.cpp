// Durability without sockets: requests through the pipeline with a data directory, the
// group commit driven by hand, then recovery into clusters of other core counts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "node.hpp"

namespace {

namespace fs = std::filesystem;
using server_test::node;

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
  static void populate(node& n, int keys) {
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

  static std::string state_of(node& n, int keys) {
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
    node reference(dir_ + "-reference", 1);  // the same history, never restarted
    populate(reference, 20);
    expected = state_of(reference, 20);
  }
  fs::remove_all(dir_ + "-reference");
  {
    node n(dir_, 2);
    populate(n, 20);
  }
  {
    node n(dir_, 3);  // three cores now own the ranks and keys two used to
    EXPECT_EQ(state_of(n, 20), expected);
  }
  node again(dir_, 1);
  EXPECT_EQ(again.get("/rank/0"),
            R"({"num_pages":64,"free":44,"reserved":0,"bound":20,"incomplete":20})");
  EXPECT_EQ(again.get("/rank/2"),
            R"({"num_pages":64,"free":61,"reserved":3,"bound":0,"incomplete":0})");
}

TEST_F(Durability, SnapshotsReplaceOldSegmentsAndRecover) {
  {
    node n(dir_, 2, 4096);  // snapshot every few KiB of log
    populate(n, 60);
  }
  std::size_t snapshots = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_))
    if (e.path().filename().string().find(".snap-") != std::string::npos) ++snapshots;
  EXPECT_GE(snapshots, 2u);
  node n(dir_, 3);
  EXPECT_EQ(n.get("/rank/1"),
            R"({"num_pages":64,"free":4,"reserved":0,"bound":60,"incomplete":60})");
  EXPECT_EQ(n.get("/rank/2"),
            R"({"num_pages":64,"free":62,"reserved":2,"bound":0,"incomplete":0})");
}

TEST_F(Durability, ClearIsDurableToo) {
  {
    node n(dir_, 2);
    populate(n, 5);
    n.post("/clear", "");
    n.post("/rank/9/initialize", R"({"num_pages":3})");
  }
  node n(dir_, 2);
  EXPECT_EQ(n.get("/rank/0"), R"({"detail":"Rank 0 not initialized"})");
  EXPECT_EQ(n.get("/rank/9"), R"({"num_pages":3,"free":3,"reserved":0,"bound":0,"incomplete":0})");
}

// A log write that reached the file but whose fdatasync failed is not durable: the
// request is not acknowledged, and the records are written again once syncs succeed.
TEST_F(Durability, AFailedSyncIsNeverAcknowledged) {
  {
    node n(dir_, 2);
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
  node n(dir_, 2);
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
    node n(dir_, 2);
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
  node n(dir_, 2);
  EXPECT_EQ(n.get("/rank/1") + n.post("/keys/get_locations", R"({"rank":1,"keys":["k"]})"), live);
}

// Released pages are quarantined (see rank_table); the quarantine and its end are
// logged, so allocation after a restart takes the same pages, and a quarantine that was
// running at the restart lasts its full time again. The second restart reads the first
// one's snapshot.
TEST_F(Durability, QuarantinesSurviveRestartsFromTheLogAndFromSnapshots) {
  {
    node n(dir_, 2);
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
    node n(dir_, 3);
    EXPECT_EQ(n.get("/rank/1"),
              R"({"num_pages":4,"free":4,"reserved":0,"bound":0,"incomplete":0})");
    if (restart == 1) {
      EXPECT_EQ(n.post("/keys/batch_allocate", R"({"rank":1,"keys":["c","d","e","f"]})"),
                R"({"rank":1,"results":[["c",0],["d",2],["e",3],["f",1]]})")
          << "free pages lowest first, then the quarantined one";
    }
    EXPECT_EQ(server::check_consistency(n.cluster()), "");
  }
}

// A worker re-initialising its rank with fewer pages (a lowered hf3fs_file_size) is
// answered 200: pages past the new end no longer exist, so the keys bound there lose
// that binding and are incomplete; one record, recovered the same way.
TEST_F(Durability, AShrinkUnbindsTheKeysPastTheNewEndAndSurvivesRestarts) {
  const std::string keys = R"({"keys":["k0","k1","k2","k3"]})";
  auto state = [&](node& n) {
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
    node n(dir_, 2);
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
    EXPECT_EQ(server::check_consistency(n.cluster()), "");
  }
  for (int restart = 0; restart < 2; ++restart) {
    node n(dir_, 3 - restart);
    EXPECT_EQ(state(n), want);
    EXPECT_EQ(server::check_consistency(n.cluster()), "");
  }
}

TEST_F(Durability, CorruptRecordInTheMiddleStopsStartUp) {
  {
    node n(dir_, 1);
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
    node n(dir_, 1);
    FAIL() << "start-up must refuse a corrupt log";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(log_path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset 0"), std::string::npos) << e.what();
  }
}

}  // namespace
