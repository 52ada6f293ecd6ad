// SGLang pools in the data directory: a restart (with the same or another core count,
// after a snapshot cut, after a vLLM /clear, after expiries) gives back every pool
// exactly: the same free stack order, bindings, LRU order, reservations and release
// quarantines, so that the next calls answer as on a server that never stopped. A
// request whose records the journal refuses changes nothing.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sim_node.hpp"
#include "store/record.hpp"

namespace {

namespace fs = std::filesystem;
using server_test::sim_node;

metad::config config(const std::string& dir, std::uint64_t snapshot_bytes) {
  metad::config cfg;
  cfg.data_dir = dir;
  cfg.snapshot_log_bytes = snapshot_bytes;
  cfg.reservation_ttl_ms = 10'000;
  cfg.sglang_read_lease_ms = 500;
  return cfg;
}

// A history on every kind of record: pools of two tenants and namespaces, a grown pool,
// saves with failed writes, reads, evictions (with leases), a delete, a clear with a
// write in flight across it, and vLLM traffic between them.
void sglang_history(sim_node& n) {
  auto post = [&n](std::string_view path, std::string_view body) {
    n.post(std::string(path), std::string(body));
  };
  post("/0/initialize", R"({"num_pages":8})");
  post("/0/initialize", R"({"num_pages":4,"namespace":"mamba"})");
  post("/t/1/initialize", R"({"num_pages":3})");
  post("/2/initialize", R"({"num_pages":2})");
  post("/2/initialize", R"({"num_pages":5})");
  post("/rank/0/initialize", R"({"num_pages":4,"role":"worker"})");
  post("/keys/batch_allocate", R"({"rank":0,"keys":["v1","v2"]})");
  post("/0/reserve_and_allocate_page_indices", R"({"keys":["a","b","c","d"]})");
  post("/0/confirm_write",
       R"({"written_keys_to_confirm":[["a",7],["b",6]],"pages_to_release":[5]})");
  post("/keys/confirm_write", R"({"rank":0,"confirmations":[["v1",0]]})");
  post("/0/get_page_indices", R"({"keys":["a"]})");
  n.now += 600;  // a's lease has ended
  post("/0/reserve_and_allocate_page_indices", R"({"keys":["e","f","g","h","i","j"]})");
  post("/0/confirm_write",
       R"({"written_keys_to_confirm":[["e",5],["f",3],["g",2],["h",1],["i",0]]})");
  post("/0/get_page_indices", R"({"keys":["f","a"]})");
  post("/0/reserve_and_allocate_page_indices", R"({"keys":["k","l"]})");
  post("/0/delete_keys", R"({"keys":["g","nope"]})");
  post("/t/1/reserve_and_allocate_page_indices", R"({"keys":["x","y"]})");
  post("/t/1/confirm_write", R"({"written_keys_to_confirm":[["x",2]]})");
  post("/t/1/clear", "{}");
  post("/t/1/confirm_write", R"({"written_keys_to_confirm":[["y",1]]})");
  post("/0/reserve_and_allocate_page_indices", R"({"keys":["z"],"namespace":"mamba"})");
  post("/2/reserve_and_allocate_page_indices", R"({"keys":["p","q"]})");
  post("/2/confirm_write", R"({"written_keys_to_confirm":[["p",4]]})");
}

// What the pools answer from here: their rows, then calls that depend on every part of
// their state (free order, bindings, LRU order, leases, reservations).
std::string sglang_probe(sim_node& n) {
  std::string out;
  const std::string stats = n.get("/stats");
  const std::size_t begin = stats.find(R"("sglang":{"pools":)");
  out +=
      begin == std::string::npos ? "no pools" : stats.substr(begin, stats.find(']', begin) - begin);
  out += "\n";
  const char* calls[][2] = {
      {"/0/exists", R"({"keys":["a","b","c","d","e","f","g","h","i","j","k","l"]})"},
      {"/0/get_page_indices", R"({"keys":["a","b","e","f","h","i","j"]})"},
      {"/0/confirm_write", R"({"written_keys_to_confirm":[["j",4],["k",6]]})"},
      {"/0/reserve_and_allocate_page_indices", R"({"keys":["m","n","o","a","p"]})"},
      {"/0/exists", R"({"keys":["z","w"],"namespace":"mamba"})"},
      {"/0/reserve_and_allocate_page_indices",
       R"({"keys":["w1","w2","w3","w4"],"namespace":"mamba"})"},
      {"/t/1/get_page_indices", R"({"keys":["x","y"]})"},
      {"/t/1/reserve_and_allocate_page_indices", R"({"keys":["r1","r2","r3","r4"]})"},
      {"/2/reserve_and_allocate_page_indices", R"({"keys":["p","q","s1","s2","s3","s4"]})"},
      {"/2/confirm_write", R"({"written_keys_to_confirm":[["q",3]]})"},
      {"/keys/batch_exists", R"({"keys":["v1","v2"]})"},
  };
  for (const auto& [path, body] : calls) out += n.post(path, body) + "\n";
  return out;
}

class SglangDurability : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::string safe;
    for (char c : name) safe.push_back(c == '/' ? '_' : c);
    dir_ = (fs::temp_directory_path() / ("metad-sglang-" + std::to_string(::getpid()) + "-" + safe))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The probe's answers on a server that never stopped, after `sglang_history`.
  std::string expected(int cores) {
    sim_node reference(config(dir_ + "-ref", 1u << 30), cores);
    sglang_history(reference);
    std::string want = sglang_probe(reference);
    fs::remove_all(dir_ + "-ref");
    return want;
  }

  std::string dir_;
};

INSTANTIATE_TEST_SUITE_P(Cores, SglangDurability, ::testing::Values(1, 3));

TEST_P(SglangDurability, ARestartGivesBackEveryPoolExactly) {
  const std::string want = expected(GetParam());
  {
    sim_node n(config(dir_, 1u << 30), GetParam());
    sglang_history(n);
  }
  for (int cores : {GetParam(), 4 - GetParam()}) {  // the same core count, then another
    SCOPED_TRACE(cores);
    std::string dir_copy = dir_ + "-copy";
    fs::remove_all(dir_copy);
    fs::copy(dir_, dir_copy, fs::copy_options::recursive);
    sim_node n(config(dir_copy, 1u << 30), cores);
    EXPECT_EQ(sglang_probe(n), want);
    EXPECT_EQ(pipeline::check_consistency(n.state()), "");
    fs::remove_all(dir_copy);
  }
}

TEST_P(SglangDurability, SnapshotCutsKeepThePools) {
  const std::string want = expected(GetParam());
  {
    sim_node n(config(dir_, 4096), GetParam());  // a cut every few requests
    sglang_history(n);
    n.post("/0/exists", "{}");
  }
  sim_node n(config(dir_, 4096), GetParam());
  EXPECT_EQ(sglang_probe(n), want);
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

TEST_P(SglangDurability, AVllmClearKeepsThePoolsAcrossARestart) {
  std::string want;
  {
    sim_node reference(config(dir_ + "-ref", 1u << 30), GetParam());
    sglang_history(reference);
    reference.post("/clear", "");
    want = sglang_probe(reference);
  }
  fs::remove_all(dir_ + "-ref");
  {
    sim_node n(config(dir_, 1u << 30), GetParam());
    sglang_history(n);
    n.post("/clear", "");
  }
  sim_node n(config(dir_, 1u << 30), GetParam());
  EXPECT_EQ(sglang_probe(n), want);
  EXPECT_NE(want.find(R"({"exists":[false,false]})"), std::string::npos);  // vLLM's are gone
}

TEST_P(SglangDurability, ExpiredReservationsStayExpired) {
  {
    sim_node n(config(dir_, 1u << 30), GetParam());
    n.post("/0/initialize", R"({"num_pages":3})");
    n.post("/0/reserve_and_allocate_page_indices", R"({"keys":["a","b"]})");
    n.now += 10'001;
    n.tick();
    n.post("/0/reserve_and_allocate_page_indices", R"({"keys":["c"]})");
  }
  sim_node n(config(dir_, 1u << 30), GetParam());
  // a's and b's pages went back (1 then 2 on top), c took 1... as before the restart.
  EXPECT_EQ(n.post("/0/reserve_and_allocate_page_indices", R"({"keys":["d","e","f"]})"),
            R"({"indices":[[false,2],[false,0],[false,-1]]})");
  EXPECT_EQ(n.post("/0/confirm_write", R"({"written_keys_to_confirm":[["a",2],["c",1]]})"), "");
  EXPECT_EQ(n.post("/0/get_page_indices", R"({"keys":["a","c"]})"), R"({"indices":[null,1]})");
}

}  // namespace

namespace {

TEST_P(SglangDurability, AFailedSyncIsA503AndTheRetrySucceeds) {
  sim_node n(config(dir_, 1u << 30), GetParam());
  EXPECT_EQ(n.post("/0/initialize", R"({"num_pages":2})"), "");
  n.fail_sync = true;
  EXPECT_EQ(n.post("/0/reserve_and_allocate_page_indices", R"({"keys":["a"]})"),
            R"({"detail":"Storage unavailable: the data directory cannot be written (disk full or )"
            R"(I/O error); nothing was changed or acknowledged, reads still work"})");
  n.fail_sync = false;
  n.tick();  // the failed bytes are retried at the tick's pace
  // The reservation was made (its record stays queued and is written with the next
  // flush), as the log will say: a retry reserves another page, and the first one
  // returns when its TTL ends.
  EXPECT_EQ(n.post("/0/reserve_and_allocate_page_indices", R"({"keys":["a"]})"),
            R"({"indices":[[false,0]]})");
  EXPECT_EQ(n.post("/0/confirm_write", R"({"written_keys_to_confirm":[["a",0]]})"), "");
  n.now += 10'001;
  n.tick();
  EXPECT_NE(n.get("/stats").find(R"("free":1,"in_flight":0,"bound":1)"), std::string::npos);
}

}  // namespace

namespace {

// How many records of `kind` the snapshot files under `dir` hold.
std::size_t snapshot_records(const std::string& dir, store::record_kind kind) {
  std::size_t count = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".snap-") == std::string::npos || name.ends_with(".tmp")) continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), {}};
    store::scan(bytes, [&](const store::record& r, std::size_t) { count += r.kind == kind; });
  }
  return count;
}

metad::config quarantine_config(const std::string& dir, std::uint64_t snapshot_bytes,
                                std::uint32_t quarantine_ms) {
  metad::config cfg = config(dir, snapshot_bytes);
  cfg.reservation_ttl_ms = 600'000;
  cfg.release_quarantine_ms = quarantine_ms;
  return cfg;
}

std::string sg_reserve(sim_node& n, std::string_view keys) {
  return n.post("/0/reserve_and_allocate_page_indices", fmt::format(R"({{"keys":[{}]}})", keys));
}
std::string sg_release(sim_node& n, int page) {
  return n.post("/0/confirm_write",
                fmt::format(R"({{"written_keys_to_confirm":[],"pages_to_release":[{}]}})", page));
}

// The release quarantine in the data directory: a quarantine logged (or in a snapshot)
// is one after the restart, for its full time again; its end is logged, so a page whose
// quarantine ended before the restart is free after it, where it was in the free stack.
TEST_P(SglangDurability, QuarantinesSurviveARestartAndEndWhereTheLogSays) {
  // The log alone; then a snapshot cut after every request.
  for (const std::uint64_t cut : {std::uint64_t{1} << 30, std::uint64_t{1}}) {
    SCOPED_TRACE(cut);
    fs::remove_all(dir_);
    {
      sim_node n(quarantine_config(dir_, cut, 5'000), GetParam());
      n.post("/0/initialize", R"({"num_pages":5})");
      // A pool beside it (on the same core), whose reads only add to the core's log.
      n.post("/0/initialize", R"({"num_pages":1,"namespace":"side"})");
      n.post("/0/reserve_and_allocate_page_indices", R"({"keys":["z"],"namespace":"side"})");
      n.post("/0/confirm_write", R"({"written_keys_to_confirm":[["z",0]],"namespace":"side"})");
      EXPECT_EQ(sg_reserve(n, R"("a","b","c")"), R"({"indices":[[false,4],[false,3],[false,2]]})");
      EXPECT_EQ(sg_release(n, 4), "");
      n.now += 3'000;
      EXPECT_EQ(sg_release(n, 3), "");
      n.now += 2'000;
      n.tick();  // 4's quarantine ends (logged), 3's runs on; c's reservation holds 2
      if (cut == 1) {
        // Until a snapshot holds the running quarantine: the restart recovers from it
        // (a cut comes after a request once the previous snapshot is written).
        for (int i = 0; i < 500; ++i) {
          if (snapshot_records(dir_, store::record_kind::sg_snapshot_quarantine) > 0) break;
          n.post("/0/get_page_indices", R"({"keys":["z"],"namespace":"side"})");
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        EXPECT_GT(snapshot_records(dir_, store::record_kind::sg_snapshot_quarantine), 0u);
      }
    }
    sim_node n(quarantine_config(dir_, cut, 5'000), GetParam());
    EXPECT_NE(n.get("/stats").find(R"("num_pages":5,"free":4,"in_flight":1,"bound":0)"),
              std::string::npos);
    EXPECT_EQ(sg_release(n, 3), "");  // a replay across the restart: nothing changes
    EXPECT_EQ(sg_reserve(n, R"("d")"), R"({"indices":[[false,4]]})");
    n.now += 4'999;  // 3's quarantine restarted with the server: 1 ms left
    n.tick();
    EXPECT_EQ(sg_reserve(n, R"("e")"), R"({"indices":[[false,1]]})");
    n.now += 1;
    n.tick();
    EXPECT_EQ(sg_reserve(n, R"("f")"), R"({"indices":[[false,3]]})");
    EXPECT_EQ(n.post("/0/confirm_write", R"({"written_keys_to_confirm":[["c",2],["f",3]]})"), "");
    EXPECT_EQ(n.post("/0/get_page_indices", R"({"keys":["c","f"]})"), R"({"indices":[2,3]})");
    EXPECT_EQ(pipeline::check_consistency(n.state()), "");
  }
}

// Restarted with --release-quarantine-ms 0: the quarantines the log holds end on the
// first tick, which logs their end (the next restart agrees).
TEST_P(SglangDurability, QuarantinesEndOnTheFirstTickWhenRestartedWithoutOne) {
  {
    sim_node n(quarantine_config(dir_, 1u << 30, 5'000), GetParam());
    n.post("/0/initialize", R"({"num_pages":4})");
    EXPECT_EQ(sg_reserve(n, R"("a","b")"), R"({"indices":[[false,3],[false,2]]})");
    EXPECT_EQ(sg_release(n, 3), "");
  }
  {
    sim_node n(quarantine_config(dir_, 1u << 30, 0), GetParam());
    EXPECT_EQ(sg_reserve(n, R"("c")"), R"({"indices":[[false,1]]})");
    n.tick();
    EXPECT_EQ(sg_release(n, 1), "");  // free at once, on top
    EXPECT_EQ(sg_reserve(n, R"("d","e")"), R"({"indices":[[false,1],[false,3]]})");
  }
  sim_node n(quarantine_config(dir_, 1u << 30, 0), GetParam());
  EXPECT_EQ(sg_reserve(n, R"("f","g")"), R"({"indices":[[false,0],[false,-1]]})");
  EXPECT_EQ(pipeline::check_consistency(n.state()), "");
}

// A journal that refuses the request's records (a failed write still queued): the
// request answers 503 and changes nothing, its reservation included (review row #13).
TEST_P(SglangDurability, ARequestWhoseRecordsTheJournalRefusesChangesNothing) {
  sim_node n(config(dir_, 1u << 30), GetParam());
  EXPECT_EQ(n.post("/0/initialize", R"({"num_pages":2})"), "");
  n.fail_sync = true;
  const std::string unavailable =
      R"({"detail":"Storage unavailable: the data directory cannot be written (disk full or )"
      R"(I/O error); nothing was changed or acknowledged, reads still work"})";
  // Applied and logged, but not synced: 503 (the log holds it, the retry below writes it).
  EXPECT_EQ(sg_reserve(n, R"("a")"), unavailable);
  // The failed bytes are still queued: the journal refuses more, before any change.
  EXPECT_EQ(sg_reserve(n, R"("b")"), unavailable);
  EXPECT_EQ(n.post("/0/confirm_write", R"({"written_keys_to_confirm":[["a",1]]})"), unavailable);
  n.fail_sync = false;
  n.tick();  // the failed bytes are written
  EXPECT_NE(n.get("/stats").find(R"("num_pages":2,"free":1,"in_flight":1,"bound":0)"),
            std::string::npos)
      << n.get("/stats");
  EXPECT_EQ(n.post("/0/exists", R"({"keys":["a","b"]})"), R"({"exists":[false,false]})");
  EXPECT_EQ(sg_reserve(n, R"("c")"), R"({"indices":[[false,0]]})");
}

}  // namespace
