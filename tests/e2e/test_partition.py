# ctest: etcd
"""Partitions and flapping with synchronous replication (docs/replication.md, "Test
plan": T2, T3 and T7), on a real etcd tuned as deploy/etcd (1 s lease). Each node
reaches etcd, and the other node reaches its --repl-listen, through a
failover_harness.Blackhole: cut, it drops the bytes both ways and keeps the connections
open (timeouts, not resets, as behind an nft drop rule); the test and its clients still
reach the node's HTTP port directly. A Prober per node asks it an API question every 10
ms from its own thread, so two nodes answering at once would show.

Checks:
  a. T2. The leader a is cut off from etcd and from its standby b while a writer and the
     probers keep talking to a directly. a answers 200 no later than its lease allows
     (1 s after the cut) and only 503s after it; b serves, and a's last 200 came back
     before b's first 200 was sent (one clock, the test's). Every write a acknowledged is
     on b. Healed, a ends as b's standby in /sync (one exit 75 and a restart allowed).
  b. T3. The standby b is cut off: the writer on a stalls for at most --sync-timeout-ms
     (500) plus an etcd write, /sync drops b, writes go on, b never serves. Healed, b
     resumes every core's stream from its position (no exit 75, no second snapshot) and
     is listed in /sync again; then a is killed under a writer and b, which took over,
     holds every write a acknowledged before, during and after the cut.
  c. T7. FLAP_ROUNDS (default 6; scripts/ha-failover.sh --flap N runs more) rounds of a
     random kill -9 of the leader, cut of the leader or cut of the standby under a writer,
     then restart or heal. After each round the serving node holds the whole ledger
     (acknowledged writes of every round), and over the whole run the probers saw exactly
     one switch of the answering node per change of leader, each one clean. The seed is
     printed; FLAP_SEED replays a run.

Skipped where etcd is absent or the binary has no --repl-listen.
"""

import os
import random
import sys
import time
import unittest

from failover_harness import (NUM_PAGES, REPL, WHY, FailoverCase, Ledger, Prober, Writer,
                              initialize, ready, serving_switches, wait_until)
from metad_harness import Client

TTL_S = 1.0         # --ha-ttl-ms default
TAKEOVER_S = 5.0    # cut or kill -> the standby serves


@unittest.skipUnless(REPL, WHY)
class PartitionTest(FailoverCase):

    def cuttable_pair(self, flags=()):
        """a leads, b is its sync standby; both cuttable."""
        a = self.started(self.node("a", cuttable=True, flags=flags))
        self.assertTrue(wait_until(lambda: ready(a.base_url), 5), a.log())
        b = self.started(self.node("b", cuttable=True, flags=flags))
        self.wait_in_sync(b, a)
        self.assertEqual(initialize(a.base_url, 0, NUM_PAGES).status_code, 200)
        return a, b

    def probers(self, *nodes):
        ps = [Prober(n) for n in nodes]
        for p in ps:
            p.start()
            self.addCleanup(p.stop)
        return ps

    def writer(self, node, ledger, tag, at_least=200):
        w = Writer(node.base_url, 0, ledger, tag)
        w.start()
        self.addCleanup(w.join, 10)
        self.addCleanup(w.stop)
        before = ledger.bound_count()
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= before + at_least
                                   or not w.is_alive(), 20),
                        f"the writer on {node.id} made no progress")
        self.assertTrue(w.is_alive(), f"the writer stopped: {w.stopped_by}\n{node.log(20)}")
        return w

    def assert_clean_switches(self, probers, changes):
        switches = serving_switches(probers)
        for old, last, new, first in switches:
            self.assertLess(last, first, f"{new} answered 200 before {old}'s last 200 came "
                            f"back: two nodes answered at once ({switches})")
        self.assertEqual(len(switches), changes,
                         f"{len(switches)} switches of the answering node for {changes} "
                         f"changes of leader: {switches}")
        return [round((first - last) * 1000) for _, last, _, first in switches]

    def test_a_a_leader_cut_off_stops_answering_before_its_standby_starts(self):
        a, b = self.cuttable_pair()
        ledger = Ledger()
        w = self.writer(a, ledger, "cut-a")
        probe_a, probe_b = self.probers(a, b)
        self.assertTrue(wait_until(lambda: probe_a.answered(), 2))

        t0 = time.monotonic()
        self.cut(a)
        self.assertTrue(wait_until(lambda: ready(b.base_url), TAKEOVER_S),
                        f"b did not take over:\nb:\n{b.log(30)}\na:\n{a.log(30)}")
        time.sleep(0.5)  # a's answers after the takeover must be 503s too
        probe_a.stop()
        probe_b.stop()
        w.stop()

        a_ok, b_ok = probe_a.answered(), probe_b.answered()
        self.assertTrue(b_ok, "b never answered 200")
        last_a, first_b = a_ok[-1][2], b_ok[0][1]
        after = [r for r in probe_a.records if r[1] > last_a]
        sys.stderr.write(
            f"\n  cut a: its last 200 {(last_a - t0) * 1000:.0f} ms after the cut, b's first "
            f"200 {(first_b - t0) * 1000:.0f} ms after (gap {(first_b - last_a) * 1000:.0f} "
            f"ms); a answered {sum(r[3] == 503 for r in after)} x 503, "
            f"{sum(r[3] is None for r in after)} x nothing since; {ledger.bound_count()} "
            f"keys acked\n")
        self.assertLess(last_a, first_b, "a answered 200 after b did")
        self.assertLess(last_a - t0, TTL_S, "a answered past its lease")
        self.assertTrue(after, "a was not asked after its last 200")
        self.assertTrue(all(r[3] == 503 for r in after if r[3] is not None),
                        sorted({r[3] for r in after}))
        self.assertEqual(ledger.problems, [])
        self.assert_ledger(b, ledger)

        # Healed, the old leader finds b leading and resyncs as its standby.
        self.heal(a)
        self.wait_in_sync(a, b, allow_diverged_exits=1, timeout=10)
        self.assertFalse(ready(a.base_url))
        self.assertTrue(ready(b.base_url))

    def test_b_a_standby_cut_off_is_dropped_from_sync_and_rejoins_healed(self):
        self.sync_timeout_ms = 500
        # Log segments of 4 MiB: the cut below spans several, each followed by a snapshot.
        a, b = self.cuttable_pair(flags=("--snapshot-log-bytes", str(4 << 20)))
        ledger = Ledger()
        w = self.writer(a, ledger, "cut-b")

        t0 = time.monotonic()
        self.cut(b)
        self.assertTrue(wait_until(lambda: not self.cluster_keys.in_sync("b", "a"), 5, 0.005),
                        a.log(20))
        dropped_ms = (time.monotonic() - t0) * 1000
        self.assert_writes_go_on_alone(w, ledger, t0, dropped_ms, "cut b")
        self.assertFalse(ready(b.base_url))

        # While b is cut off, each core logs more than it keeps in memory for a standby
        # (16 MiB, repl::kRetainBytes): b's positions are then only in a's log segment
        # files, which a keeps past its snapshots (--repl-retain-log-bytes, 256 MiB).
        # Keys of 160 bytes saved on rank 0 (core 0) and deleted: their directory records
        # go to both cores.
        c = Client(a.base_url)
        self.addCleanup(c.close)
        pad = "x" * 160
        for n in range(13):
            ks = [f"burst-{n}-{i}-{pad}" for i in range(8192)]
            answer = c.batch_allocate(0, ks)
            self.assertEqual(answer.status_code, 200, answer.text[:200])
            self.assertEqual(c.confirm_write(0, answer.json()["results"]).status_code, 204)
            deleted = c.post("/keys/delete", {"keys": ks})
            self.assertEqual(deleted.status_code, 200, deleted.text[:200])
        files = [f for g in os.listdir(a.data) if g.startswith("g")
                 for f in os.listdir(os.path.join(a.data, g))]
        for core in (0, 1):
            def segments(kind):
                prefix = f"core-{core}.{kind}-"
                return [int(f[len(prefix):]) for f in files if f.startswith(prefix)]
            # Snapshots were cut meanwhile, and the log segments they made old are kept.
            self.assertGreater(max(segments("snap")), 1, files)
            self.assertLess(min(segments("log")), max(segments("snap")), files)

        # Healed, b resumes each core's stream where it broke, from what a keeps in memory
        # or, further behind, from a's log files: no exit, no second copy of the state.
        began = time.monotonic()
        self.heal(b)
        self.wait_in_sync(b, a, timeout=20)
        sys.stderr.write(f"  healed: b back in /sync after "
                         f"{(time.monotonic() - began) * 1000:.0f} ms\n")
        self.assertIn("resumes the leader's stream", b.log())
        self.assertNotIn("received the leader's state", b.log().split("resumes")[-1])
        from_files = [line for line in a.lines if "from its log files" in line]
        self.assertEqual(len({line.split("core ")[1].split()[0] for line in from_files}), 2,
                         "each core resumed b from its log files\n" + a.log(30))
        self.assertFalse(ready(b.base_url))

        # What b resumed is the leader's state: it takes over with the whole ledger.
        self.write_then_kill(a, b, ledger, "cut-b-then-kill", min_bound=200, writers=1)
        w.join(10)
        self.assertEqual(ledger.problems, [])
        self.assert_ledger(b, ledger, kills=2)

    def test_c_flapping_never_two_leaders_and_the_ledger_holds(self):
        rounds = int(os.environ.get("FLAP_ROUNDS", "6"))
        seed = int(os.environ.get("FLAP_SEED", str(int(time.time()))))
        rng = random.Random(seed)
        a, b = self.cuttable_pair()
        leader, standby = a, b
        ledger = Ledger()
        probers = self.probers(a, b)
        changes, log = 0, []
        for n in range(rounds):
            action = rng.choice(["kill leader", "cut leader", "cut standby"])
            w = self.writer(leader, ledger, f"flap{n}", at_least=rng.choice([50, 200, 500]))
            t0 = time.monotonic()
            if action == "kill leader":
                leader.kill()
            elif action == "cut leader":
                self.cut(leader)
            else:
                self.cut(standby)
            if action == "cut standby":
                self.assertTrue(wait_until(lambda: not self.cluster_keys.in_sync(
                    standby.id, leader.id), 5), f"round {n}: {standby.id} still in /sync")
                serving = leader
            else:
                self.assertTrue(wait_until(lambda: ready(standby.base_url), TAKEOVER_S),
                                f"round {n} ({action}): {standby.id} did not take over\n"
                                f"{standby.log(30)}")
                serving = standby
            took = (time.monotonic() - t0) * 1000
            w.stop()
            w.join(10)
            self.assertEqual(ledger.problems, [], f"round {n} ({action})")
            if serving is not leader:
                changes += 1
            self.assert_ledger(serving, ledger, kills=n + 1)
            other = standby if serving is leader else leader
            if action == "kill leader":
                other.start()
            elif action == "cut leader" or action == "cut standby":
                self.heal(other)
            self.wait_in_sync(other, serving, allow_diverged_exits=1, timeout=10)
            leader, standby = serving, other
            log.append(f"{action} {took:.0f} ms")
        for p in probers:
            p.stop()
        gaps = self.assert_clean_switches(probers, changes)
        sys.stderr.write(f"\n  flapping, seed {seed}: {'; '.join(log)}; {changes} changes of "
                         f"leader, gaps between the last and first 200 (ms) {gaps}; "
                         f"{ledger.bound_count()} keys acked\n")


if __name__ == "__main__":
    unittest.main()
