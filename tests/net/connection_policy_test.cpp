#include "net/connection_policy.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace metad::net {
namespace {

// Tables of events → what the handler was asked and what the policy decided. A step's
// outcome reads "calls → action" for an event the loop follows with next(), and
// "calls → yes|no" for a question (parking, wake, shut, stop, sweep).

// Says what it is asked, and answers what the current step scripted.
struct fake_handler final : connection_handler {
  std::string* log = nullptr;
  flow answer = flow::read;
  bool mid = false;
  std::array<char, 16> space{};
  std::string out;

  void note(const char* what) { *log += *log == "" ? what : std::string(" ") + what; }
  std::span<char> read_space() override { return space; }
  flow on_bytes(std::size_t) override { return note("on_bytes"), answer; }
  flow on_resume() override { return note("on_resume"), answer; }
  flow on_drained() override { return note("on_drained"), answer; }
  void trim() override { note("trim"); }
  std::string& output() override { return out; }
  bool mid_request() const override { return mid; }
};

struct fake_peer final : waker {
  std::string* log = nullptr;
  bool input = false;
  void wake() override {}
  bool input_pending() override {
    *log += *log == "" ? "input?" : " input?";
    return input;
  }
};

enum class ev {
  start,        // the loop's first next()
  data,         // a read brought bytes
  cancelled,    // a read the loop cancelled (stop)
  ended,        // a read saw the end of the stream or an error
  parking,      // the loop is about to suspend (question)
  resumed,      // the loop resumed the parked connection
  drained,      // every byte of the output was sent
  linger,       // the write side is shut: linger_started()
  discard,      // a discarding read brought bytes
  discard_end,  // a discarding read saw the end
  send_failed,  // a send failed
  wake,         // waker::wake() (question: must the loop resume it?)
  shut,         // the loop shuts the socket (question: the first time?)
  stop,         // the loop stops (question: cancel the pending read?)
  sweep,        // the sweep (question: time is up?)
};

struct step {
  ev event;
  const char* outcome;
  flow answer = flow::read;  // what the handler returns if called
  bool mid = false;          // the handler's mid_request() from this step on
  std::uint64_t now = 0;     // for the events that take the time
  bool input = false;        // the peer has input pending
};

const char* name(action a) {
  switch (a) {
    case action::read:
      return "read";
    case action::park:
      return "park";
    case action::drain:
      return "drain";
    case action::linger:
      return "linger";
    case action::discard:
      return "discard";
    case action::close:
      return "close";
  }
  return "?";
}

const char* yes(bool b) { return b ? "yes" : "no"; }

policy_limits test_limits() {
  policy_limits limits;
  limits.idle_timeout_ms = 1000;
  limits.header_timeout_ms = 100;
  limits.drain_timeout_ms = 50;
  limits.linger_ms = 10;
  limits.linger_reads_max = 3;
  return limits;
}

// Runs the steps on a fresh policy created at time 0; fails at the first step whose
// outcome differs.
void run(const std::vector<step>& steps) {
  std::string log;
  auto owned = std::make_unique<fake_handler>();
  fake_handler& handler = *owned;
  handler.log = &log;
  fake_peer peer;
  peer.log = &log;
  connection_policy policy(std::move(owned), peer, test_limits(), 0);
  ASSERT_EQ(&policy.handler(), &handler);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const step& s = steps[i];
    log.clear();
    handler.answer = s.answer;
    handler.mid = s.mid;
    peer.input = s.input;
    const char* answer = nullptr;  // a question's; else next() is asked
    switch (s.event) {
      case ev::start:
        break;
      case ev::data:
        policy.read_done(read_status::data, 5, s.now);
        break;
      case ev::cancelled:
        policy.read_done(read_status::cancelled, 0, s.now);
        break;
      case ev::ended:
        policy.read_done(read_status::ended, 0, s.now);
        break;
      case ev::parking:
        answer = yes(policy.parking());
        break;
      case ev::resumed:
        policy.resumed();
        break;
      case ev::drained:
        policy.drained();
        break;
      case ev::linger:
        policy.linger_started(s.now);
        break;
      case ev::discard:
        policy.discarded(read_status::data);
        break;
      case ev::discard_end:
        policy.discarded(read_status::ended);
        break;
      case ev::send_failed:
        policy.send_failed();
        break;
      case ev::wake:
        answer = yes(policy.wake());
        break;
      case ev::shut:
        answer = yes(policy.shut());
        break;
      case ev::stop:
        answer = yes(policy.stop(s.now));
        break;
      case ev::sweep:
        answer = yes(policy.expired(s.now));
        break;
    }
    std::string decided;
    if (answer != nullptr) {
      decided = answer;
    } else {
      const action a = policy.next();
      decided = name(a);
      if (a == action::read && policy.idle()) decided += "(idle)";
    }
    const std::string outcome = log.empty() ? "→ " + decided : log + " → " + decided;
    ASSERT_EQ(outcome, s.outcome) << "step " << i;
  }
}

TEST(ConnectionPolicy, IdleConnectionTrimsThenReads) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes trim → read(idle)"},  // a whole request, answered inline
      {ev::data, "on_bytes trim → read(idle)"},
  });
}

TEST(ConnectionPolicy, PartialRequestReadsWithoutTrimming) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → read", flow::read, true},
      {ev::data, "on_bytes → read", flow::read, true},
      {ev::data, "on_bytes trim → read(idle)"},
  });
}

TEST(ConnectionPolicy, IdleDeadlineCountsFromTheLastCompleteRequest) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::sweep, "→ no", flow::read, false, 999},
      {ev::sweep, "→ yes", flow::read, false, 1000},  // from the accept
      {ev::data, "on_bytes trim → read(idle)", flow::read, false, 500},
      {ev::sweep, "→ no", flow::read, false, 1499},
      {ev::sweep, "→ yes", flow::read, false, 1500},
  });
}

TEST(ConnectionPolicy, HeaderDeadlineCountsFromTheRequestsFirstBytes) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → read", flow::read, true, 10},
      {ev::data, "on_bytes → read", flow::read, true, 60},  // not per byte
      {ev::sweep, "→ no", flow::read, true, 109},
      {ev::sweep, "→ yes", flow::read, true, 110},
  });
}

TEST(ConnectionPolicy, ParkedRequestOutlivesItsDeadline) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → park", flow::wait},
      {ev::parking, "→ yes"},
      {ev::sweep, "→ no", flow::read, false, 1'000'000},  // on another core: never cut
      {ev::wake, "→ yes"},
      {ev::resumed, "on_resume trim → read(idle)"},
      {ev::sweep, "→ yes", flow::read, false, 1'000'000},  // back to the idle deadline
  });
}

TEST(ConnectionPolicy, WokenBeforeParkingDoesNotSuspend) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → park", flow::wait},
      {ev::wake, "→ no"},  // finished inline on another path: nothing to resume yet
      {ev::parking, "→ no"},
      {ev::resumed, "on_resume trim → read(idle)"},
      {ev::data, "on_bytes → park", flow::wait},
      {ev::parking, "→ yes"},  // the earlier wake-up was used up
  });
}

TEST(ConnectionPolicy, PipelinedRequestsParkOneAfterAnother) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → park", flow::wait},  // three requests in one read
      {ev::parking, "→ yes"},
      {ev::wake, "→ yes"},
      {ev::resumed, "on_resume → park", flow::wait},
      {ev::parking, "→ yes"},
      {ev::wake, "→ yes"},
      {ev::resumed, "on_resume → linger", flow::close},  // the last says connection: close
      {ev::linger, "→ discard"},
  });
}

TEST(ConnectionPolicy, HalfClosedPeerIsAnsweredThenClosed) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → park", flow::wait},  // request, then the peer's FIN
      {ev::parking, "→ yes"},
      {ev::wake, "→ yes"},
      {ev::resumed, "on_resume trim → read(idle)"},  // the answer goes out first
      {ev::ended, "→ close"},
  });
}

TEST(ConnectionPolicy, CloseLingersForBoundedReads) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → linger", flow::close, true},  // a refused body
      {ev::linger, "→ discard", flow::read, false, 20},
      {ev::discard, "→ discard"},
      {ev::discard, "→ discard"},
      {ev::discard, "→ close"},  // linger_reads_max
  });
}

TEST(ConnectionPolicy, LingerEndsWithThePeersClose) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → linger", flow::close},
      {ev::linger, "→ discard", flow::read, false, 20},
      {ev::discard_end, "→ close"},
  });
}

TEST(ConnectionPolicy, LingerDeadlineReplacesTheIdleOne) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → linger", flow::close, false, 500},
      {ev::sweep, "→ no", flow::read, false, 600},  // idle deadline still 1500
      {ev::linger, "→ discard", flow::read, false, 600},
      {ev::stop, "→ no", flow::read, false, 605},  // a discarding read is not cancelled
      {ev::sweep, "→ no", flow::read, false, 609},
      {ev::sweep, "→ yes", flow::read, false, 610},
      {ev::shut, "→ yes"},
      {ev::discard_end, "→ close"},
  });
}

TEST(ConnectionPolicy, ShutWhileLingeringClosesWithoutReading) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → linger", flow::close},
      {ev::shut, "→ yes"},
      {ev::linger, "→ close"},
  });
}

TEST(ConnectionPolicy, OutputBackpressureDrainsBeforeReading) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → drain", flow::drain},  // pipelined, answers not read
      {ev::drained, "on_drained → drain", flow::drain},
      {ev::drained, "on_drained → park", flow::wait},
      {ev::parking, "→ yes"},
      {ev::wake, "→ yes"},
      {ev::resumed, "on_resume → drain", flow::drain},
      {ev::drained, "on_drained trim → read(idle)"},
  });
}

TEST(ConnectionPolicy, FailedSendWhileDrainingCloses) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → drain", flow::drain},
      {ev::send_failed, "→ close"},
      {ev::drained, "→ close"},  // the handler is not asked to go on
  });
}

TEST(ConnectionPolicy, FailedSendEndsTheReadInProgress) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::send_failed, "→ close"},
      {ev::data, "→ close"},  // bytes after the failure are not handed over
  });
}

TEST(ConnectionPolicy, ReadErrorOrEndCloses) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → read", flow::read, true},
      {ev::ended, "→ close"},  // mid-request: no answer to send
  });
}

TEST(ConnectionPolicy, BytesAfterShutAreNotHandedOver) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::sweep, "→ yes", flow::read, false, 1000},
      {ev::shut, "→ yes"},
      {ev::shut, "→ no"},                            // once
      {ev::sweep, "→ no", flow::read, false, 2000},  // counted once
      {ev::data, "→ close"},
  });
}

TEST(ConnectionPolicy, StopCancelsAnIdleReadAndCloses) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::stop, "→ yes", flow::read, false, 100},
      {ev::cancelled, "input? → close"},
  });
}

TEST(ConnectionPolicy, StopServesInputAlreadySent) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::stop, "→ yes", flow::read, false, 100},
      {ev::cancelled, "input? trim → read(idle)", flow::read, false, 0, true},
      {ev::data, "on_bytes → park", flow::wait},
      {ev::parking, "→ yes"},
      {ev::wake, "→ yes"},
      {ev::resumed, "on_resume input? → close"},
  });
}

TEST(ConnectionPolicy, StopWhileMidRequestFinishesTheRequest) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → read", flow::read, true, 90},
      {ev::stop, "→ no", flow::read, true, 100},             // the read is not cancelled
      {ev::data, "on_bytes → read", flow::read, true, 120},  // still reading the body
      {ev::data, "on_bytes → park", flow::wait, false, 130},
      {ev::parking, "→ yes"},
      {ev::wake, "→ yes"},
      {ev::resumed, "on_resume input? → close"},
  });
}

TEST(ConnectionPolicy, DrainDeadlineCutsAReadingConnection) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → read", flow::read, true, 100},  // header deadline 200
      {ev::stop, "→ no", flow::read, true, 120},             // drain deadline 170
      {ev::sweep, "→ no", flow::read, true, 169},
      {ev::sweep, "→ yes", flow::read, true, 170},
      {ev::shut, "→ yes"},
      {ev::cancelled, "→ close"},  // the shut's cancellation ends it
  });
}

TEST(ConnectionPolicy, DrainDeadlineSparesAParkedRequest) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::data, "on_bytes → park", flow::wait},
      {ev::parking, "→ yes"},
      {ev::stop, "→ no", flow::read, false, 100},
      {ev::sweep, "→ no", flow::read, false, 10'000},
      {ev::wake, "→ yes"},
      {ev::resumed, "on_resume input? → close"},
  });
}

TEST(ConnectionPolicy, CancelledReadBeforeStopReadsAgain) {
  run({
      {ev::start, "trim → read(idle)"},
      {ev::cancelled, "trim → read(idle)"},  // not stopping: look again, read again
  });
}

TEST(ConnectionPolicy, LimitsComeFromTheLoopOptions) {
  loop_options options;
  options.idle_timeout_ms = 7;
  options.header_timeout_ms = 8;
  options.drain_timeout_ms = 9;
  const policy_limits limits = limits_of(options);
  EXPECT_EQ(limits.idle_timeout_ms, 7u);
  EXPECT_EQ(limits.header_timeout_ms, 8u);
  EXPECT_EQ(limits.drain_timeout_ms, 9u);
  EXPECT_EQ(limits.linger_ms, 1000u);
  EXPECT_EQ(limits.linger_reads_max, 64);
}

}  // namespace
}  // namespace metad::net
