"""High availability on a real etcd (Debian's /usr/bin/etcd on free loopback ports,
tuned as deploy/etcd: heartbeat 50 ms, election 500 ms, so a 1 s lease): two nodes of
one cluster, each with its own --data-dir. Exactly one leads and answers the API; the
other answers 503 naming it, /ready 200 only on the leader, /health 200 on both. With no
replication (yet) only the first leader is in /sync: kill -9 of the leader leaves the
standby answering 503, and the old leader leads again after a restart with its data.
SIGTERM revokes the lease before the process exits. Skipped where etcd is absent.
Run by scripts/test.sh's release stage only (ctest label etcd)."""

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import requests

from metad_harness import Client, MetadServer, keys, run_to_exit

ETCD = "/usr/bin/etcd"
HAPROXY = "/usr/sbin/haproxy"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


class Etcd:
    """A one-member etcd with the tuned timing of design-ha (TTL 1 s is its minimum)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="metad-ha-etcd-")
        client, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.log = open(os.path.join(self.dir, "etcd.log"), "wb")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "n1", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"n1={peer_url}",
             "--heartbeat-interval", "50", "--election-timeout", "500"],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        if not wait_until(self._answers, 10):
            self.stop()
            raise RuntimeError("etcd did not start")

    def _answers(self):
        try:
            return requests.post(self.url + "/v3/kv/range", json={"key": "eA=="},
                                 timeout=0.5).status_code == 200
        except requests.RequestException:
            return False

    def get(self, key):
        """The key's value (str) or None."""
        answer = requests.post(self.url + "/v3/kv/range",
                               json={"key": base64.b64encode(key.encode()).decode()},
                               timeout=2).json()
        kvs = answer.get("kvs", [])
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@unittest.skipUnless(os.access(ETCD, os.X_OK),
                     f"{ETCD} not found (Debian package etcd-server; scripts/setup.sh --test)")
class HaTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.etcd = Etcd()

    @classmethod
    def tearDownClass(cls):
        cls.etcd.stop()

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="metad-ha-")
        self.cluster = self.id().rsplit(".", 1)[-1].replace("_", "-")[:64]
        self.nodes = []

    def tearDown(self):
        for node in self.nodes:
            if node.alive():
                node.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, node_id, *extra):
        data = os.path.join(self.dir, node_id)
        os.makedirs(data, exist_ok=True)
        server = MetadServer(["--ha-etcd", self.etcd.url, "--ha-cluster", self.cluster,
                              "--ha-node", node_id, "--data-dir", data, *extra])
        self.nodes.append(server)
        return server

    @staticmethod
    def ready(server):
        try:
            return requests.get(server.base_url + "/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def wait_leader(self, servers, timeout=5):
        found = []
        self.assertTrue(wait_until(lambda: found.extend(s for s in servers if self.ready(s))
                                   or found, timeout), "no node became ready")
        return found[0]

    def assert_standby(self, server, leader_id, leader):
        c = Client(server.base_url)
        try:
            for answer in (c.initialize(0, 16), c.batch_exists(keys(2)),
                           c.post("/0/exists", {"keys": ["k"]}), c.request("GET", "/stats"),
                           c.request("GET", "/ready")):
                self.assertEqual(answer.status_code, 503, answer.text)
                detail = answer.json()["detail"]
                if leader is None:
                    self.assertIn("no leader", detail)
                else:
                    self.assertEqual(detail, f"not the leader; the leader is node {leader_id} "
                                             f"at {leader.base_url}")
            health = c.request("GET", "/health")
            self.assertEqual(health.status_code, 200)
            self.assertEqual(health.json(), {"status": "ok", "role": "standby"})
            metrics = c.request("GET", "/metrics")
            self.assertEqual(metrics.status_code, 200)
            self.assertIn('hf3fs_metad_ha_role{role="standby"} 1', metrics.text)
            self.assertIn("hf3fs_metad_ha_serving 0", metrics.text)
            self.assertIn("hf3fs_metad_ranks 0", metrics.text)  # the 503s changed nothing
        finally:
            c.close()

    def test_one_leader_no_takeover_without_replication_and_the_old_leader_returns(self):
        a, b = self.start("a"), self.start("b")
        leader = self.wait_leader([a, b])
        standby = b if leader is a else a
        leader_id, standby_id = ("a", "b") if leader is a else ("b", "a")
        self.assertFalse(self.ready(standby))
        sync = json.loads(self.etcd.get(f"/hf3fs-metad/{self.cluster}/sync"))
        self.assertEqual((sync["leader"], sync["sync"]), (leader_id, []))

        c = Client(leader.base_url)
        self.assertEqual(c.request("GET", "/health").json(), {"status": "ok", "role": "leader"})
        metrics = c.request("GET", "/metrics").text
        self.assertIn('hf3fs_metad_ha_role{role="leader"} 1', metrics)
        self.assertIn("hf3fs_metad_ha_serving 1", metrics)
        ks = keys(8, "ha")
        self.assertEqual(c.initialize(0, 16).status_code, 200)
        pages = dict(c.batch_allocate(0, ks).json()["results"])
        self.assertEqual(c.confirm_write(0, pages.items()).status_code, 204)
        self.assertEqual(c.get_locations(0, ks).json()["locations"], [pages[k] for k in ks])
        c.close()
        self.assert_standby(standby, leader_id, leader)

        # kill -9: the lease expires (TTL 1 s, etcd checks every 0.5 s) and the standby,
        # not in /sync, does not campaign: it keeps answering 503, now with no leader.
        leader.kill()
        key = f"/hf3fs-metad/{self.cluster}/leader"
        self.assertTrue(wait_until(lambda: self.etcd.get(key) is None, 3), "lease not expired")
        time.sleep(0.5)
        self.assertFalse(self.ready(standby))
        self.assert_standby(standby, None, None)
        self.assertIn(f"node {standby_id} candidate -> standby", standby.log())
        self.assertNotIn(f"node {standby_id} candidate -> leader", standby.log())

        # The old leader restarts on its data directory and leads again, data intact.
        back = self.start(leader_id)
        self.assertTrue(wait_until(lambda: self.ready(back), 5), back.log())
        c = Client(back.base_url)
        self.assertEqual(c.get_locations(0, ks).json()["locations"], [pages[k] for k in ks])
        self.assertEqual(c.batch_exists(ks).json()["exists"], [True] * len(ks))
        c.close()
        self.assertTrue(wait_until(lambda: requests.post(
            standby.base_url + "/keys/batch_exists", json={"keys": []}).json()["detail"].endswith(
                back.base_url), 3))
        self.assert_standby(standby, leader_id, back)
        new_sync = json.loads(self.etcd.get(f"/hf3fs-metad/{self.cluster}/sync"))
        self.assertGreater(new_sync["epoch"], sync["epoch"])

        # SIGTERM: drained, then the lease is revoked before the process exits, so the
        # leader key is gone at once (not a TTL later).
        began = time.monotonic()
        self.assertEqual(back.stop(), 0)
        took = time.monotonic() - began
        self.assertIsNone(self.etcd.get(key), "the lease was not revoked")
        self.assertLess(took, 1.0)
        self.assertFalse(self.ready(standby))

    def test_a_fresh_cluster_elects_the_first_node_and_a_second_stands_by(self):
        a = self.start("a")
        self.assertTrue(wait_until(lambda: self.ready(a), 5), a.log())
        b = self.start("b")
        self.assertTrue(wait_until(lambda: "candidate -> standby" in b.log(), 3), b.log())
        self.assert_standby(b, "a", a)
        value = json.loads(self.etcd.get(f"/hf3fs-metad/{self.cluster}/leader"))
        self.assertEqual(value, {"node": "a", "http": a.base_url})


class HaFlagsTest(unittest.TestCase):
    """Bad HA flags: one line, exit 2 (no etcd needed)."""

    def test_bad_ha_flags_are_refused(self):
        etcd = ["--ha-etcd", "http://127.0.0.1:1"]
        named = [*etcd, "--ha-cluster", "c", "--ha-node", "a"]
        cases = [
            (etcd, "--ha-etcd needs --ha-cluster and --ha-node"),
            ([*etcd, "--ha-cluster", "c"], "--ha-etcd needs --ha-cluster and --ha-node"),
            (["--ha-node", "a"], "need --ha-etcd"),
            (["--ha-ttl-ms", "2000"], "need --ha-etcd"),
            (["--ha-etcd", "localhost:2379", "--ha-cluster", "c", "--ha-node", "a"],
             "--ha-etcd: expected http://HOST:PORT"),
            ([*etcd, "--ha-cluster", "c/d", "--ha-node", "a"], "--ha-cluster"),
            ([*named, "--ha-ttl-ms", "1500"], "whole seconds"),
            ([*named, "--ha-renew-ms", "900"], "must be < TTL"),
            ([*named, "--ha-ttl-ms", "500"], "--ha-ttl-ms: expected an integer"),
            ([*named, "--ha-advertise", "https://x:1"], "--ha-advertise"),
            ([*named, "--ha-advertise", 'http://x":1'], "--ha-advertise"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                code, err, started = run_to_exit(args)
                self.assertFalse(started)
                self.assertEqual(code, 2, err)
                self.assertIn(message, err)


if __name__ == "__main__":
    unittest.main()
