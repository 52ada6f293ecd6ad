# ctest: etcd
"""Replication over mutual TLS (issue 30, item 1; docs/replication.md, "TLS"), on a real
etcd tuned as deploy/etcd. Certificates are made in the test by scripts/repl-certs.sh
(the openssl tool, as docs/operations.md shows): the cluster's CA with nodes a, b, c
and x, and another CA with its own b.

Checks:
  a. a TLS pair: b joins /sync (it follows a only because a's certificate names a);
     two writers are acknowledged; then for 3 s intruders (tests/e2e/repl_intruder.py,
     its own process) try a's --repl-listen while the writers go on: a plain TCP client
     sending b's hello, a client with another CA's certificate for b, a client with the
     cluster CA's certificate for x claiming to be b (issue 30 finding 1), and node c
     with its own certificate (a node of the cluster, not the standby). None gets a
     replication answer or a snapshot byte (c: busy, nothing else); a cuts no snapshot;
     b stays in /sync the whole time; the writers keep at least half their rate and no
     call takes 1 s; a's /metrics counts each refusal. Then kill -9 of a: b serves
     with every acknowledged write (0 lost).
  b. --repl-insecure: a node listening on 0.0.0.0 in clear text starts and leads.
ReplTlsFlagsTest (no etcd): --repl-listen 0.0.0.0 without TLS exits 2 naming the TLS
flags; partial or contradictory flags, a key group or others may read, a certificate
naming another node or signed by another CA, and a key of another certificate exit 2,
each saying so.

Skipped where etcd or openssl is absent or the binary has no --repl-tls-cert.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from failover_harness import (NUM_PAGES, REPL, WHY, FailoverCase, Ledger, Writer, initialize,
                              ready, wait_until)
from metad_harness import run_to_exit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CERTS = os.path.join(ROOT, "scripts", "repl-certs.sh")
OPENSSL = shutil.which("openssl")


def tls_supported():
    if not REPL:
        return False, WHY
    if OPENSSL is None:
        return False, "openssl not found (scripts/setup.sh installs it)"
    out = subprocess.run([os.environ["METAD_BIN"], "--help"], capture_output=True, timeout=10)
    if b"--repl-tls-cert" not in out.stdout:
        return False, "the binary has no --repl-tls-cert"
    return True, ""


TLS, TLS_WHY = tls_supported()


def make_certs(directory, *nodes):
    subprocess.run([CERTS, directory, *nodes], check=True, capture_output=True, timeout=60)


def tls_flags(directory, node):
    return ("--repl-tls-cert", os.path.join(directory, f"{node}.crt"),
            "--repl-tls-key", os.path.join(directory, f"{node}.key"),
            "--repl-tls-ca", os.path.join(directory, "ca.crt"))


def metric(text, name, labels=""):
    m = re.search(rf"^{re.escape(name + labels)} (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


@unittest.skipUnless(TLS, TLS_WHY)
class ReplTlsTest(FailoverCase):
    """Cases a and b of the docstring above."""

    def setUp(self):
        super().setUp()
        self.pki = os.path.join(self.dir, "pki")
        self.other = os.path.join(self.dir, "other-ca")
        make_certs(self.pki, "a", "b", "c", "x")
        make_certs(self.other, "b")

    def test_a_intruders_get_nothing_and_slow_nothing_and_failover_loses_nothing(self):
        a = self.started(self.node("a", flags=tls_flags(self.pki, "a")))
        self.assertTrue(wait_until(lambda: ready(a.base_url), 5), a.log())
        b = self.started(self.node("b", flags=tls_flags(self.pki, "b")))
        self.wait_in_sync(b, a)
        self.assertTrue(any("following node a" in line and "TLS" in line for line in b.lines),
                        b.log(10))
        self.assertEqual(initialize(a.base_url, 0, NUM_PAGES).status_code, 200)
        ledger = Ledger()
        writers = [Writer(a.base_url, 0, ledger, f"tls-{i}") for i in range(2)]
        for w in writers:
            w.start()
            self.addCleanup(w.join, 10)
            self.addCleanup(w.stop)
        time.sleep(0.5)
        tasks = lambda: sum(w.tasks for w in writers)  # noqa: E731
        t0, n0 = time.monotonic(), tasks()
        time.sleep(2.0)
        before = (tasks() - n0) / (time.monotonic() - t0)
        snapshots = metric(a.metrics(), "hf3fs_metad_repl_snapshots_sent_total")
        lines_before = len(a.lines)

        # The intruders, for 3 s, while /sync is sampled.
        specs = {
            "plain": "plain:b",
            "other_ca": f"tls:{self.other}/b.crt:{self.other}/b.key:b",
            "x_as_b": f"tls:{self.pki}/x.crt:{self.pki}/x.key:b",
            "c": f"tls:{self.pki}/c.crt:{self.pki}/c.key:c",
        }
        intruder = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "repl_intruder.py"), str(a.repl_port),
             self.cluster, "3", *specs.values()],
            cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        in_sync, t1, n1 = [], time.monotonic(), tasks()
        while intruder.poll() is None:
            in_sync.append(self.cluster_keys.in_sync("b", "a"))
            time.sleep(0.05)
        during = (tasks() - n1) / (time.monotonic() - t1)
        out, err = intruder.communicate()
        self.assertEqual(intruder.returncode, 0, err.decode())
        stats = {name: json.loads(out)[spec] for name, spec in specs.items()}
        slowest = max([took for end, took, _, _ in
                       [c for w in writers for c in list(w.slow_calls)] if end >= t1] or [0])
        for w in writers:
            w.stop()
        for w in writers:
            w.join(10)
        sys.stderr.write(f"\n  writes {before:.0f} tasks/s before, {during:.0f} during the "
                         f"intruders (slowest call {slowest * 1000:.0f} ms); intruders: "
                         f"{json.dumps(stats)}\n")

        for name in ("plain", "other_ca", "x_as_b", "c"):
            self.assertGreater(stats[name]["tries"], 0, name)
        # Nothing of the stream: no answer, no snapshot, no batch. A plain client gets at
        # most TLS's alert (7 bytes, in clear), never a replication message.
        self.assertEqual(stats["plain"]["answers"], {})
        self.assertLessEqual(stats["plain"]["bytes"], 7 * stats["plain"]["tries"])
        for name in ("other_ca", "x_as_b"):
            self.assertEqual((stats[name]["bytes"], stats[name]["answers"]), (0, {}), name)
        # c is a node of the cluster: told busy (b's streams are live), nothing more.
        self.assertEqual(set(stats["c"]["answers"]), {"busy"})
        self.assertEqual(stats["c"]["bytes"], 38 * stats["c"]["answers"]["busy"])
        new_lines = list(a.lines)[lines_before:]
        self.assertFalse([line for line in new_lines if "forked" in line or "resumes" in line],
                         "a began a stream for an intruder")
        self.assertEqual(metric(a.metrics(), "hf3fs_metad_repl_snapshots_sent_total"), snapshots)
        # b never left /sync; the writers were not slowed.
        self.assertTrue(in_sync and all(in_sync), f"b left /sync: {in_sync}\n{a.log(20)}")
        self.assertEqual(ledger.problems, [])
        self.assertGreater(during, before / 2, "the intruders slowed the writes")
        self.assertLess(slowest, 1.0)
        m = a.metrics()
        refused = lambda why: metric(m, "hf3fs_metad_repl_refused_connections_total",  # noqa: E731
                                     f'{{reason="{why}"}}')
        self.assertGreaterEqual(refused("handshake"),
                                stats["plain"]["tries"] + stats["other_ca"]["tries"])
        self.assertGreaterEqual(refused("name"), stats["x_as_b"]["tries"])
        self.assertGreaterEqual(refused("taken"), stats["c"]["tries"])
        self.assertTrue(any("its certificate names x, its hello claims node b" in line
                            for line in new_lines), a.log(20))

        # The real standby holds every acknowledged write.
        self.write_then_kill(a, b, ledger, "tls-kill", min_bound=300)
        self.assert_ledger(b, ledger)

    def test_b_insecure_clear_text_on_every_address_starts(self):
        a = self.node("a")
        # Its own port, on every address (a later flag wins), told to others as loopback.
        a.args += ["--repl-listen", f"0.0.0.0:{a.repl_port}", "--repl-insecure",
                   "--repl-advertise", a.repl]
        self.started(a)
        self.assertTrue(wait_until(lambda: ready(a.base_url), 5), a.log())


@unittest.skipUnless(TLS, TLS_WHY)
class ReplTlsFlagsTest(unittest.TestCase):
    """Bad replication security flags: one line, exit 2 (no etcd needed)."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="metad-tls-flags-")
        cls.pki = os.path.join(cls.dir, "pki")
        cls.other = os.path.join(cls.dir, "other")
        make_certs(cls.pki, "a", "b")
        make_certs(cls.other, "a")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_refused(self):
        pki, other = self.pki, self.other
        loose = os.path.join(self.dir, "loose.key")
        shutil.copy(os.path.join(pki, "a.key"), loose)
        os.chmod(loose, 0o644)
        node = ["--ha-etcd", "http://127.0.0.1:1", "--ha-cluster", "c", "--ha-node", "a",
                "--data-dir", self.dir]
        every = [*node, "--repl-listen", "0.0.0.0:1"]
        tls = list(tls_flags(pki, "a"))
        cases = [
            (every, "--repl-listen 0.0.0.0:1 is not a loopback address: give --repl-tls-cert, "
                    "--repl-tls-key and --repl-tls-ca"),
            ([*node, "--repl-listen", "10.0.0.1:1"], "--repl-insecure"),
            ([*every, *tls[:4]], "go together"),
            ([*every, *tls, "--repl-insecure"], "contradict"),
            ([*node, *tls], "need --repl-listen"),
            ([*every, *tls[:2], "--repl-tls-key", loose, *tls[4:]],
             f"--repl-tls-key {loose}: mode 0644 lets group or others read the private key"),
            ([*every, *tls_flags(pki, "b")], "names b, not this node's id a"),
            ([*every, *tls_flags(other, "a")[:4], *tls[4:]], "not valid under --repl-tls-ca"),
            ([*every, *tls[:2], "--repl-tls-key", os.path.join(pki, "b.key"), *tls[4:]],
             "is not the key of --repl-tls-cert"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                code, err, started = run_to_exit(args)
                self.assertFalse(started)
                self.assertEqual(code, 2, err)
                self.assertIn(message, err)
                self.assertNotIn("PRIVATE KEY", err)


if __name__ == "__main__":
    unittest.main()
