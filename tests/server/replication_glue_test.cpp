// replica::replication's leader end driven in-process (src/replica/replication_impl.hpp):
// a node's group commits shipped through the glue, and acks moving the log's replicated
// watermark (store::log_writer::replicated), no further than each ack says. With a
// standby's end too (ReplicaPair): the standby copies the leader, and a batch that leaves
// a gap makes it exit 75 before it applies or acks anything of it.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "replica/replication_impl.hpp"
#include "sim_node.hpp"
#include "temp_dir.hpp"

using namespace metad;

namespace {

using server_test::sim_node;

// A replicated node's settings: its link bound, never started (no link thread).
metad::config glue_config(const std::string& dir) {
  metad::config cfg;
  cfg.data_dir = dir;
  cfg.repl_listen = "127.0.0.1:0";
  return cfg;
}

// A leader node, its replication state, and the end of each group commit it shipped.
class ReplicaLeaderEnd : public ::testing::Test {
 protected:
  ReplicaLeaderEnd() {
    n_.on_flush = [this](pipeline::core_state& core, const store::log_writer::flush_job& job) {
      glue_.shipped(core.index, job);
      ends_.push_back(job.lsn + job.bytes);
    };
  }

  // As on_hello leaves core 0's end once a standby said hello at position 0 (a hello
  // needs a serving lease; the epoch of a leader that does not serve is 0).
  replica::replication::impl::leading_end& stream_from_start() {
    auto* l = glue_.ends[0].leader();
    l->stream.emplace(0, generation(), 0, 0);
    l->retained.begin(0);
    l->acks.start(0, smp::monotonic_ns(), std::uint64_t{500} * smp::kNsPerMs);
    return *l;
  }
  std::uint64_t generation() { return n_.state().data->generation(); }
  repl::ack ack(std::uint64_t lsn) { return {0, generation(), 0, lsn}; }
  store::log_writer& log() { return n_.state().core[0]->log; }
  void write() {
    n_.post("/rank/0/initialize", R"({"num_pages":64})");
    n_.post("/keys/batch_allocate", R"({"rank":0,"keys":["k1","k2"]})");
  }

  sim::temp_dir dir_{"metad-replica-glue"};
  sim_node n_{glue_config(dir_.path()), 1};
  replica::replication::impl glue_{n_.state(), replica::replication::start_as::primary};
  std::vector<std::uint64_t> ends_;
};

}  // namespace

TEST_F(ReplicaLeaderEnd, AnAckMarksReplicatedOnlyWhatItCovers) {
  auto& l = stream_from_start();
  write();
  ASSERT_GE(ends_.size(), 2u);
  ASSERT_EQ(l.stream->sent(), log().end());
  const std::uint64_t first = ends_.front();
  ASSERT_LT(first, log().end());
  glue_.on_ack(0, glue_.ends[0], l, ack(first));
  EXPECT_FALSE(glue_.ends[0].closing);
  EXPECT_EQ(log().replicated(), first);  // not what was shipped since
  EXPECT_EQ(glue_.share(0).state.load(), repl::progress::caught_up);
  EXPECT_NE(glue_.share(0).oldest_unacked_ns.load(), 0u);  // the later writes
  EXPECT_EQ(glue_.share(0).lag_bytes.load(), log().end() - first);
  glue_.on_ack(0, glue_.ends[0], l, ack(log().end()));
  EXPECT_EQ(log().replicated(), log().end());
  EXPECT_EQ(glue_.share(0).oldest_unacked_ns.load(), 0u);
  EXPECT_EQ(glue_.share(0).lag_bytes.load(), 0u);
}

TEST_F(ReplicaLeaderEnd, AnAckOfWhatWasNeverSentClosesTheStreamAndMovesNothing) {
  auto& l = stream_from_start();
  write();
  const std::uint64_t first = ends_.front();
  glue_.on_ack(0, glue_.ends[0], l, ack(first));
  glue_.on_ack(0, glue_.ends[0], l, ack(log().end() + 1));
  EXPECT_TRUE(glue_.ends[0].closing);
  EXPECT_EQ(log().replicated(), first);
}

TEST_F(ReplicaLeaderEnd, AStreamThatEndsLeavesNoProgressBehind) {
  auto& l = stream_from_start();
  write();
  glue_.on_ack(0, glue_.ends[0], l, ack(ends_.front()));
  glue_.end_leading(0, l);
  EXPECT_FALSE(l.stream);
  EXPECT_EQ(glue_.share(0).state.load(), repl::progress::none);
  EXPECT_EQ(glue_.share(0).oldest_unacked_ns.load(), 0u);
  EXPECT_EQ(glue_.share(0).lag_bytes.load(), 0u);
  EXPECT_TRUE(l.retained.retaining());  // kept for a stream that resumes
  EXPECT_EQ(l.retained.end(), log().end());
}

namespace {

// A leader's and a standby's replication state in one process, their bytes carried by
// hand (no link): the standby's hello answered with a snapshot of the leader's state,
// then the leader's group commits as batches, the standby's acks back to the leader.
class ReplicaPair : public ::testing::Test {
 protected:
  ReplicaPair() {
    leader_.on_flush = [this](pipeline::core_state& core, const store::log_writer::flush_job& job) {
      to_standby_.send(wire_, std::string_view(job.data, job.bytes));
      leader_glue_.shipped(core.index, job);
    };
  }

  // What the standby core decodes from `bytes`, through its end (impl::handle).
  void to_standby(const std::string& bytes) {
    auto& e = standby_glue_.ends[0];
    e.decoder.feed(bytes);
    standby_glue_.handle(0, e);
  }

  std::uint64_t generation() { return leader_.state().data->generation(); }

  // The standby says hello and gets the leader's state as a snapshot (as on_hello makes
  // them for a new standby), then the leader streams its group commits from there on.
  // The leader's end.
  replica::replication::impl::leading_end& copy_then_stream() {
    auto& se = standby_glue_.ends[0];
    EXPECT_NE(se.standby(), nullptr);
    EXPECT_EQ(leader_glue_.ends[0].standby(), nullptr);
    se.stream = 1;  // as poll() does for a new stream
    standby_glue_.say_hello(0, se, *se.standby());
    repl::snapshot head;
    head.generation = generation();
    head.lsn = leader_log().end();
    std::string bytes;
    repl::encode(bytes,
                 repl::answer{repl::answer_status::need_snapshot, 0, generation(), 0, head.lsn});
    leader_glue_.encode_snapshot(0, head, /*images=*/true, [&](std::string& out) {
      bytes += out;
      out.clear();
    });
    to_standby(bytes);
    wire_.clear();  // what the leader wrote before its snapshot is in it
    EXPECT_EQ(standby_glue_.share(0).state.load(), repl::progress::caught_up);
    auto& l = *leader_glue_.ends[0].leader();
    l.stream.emplace(0, generation(), 0, head.lsn);
    l.retained.begin(head.lsn);
    l.acks.start(head.lsn, smp::monotonic_ns(), std::uint64_t{500} * smp::kNsPerMs);
    to_standby_ = repl::leader_stream(0, generation(), 0, head.lsn);
    return l;
  }
  store::log_writer& leader_log() { return leader_.state().core[0]->log; }

  sim::temp_dir dir_{"metad-replica-pair"};
  sim_node leader_{glue_config(dir_.path() + "/a"), 1};
  sim_node standby_{glue_config(dir_.path() + "/b"), 1};
  replica::replication::impl leader_glue_{leader_.state(), replica::replication::start_as::primary};
  replica::replication::impl standby_glue_{standby_.state(),
                                           replica::replication::start_as::standby};
  repl::leader_stream to_standby_{0, 0, 0, 0};  // reset once the snapshot's position is known
  std::string wire_;                            // batches not yet carried
};

}  // namespace

TEST_F(ReplicaPair, AStandbyCopiesTheLeaderAndItsAcksMoveTheLeadersWatermark) {
  leader_.post("/rank/0/initialize", R"({"num_pages":64})");
  leader_.post("/keys/batch_allocate", R"({"rank":0,"keys":["k1","k2"]})");
  auto& l = copy_then_stream();
  auto& se = standby_glue_.ends[0];
  store::log_writer& log = leader_log();
  leader_.post("/keys/confirm_write", R"({"rank":0,"confirmations":[["k1",0],["k2",1]]})");
  ASSERT_FALSE(wire_.empty());
  to_standby(std::exchange(wire_, {}));
  EXPECT_FALSE(se.closing);
  // The standby's group commit, then its ack of what became durable.
  standby_.tick();
  const repl::follower& f = *se.standby()->follower;
  standby_glue_.ack_durable(0, se);
  EXPECT_EQ(f.acked(), log.end());
  leader_glue_.on_ack(0, leader_glue_.ends[0], l, f.current_ack());
  EXPECT_EQ(log.replicated(), log.end());
  // The rank as the leader has it (its keys' directory is built at promotion).
  EXPECT_EQ(standby_.get("/rank/0"), leader_.get("/rank/0"));
}

// A batch lost between the two (the carrier drops it) leaves a gap before the next:
// the standby applies nothing of it and acks nothing beyond what it has; it cannot
// follow, and exits with status 75 (docs/replication.md, "Exit status 75") to start
// again as an empty standby.
TEST_F(ReplicaPair, ABatchAfterALostOneIsAGapTheStandbyExits75WithoutApplyingOrAckingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  leader_.post("/rank/0/initialize", R"({"num_pages":64})");
  copy_then_stream();
  auto& se = standby_glue_.ends[0];
  const repl::follower& f = *se.standby()->follower;
  const std::uint64_t held = leader_log().end();
  ASSERT_EQ(f.received(), held);
  leader_.post("/keys/batch_allocate", R"({"rank":0,"keys":["k1","k2"]})");
  ASSERT_FALSE(wire_.empty());
  wire_.clear();  // lost
  // A change that does not depend on the lost one: it would apply; only the gap stops it.
  leader_.post("/rank/1/initialize", R"({"num_pages":64})");
  ASSERT_FALSE(wire_.empty());
  EXPECT_EXIT(
      {
        to_standby(std::exchange(wire_, {}));
        // Reached only if the standby took the batch: its group commit and its ack.
        standby_.tick();
        standby_glue_.ack_durable(0, se);
        std::fprintf(stderr, "the standby held %llu, now has %llu and acked %llu\n",
                     static_cast<unsigned long long>(held),
                     static_cast<unsigned long long>(f.received()),
                     static_cast<unsigned long long>(f.acked()));
      },
      ::testing::ExitedWithCode(75), "a batch that does not continue this standby's log");
}

// A standby further behind than the retained window resumes from the log files
// (on_hello: l.files). While the leader writes more than the window holds, the retained
// bytes move past the log end the hello saw: the pump then sends file bytes beyond it,
// and the standby's ack of them must not count it caught up (the sync set would make
// the core's writes wait for a standby still a window or more behind, with nothing
// unacked on the clock to say it lags). Caught up: once it acks what the core shipped
// when the pump handed over to memory.
TEST_F(ReplicaLeaderEnd, AStandbyPumpedFromTheLogFilesIsNotCaughtUpBeforeThePumpEnds) {
  auto* l = glue_.ends[0].leader();
  l->retained.begin(0);
  const auto burst = [&](int round) {
    std::string list, confirmations;
    for (int i = 0; i < 1000; ++i) {
      const std::string k = "\"" + std::to_string(round) + "-" + std::to_string(i) + "-" +
                            std::string(150, 'x') + "\"";
      list += (i ? "," : "") + k;
      confirmations += (i ? ",[" : "[") + k + "," + std::to_string(i) + "]";
    }
    n_.post("/keys/batch_allocate", "{\"rank\":0,\"keys\":[" + list + "]}");
    n_.post("/keys/confirm_write", "{\"rank\":0,\"confirmations\":[" + confirmations + "]}");
    n_.post("/keys/delete", "{\"keys\":[" + list + "]}");
  };
  n_.post("/rank/0/initialize", R"({"num_pages":2048})");
  int round = 0;
  while (l->retained.from() == 0) burst(round++);  // more than the window: 0 is in the files
  // The hello at position 0, as on_hello answers it from the files.
  const std::uint64_t hello_end = l->retained.end();
  auto& segments = n_.state().core[0]->segments;
  std::vector<repl::log_file_pump::segment> files;
  for (const auto& [segment, start] : segments)
    files.push_back({n_.state().data->log_path(generation(), 0, segment), start});
  l->stream.emplace(0, generation(), 0, 0);
  l->files = std::make_unique<repl::log_file_pump>();
  ASSERT_TRUE(l->files->start(std::move(files), 0));
  l->acks.start(l->retained.end(), smp::monotonic_ns(), std::uint64_t{500} * smp::kNsPerMs);
  glue_.share(0).state.store(repl::progress::catching_up);
  while (l->retained.from() <= hello_end) burst(round++);  // the window moves past it
  // The pump sends file bytes up to past hello_end (as pump_files does, a piece a turn).
  std::string wire;
  while (l->files->pos() <= hello_end) {
    std::string bytes;
    ASSERT_TRUE(l->files->read(bytes, 1 << 20, std::min(l->retained.from(), log().durable())))
        << l->files->error();
    l->stream->send(wire, bytes);
  }
  ASSERT_LT(l->files->pos(), l->retained.from());  // still pumping
  glue_.on_ack(0, glue_.ends[0], *l, ack(l->files->pos()));
  EXPECT_FALSE(glue_.ends[0].closing);
  EXPECT_NE(glue_.share(0).state.load(), repl::progress::caught_up)
      << "acked " << l->files->pos() << " of a log of " << log().end()
      << " bytes, still pumping from the files";
  // The pump hands over to memory (the retained bytes resent): caught up once those are
  // acked.
  glue_.pump_files(0, glue_.ends[0], *l);
  ASSERT_FALSE(l->files);
  ASSERT_EQ(l->stream->sent(), log().end());
  glue_.on_ack(0, glue_.ends[0], *l, ack(log().end()));
  EXPECT_EQ(glue_.share(0).state.load(), repl::progress::caught_up);
}
