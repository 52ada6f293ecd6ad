# ctest: etcd
"""etcd over TLS with authentication (issue 30, item 4), on a real etcd secured as
deploy/etcd ships it: TLS on the client port, client certificates required
(--trusted-ca-file, --client-cert-auth), password authentication on, and the nodes' user
limited to /hf3fs-metad/ by its role; certificates made by openssl in the test
(test_ha.make_certificates). etcd's --auth-token-ttl is 2 s, so tokens expire mid-run.

Checks:
  a. two replicated nodes as deploy/ ships them (--ha-etcd https://..., --ha-etcd-ca, a
     client certificate without a Common Name, --ha-etcd-user, --ha-etcd-password-file,
     and replication over mutual TLS: --repl-tls-cert/-key/-ca) form a cluster: a
     leads, b is listed in /sync, writes are acknowledged; mid-run the nodes' tokens stop
     working (their user's password set again: etcd drops the user's tokens, as after a
     restart or for a token unused past --auth-token-ttl): both nodes authenticate again,
     a keeps leading and the writes go on; kill -9 of a: b answers as leader within 2 s and holds every
     acknowledged write.
  b. a standby cut off from etcd past --auth-token-ttl (its token forgotten by etcd)
     authenticates again once healed and rejoins /sync; the leader leads throughout.
  c. start-up refusals, each exit 2 with a message that says what is wrong, before the
     node listens: a wrong password; a password file others can read; etcd's certificate
     checked against another CA; a URL naming a host the certificate does not (localhost
     for a certificate of 127.0.0.1 only); a client certificate with a Common Name (etcd
     3.4's gateway refuses it under --client-cert-auth).
  d. the node's role cannot touch keys outside /hf3fs-metad/ (etcd answers permission
     denied), so a leaked node password cannot reach another tenant's keys.

Skipped where etcd or openssl is absent, or where the binary has no --repl-listen.
"""

import base64
import os
import shutil
import sys
import time
import unittest

import requests

from failover_harness import (NUM_PAGES, REPL, WHY, FailoverCase, Ledger, Writer, initialize,
                              ready, wait_until)
from metad_harness import run_to_exit
import test_repl_tls as repl_tls  # its certificates (scripts/repl-certs.sh) and flags

TOKEN_TTL_S = 2


@unittest.skipUnless(REPL, WHY)
@unittest.skipUnless(shutil.which("openssl"), "openssl not found")
class EtcdTlsTest(FailoverCase):

    etcd_options = {"secure": True, "token_ttl_s": TOKEN_TTL_S}

    def test_a_cluster_over_tls_with_auth_fails_over_losing_nothing(self):
        if not repl_tls.TLS:
            self.skipTest(repl_tls.TLS_WHY)
        pki = os.path.join(self.dir, "repl-pki")
        repl_tls.make_certs(pki, "a", "b")
        a = self.started(self.node("a", flags=repl_tls.tls_flags(pki, "a")))
        self.assertTrue(wait_until(lambda: ready(a.base_url), 5), a.log())
        b = self.started(self.node("b", flags=repl_tls.tls_flags(pki, "b")))
        self.wait_in_sync(b, a)
        self.assertIn("ha: etcd over TLS, authenticated as hf3fs-metad", a.log())
        leader, _ = self.cluster_keys.leader()
        self.assertEqual(leader["node"], "a")
        initialize(a.base_url, 0, NUM_PAGES)
        ledger = Ledger()
        w = Writer(a.base_url, 0, ledger, "tls-before")
        w.start()
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= 200 or not w.is_alive(), 10),
                        f"no writes acknowledged: {w.stopped_by}")
        # Mid-run, the nodes' tokens stop working: the user's password set again (the
        # same one, as a rotation's first step would) makes etcd drop every token of the
        # user ("invalid auth token"), as an etcd restart or a token unused past
        # --auth-token-ttl does. Both nodes authenticate again; a keeps leading and the
        # writes go on.
        before = ledger.bound_count()
        changed = self.etcd.post("/v3/auth/user/changepw",
                                 {"name": self.etcd.USER, "password": self.etcd.PASSWORD})
        self.assertEqual(changed.status_code, 200, changed.text)
        self.assertTrue(wait_until(lambda: "authenticated again" in a.log()
                                   and "authenticated again" in b.log(), 5),
                        f"a:\n{a.log(10)}\nb:\n{b.log(10)}")
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= before + 200
                                   or not w.is_alive(), 10), f"writes stopped: {w.stopped_by}")
        w.stop()
        w.join(10)
        self.assertEqual(ledger.problems, [])
        self.assertNotIn("leader ->", a.log(), "a stopped leading")
        self.assertTrue(self.cluster_keys.in_sync("b", "a"), self.cluster_keys.sync())
        ready_ms, _ = self.write_then_kill(a, b, ledger, "tls", min_bound=200)
        self.assertLessEqual(ready_ms, 2000, b.log(30))
        self.assert_ledger(b, ledger)
        leader, _ = self.cluster_keys.leader()
        self.assertEqual(leader["node"], "b")

    def test_a_token_that_expired_unused_is_fetched_again(self):
        a = self.started(self.node("a"))
        self.assertTrue(wait_until(lambda: self.ready(a), 5), a.log())
        b = self.started(self.node("b", cuttable=True))
        self.wait_in_sync(b, a)
        # Cut off from etcd (and from a's streams) past etcd's --auth-token-ttl, b's token
        # is not used and etcd forgets it (its keeper checks each second).
        self.cut(b)
        time.sleep(TOKEN_TTL_S + 1.5)
        self.heal(b)
        self.assertTrue(wait_until(lambda: "authenticated again" in b.log(), 5), b.log(15))
        self.wait_in_sync(b, a, allow_diverged_exits=1)
        self.assertNotIn("leader ->", a.log(), "a stopped leading")

    def refused(self, *flags, url=None):
        """Runs a node expecting it to stop at start-up; returns its stderr."""
        code, stderr, started = run_to_exit(
            ["--port", "0", "--ha-etcd", url or self.etcd.url, "--ha-cluster", self.cluster,
             "--ha-node", "x", *flags])
        self.assertFalse(started, stderr)
        self.assertEqual(code, 2, stderr)
        return stderr

    def test_a_wrong_password_or_certificate_stops_the_start(self):
        d = self.dir
        pem = lambda name: os.path.join(self.etcd.dir, name)
        flags = dict(zip(self.etcd.node_flags[::2], self.etcd.node_flags[1::2]))

        def run(**changed):
            merged = {**flags, **changed}
            return self.refused(*[x for kv in merged.items() for x in kv])

        wrong = os.path.join(d, "wrong")
        with open(os.open(wrong, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write("not-the-password\n")
        out = run(**{"--ha-etcd-password-file": wrong})
        self.assertIn("etcd refused the password of user hf3fs-metad", out)
        self.assertNotIn("not-the-password", out)

        readable = os.path.join(d, "readable")
        with open(readable, "w") as f:
            f.write(self.etcd.PASSWORD + "\n")
        os.chmod(readable, 0o644)
        out = run(**{"--ha-etcd-password-file": readable})
        self.assertIn("chmod 600", out)
        self.assertNotIn(self.etcd.PASSWORD, out)

        out = run(**{"--ha-etcd-ca": pem("other-ca.pem")})
        self.assertIn("certificate does not verify", out)

        port = self.etcd.url.rsplit(":", 1)[1]
        out = self.refused(*self.etcd.node_flags, url=f"https://localhost:{port}")
        self.assertIn("certificate does not verify", out)
        self.assertIn("hostname mismatch", out)

        out = run(**{"--ha-etcd-cert": pem("cn-client.pem"), "--ha-etcd-key": pem("cn-client.key")})
        self.assertIn("without a CN", out)

    def test_the_nodes_role_reaches_only_its_prefix(self):
        tls = {"verify": os.path.join(self.etcd.dir, "ca.pem"),
               "cert": (os.path.join(self.etcd.dir, "client.pem"),
                        os.path.join(self.etcd.dir, "client.key"))}
        token = requests.post(self.etcd.url + "/v3/auth/authenticate",
                              json={"name": self.etcd.USER, "password": self.etcd.PASSWORD},
                              timeout=5, **tls).json()["token"]
        b64 = lambda text: base64.b64encode(text.encode()).decode()
        for key, status in ((f"/hf3fs-metad/{self.cluster}/x", 200), ("/other/x", 403),
                            ("/hf3fs-metadX", 403)):
            put = requests.post(self.etcd.url + "/v3/kv/put", timeout=5,
                                json={"key": b64(key), "value": b64("v")},
                                headers={"Authorization": token}, **tls)
            self.assertEqual(put.status_code, status, f"{key}: {put.text}")
        # Without a token (or with no client certificate) etcd gives nothing.
        self.assertNotEqual(requests.post(self.etcd.url + "/v3/kv/range", timeout=5,
                                          json={"key": b64("/hf3fs-metad/")},
                                          **tls).status_code, 200)
        with self.assertRaises(requests.RequestException):
            requests.post(self.etcd.url + "/v3/kv/range", json={"key": b64("x")}, timeout=5,
                          verify=tls["verify"])


if __name__ == "__main__":
    unittest.main()
