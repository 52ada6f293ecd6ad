# ctest: etcd
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
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import requests

from metad_harness import Client, MetadServer, free_port, keys, run_to_exit, wait_until

ETCD = "/usr/bin/etcd"
HAPROXY = "/usr/sbin/haproxy"
NGINX = "/usr/sbin/nginx"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def start_haproxy(directory, port_a, port_b, log_path=None):
    """deploy/haproxy/hf3fs-metad-ha.cfg in front of two nodes on loopback ports, written
    to `directory` and checked with haproxy -c; returns (process, URL). RuntimeError if
    the shipped file lacks a placeholder or does not check."""
    with open(os.path.join(ROOT, "deploy", "haproxy", "hf3fs-metad-ha.cfg")) as f:
        text = f.read()
    port = free_port()
    for shipped, ours in (("NODE_A_HOST:18000", f"127.0.0.1:{port_a}"),
                          ("NODE_B_HOST:18000", f"127.0.0.1:{port_b}"),
                          ("bind 127.0.0.1:18000", f"bind 127.0.0.1:{port}"),
                          ("CHANGE-ME", "t")):
        if shipped not in text:
            raise RuntimeError(f"deploy/haproxy/hf3fs-metad-ha.cfg: no {shipped!r}")
        text = text.replace(shipped, ours)
    if os.geteuid() != 0:
        text = re.sub(r"\n\s*(user|group) haproxy\b", "", text)
    text = text.replace("log /dev/log local0 warning", "")
    conf = os.path.join(directory, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(text)
    check = subprocess.run([HAPROXY, "-c", "-f", conf], capture_output=True, timeout=30)
    if check.returncode != 0:
        raise RuntimeError(f"haproxy -c: {check.stdout + check.stderr}")
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([HAPROXY, "-db", "-f", conf], stdin=subprocess.DEVNULL,
                            stdout=out, stderr=out)
    return proc, f"http://127.0.0.1:{port}"


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_certificates(directory):
    """A CA, etcd's certificate (IP SAN 127.0.0.1 only, for serving and for the gateway's
    own client connection to etcd's gRPC side), and client certificates signed by it:
    client.pem without a Common Name (what etcd --client-cert-auth's gateway accepts),
    cn-client.pem with one, and other-ca.pem, a CA that signed nothing here. P-256 keys:
    fast to make. Files in `directory`."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=hf3fs-metad test CA", cwd=directory)
    _openssl("req", "-x509", *ec, "-keyout", "other-ca.key", "-out", "other-ca.pem", "-days",
             "2", "-subj", "/CN=another CA", cwd=directory)
    for name, subject, usage, san in (
            ("etcd", "/CN=etcd", "serverAuth,clientAuth", "subjectAltName=IP:127.0.0.1\n"),
            ("client", "/O=hf3fs-metad", "clientAuth", ""),
            ("cn-client", "/CN=hf3fs-metad", "clientAuth", "")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
                 cwd=directory)
        with open(os.path.join(directory, f"{name}.ext"), "w") as f:
            f.write(f"{san}extendedKeyUsage={usage}\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile",
                 f"{name}.ext", cwd=directory)


class Etcd:
    """A one-member etcd with the tuned timing of docs/replication.md (TTL 1 s is its minimum).

    secure=True: as deploy/etcd ships it, on loopback: TLS on the client port with client
    certificates required (--trusted-ca-file, --client-cert-auth), certificates made by
    openssl in its directory (make_certificates), and authentication on: user root, and
    user hf3fs-metad whose role may read and write /hf3fs-metad/ only. node_flags are the
    flags a node needs to reach it; post() speaks to it as root. token_ttl_s: etcd's
    --auth-token-ttl (how long a token may go unused)."""

    USER = "hf3fs-metad"
    PASSWORD = "metad-test-password"

    def __init__(self, secure=False, token_ttl_s=300):
        self.dir = tempfile.mkdtemp(prefix="metad-ha-etcd-")
        self.secure = secure
        self.node_flags = []
        self._token = None
        self._tls = {}
        client, peer = free_port(), free_port()
        scheme = "https" if secure else "http"
        self.url = f"{scheme}://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        args = [ETCD, "--name", "n1", "--data-dir", os.path.join(self.dir, "data"),
                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"n1={peer_url}",
                "--heartbeat-interval", "50", "--election-timeout", "500"]
        if secure:
            make_certificates(self.dir)
            pem = lambda name: os.path.join(self.dir, name)
            args += ["--cert-file", pem("etcd.pem"), "--key-file", pem("etcd.key"),
                     "--trusted-ca-file", pem("ca.pem"), "--client-cert-auth",
                     "--auth-token-ttl", str(token_ttl_s)]
            self._tls = {"verify": pem("ca.pem"), "cert": (pem("client.pem"), pem("client.key"))}
            self.password_file = pem("metad-password")
            with open(os.open(self.password_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(self.PASSWORD + "\n")
            self.node_flags = ["--ha-etcd-ca", pem("ca.pem"), "--ha-etcd-cert", pem("client.pem"),
                               "--ha-etcd-key", pem("client.key"), "--ha-etcd-user", self.USER,
                               "--ha-etcd-password-file", self.password_file]
        self.log = open(os.path.join(self.dir, "etcd.log"), "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log,
                                     stdin=subprocess.DEVNULL)
        if not wait_until(self._answers, 10):
            self.stop()
            raise RuntimeError("etcd did not start")
        if secure:
            self._secure()

    def _secure(self):
        """docs/operations.md's etcdctl steps, through the gateway: root, the node's user
        and role (read and write under /hf3fs-metad/ only), then auth enable."""
        b64 = lambda text: base64.b64encode(text.encode()).decode()
        for path, body in (
                ("user/add", {"name": "root", "password": "root-test-password"}),
                ("user/grant", {"user": "root", "role": "root"}),
                ("user/add", {"name": self.USER, "password": self.PASSWORD}),
                ("role/add", {"name": self.USER}),
                ("role/grant", {"name": self.USER, "perm": {
                    "permType": "READWRITE", "key": b64("/hf3fs-metad/"),
                    "range_end": b64("/hf3fs-metad0")}}),
                ("user/grant", {"user": self.USER, "role": self.USER}),
                ("enable", {})):
            answer = requests.post(f"{self.url}/v3/auth/{path}", json=body, timeout=5,
                                   **self._tls)
            if answer.status_code != 200:
                raise RuntimeError(f"etcd auth {path}: {answer.status_code} {answer.text}")

    def post(self, path, body, timeout=2):
        """POST to the gateway; as root once auth is on (a token fetched again on 401)."""
        for attempt in range(2):
            headers = {}
            if self.secure and self._token is None:
                answer = requests.post(self.url + "/v3/auth/authenticate",
                                       json={"name": "root", "password": "root-test-password"},
                                       timeout=timeout, **self._tls)
                self._token = answer.json().get("token")
            if self._token:
                headers["Authorization"] = self._token
            answer = requests.post(self.url + path, json=body, headers=headers,
                                   timeout=timeout, **self._tls)
            if answer.status_code != 401:
                return answer
            self._token = None
        return answer

    def _answers(self):
        try:
            return requests.post(self.url + "/v3/kv/range", json={"key": "eA=="},
                                 timeout=0.5, **self._tls).status_code == 200
        except requests.RequestException:
            return False

    def get(self, key):
        """The key's value (str) or None."""
        answer = self.post("/v3/kv/range",
                           {"key": base64.b64encode(key.encode()).decode()}).json()
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
class HaCase(unittest.TestCase):
    """One etcd per class; each test's nodes form a cluster named after the test.
    etcd_options: Etcd's arguments (secure=True: TLS and authentication)."""

    etcd_options = {}

    @classmethod
    def setUpClass(cls):
        cls.etcd = Etcd(**cls.etcd_options)

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
                              "--ha-node", node_id, "--data-dir", data, *self.etcd.node_flags,
                              *extra])
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



class HaTest(HaCase):

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


class ForeignLeaderKeyTest(HaCase):
    """A leader key written without a lease (by hand, or by anyone with write access to
    etcd: issue 30, finding 7) names no leader and never expires. It must not stop the
    cluster for good: it is logged (error, with the etcdctl command that removes it),
    counted in /metrics, and a node that may lead removes it once it has stood unchanged
    for twice the lease TTL (2 s here), then campaigns."""

    BOUND = 6.0  # s: 2 x TTL, a campaign and the deposed leader's steps, with slack

    def forge(self, value):
        b64 = lambda text: base64.b64encode(text.encode()).decode()
        answer = requests.post(self.etcd.url + "/v3/kv/put",
                               json={"key": b64(f"/hf3fs-metad/{self.cluster}/leader"),
                                     "value": b64(value)}, timeout=2)
        self.assertEqual(answer.status_code, 200, answer.text)

    def leader_key(self):
        answer = requests.post(self.etcd.url + "/v3/kv/range", json={"key": base64.b64encode(
            f"/hf3fs-metad/{self.cluster}/leader".encode()).decode()}, timeout=2).json()
        kvs = answer.get("kvs", [])
        return kvs[0] if kvs else None

    def assert_reported(self, *nodes):
        removal = (f"etcdctl --endpoints={self.etcd.url} del "
                   f"/hf3fs-metad/{self.cluster}/leader")
        for node in nodes:
            log = node.log()
            self.assertIn("FOREIGN LEADER KEY", log)
            self.assertIn(removal, log)
            metrics = requests.get(node.base_url + "/metrics", timeout=2).text
            self.assertRegex(metrics, r"\nhf3fs_metad_ha_foreign_leader_keys_total [1-9]")
            self.assertIn("\nhf3fs_metad_ha_foreign_leader_key 0", metrics)  # removed

    def test_a_key_forged_over_the_leaders_is_removed_and_the_leader_serves_again(self):
        a, b = self.start("a"), self.start("b")
        leader = self.wait_leader([a, b])
        standby = b if leader is a else a
        c = Client(leader.base_url)
        self.addCleanup(c.close)
        ks = keys(4, "forged")
        self.assertEqual(c.initialize(0, 16).status_code, 200)
        pages = dict(c.batch_allocate(0, ks).json()["results"])
        self.assertEqual(c.confirm_write(0, pages.items()).status_code, 204)
        epoch = int(self.leader_key()["create_revision"])

        self.forge(json.dumps({"node": "mallory", "http": "http://10.9.9.9:1"}))
        began = time.monotonic()
        # The leader stops at once (it sees its key overwritten), nobody else serves.
        self.assertTrue(wait_until(lambda: not self.ready(leader), 1), leader.log())
        self.assertFalse(self.ready(standby))
        # ... and within the bound the key has a lease again and a node serves.
        self.assertTrue(wait_until(lambda: self.ready(leader), self.BOUND), leader.log())
        took = time.monotonic() - began
        self.assertGreater(took, 1.5)  # the key was waited out (2 s after it was seen)
        key = self.leader_key()
        self.assertNotEqual(key.get("lease", "0"), "0")
        self.assertGreater(int(key["create_revision"]), epoch)
        self.assertFalse(self.ready(standby))
        self.assertEqual(c.get_locations(0, ks).json()["locations"], [pages[k] for k in ks])
        self.assert_reported(leader, standby)
        self.assertIn("removed the foreign leader key", leader.log())

    def test_a_forged_key_that_does_not_parse_in_a_fresh_cluster_is_removed(self):
        self.forge("\x01not json")
        a = self.start("a")
        self.assertTrue(wait_until(lambda: self.ready(a), self.BOUND), a.log())
        self.assert_reported(a)
        self.assertIn("\\x01not json", a.log())  # printed escaped


@unittest.skipUnless(os.access(ETCD, os.X_OK), f"{ETCD} not found (Debian package etcd-server)")
@unittest.skipUnless(os.access(HAPROXY, os.X_OK),
                     f"{HAPROXY} absent: install haproxy (scripts/setup.sh --test)")
class HaproxyHaTest(HaCase):
    """deploy/haproxy/hf3fs-metad-ha.cfg in front of two nodes: it follows /ready."""

    def haproxy(self, port_a, port_b):
        proc, url = start_haproxy(self.dir, port_a, port_b)
        self.addCleanup(lambda: (proc.kill(), proc.wait()))
        return url

    def test_haproxy_sends_everything_to_the_leader_and_finds_it_again(self):
        ports = {"a": free_port(), "b": free_port()}
        a = self.start("a", "--port", str(ports["a"]))
        b = self.start("b", "--port", str(ports["b"]))
        leader = self.wait_leader([a, b])
        leader_id = "a" if leader is a else "b"
        c = Client(self.haproxy(ports["a"], ports["b"]))
        self.addCleanup(c.close)
        time.sleep(0.5)  # the standby's first failed check marks it down
        ks = keys(4, "haproxy")
        self.assertEqual(c.initialize(0, 16).status_code, 200)
        pages = dict(c.batch_allocate(0, ks).json()["results"])
        self.assertEqual(c.confirm_write(0, pages.items()).status_code, 204)
        statuses = [c.batch_exists(ks).status_code for _ in range(40)]
        self.assertEqual(statuses, [200] * 40, "a request reached the standby")

        def status():
            # A connection through HAProxy closes when its node is marked down
            # (on-marked-down shutdown-sessions); vLLM's client retries those.
            try:
                return c.batch_exists(ks).status_code
            except requests.ConnectionError:
                return None

        leader.kill()
        self.assertTrue(wait_until(lambda: status() == 503, 2))  # no node is up
        back = self.start(leader_id, "--port", str(ports[leader_id]))
        self.assertTrue(wait_until(lambda: status() == 200, 5), back.log())
        self.assertEqual(c.get_locations(0, ks).json()["locations"], [pages[k] for k in ks])


class DeployConfigTest(unittest.TestCase):

    @unittest.skipUnless(os.access(ETCD, os.X_OK), f"{ETCD} not found")
    def test_the_etcd_example_makes_a_3_member_cluster_granting_1_s_leases(self):
        """deploy/etcd/etcd.default, its three members moved to loopback ports, with
        certificates made here (TLS between members and to clients, client certificates
        required)."""
        with open(os.path.join(ROOT, "deploy", "etcd", "etcd.default")) as f:
            env = dict(line.strip().split("=", 1) for line in f
                       if "=" in line and not line.startswith("#"))
        d = tempfile.mkdtemp(prefix="metad-ha-etcd3-")
        self.addCleanup(shutil.rmtree, d, True)
        make_certificates(d)
        shutil.copy(os.path.join(d, "etcd.pem"), os.path.join(d, "member.pem"))
        shutil.copy(os.path.join(d, "etcd.key"), os.path.join(d, "member.key"))
        tls = {"verify": os.path.join(d, "ca.pem"),
               "cert": (os.path.join(d, "client.pem"), os.path.join(d, "client.key"))}
        ports = {n: (free_port(), free_port()) for n in (1, 2, 3)}  # client, peer

        def local(text):
            for n, (client, peer) in ports.items():
                text = text.replace(f"10.0.1.{n}:2379", f"127.0.0.1:{client}")
                text = text.replace(f"10.0.1.{n}:2380", f"127.0.0.1:{peer}")
            return text.replace(",https://127.0.0.1:2379", "").replace("/etc/etcd/pki/", d + "/")

        procs = []
        for n in (1, 2, 3):
            # The example is member 1's: the other two put their own address in its URLs.
            member = {k: v.replace("10.0.1.1:", f"10.0.1.{n}:") if k.endswith("_URLS") else v
                      for k, v in env.items()}
            member = {k: local(v) for k, v in member.items()}
            member.update(ETCD_NAME=f"etcd{n}", ETCD_DATA_DIR=os.path.join(d, str(n)))
            log = open(os.path.join(d, f"{n}.log"), "wb")
            self.addCleanup(log.close)
            proc = subprocess.Popen([ETCD], env={**os.environ, **member}, stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL)
            procs.append(proc)
            self.addCleanup(lambda p=proc: (p.kill(), p.wait()))
        url = f"https://127.0.0.1:{ports[2][0]}"
        self.assertTrue(env["ETCD_ADVERTISE_CLIENT_URLS"].startswith("https://"))

        def grant():
            try:
                return requests.post(url + "/v3/lease/grant", json={"TTL": 1}, timeout=1,
                                     **tls).json()
            except (requests.RequestException, ValueError):
                return None

        self.assertTrue(wait_until(lambda: (grant() or {}).get("TTL") is not None, 15),
                        open(os.path.join(d, "2.log")).read()[-2000:])
        self.assertEqual(grant()["TTL"], "1")  # the tuned timing's minimum: 1 s
        with self.assertRaises(requests.RequestException):  # no client certificate
            requests.post(url + "/v3/lease/grant", json={"TTL": 1}, timeout=1,
                          verify=tls["verify"])
        members = requests.post(url + "/v3/cluster/member/list", json={}, timeout=2,
                                **tls).json()
        self.assertEqual(len(members["members"]), 3)

    @unittest.skipUnless(os.access(NGINX, os.X_OK), f"{NGINX} absent")
    def test_nginx_ha_example_parses(self):
        d = tempfile.mkdtemp(prefix="metad-ha-nginx-")
        self.addCleanup(shutil.rmtree, d, True)
        with open(os.path.join(ROOT, "deploy", "nginx", "hf3fs-metad-ha.conf")) as f:
            text = f.read().replace("NODE_A_HOST", "127.0.0.1").replace("NODE_B_HOST",
                                                                       "127.0.0.2")
        shipped = os.path.join(d, "ha.conf")
        with open(shipped, "w") as f:
            f.write(text)
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"pid {d}/nginx.pid;\nevents {{}}\nhttp {{\n    include {shipped};\n}}\n")
        run = subprocess.run([NGINX, "-t", "-p", d, "-c", conf, "-e", os.path.join(d, "error.log")],
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        self.assertEqual(run.returncode, 0, run.stderr.decode())


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
             "--ha-etcd: expected http(s)://HOST:PORT"),
            ([*named, "--ha-etcd-ca", "/etc/ssl/certs/ca-certificates.crt"], "need https://"),
            (["--ha-etcd", "https://127.0.0.1:1", "--ha-cluster", "c", "--ha-node", "a",
              "--ha-etcd-user", "u"], "--ha-etcd-user and --ha-etcd-password-file go together"),
            (["--ha-etcd", "https://127.0.0.1:1", "--ha-cluster", "c", "--ha-node", "a",
              "--ha-etcd-cert", "/nonexistent.pem"], "--ha-etcd-cert and --ha-etcd-key go together"),
            (["--ha-etcd", "https://127.0.0.1:1", "--ha-cluster", "c", "--ha-node", "a",
              "--ha-etcd-ca", "/nonexistent.pem"], "--ha-etcd-ca /nonexistent.pem"),
            (["--ha-etcd-user", "u"], "need --ha-etcd"),
            ([*etcd, "--ha-cluster", "c/d", "--ha-node", "a"], "--ha-cluster"),
            ([*named, "--ha-ttl-ms", "1500"], "whole seconds"),
            ([*named, "--ha-renew-ms", "900"], "must be < TTL"),
            ([*named, "--ha-ttl-ms", "500"], "--ha-ttl-ms: expected an integer"),
            ([*named, "--ha-advertise", "https://x:1"], "--ha-advertise"),
            ([*named, "--ha-advertise", 'http://x":1'], "--ha-advertise"),
            (["--repl-advertise", "127.0.0.1:1"], "need --ha-etcd"),
            ([*named, "--repl-advertise", "127.0.0.1:1"], "--repl-advertise needs --repl-listen"),
            ([*named, "--data-dir", "/tmp", "--repl-listen", "127.0.0.1:1",
              "--repl-advertise", "0.0.0.0:5"], "--repl-advertise: expected"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                code, err, started = run_to_exit(args)
                self.assertFalse(started)
                self.assertEqual(code, 2, err)
                self.assertIn(message, err)


if __name__ == "__main__":
    unittest.main()
