// replica::replication's leader end driven in-process (src/replica/replication_impl.hpp):
// a node's group commits shipped through the glue, and acks moving the log's replicated
// watermark (store::log_writer::replicated), no further than each ack says.
#include <gtest/gtest.h>

#include <vector>

#include "replica/replication_impl.hpp"
#include "sim_node.hpp"
#include "temp_dir.hpp"

using namespace metad;

namespace {

using server_test::sim_node;

// A leader node, its replication state, and the end of each group commit it shipped.
class ReplicaLeaderEnd : public ::testing::Test {
 protected:
  ReplicaLeaderEnd() {
    n_.on_flush = [this](pipeline::core_state& core, const store::log_writer::flush_job& job) {
      glue_.shipped(core.index, job);
      ends_.push_back(job.lsn + job.bytes);
    };
  }

  static metad::config leader_config(const std::string& dir) {
    metad::config cfg;
    cfg.data_dir = dir;
    cfg.repl_listen = "127.0.0.1:0";  // bound, never started: no link thread
    return cfg;
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
  sim_node n_{leader_config(dir_.path()), 1};
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
