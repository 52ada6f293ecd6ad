# ctest: etcd
"""Failover with synchronous replication (design-ha.md §4, test plan T1 in small), on a
real etcd tuned as deploy/etcd (1 s lease). Two nodes a and b run the same command line
apart from --ha-node, ports, --data-dir and --repl-listen.

Checks:
  a. a leads; b starts as an empty standby, catches up and is listed in /sync within a
     few seconds; b answers the API (and /ready) 503 naming a; the leader key carries
     the repl address and /sync's epoch is the leader key's create_revision.
  b. an ack ledger: two vLLM-like writers (initialize rank 0, then batch_allocate +
     confirm of fresh keys, every 5th task releasing its pages instead) run against a; a
     is killed -9 under them. b must serve (kill -> /ready 200 and kill -> first API 200 are
     measured and printed), and on b EVERY acknowledged binding is present with its page
     (get_locations, batch_exists), no page is bound to two keys, the acknowledged but
     unconfirmed reservation can still be confirmed, and a fresh allocation gets none of
     the acknowledged pages. 0 lost.
  c. the old leader a restarted with the same command line ends as b's standby, listed
     in /sync (one exit with status 75 and a restart allowed); a second failover (kill -9
     b under the writers) keeps the whole ledger of both phases intact on a.
  d. the shipped restart policy (deploy/ha/ha.conf: Restart=always, RestartSec=200ms):
     a is restarted 0.2 s after its kill -9, inside its lease, and every exit 75 of
     either node is restarted 0.2 s later. Whichever node ends up leading must hold the
     whole ledger, and the other must rejoin /sync. Who leads and how many exits 75 it
     took are printed, not asserted.
  e. a standby that stops acknowledging (SIGSTOP) is dropped from /sync within
     --sync-timeout-ms (500) plus an etcd write, and the writer goes on after one stall;
     resumed, the standby exits 75 or rejoins (restarted, it rejoins /sync); stopped
     again and dropped, a kill -9 of the leader does NOT make it serve: only a standby
     listed in /sync may take over.
  f. T6: a leader holding 2^20 bindings on one rank (one core's state) and a writer on
     that rank; an empty standby b starts, its state is cut by a child process the
     leader's core forks while the writer goes on, b joins /sync (time, bytes sent and
     the writer's longest call are printed), then a is killed and b holds every binding.
  g. a leader key forged without a lease (issue 30, finding 7) under two writers: a stops
     at once and exits 75, b waits the key out, removes it and takes over with the whole
     ledger; a rejoins /sync.

Skipped where etcd is absent or where `hf3fs-metad --help` does not mention
--repl-listen. Run by scripts/test.sh's release stage (ctest e2e_python_failover, label
etcd). The long run (T1 x N through HAProxy) is scripts/ha-failover.sh.
"""

import base64
import os
import re
import signal
import sys
import time
import unittest

import requests

from failover_harness import (EXIT_DIVERGED, NUM_PAGES, REPL, WHY, Diverged, FailoverCase,
                              Ledger, Supervisor, Writer, initialize, ready, takeover_any,
                              wait_until)
from metad_harness import Client, keys

# T6 at the size; CATCH_UP_BINDINGS=N (a multiple of 8192) for another.
CATCH_UP_BINDINGS = int(os.environ.get("CATCH_UP_BINDINGS", str(1 << 20)))

@unittest.skipUnless(REPL, WHY)
class FailoverTest(FailoverCase):
    """Cases a-g of the docstring above."""

    def test_a_the_second_node_becomes_a_sync_standby_and_answers_503(self):
        a, b = self.pair()
        value, revision = self.cluster_keys.leader()
        self.assertEqual(value, {"node": "a", "http": a.base_url, "repl": a.repl})
        self.assertEqual(self.cluster_keys.sync(), {"epoch": revision, "leader": "a",
                                                    "sync": ["b"]})
        self.assertFalse(ready(b.base_url))
        self.assert_standby(b, "a", a)
        self.assertIn('hf3fs_metad_ha_role{role="leader"} 1', a.metrics())

    def test_b_kill_the_leader_under_a_writer_and_lose_no_acknowledged_write(self):
        a, b = self.pair()
        self.assertEqual(initialize(a.base_url, 0, NUM_PAGES).status_code, 200)
        ledger = Ledger()
        self.write_then_kill(a, b, ledger, "b1")
        self.assert_ledger(b, ledger)
        value, _ = self.cluster_keys.leader()
        self.assertEqual(value["node"], "b")
        sync = self.cluster_keys.sync()
        self.assertEqual((sync["leader"], sync["sync"]), ("b", []))
        self.assertIn('hf3fs_metad_ha_role{role="leader"} 1', b.metrics())

    def test_c_the_old_leader_rejoins_as_standby_and_a_second_failover_loses_nothing(self):
        a, b = self.pair()
        self.assertEqual(initialize(a.base_url, 0, NUM_PAGES).status_code, 200)
        ledger = Ledger()
        self.write_then_kill(a, b, ledger, "c1")
        self.assert_ledger(b, ledger)

        # The old leader comes back with the same command line: another node leads, so
        # it resyncs as an empty standby (maybe after one exit 75 and a restart).
        began = time.monotonic()
        a.start()
        self.wait_in_sync(a, b, allow_diverged_exits=1)
        sys.stderr.write(f"  a back in /sync {(time.monotonic() - began) * 1000:.0f} ms "
                         f"after its restart (exits: {a.exits})\n")
        self.assertFalse(ready(a.base_url))
        self.assertTrue(ready(b.base_url))
        self.assertIn('hf3fs_metad_ha_role{role="standby"} 1', a.metrics())

        self.write_then_kill(b, a, ledger, "c2")
        self.assert_ledger(a, ledger, kills=2)
        value, _ = self.cluster_keys.leader()
        self.assertEqual(value["node"], "a")


    def test_d_a_leader_restarted_inside_its_lease_loses_nothing(self):
        a, b = self.pair()
        self.assertEqual(initialize(a.base_url, 0, NUM_PAGES).status_code, 200)
        ledger = Ledger()
        ws = [Writer(a.base_url, 0, ledger, f"d-{i}") for i in range(2)]
        for w in ws:
            w.start()
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= 1000, 30))
        self.assertTrue(self.cluster_keys.in_sync("b", "a"))
        t0 = time.monotonic()
        a.kill()
        time.sleep(0.2)  # RestartSec=200ms
        a.start()
        systemd = Supervisor([a, b], restart_s=0.2)
        exits = systemd.exits
        try:
            leader, ready_ms, api_ms, write_ms = takeover_any(systemd, None, t0, 15)
            self.assertIsNotNone(leader, f"no node served within 15 s (exits 75: {exits})"
                                 f"\na:\n{a.log(20)}\nb:\n{b.log(20)}")
            self.assertIsNotNone(write_ms, f"{leader.id} serves, but no write was answered "
                                 f"within 15 s of the kill:\n{leader.log(20)}")
            standby = b if leader is a else a
            self.assertTrue(systemd.until(lambda: self.cluster_keys.in_sync(
                standby.id, leader.id), 15),
                f"{standby.id} not back in /sync: {self.cluster_keys.sync()}; exits 75: "
                f"{exits}\n{standby.log(20)}")
        except Diverged as e:
            self.fail(str(e))
        for w in ws:
            w.join(10)
        sys.stderr.write(f"  kill -9 a, restarted 200 ms later: {leader.id} leads, /ready "
                         f"200 after {ready_ms:.0f} ms, first write after {write_ms:.0f} ms; "
                         f"exits 75 (restarted): {exits}; "
                         f"{ledger.bound_count()} keys acked bound\n")
        self.assertEqual(ledger.problems, [])
        self.assert_ledger(leader, ledger)


    def test_e_a_silent_standby_is_dropped_from_sync_and_never_takes_over(self):
        self.sync_timeout_ms = 500
        a, b = self.pair()
        self.assertEqual(initialize(a.base_url, 0, NUM_PAGES).status_code, 200)
        ledger = Ledger()
        writer = Writer(a.base_url, 0, ledger, "e")
        writer.start()
        self.addCleanup(writer.join, 10)
        self.addCleanup(writer.stop)
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= 200, 20))

        t0 = time.monotonic()
        b.proc.send_signal(signal.SIGSTOP)
        self.addCleanup(lambda: b.alive() and b.proc.send_signal(signal.SIGCONT))
        self.assertTrue(wait_until(lambda: not self.cluster_keys.in_sync("b", "a"), 5, 0.005),
                        a.log(20))
        dropped_ms = (time.monotonic() - t0) * 1000
        self.assertEqual(self.cluster_keys.sync()["sync"], [])
        self.assert_writes_go_on_alone(writer, ledger, t0, dropped_ms, "SIGSTOP b")

        # Resumed, its stream cannot go on: it exits 75 (or rejoins); restarted, it
        # resyncs and is listed again.
        b.proc.send_signal(signal.SIGCONT)
        self.wait_in_sync(b, a, allow_diverged_exits=1)

        # Out of /sync again, it must not take over when the leader dies.
        b.proc.send_signal(signal.SIGSTOP)
        self.assertTrue(wait_until(lambda: not self.cluster_keys.in_sync("b", "a"), 5, 0.005))
        writer.stop()
        writer.join(10)
        a.kill()
        b.proc.send_signal(signal.SIGCONT)
        self.assertTrue(wait_until(lambda: self.cluster_keys.leader()[0] is None, 3),
                        "the dead leader's lease did not expire")
        time.sleep(1.0)  # time enough to campaign, were it allowed to
        self.assertFalse(ready(b.base_url), "a standby not in /sync took over")
        self.assertIsNone(self.cluster_keys.leader()[0])
        self.assertTrue(b.alive() or b.exit_code() == EXIT_DIVERGED, b.log(20))

    def test_g_a_key_forged_without_a_lease_hands_over_to_the_sync_standby(self):
        """Issue 30, finding 7, replicated: a key forged over the leader's (no lease) stops
        a at once (deposed, it exits 75 and comes back as an empty standby under
        systemd's policy); b, in /sync, waits the key out (twice the 1 s TTL), removes it
        and takes over with every acknowledged write: no 503 for good."""
        a, b = self.pair()
        self.assertEqual(initialize(a.base_url, 0, NUM_PAGES).status_code, 200)
        ledger = Ledger()
        ws = [Writer(a.base_url, 0, ledger, f"g-{i}") for i in range(2)]
        for w in ws:
            w.start()
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= 500, 30))
        self.assertTrue(self.cluster_keys.in_sync("b", "a"))
        t0 = time.monotonic()
        b64 = lambda text: base64.b64encode(text.encode()).decode()
        put = requests.post(self.etcd.url + "/v3/kv/put",
                            json={"key": b64(self.cluster_keys.leader_key),
                                  "value": b64("forged")}, timeout=2)
        self.assertEqual(put.status_code, 200, put.text)
        # a stops at once (its watch shows the overwrite, or its next renewal's read).
        self.assertTrue(wait_until(lambda: not ready(a.base_url, timeout=0.3), 2), a.log(20))
        systemd = Supervisor([a, b], restart_s=0.2)
        try:
            leader, ready_ms, api_ms, write_ms = takeover_any(systemd, None, t0, 15)
            self.assertIs(leader, b, f"exits 75: {systemd.exits}\na:\n{a.log(20)}\n"
                                     f"b:\n{b.log(20)}")
            self.assertIsNotNone(write_ms, b.log(20))
            self.assertGreater(ready_ms, 1500, "the forged key was not waited out")
            self.assertTrue(systemd.until(lambda: self.cluster_keys.in_sync("a", "b"), 15),
                            f"a not back in /sync: {self.cluster_keys.sync()}\n{a.log(20)}")
        except Diverged as e:
            self.fail(str(e))
        for w in ws:
            w.join(10)
        sys.stderr.write(f"  forged leader key: b /ready 200 after {ready_ms:.0f} ms, first "
                         f"write after {write_ms:.0f} ms; exits 75 (restarted): "
                         f"{systemd.exits}; {ledger.bound_count()} keys acked bound\n")
        self.assertIn("FOREIGN LEADER KEY", b.log())
        self.assertIn("removed the foreign leader key", b.log())
        self.assertEqual(ledger.problems, [])
        self.assert_ledger(b, ledger)

    def test_f_an_empty_standby_catches_up_a_million_bindings_under_a_writer(self):
        a = self.started(self.node("a"))
        self.assertTrue(wait_until(lambda: ready(a.base_url), 5), a.log())
        self.assertEqual(initialize(a.base_url, 0, 1 << 21).status_code, 200)
        ledger = Ledger()
        c = Client(a.base_url)
        try:
            began = time.monotonic()
            for n in range(CATCH_UP_BINDINGS // 8192):
                ks = keys(8192, f"bulk-{n}")
                answer = c.batch_allocate(0, ks)
                self.assertEqual(answer.status_code, 200, answer.text[:200])
                results = answer.json()["results"]
                ledger.on_allocate(0, results)
                self.assertEqual(c.confirm_write(0, results).status_code, 204)
                ledger.on_confirm(0, results)
            fill_s = time.monotonic() - began
        finally:
            c.close()
        writer = Writer(a.base_url, 0, ledger, "f")
        writer.start()
        self.addCleanup(writer.join, 10)
        self.addCleanup(writer.stop)
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= CATCH_UP_BINDINGS + 100, 10))

        b = self.started(self.node("b"))
        t0 = time.monotonic()
        self.wait_in_sync(b, a, timeout=60)
        catch_up_s = time.monotonic() - t0
        sent = sum(int(m) for m in re.findall(r"its state at \d+: (\d+) bytes", a.log()))
        stall_ms = max([took for end, took, _, _ in list(writer.slow_calls) if end >= t0]
                       or [0]) * 1000
        self.assertTrue(writer.is_alive(), f"the writer stopped: {writer.stopped_by}")
        sys.stderr.write(f"\n  {CATCH_UP_BINDINGS} bindings filled in {fill_s:.1f} s; b in "
                         f"/sync {catch_up_s:.2f} s after its start ({sent / 1e6:.1f} MB of "
                         f"state, forked: {'forked in' in a.log()}); the writer's longest "
                         f"call over 0.1 s meanwhile {stall_ms:.0f} ms (0: none)\n")
        self.assertGreater(sent, CATCH_UP_BINDINGS * 16)
        self.assertLess(stall_ms, 2000)
        writer.stop()
        writer.join(10)
        self.write_then_kill(a, b, ledger, "f-kill", min_bound=200, writers=1)
        self.assert_ledger(b, ledger)


if __name__ == "__main__":
    unittest.main()
