# ctest: etcd
"""A replicated pair on a real 3-member etcd that loses members (docs/replication.md,
"Test plan": T4 and T5). etcd runs three members on loopback ports, tuned as deploy/etcd (heartbeat
50 ms, election 500 ms, so a 1 s lease); every node gets all three client URLs in
--ha-etcd and moves to the next one when a member fails. Node a leads, b is its sync
standby, two vLLM-like writers (rank 0) run against a, and a sampler asks both nodes'
GET /ready (and a's API) every ~10 ms for the whole test.

Checks:
  T4. kill -9 of the etcd LEADER member under the writers (two members keep quorum and
      elect a new etcd leader). There must be no metad failover: the leader key still
      names a with the same create_revision (epoch), b never answers /ready 200, no
      sampler round has two nodes at 200, a's longest stretch without /ready 200 stays
      under 1.5 s and a ends serving, b is (again) listed in /sync. No lease can be
      renewed while etcd elects (0.5-1 s and more, and etcd 3.4 holds a renewal that
      reached a member knowing no leader for one more election timeout), so a may pass
      its deadline (renewal send time + 850 ms) and answer 503 until a renewal lands:
      the writers therefore use vLLM's retry schedule (0.01, 0.61, 1.81 s), none of
      their calls may fail after those retries, they keep acknowledging after the kill,
      and the longest call that ended after the kill (the write pause, quantized by
      that schedule) is printed and must stay under 2 s; a's stretch without 200 and
      the tries answered 503 are printed too. The ledger is clean on a (every
      acknowledged binding with its page, nothing aliased, acknowledged reservations
      honoured). The killed member is restarted on its data dir and must rejoin.
  T5. kill -9 of two of the three members at once, the etcd leader among them (a lone
      etcd leader would go on renewing leases until it noticed the lost quorum): quorum
      is lost for 3 s. kill -> a's /ready not 200 and kill -> a's API answering 503
      ("... its lease is not confirmed") are printed; a's /health says "fenced". Every
      request sent later than the TTL (1 s) after the members died, until etcd is
      restarted, must be refused: /ready not 200 on both nodes and 503 from a's API
      (no renewal made before the kill covers that instant). The writers (no retries)
      stop at their first 503; the ledger holds only acknowledged answers. The two
      members are restarted: exactly one node serves again within 15 s (which one, and
      how long after the restart and after etcd had a leader again, is printed), the
      other is back in /sync (exits with status 75 are restarted as the shipped systemd
      unit does), never two nodes at 200 in one sampler round, and the whole ledger is
      on the serving node: 0 acknowledged writes lost.

Skipped where etcd is absent or where `hf3fs-metad --help` does not mention
--repl-listen. Run by scripts/test.sh's release stage (ctest e2e_python_etcd_loss,
label etcd).
"""

import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import requests

from failover_harness import (NUM_PAGES, REPL, WHY, Cluster, Diverged, FailoverCase, Ledger,
                              Supervisor, Writer, initialize, ready, wait_until)
from metad_harness import compact, free_port
from test_ha import ETCD

TTL_S = 1.0  # the nodes' lease (--ha-ttl-ms default); the tuned etcd's minimum
OUTAGE_S = 3.0  # how long T5 keeps quorum lost: past the TTL and etcd's lease extension
WATCH_S = 3.0  # how long T4 watches after the kill for a failover that must not come


class EtcdCluster:
    """An etcd cluster of `size` members on free loopback ports and a temp dir, tuned as
    deploy/etcd (heartbeat 50 ms, election 500 ms). `url` is the comma-separated client
    URLs (what --ha-etcd takes). A member can be killed -9 and started again with the
    same command line and data dir (it then rejoins; its --initial-cluster flags are
    ignored once it has data)."""

    def __init__(self, size=3):
        self.dir = tempfile.mkdtemp(prefix="metad-etcd-loss-")
        self.names = [f"m{i}" for i in range(1, size + 1)]
        ports = {n: (free_port(), free_port()) for n in self.names}
        self.client_urls = {n: f"http://127.0.0.1:{c}" for n, (c, _) in ports.items()}
        self.peer_urls = {n: f"http://127.0.0.1:{p}" for n, (_, p) in ports.items()}
        self.url = ",".join(self.client_urls[n] for n in self.names)
        self.cluster = ",".join(f"{n}={self.peer_urls[n]}" for n in self.names)
        self.procs = {}
        for n in self.names:
            self.start(n)
        if not wait_until(self.healthy, 20):
            logs = {n: self.log(n) for n in self.names}
            self.stop()
            raise RuntimeError(f"etcd did not form a cluster: {logs}")

    def start(self, *names):
        for n in names:
            assert not self.alive(n), f"etcd {n} is running"
            log = open(os.path.join(self.dir, f"{n}.log"), "ab")
            try:
                self.procs[n] = subprocess.Popen(
                    [ETCD, "--name", n, "--data-dir", os.path.join(self.dir, n),
                     "--listen-client-urls", self.client_urls[n],
                     "--advertise-client-urls", self.client_urls[n],
                     "--listen-peer-urls", self.peer_urls[n],
                     "--initial-advertise-peer-urls", self.peer_urls[n],
                     "--initial-cluster", self.cluster, "--initial-cluster-state", "new",
                     "--initial-cluster-token", os.path.basename(self.dir),
                     "--heartbeat-interval", "50", "--election-timeout", "500"],
                    stdout=log, stderr=log, stdin=subprocess.DEVNULL)
            finally:
                log.close()  # the child has its own descriptor

    def kill(self, *names):
        """kill -9 of all `names` at once (signals first, then waits for each)."""
        for n in names:
            self.procs[n].send_signal(signal.SIGKILL)
        for n in names:
            self.procs[n].wait()

    def alive(self, name):
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def live(self):
        return [n for n in self.names if self.alive(n)]

    def status(self, name, timeout=0.5):
        """POST /v3/maintenance/status of one member (answered locally, even without a
        quorum): a dict with header.member_id and leader ("0": none known), or None."""
        try:
            r = requests.post(self.client_urls[name] + "/v3/maintenance/status", json={},
                              timeout=timeout)
            answer = r.json()
            return answer if r.status_code == 200 and "header" in answer else None
        except (requests.RequestException, ValueError):
            return None

    def leader(self):
        """The name of the live member that reports itself leader, or None."""
        for n in self.live():
            s = self.status(n)
            if s and s.get("leader", "0") != "0" and s["leader"] == s["header"]["member_id"]:
                return n
        return None

    def healthy(self):
        """Every member runs and reports the same leader, itself a member."""
        if len(self.live()) != len(self.names):
            return False
        statuses = [self.status(n) for n in self.names]
        if not all(statuses):
            return False
        ids = {s["header"]["member_id"] for s in statuses}
        leaders = {s.get("leader", "0") for s in statuses}
        return len(leaders) == 1 and leaders <= ids

    def revive(self, timeout=20):
        """Starts every dead member and waits until the cluster is healthy."""
        self.start(*[n for n in self.names if not self.alive(n)])
        return wait_until(self.healthy, timeout)

    def log(self, name, chars=3000):
        try:
            with open(os.path.join(self.dir, f"{name}.log"), "rb") as f:
                return f.read().decode(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class LeaderWatch:
    """Asks every member its status every ~10 ms, each member from its own thread (a
    member still starting can hold an answer back), until one answers that it is the
    leader; `at` is then the monotonic time that answer arrived (an upper bound of
    when etcd had a leader again) and `leader` its name; None until then."""

    def __init__(self, etcd, timeout=20.0):
        self.etcd = etcd
        self.deadline = time.monotonic() + timeout
        self.at = None
        self.leader = None
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._poll, args=(n,), daemon=True)
                        for n in etcd.names]
        for t in self.threads:
            t.start()

    def _poll(self, name):
        while self.at is None and time.monotonic() < self.deadline:
            s = self.etcd.status(name, timeout=0.2)
            if s and s.get("leader", "0") not in ("0", "") and \
                    s["leader"] == s["header"]["member_id"]:
                with self.lock:
                    if self.at is None:
                        self.at, self.leader = time.monotonic(), name
                return
            time.sleep(0.01)

    def join(self):
        for t in self.threads:
            t.join(max(0.0, self.deadline - time.monotonic()))


class EtcdKeys(Cluster):
    """failover_harness.Cluster over several members: a read goes to each live member in
    turn until one answers with a header (an error answer such as "no leader" is not
    taken for a missing key)."""

    def __init__(self, etcd, name):
        super().__init__(etcd.client_urls[etcd.names[0]], name)
        self.etcd = etcd

    def _range(self, k):
        error = "no etcd member is running"
        for n in self.etcd.live():
            try:
                r = requests.post(self.etcd.client_urls[n] + "/v3/kv/range",
                                  json={"key": base64.b64encode(k.encode()).decode()},
                                  timeout=2)
                answer = r.json()
            except (requests.RequestException, ValueError) as e:
                error = f"{n}: {e}"
                continue
            if r.status_code == 200 and "header" in answer:
                kvs = answer.get("kvs", [])
                return kvs[0] if kvs else None
            error = f"{n}: {r.status_code} {r.text[:200]}"
        raise requests.ConnectionError(error)


class Sampler(threading.Thread):
    """Every `period` s, one round: GET /ready of each node, then (api_node given) an API
    call on that node (POST /keys/batch_exists of no keys). Records
    (sent, received, {node id: status or None}, (api status or None, api detail)) on
    the monotonic clock; `sent` is when the round's first request left, so an answer in
    the round was produced at or after it."""

    def __init__(self, nodes, api_node=None, period=0.01):
        super().__init__(daemon=True, name="ready-sampler")
        self.nodes = nodes
        self.api_node = api_node
        self.period = period
        self.rounds = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()

    def stop(self):
        self.stop_event.set()
        self.join(5)

    def run(self):
        sessions = {n.id: requests.Session() for n in self.nodes}
        api_session = requests.Session()
        while not self.stop_event.is_set():
            sent = time.monotonic()
            codes = {}
            for n in self.nodes:
                try:
                    codes[n.id] = sessions[n.id].get(n.base_url + "/ready",
                                                     timeout=0.3).status_code
                except requests.RequestException:
                    codes[n.id] = None
            api = (None, "")
            if self.api_node is not None:
                try:
                    r = api_session.post(self.api_node.base_url + "/keys/batch_exists",
                                         data=compact({"keys": []}),
                                         headers={"Content-Type": "application/json"},
                                         timeout=0.3)
                    api = (r.status_code, r.json().get("detail", "") if r.status_code != 200
                           else "")
                except (requests.RequestException, ValueError):
                    api = (None, "")
            received = time.monotonic()
            with self.lock:
                self.rounds.append((sent, received, codes, api))
            self.stop_event.wait(max(0.0, self.period - (received - sent)))
        for s in (*sessions.values(), api_session):
            s.close()

    def snapshot(self, since=float("-inf"), until=float("inf")):
        with self.lock:
            return [r for r in self.rounds if since <= r[0] < until]

    def two_serving(self):
        """Rounds in which more than one node answered /ready 200 (the answers of one
        round are a few ms apart)."""
        return [(round(s, 3), c) for s, _, c, _ in self.snapshot()
                if sum(1 for v in c.values() if v == 200) > 1]

    def longest_without_200(self, node_id, since, until):
        """The longest time (s) between two consecutive rounds in [since, until) in which
        node_id answered /ready 200, and how many rounds there answered otherwise."""
        times = [s for s, _, c, _ in self.snapshot(since, until) if c.get(node_id) == 200]
        others = sum(1 for _, _, c, _ in self.snapshot(since, until) if c.get(node_id) != 200)
        gaps = [b - a for a, b in zip(times, times[1:])]
        return max(gaps or [float("inf")]), others


@unittest.skipUnless(REPL, WHY)
@unittest.skipUnless(os.access(ETCD, os.X_OK), f"{ETCD} not found (Debian package etcd-server)")
class EtcdLossTest(FailoverCase):
    """T4 and T5 of the docstring above, on one 3-member etcd per class."""

    @classmethod
    def setUpClass(cls):
        cls.etcd = EtcdCluster(3)

    @classmethod
    def tearDownClass(cls):
        cls.etcd.stop()

    def setUp(self):
        # A test that failed half way may have left members down.
        self.assertTrue(self.etcd.revive(), {n: self.etcd.log(n, 800) for n in self.etcd.names})
        super().setUp()
        self.cluster_keys = EtcdKeys(self.etcd, self.cluster)

    def writers(self, node, ledger, tag, retry):
        ws = [Writer(node.base_url, 0, ledger, f"{tag}-{i}", retry=retry) for i in range(2)]
        for w in ws:
            w.start()
            self.addCleanup(w.join, 10)
            self.addCleanup(w.stop)
        return ws

    def sampler(self, nodes, api_node=None):
        s = Sampler(nodes, api_node)
        s.start()
        self.addCleanup(s.stop)
        return s

    def loaded_pair(self, tag, retry, min_bound=500):
        """a leads, b in /sync, the sampler running, two writers with min_bound acked
        bindings on a; returns (a, b, epoch, ledger, writers, sampler)."""
        a, b = self.pair()
        value, epoch = self.cluster_keys.leader()
        self.assertEqual(value["node"], "a")
        self.assertEqual(initialize(a.base_url, 0, NUM_PAGES).status_code, 200)
        sampler = self.sampler([a, b], api_node=a)
        ledger = Ledger()
        ws = self.writers(a, ledger, tag, retry)
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= min_bound
                                   or not all(w.is_alive() for w in ws), 30),
                        "the writers made no progress")
        for w in ws:
            self.assertTrue(w.is_alive(), f"a writer stopped before the kill: {w.stopped_by}"
                            f"\n{a.log(20)}")
        self.assertTrue(self.cluster_keys.in_sync("b", "a"),
                        f"b fell out of /sync under the writers: {self.cluster_keys.sync()}"
                        f"\n{a.log(12)}")
        return a, b, epoch, ledger, ws, sampler

    def test_t4_losing_the_etcd_leader_member_causes_no_failover(self):
        a, b, epoch, ledger, ws, sampler = self.loaded_pair("t4", retry=True)
        victim = self.etcd.leader()
        self.assertIsNotNone(victim, "no etcd leader before the kill")
        before = ledger.bound_count()
        t0 = time.monotonic()
        self.etcd.kill(victim)
        election = LeaderWatch(self.etcd)
        # Long enough for a lease expiry and a takeover, were either to happen.
        time.sleep(WATCH_S)
        progress = ledger.bound_count()
        self.assertTrue(wait_until(lambda: ledger.bound_count() > progress + 100, 5),
                        f"the writers stopped acknowledging after the kill: "
                        f"{[w.stopped_by for w in ws]}\na:\n{a.log(20)}")
        for w in ws:
            w.stop()
        for w in ws:
            w.join(10)
            self.assertFalse(w.is_alive(), "a writer did not stop")
        sampler.stop()
        election.join()

        # The write pause: the longest writer call that ended after the kill, vLLM's
        # retries included (the Writer records calls over 100 ms), and the tries a
        # answered 503 meanwhile; a's own pause: its longest stretch without /ready 200.
        calls = [(took, path, attempts) for w in ws for end, took, path, attempts
                 in list(w.slow_calls) if end >= t0]
        pause_s, pause_path, pause_tries = max(calls, default=(0.0, None, []))
        answered_503 = sum(1 for _, _, tries in calls for _, _, outcome in tries
                           if outcome == 503)
        gap_s, not_200 = sampler.longest_without_200("a", t0 - 0.5, t0 + WATCH_S)
        pause = (f"{pause_s * 1000:.0f} ms ({pause_path}, tries at "
                 f"{[(round(at, 2), outcome) for at, _, outcome in pause_tries]})"
                 if calls else "under 100 ms")
        sys.stderr.write(
            f"\n  kill -9 etcd leader {victim}: etcd leader {election.leader} after "
            f"{election.at and round((election.at - t0) * 1000)} ms; longest write {pause}; "
            f"a without /ready 200 for {gap_s * 1000:.0f} ms ({not_200} samples not 200); "
            f"{sum(w.retried_calls for w in ws)} calls retried, {answered_503} tries answered "
            f"503; {ledger.bound_count() - before} keys acked after the kill, "
            f"{ledger.bound_count()} in all\n")

        self.assertIsNotNone(election.at, "etcd elected no new leader")
        self.assertEqual([f for w in ws for f in w.failures], [],
                         "a writer's call failed even after vLLM's retries")
        self.assertEqual(ledger.problems, [])
        self.assertLess(pause_s, 2.0, "the write pause exceeds 2 s")
        # No metad failover: the same leader key (same epoch), b never served, a serves.
        value, revision = self.cluster_keys.leader()
        self.assertEqual((value["node"], revision), ("a", epoch),
                         f"the leader key changed\na:\n{a.log(30)}\nb:\n{b.log(30)}")
        self.assertGreater(len(sampler.snapshot(t0, t0 + WATCH_S)), 50, "the sampler stalled")
        self.assertEqual(sampler.two_serving(), [], "two nodes answered /ready 200 at once")
        self.assertEqual([s for s, _, c, _ in sampler.snapshot() if c.get("b") == 200], [],
                         f"b served without a failover\nb:\n{b.log(30)}")
        self.assertLess(gap_s, 1.5, f"a stopped serving for too long\na:\n{a.log(30)}")
        self.assertTrue(ready(a.base_url), a.log(30))
        self.wait_in_sync(b, a, allow_diverged_exits=1)
        self.assert_ledger(a, ledger, kills=0)

        # The killed member comes back on its data dir and rejoins the cluster.
        began = time.monotonic()
        self.etcd.start(victim)
        self.assertTrue(wait_until(self.etcd.healthy, 15), self.etcd.log(victim))
        sys.stderr.write(f"  etcd {victim} restarted: all 3 members agree on a leader after "
                         f"{(time.monotonic() - began) * 1000:.0f} ms\n")
        self.assertTrue(ready(a.base_url))

    def test_t5_losing_etcd_quorum_fences_the_leader_and_loses_nothing(self):
        a, b, epoch, ledger, ws, sampler = self.loaded_pair("t5", retry=False)
        leader = self.etcd.leader()
        self.assertIsNotNone(leader, "no etcd leader before the kill")
        # The etcd leader goes too: a lone leader would renew leases until it noticed,
        # an election timeout later, that it lost its quorum.
        victims = [leader, next(n for n in self.etcd.names if n != leader)]
        survivor = next(n for n in self.etcd.names if n not in victims)
        t0 = time.monotonic()
        self.etcd.kill(*victims)
        dead = time.monotonic()  # a renewal that succeeded was sent before this
        s = self.etcd.status(survivor)
        self.assertTrue(s is not None and s["leader"] != s["header"]["member_id"],
                        f"the surviving member {survivor} leads: {s}")

        for w in ws:
            w.join(max(0.0, t0 + TTL_S + 2.0 - time.monotonic()))
            self.assertFalse(w.is_alive(), "a writer went on without quorum")
        time.sleep(max(0.0, t0 + OUTAGE_S - time.monotonic()))
        health = requests.get(a.base_url + "/health", timeout=2).json()
        back = time.monotonic()
        self.etcd.start(*victims)
        quorum = LeaderWatch(self.etcd)

        outage = sampler.snapshot(t0, back)
        first_not_ready = next((r for _, r, c, _ in outage if c.get("a") != 200), None)
        first_503 = next(((r, api) for _, r, _, api in outage if api[0] == 503), None)
        # Past the TTL no renewal made before the kill covers anyone: every answer to a
        # request sent then must be a refusal, on both nodes, until etcd is restarted.
        past_ttl = [r for r in outage if r[0] >= dead + TTL_S]
        late = [(round(s - dead, 3), c, api) for s, _, c, api in past_ttl
                if 200 in c.values() or api[0] != 503]
        sys.stderr.write(
            f"\n  kill -9 etcd {victims} (leader {leader}): a /ready not 200 after "
            f"{first_not_ready and round((first_not_ready - t0) * 1000)} ms, API 503 after "
            f"{first_503 and round((first_503[0] - t0) * 1000)} ms; writers stopped by "
            f"{[w.stopped_by and w.stopped_by[:40] for w in ws]}; {ledger.bound_count()} "
            f"keys acked\n")
        self.assertIsNotNone(first_not_ready, f"a kept /ready 200 without quorum\n{a.log(30)}")
        self.assertIsNotNone(first_503, f"a's API never answered 503\n{a.log(30)}")
        self.assertIn("not serving: this node (a) holds the leader key but its lease is not "
                      "confirmed", first_503[1][1])
        self.assertEqual(health, {"status": "ok", "role": "fenced"})
        self.assertGreater(len(past_ttl), 50, "the sampler stalled")
        self.assertEqual(late, [], "past the lease TTL without quorum, an answer was not a "
                         f"refusal (s after the kill, /ready, a's API)\na:\n{a.log(30)}")
        for w in ws:
            self.assertIsNotNone(w.stopped_by)
            self.assertIn("503", w.stopped_by)
        self.assertEqual(ledger.problems, [])

        # Quorum returns: exactly one node serves again, the other rejoins /sync.
        systemd = Supervisor([a, b], restart_s=0.2)
        serving = []

        def someone_serves():
            serving[:] = [n for n in (a, b) if n.alive() and ready(n.base_url, timeout=0.3)]
            return bool(serving)

        try:
            self.assertTrue(systemd.until(someone_serves, 15),
                            f"no node served within 15 s of the restart (exits 75: "
                            f"{systemd.exits})\na:\n{a.log(30)}\nb:\n{b.log(30)}")
            self.assertEqual(len(serving), 1, "two nodes serve")
            new = serving[0]
            other = b if new is a else a
            self.assertTrue(systemd.until(lambda: self.cluster_keys.in_sync(other.id, new.id),
                                          15),
                            f"{other.id} not back in /sync: {self.cluster_keys.sync()}; exits "
                            f"75: {systemd.exits}\n{other.id}:\n{other.log(30)}")
        except Diverged as e:
            self.fail(str(e))
        # someone_serves() may see `new` serve between two of the sampler's rounds (a
        # round waits up to 0.3 s on each node), and /sync may list the other at once:
        # the sampler must record `new` serving before it stops.
        self.assertTrue(wait_until(lambda: any(c.get(new.id) == 200
                                               for _, _, c, _ in sampler.snapshot(back)), 5),
                        f"the sampler never saw {new.id} serve")
        sampler.stop()
        quorum.join()
        served_at = next(r for s, r, c, _ in sampler.snapshot(back) if c.get(new.id) == 200)
        value, revision = self.cluster_keys.leader()
        sys.stderr.write(
            f"  etcd {victims} restarted: etcd leader after "
            f"{quorum.at and round((quorum.at - back) * 1000)} ms; {new.id} serves "
            f"{(served_at - back) * 1000:.0f} ms after the restart"
            f"{f', {(served_at - quorum.at) * 1000:.0f} ms after quorum' if quorum.at else ''}"
            f", epoch {'unchanged' if revision == epoch else 'new'}; exits 75: "
            f"{systemd.exits}\n")
        self.assertEqual(value["node"], new.id)
        self.assertEqual(sampler.two_serving(), [], "two nodes answered /ready 200 at once")
        self.assert_ledger(new, ledger, kills=1)


if __name__ == "__main__":
    unittest.main()
