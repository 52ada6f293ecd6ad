// Writes data_dir_fuzz's seed corpus (tests/fuzz/corpus/data_dir_fuzz/): real data
// directories, made by a node with --data-dir (server_test::sim_node: the pipeline,
// recovery, the group commit and snapshot cuts) served requests of both APIs and
// restarted, so that the seeds hold what a server writes: every record kind a request
// logs, and snapshots in the compact form (snapshot_rank_slots images,
// snapshot_rank_keys, snapshot_directory_keys, SGLang pool images, quarantines). A few
// seeds are made by hand with store's appenders: the form before the compact one, an
// image of another layout, and the SGLang records only a quota or a spent memory budget
// logs. Each seed is one former core's newest snapshot and the log after it, in the
// harness's framing (data_dir_fuzz.cpp). Not a fuzzer; the fuzz build makes it:
//   build-fuzz/tests/fuzz/data_dir_seeds tests/fuzz/corpus/data_dir_fuzz
#include <fmt/format.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "former_format.hpp"
#include "pipeline/routes.hpp"
#include "pipeline/tenants.hpp"
#include "shard/packed_key.hpp"
#include "shard/packed_map.hpp"
#include "sim_node.hpp"
#include "store/record.hpp"

namespace {

namespace fs = std::filesystem;
using server_test::sim_node;

// Byte 0 of an input (data_dir_fuzz.cpp): bits 0-1 the recovering node's cores (% 3 + 1),
// bit 2 fix the frames' checksums.
constexpr std::uint8_t kFixChecksums = 1u << 2;

std::string out_dir;
const std::string work_dir = "/tmp/metad-data-dir-seeds-" + std::to_string(::getpid());
int seeds = 0;

std::string hex_key(int i) {
  const auto n = static_cast<std::uint64_t>(i + 1);
  return fmt::format("{:016x}{:016x}", 0x9E3779B97F4A7C15ull * n, 0xC2B2AE3D27D4EB4Full * n);
}

// The pages an answer lists: each number between a comma and a closing bracket
// (batch_allocate's [key,page], reserve_and_allocate_page_indices' [exists,page]).
std::vector<std::string> pages_in(const std::string& answer) {
  static const std::regex page(R"(,(-?[0-9]+)\])");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(answer.begin(), answer.end(), page);
       it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_seed(const std::string& name, std::uint8_t options, const std::string& snapshot,
                const std::string& log) {
  if (snapshot.size() > 0xFFFF || snapshot.size() + log.size() + 3 > 32768) {
    std::fprintf(stderr, "seed %s is too long for the fuzzer's -max_len\n", name.c_str());
    std::exit(1);
  }
  std::string input;
  input.push_back(static_cast<char>(options));
  input.push_back(static_cast<char>(snapshot.size() & 0xFF));
  input.push_back(static_cast<char>(snapshot.size() >> 8));
  input += snapshot;
  input += log;
  std::ofstream(out_dir + "/" + name, std::ios::binary) << input;
  ++seeds;
}

// Each former core's newest snapshot and the log segments after it (concatenated: one
// segment's records follow the last of the one before), as seeds for 1, 2 and 3 cores.
void seeds_from(const std::string& name, const std::string& dir) {
  const std::string generation = "g" + read_file(dir + "/CURRENT").substr(0, 1);
  std::map<int, std::map<std::uint64_t, fs::path>> snaps, logs;
  for (const auto& entry : fs::directory_iterator(dir + "/" + generation)) {
    int core = 0;
    char kind[8] = {};
    unsigned long long segment = 0;
    const std::string file = entry.path().filename().string();
    if (std::sscanf(file.c_str(), "core-%d.%4[a-z]-%llu", &core, kind, &segment) != 3) continue;
    (std::string(kind) == "snap" ? snaps : logs)[core][segment] = entry.path();
  }
  for (const auto& [core, by_segment] : logs) {
    std::uint64_t from = 0;
    std::string snapshot, log;
    if (!snaps[core].empty()) {
      from = snaps[core].rbegin()->first;
      snapshot = read_file(snaps[core].rbegin()->second);
    }
    for (const auto& [segment, path] : by_segment)
      if (segment >= from) log += read_file(path);
    for (std::uint8_t cores = 0; cores < 3; ++cores)
      write_seed(fmt::format("{}-core{}-into{}", name, core, cores + 1), kFixChecksums | cores,
                 snapshot, log);
  }
}

metad::config config_for(std::uint32_t quarantine_ms = 5'000) {
  metad::config cfg;
  cfg.data_dir = work_dir;
  cfg.release_quarantine_ms = quarantine_ms;
  return cfg;
}

void expect(const std::string& got, const std::string& want, const char* what) {
  if (got != want) {
    std::fprintf(stderr, "%s: got %s, want %s\n", what, got.c_str(), want.c_str());
    std::exit(1);
  }
}

std::string key_list(int from, int to, bool pairs) {
  std::string out;
  for (int i = from; i < to; ++i)
    out += (i > from ? "," : "") +
           (pairs ? "[\"" + hex_key(i) + "\",\"\"]" : "\"" + hex_key(i) + "\"");
  return out;
}

// A save of keys [from, to) on ranks [0, ranks): each confirmed on the page
// batch_allocate gave it (complete once every initialised rank holds it).
void save(sim_node& n, int from, int to, int ranks) {
  for (int r = 0; r < ranks; ++r) {
    const std::string rank = std::to_string(r);
    // {"rank":r,"results":[["key",page],...]}: each pair is a confirmation as it is.
    const std::string allocated =
        n.post("/keys/batch_allocate",
               "{\"rank\":" + rank + ",\"keys\":[" + key_list(from, to, true) + "]}");
    const std::size_t list = allocated.find("\"results\":[") + 11;
    const std::string confirmations = allocated.substr(list, allocated.rfind(']') - list);
    n.post("/keys/confirm_write",
           "{\"rank\":" + rank + ",\"confirmations\":[" + confirmations + "]}");
  }
}

// vLLM's API: ranks, saves, open reservations, a failed write's release (quarantined),
// non-hex keys; a restart (the snapshot: images, packed keys, entries, quarantines, the
// directory); then the log: more saves, a delete, quarantines ending, reservations
// expiring.
void vllm_flow() {
  fs::remove_all(work_dir);
  std::vector<std::string> failed;  // rank 3's pages of writes that failed
  {
    sim_node n(config_for(), 1);
    for (int r = 0; r < 4; ++r)
      n.post("/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":256})");
    save(n, 0, 40, 4);
    std::string all_true;
    for (int i = 0; i < 40; ++i) all_true += i ? ",true" : "true";
    expect(n.post("/keys/batch_exists", "{\"keys\":[" + key_list(0, 40, false) + "]}"),
           "{\"exists\":[" + all_true + "]}", "a save is complete");
    n.post("/keys/batch_allocate", R"({"rank":0,"keys":[["odd key",""],["other/key",""]]})");
    n.post("/keys/confirm_write", R"({"rank":0,"confirmations":[["odd key",40]]})");
    n.post("/keys/batch_allocate", "{\"rank\":2,\"keys\":[[\"" + hex_key(100) + "\",\"\"],[\"" +
                                       hex_key(101) + "\",\"\"]]}");
    failed = pages_in(n.post("/keys/batch_allocate",
                             "{\"rank\":3,\"keys\":[[\"" + hex_key(102) + "\",\"\"],[\"" +
                                 hex_key(103) + "\",\"\"],[\"" + hex_key(104) + "\",\"\"]]}"));
    // Two of them failed: released, quarantined (the third stays reserved).
    n.post("/keys/confirm_write", "{\"rank\":3,\"confirmations\":[],\"pages_to_release\":[" +
                                      failed.at(0) + "," + failed.at(1) + "]}");
    seeds_from("vllm-first-run", work_dir);
  }
  {
    sim_node n(config_for(), 1);  // recovers, and writes the state as a snapshot
    seeds_from("vllm-restarted", work_dir);
    save(n, 40, 60, 2);  // incomplete keys
    n.post("/keys/delete",
           "{\"keys\":[\"" + hex_key(3) + "\",\"" + hex_key(4) + "\",\"odd key\"]}");
    n.post("/keys/confirm_write",
           "{\"rank\":3,\"confirmations\":[],\"pages_to_release\":[" + failed.at(2) + "]}");
    n.now += 6'000;  // the quarantines end
    n.tick();
    n.post("/keys/batch_allocate", "{\"rank\":1,\"keys\":[[\"" + hex_key(200) + "\",\"\"]]}");
    n.now += 601'000;  // reservations expire (--reservation-ttl 600)
    n.tick();
    n.post("/rank/0/initialize", R"({"num_pages":512})");  // grown
    n.post("/rank/5/initialize", R"({"num_pages":8})");
    seeds_from("vllm-logged", work_dir);
  }
  {
    sim_node n(config_for(), 1);
    const std::vector<std::string> lost = pages_in(
        n.post("/keys/batch_allocate", "{\"rank\":3,\"keys\":[[\"" + hex_key(105) + "\",\"\"]]}"));
    n.post("/keys/confirm_write",
           "{\"rank\":3,\"confirmations\":[],\"pages_to_release\":[" + lost.at(0) + "]}");
    n.post("/rank/0/initialize", R"({"num_pages":30})");  // shrunk past bound keys
    n.post("/clear", "");
    n.post("/rank/0/initialize", R"({"num_pages":16})");
    save(n, 300, 304, 1);
    seeds_from("vllm-cleared", work_dir);
  }
}

// One rank with many keys: a table of several hundred buckets, as an image, and no log
// after it (recovery into one core links such a snapshot instead of writing it again).
void large_image() {
  fs::remove_all(work_dir);
  {
    sim_node n(config_for(), 1);
    n.post("/rank/0/initialize", R"({"num_pages":2048})");
    n.post("/rank/1/initialize", R"({"num_pages":2048})");
    save(n, 0, 400, 2);
  }
  sim_node n(config_for(), 1);
  seeds_from("large-image", work_dir);
}

// A node of 2 cores: each core's files hold its ranks and its slice of the directory.
void two_cores() {
  fs::remove_all(work_dir);
  {
    sim_node n(config_for(0), 2);
    for (int r = 0; r < 4; ++r)
      n.post("/rank/" + std::to_string(r) + "/initialize", R"({"num_pages":64})");
    save(n, 0, 12, 4);
  }
  sim_node n(config_for(0), 2);
  save(n, 12, 16, 4);
  n.post("/keys/delete", "{\"keys\":[\"" + hex_key(0) + "\"]}");
  seeds_from("two-cores", work_dir);
}

// SGLang's API, the default tenant and a named one: pools created and grown, reserve,
// confirm with releases (quarantined), get, delete, expiry, clear; restarted in the
// middle (pool images, their quarantines).
// Each tenant's own vLLM state (--tenants-file): records scoped to their tenant
// (record_kind::in_tenant), a tenant's scoped clear, the unnamed state's besides; a
// restart (each tenant's state in the snapshot, scoped), then more in the log.
void tenants_flow() {
  fs::remove_all(work_dir);
  const auto publish = [](sim_node& n) {
    std::string text;
    for (const char* name : {"t", "u", "v"}) {
      std::string hex;
      for (const unsigned char b : pipeline::token_sha256(std::string("token-") + name))
        hex += fmt::format("{:02x}", b);
      text += fmt::format("{} {}{}\n", name, hex, name[0] == 't' ? " vllm" : "");
    }
    auto table = std::make_shared<pipeline::tenant_table>();
    expect(pipeline::parse_tenants(text, pipeline::kPatterns, *table), "", "the tenants file");
    n.state().tenants.publish(std::move(table));
  };
  const auto as = [](sim_node& n, const char* tenant, const std::string& path,
                     const std::string& body) {
    const std::string answer = n.send(fmt::format(
        "POST {} HTTP/1.1\r\nauthorization: Bearer token-{}\r\ncontent-length: {}\r\n\r\n{}", path,
        tenant, body.size(), body));
    return answer.substr(answer.find("\r\n\r\n") + 4);
  };
  const auto save_as = [&](sim_node& n, const char* tenant, int from, int to) {
    const std::string allocated = as(n, tenant, "/keys/batch_allocate",
                                     "{\"rank\":0,\"keys\":[" + key_list(from, to, true) + "]}");
    const std::size_t list = allocated.find("\"results\":[") + 11;
    as(n, tenant, "/keys/confirm_write",
       "{\"rank\":0,\"confirmations\":[" + allocated.substr(list, allocated.rfind(']') - list) +
           "]}");
  };
  metad::config cfg = config_for();
  cfg.tenants_file = "tenants";  // published by hand above
  {
    sim_node n(cfg, 1);
    publish(n);
    for (const char* tenant : {"t", "u", "v"}) {
      as(n, tenant, "/rank/0/initialize", R"({"num_pages":64})");
      save_as(n, tenant, 0, 8);  // the same keys, three tenants
    }
    as(n, "u", "/keys/batch_allocate", "{\"rank\":0,\"keys\":[\"odd key\"]}");
    expect(as(n, "v", "/clear", ""), "", "v clears its own state");
    as(n, "v", "/rank/1/initialize", R"({"num_pages":8})");
    seeds_from("tenants-first-run", work_dir);
  }
  sim_node n(cfg, 1);  // recovers: each tenant's state in the snapshot
  publish(n);
  seeds_from("tenants-restarted", work_dir);
  save_as(n, "u", 8, 12);
  as(n, "u", "/keys/delete", "{\"keys\":[\"" + hex_key(0) + "\"]}");
  expect(as(n, "t", "/keys/batch_exists", "{\"keys\":[\"" + hex_key(0) + "\"]}"),
         "{\"exists\":[true]}", "u's delete leaves t's key");
  as(n, "u", "/clear", "");
  save_as(n, "u", 20, 22);
  seeds_from("tenants-logged", work_dir);
}

void sglang_flow() {
  fs::remove_all(work_dir);
  auto keys = [](int from, int to) {
    std::string out;
    for (int i = from; i < to; ++i)
      out += fmt::format("{}[\"sg-{}\",\"\"]", i > from ? "," : "", i);
    return out;
  };
  auto save_sg = [&](sim_node& n, const std::string& prefix, int from, int to) {
    const std::string got = n.post(prefix + "/reserve_and_allocate_page_indices",
                                   "{\"keys\":[" + keys(from, to) + "],\"namespace\":\"kv\"}");
    // {"indices":[[false,page],...]}
    std::string confirm;
    std::size_t at = got.find("[false,");
    for (int i = from; at != std::string::npos && i < to; ++i) {
      const std::size_t end = got.find(']', at);
      confirm += fmt::format("{}[\"sg-{}\",{}]", confirm.empty() ? "" : ",", i,
                             got.substr(at + 7, end - at - 7));
      at = got.find("[false,", end);
    }
    n.post(prefix + "/confirm_write",
           "{\"written_keys_to_confirm\":[" + confirm + "],\"namespace\":\"kv\"}");
  };
  {
    sim_node n(config_for(), 1);
    n.post("/0/initialize", R"({"num_pages":32,"namespace":"kv"})");
    n.post("/llama70b/1/initialize", R"({"num_pages":16,"namespace":"kv"})");
    save_sg(n, "/0", 0, 10);
    save_sg(n, "/llama70b/1", 0, 4);
    const std::vector<std::string> failed = pages_in(n.post(
        "/0/reserve_and_allocate_page_indices", R"({"keys":[["failed",""]],"namespace":"kv"})"));
    n.post("/0/confirm_write", "{\"written_keys_to_confirm\":[],\"pages_to_release\":[" +
                                   failed.at(0) + "],\"namespace\":\"kv\"}");
    n.post("/0/reserve_and_allocate_page_indices", R"({"keys":[["open",""]],"namespace":"kv"})");
    n.post("/0/get_page_indices", R"({"keys":["sg-1","sg-2"],"namespace":"kv"})");
    seeds_from("sglang-first-run", work_dir);
  }
  {
    sim_node n(config_for(), 1);
    seeds_from("sglang-restarted", work_dir);
    n.post("/0/initialize", R"({"num_pages":64,"namespace":"kv"})");
    save_sg(n, "/0", 10, 14);
    n.post("/0/delete_keys", R"({"keys":["sg-3","sg-4"],"namespace":"kv"})");
    n.post("/0/get_page_indices", R"({"keys":["sg-5"],"namespace":"kv"})");
    n.now += 6'000;
    n.tick();
    n.now += 601'000;
    n.tick();
    n.post("/llama70b/1/clear", R"({"namespace":"kv"})");
    seeds_from("sglang-logged", work_dir);
  }
}

// By hand: the snapshot form before the compact one (snapshot_entry, directory_key).
void former_format() {
  const std::string snap = server_test::former_format_snapshot(hex_key);
  std::string log;
  const std::string k2 = hex_key(2);
  const std::vector<std::string_view> keys{k2};
  const std::vector<std::int64_t> pages{0};  // rank 1's lowest free page
  store::append_allocate(log, 1, keys);
  store::append_confirm(log, 1, 2, keys, pages, {});
  store::append_remove(log, 0, std::vector<std::string_view>{"odd key"});
  store::append_directory_remove(log, "odd key");
  for (std::uint8_t cores = 0; cores < 3; ++cores)
    write_seed(fmt::format("former-format-into{}", cores + 1), kFixChecksums | cores, snap, log);
}

// By hand: an image whose layout is not this build's (loaded key by key), in two chunks;
// a log that adds keys to its rank.
void image_of_another_layout() {
  constexpr std::uint64_t kBuckets = 64;
  std::string snap;
  store::append_snapshot_rank(snap, 0, 128);
  std::vector<std::uint8_t> masks(kBuckets / 2);
  for (std::uint64_t first : {std::uint64_t{0}, kBuckets / 2}) {
    const std::size_t frame = store::begin_rank_slots(snap, 0, 999, kBuckets, first, kBuckets / 2);
    std::fill(masks.begin(), masks.end(), 0);
    for (int i = 0; i < 8; ++i) {
      const int k = static_cast<int>(first) + i;
      shard::packed_key key;
      shard::pack_hex_key(hex_key(k), key);
      masks[static_cast<std::size_t>(i) * 2] = 1;
      store::add_packed_item(snap, {key.lo, key.hi, static_cast<std::uint32_t>(k) | 1u << 31});
    }
    store::end_rank_slots(snap, frame, masks);
  }
  std::string log;
  const std::string k500 = hex_key(500), k501 = hex_key(501);
  const std::vector<std::string_view> keys{k500, k501};
  store::append_allocate(log, 0, keys);
  const std::vector<std::int64_t> pages{8, 9};
  store::append_confirm(log, 0, 1, keys, pages, {});
  for (std::uint8_t cores = 0; cores < 3; ++cores)
    write_seed(fmt::format("image-layout-999-into{}", cores + 1), kFixChecksums | cores, snap, log);
}

// By hand: SGLang records a request logs only past a tenant's pages=N (sg_reserve_capped)
// or with the memory budget spent (sg_reserve_full), and a snapshot of a pool in the
// page-by-page form (sg_snapshot_pool) with its quarantine.
void sglang_rare_records() {
  const store::sg_pool_name pool{"t1", 2, "kv"};
  std::string snap;
  {
    // sg_snapshot_pool_runs is what append_sg_snapshot_pool writes; the older page-by-page
    // kind (39) differs only in its kind byte and the free list's meaning.
    const std::vector<std::int64_t> free{0, 6};  // one run: pages 0-5
    const std::vector<std::string_view> bound{"a", "b"};
    const std::vector<std::int64_t> bound_pages{6, 7};
    // Due within --reservation-ttl's 600 s of the snapshot's time (its clock is in ns).
    const std::vector<store::sg_flight> flight{{8, "c", 0, 1'300'000'000'000}};
    store::append_sg_snapshot_pool(snap, pool, 1'000'000'000'000, 10, 0, free, bound, bound_pages,
                                   flight);
    store::append_sg_snapshot_quarantine(snap, pool, std::vector<std::int64_t>{9});
    // Another pool in the page-by-page form (kind 39): the free stack page by page.
    const std::size_t frame = snap.size();
    const std::vector<std::int64_t> pages{5, 4, 3, 2, 1, 0};
    store::append_sg_snapshot_pool(snap, {"t1", 2, "older"}, 1'000'000'000'000, 8, 3, pages, bound,
                                   bound_pages, {});
    snap[frame + 8] = static_cast<char>(store::record_kind::sg_snapshot_pool);
    const std::uint32_t crc = store::crc32c(std::string_view(snap).substr(frame + 8));
    std::memcpy(snap.data() + frame + 4, &crc, 4);
  }
  std::string log;
  const std::vector<std::string_view> keys{"d", "e", "f"};
  store::append_sg_reserve_capped(log, pool, 1'000'000'100'000, 1, keys);
  store::append_sg_keys_at(log, store::record_kind::sg_reserve_full, pool, 1'000'000'200'000, keys);
  store::append_sg_quarantine_end(log, pool, 1'000'000'300'000, std::vector<std::int64_t>{9});
  store::append_sg_expire(log, pool, 3'000'000'000'000);
  store::append_sg_delete(log, pool, std::vector<std::string_view>{"a"});
  for (std::uint8_t cores = 0; cores < 3; ++cores)
    write_seed(fmt::format("sglang-rare-into{}", cores + 1), kFixChecksums | cores, snap, log);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  metad::log::threshold = metad::log_level::error;
  fs::remove_all(out_dir);
  fs::create_directories(out_dir);
  vllm_flow();
  large_image();
  two_cores();
  sglang_flow();
  tenants_flow();
  former_format();
  image_of_another_layout();
  sglang_rare_records();
  fs::remove_all(work_dir);
  std::printf("%d seeds in %s\n", seeds, out_dir.c_str());
  return 0;
}
