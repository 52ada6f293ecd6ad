"""End-to-end: a central server for several models behind TLS, as deploy/ ships it
(issue 34 item 6).

A CA and the central host's certificate made by openssl in a temporary directory;
hf3fs-metad with --tenants-file (two tenants: team_a holds vLLM's API, team_b SGLang
only) on its unix socket; the central host's HAProxy (deploy/haproxy/hf3fs-metad-central.cfg)
terminating TLS in front of it; engine-host forwarders, each carrying its tenant's token:
nginx (deploy/nginx/hf3fs-metad-tls.conf) and HAProxy (deploy/haproxy/hf3fs-metad-tls.cfg),
one of each per tenant. Every config is the shipped file with only ports, paths, the
certificate's name and the token substituted.

Checked: vLLM's flow through both forwarders of the vllm tenant (and a 403 through the
other tenant's); SGLang's flow through all four; the tenants isolated through their
forwarders (tenant B's exists does not see tenant A's keys, naming A's tenant is a 403);
a forwarder that trusts another CA, or expects another name, fails (502/503) and no
request reaches the server; plain HTTP to the TLS port gets no HTTP answer; the TLS port
takes TLS 1.2 and 1.3, refuses 1.1; a tenant's token rotated with two hashes (deploy/README.md)
while requests go on; no token appears in the server's log (with --access-log) or the
forwarders' logs.

Skips when nginx, haproxy or openssl is missing. A wire suite: it runs once per
transport (METAD_IO), as issue 34 asks of the forwarders' tests.

Run: cd tests/e2e && METAD_BIN=... /usr/bin/python3 -m unittest test_deploy_tls
"""

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from metad_harness import compact, keys
from test_operations import (NGINX, NGINX_CONF, HttpCaller, Metrics, OpsServer,
                             RequestsCaller, free_port, stop_process, wait_listening)

HAPROXY = "/usr/sbin/haproxy"
OPENSSL = "/usr/bin/openssl"
DEPLOY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy")
NGINX_TLS = os.path.join(DEPLOY, "nginx", "hf3fs-metad-tls.conf")
HAPROXY_TLS = os.path.join(DEPLOY, "haproxy", "hf3fs-metad-tls.cfg")
HAPROXY_CENTRAL = os.path.join(DEPLOY, "haproxy", "hf3fs-metad-central.cfg")

NAME = "central.metad.test"   # the name in the central host's certificate
TOKEN_A = secrets.token_hex(32)
TOKEN_A2 = secrets.token_hex(32)   # tenant A's next token (the rotation)
TOKEN_B = secrets.token_hex(32)
OPERATOR = secrets.token_hex(32)
ADMIN = secrets.token_hex(32)
def sha(token):
    return hashlib.sha256(token.encode()).hexdigest()


def write_secret(path, text):
    """A file only its owner may read, created so (never world-readable for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def substitute(path, pairs):
    """The shipped file's text with each (shipped, ours) replaced; every shipped part must
    still be there, so that the test follows the file."""
    with open(path) as f:
        text = f.read()
    for shipped, ours in pairs:
        if shipped not in text:
            raise AssertionError(f"{path} no longer contains {shipped!r}")
        text = text.replace(shipped, ours)
    if os.geteuid() != 0:  # only root may switch users
        text = re.sub(r"\n\s*(user|group) haproxy\b", "", text)
    return text


def openssl(*args, cwd):
    run = subprocess.run([OPENSSL, *args], cwd=cwd, stdin=subprocess.DEVNULL,
                         capture_output=True, timeout=60)
    if run.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}:\n{run.stderr.decode()}")


def make_ca(d, name):
    """A CA (P-256): d/name.key, d/name.pem."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
            "-subj", f"/CN=hf3fs-metad test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    os.chmod(os.path.join(d, f"{name}.key"), 0o600)


def make_server_cert(d, ca, dns):
    """The central host's certificate for `dns`, signed by `ca`: d/central.pem holds the
    certificate, the CA's and the key, as HAProxy's `crt` takes them (mode 600)."""
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={dns}", cwd=d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write(f"subjectAltName=DNS:{dns}\nextendedKeyUsage=serverAuth\n"
                "keyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.pem",
            cwd=d)
    parts = []
    for name in ("server.pem", f"{ca}.pem", "server.key"):
        with open(os.path.join(d, name)) as f:
            parts.append(f.read())
    return write_secret(os.path.join(d, "central.pem"), "".join(parts))


class Proc:
    """nginx or haproxy in the foreground on a config written to `directory`."""

    def __init__(self, kind, directory, text, port):
        self.kind, self.dir, self.port = kind, directory, port
        self.log_path = os.path.join(directory, "error.log")
        if kind == "nginx":
            # nginx.conf from test_operations, the shipped file included in `http { }`.
            shipped = write_secret(os.path.join(directory, "hf3fs-metad.conf"), text)
            user = "user root;" if os.geteuid() == 0 else ""
            self.conf = write_secret(os.path.join(directory, "nginx.conf"), NGINX_CONF.format(
                user=user, dir=directory, blocks=f"    include {shipped};\n"))
            argv = [NGINX, "-p", directory, "-c", self.conf, "-e", self.log_path,
                    "-g", "daemon off;"]
            self.soft = signal.SIGQUIT
        else:
            self.conf = write_secret(os.path.join(directory, "haproxy.cfg"), text)
            argv = [HAPROXY, "-db", "-f", self.conf]
            self.soft = signal.SIGUSR1
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            wait_listening(self.proc, kind, [port], self.log)
        except Exception:
            self.stop()
            raise

    def log(self):
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        return stop_process(self.proc, self.soft)


def missing_tools():
    return [tool for tool in (NGINX, HAPROXY, OPENSSL) if not os.path.exists(tool)]


@unittest.skipIf(missing_tools(), f"{', '.join(missing_tools())} absent: install nginx-light, "
                 "haproxy and openssl (scripts/setup.sh --test) to run the TLS deployment tests")
class DeployTlsTest(unittest.TestCase):
    """One central deployment for the class: server, central HAProxy, four forwarders."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="metad-deploy-tls-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        os.chmod(cls.dir, 0o755)
        d = cls.dir
        make_ca(d, "ca")
        make_ca(d, "other-ca")   # a CA that did not sign the central certificate
        central_pem = make_server_cert(d, "ca", NAME)
        cls.ca = os.path.join(d, "ca.pem")

        # The server: the unit's loopback port and unix socket, the tenants (hashes only),
        # the operator's read token and the admin token.
        tenants = cls.tenants = os.path.join(d, "tenants")
        cls.write_tenants(sha(TOKEN_A))
        cls.sock = os.path.join(d, "metad.sock")
        cls.server = OpsServer(("--unix", cls.sock, "--tenants-file", tenants,
                                "--auth-token-file", write_secret(os.path.join(d, "operator"),
                                                                  OPERATOR + "\n"),
                                "--admin-token-file", write_secret(os.path.join(d, "admin"),
                                                                   ADMIN + "\n"),
                                "--access-log"),
                               # The unit's UMask=0000: HAProxy's user may connect.
                               preexec_fn=lambda: os.umask(0))
        cls.addClassCleanup(cls._stop_server)

        # The central host's HAProxy: TLS on its port, the server's unix socket behind it.
        cls.central_port = free_port()
        cls.central = cls.start_proc("haproxy", substitute(HAPROXY_CENTRAL, (
            ("bind :18443", f"bind 127.0.0.1:{cls.central_port}"),
            ("/etc/haproxy/hf3fs-metad.pem", central_pem),
            ("unix@/run/hf3fs-metad/metad.sock", f"unix@{cls.sock}"))), cls.central_port)

        # The engine hosts' forwarders: one nginx and one HAProxy per tenant.
        cls.forwarders = {}
        for tenant, token in (("a", TOKEN_A), ("b", TOKEN_B)):
            cls.forwarders[("nginx", tenant)] = cls.start_nginx_forwarder(token, cls.ca)
            cls.forwarders[("haproxy", tenant)] = cls.start_haproxy_forwarder(token, cls.ca)

    @classmethod
    def write_tenants(cls, team_a_hashes):
        """The tenants file, written beside and renamed over, as deploy/README.md says."""
        with open(cls.tenants + ".new", "w") as f:
            f.write(f"team_a {team_a_hashes} ranks=8 vllm   # model A's engine hosts\n"
                    f"team_b {sha(TOKEN_B)} ranks=8        # model B's engine hosts\n")
        os.replace(cls.tenants + ".new", cls.tenants)

    @classmethod
    def _stop_server(cls):
        code = cls.server.stop()
        if code != 0:
            raise AssertionError(f"server exit code {code}:\n{cls.server.log()[-3000:]}")

    @classmethod
    def start_proc(cls, kind, text, port):
        directory = tempfile.mkdtemp(dir=cls.dir, prefix=kind + "-")
        os.chmod(directory, 0o755)
        proc = Proc(kind, directory, text, port)

        def stop():
            code = proc.stop()
            if code != 0:
                raise AssertionError(f"{kind} exit code {code}:\n{proc.log()[-3000:]}")
        cls.addClassCleanup(stop)
        return proc

    @classmethod
    def start_nginx_forwarder(cls, token, ca, name=NAME):
        port = free_port()
        include = write_secret(os.path.join(cls.dir, f"token-{secrets.token_hex(4)}.conf"),
                               f'proxy_set_header Authorization "Bearer {token}";\n')
        text = substitute(NGINX_TLS, (
            ("server METAD_HOST:18443", f"server 127.0.0.1:{cls.central_port}"),
            ("proxy_ssl_name METAD_HOST", f"proxy_ssl_name {name}"),
            ("listen 127.0.0.1:18000", f"listen 127.0.0.1:{port}"),
            ("/etc/nginx/hf3fs-metad-token.conf", include),
            ("/etc/nginx/hf3fs-metad-ca.pem", ca)))
        proc = cls.start_proc("nginx", text, port)
        proc.include = include
        return proc

    @classmethod
    def start_haproxy_forwarder(cls, token, ca, name=NAME):
        port = free_port()
        text = substitute(HAPROXY_TLS, (
            ("METAD_HOST:18443", f"127.0.0.1:{cls.central_port}"),
            ("METAD_HOST", name),
            ("bind 127.0.0.1:18000", f"bind 127.0.0.1:{port}"),
            ("/etc/haproxy/hf3fs-metad-ca.pem", ca),
            ("CHANGE-ME", token)))
        return cls.start_proc("haproxy", text, port)

    def call(self, kind, tenant):
        """An engine's client on that forwarder: no token of its own."""
        caller = RequestsCaller(f"http://127.0.0.1:{self.forwarders[(kind, tenant)].port}")
        self.addCleanup(caller.close)
        return caller

    def requests_served(self):
        """API requests the server answered (its own /metrics scrapes left out), read on
        the unix socket with the operator's token."""
        host = HttpCaller.unix(self.sock)
        try:
            status, _, body = host("GET", "/metrics", None,
                                   {"Authorization": f"Bearer {OPERATOR}"})
        finally:
            host.close()
        self.assertEqual(status, 200, body)
        m = Metrics(body.decode())
        return (m.sum("hf3fs_metad_requests_total") -
                m.sum("hf3fs_metad_requests_total", endpoint="metrics"))

    # --- the flows --------------------------------------------------------------------

    def vllm_flow(self, call, tag, ranks=(0, 1), n=8):
        """What one engine (TP = len(ranks)) does: scheduler and worker inits, a miss, a
        save on every rank, a hit, the loads. No /clear: it takes the admin token."""
        ks = keys(n, tag)
        self.assertEqual(call("POST", "/rank/0/initialize", {"num_pages": 0,
                                                            "role": "scheduler"})[0], 200)
        for r in ranks:
            status, _, body = call("POST", f"/rank/{r}/initialize",
                                   {"num_pages": 64, "role": "worker"})
            self.assertEqual(status, 200, body)
        self.assertEqual(call("POST", "/keys/batch_exists", {"keys": ks})[::2],
                         (200, compact({"exists": [False] * n})))
        pages = {}
        for r in ranks:
            status, _, body = call("POST", "/keys/batch_allocate",
                                   {"rank": r, "keys": [[k, ""] for k in ks]})
            self.assertEqual(status, 200, body)
            results = dict(map(tuple, json.loads(body)["results"]))
            self.assertEqual(sorted(results), sorted(ks))
            self.assertTrue(all(p >= 0 for p in results.values()), body)
            pages[r] = [results[k] for k in ks]
            self.assertEqual(call("POST", "/keys/confirm_write",
                                  {"rank": r, "confirmations": [[k, pages[r][i]]
                                                                for i, k in enumerate(ks)],
                                   "pages_to_release": []})[::2], (204, b""))
        self.assertEqual(call("POST", "/keys/batch_exists", {"keys": ks})[::2],
                         (200, compact({"exists": [True] * n})))
        for r in ranks:
            self.assertEqual(call("POST", "/keys/get_locations", {"rank": r, "keys": ks})[::2],
                             (200, compact({"locations": pages[r]})))
        return ks

    def sglang_save(self, call, rank, ks):
        """SGLang's HiCache 3FS: initialize the pool, reserve, confirm; the pages."""
        self.assertEqual(call("POST", f"/{rank}/initialize",
                              {"num_pages": 64, "namespace": "kv"})[0], 204)
        status, _, body = call("POST", f"/{rank}/reserve_and_allocate_page_indices",
                               {"keys": [[k, ""] for k in ks], "namespace": "kv"})
        self.assertEqual(status, 200, body)
        indices = json.loads(body)["indices"]
        self.assertTrue(all(not exists and page >= 0 for exists, page in indices), body)
        pages = [page for _, page in indices]
        self.assertEqual(call("POST", f"/{rank}/confirm_write",
                              {"written_keys_to_confirm": [[k, p] for k, p in zip(ks, pages)],
                               "pages_to_release": [], "namespace": "kv"})[::2], (204, b""))
        return pages

    def sglang_flow(self, call, rank, tag):
        ks = [hashlib.sha256(f"{tag}/{i}".encode()).hexdigest() for i in range(4)]
        self.assertEqual(call("POST", f"/{rank}/exists", {"keys": ks, "namespace": "kv"})[0],
                         404)  # the tenant's pool does not exist yet
        pages = self.sglang_save(call, rank, ks)
        self.assertEqual(call("POST", f"/{rank}/exists", {"keys": ks, "namespace": "kv"})[::2],
                         (200, compact({"exists": [True] * 4})))
        self.assertEqual(call("POST", f"/{rank}/get_page_indices",
                              {"keys": ks, "namespace": "kv"})[::2],
                         (200, compact({"indices": pages})))
        return ks

    # --- the tests --------------------------------------------------------------------

    def test_a_vllm_through_every_forwarder_and_the_tenants_are_isolated(self):
        """Two models' engines on one server: each tenant's forwarders carry its token, and
        each engine's ranks 0 and 1 and its keys are its own tenant's."""
        saved = {}
        for tenant in ("a", "b"):
            for kind in ("nginx", "haproxy"):
                with self.subTest(forwarder=kind, tenant=tenant):
                    call = self.call(kind, tenant)
                    saved[(kind, tenant)] = self.vllm_flow(call, f"vllm-{kind}-{tenant}")
                    self.assertEqual(call("GET", "/health")[::2], (200, b'{"status":"ok"}'))
        # The other tenant's keys are not seen, through either kind of forwarder.
        for (kind, tenant), ks in saved.items():
            other = "b" if tenant == "a" else "a"
            for via in ("nginx", "haproxy"):
                with self.subTest(keys_of=(kind, tenant), asked_by=(via, other)):
                    self.assertEqual(self.call(via, other)("POST", "/keys/batch_exists",
                                                           {"keys": ks})[::2],
                                     (200, compact({"exists": [False] * len(ks)})))

    def test_b_sglang_through_every_forwarder_and_the_tenants_are_isolated(self):
        saved = {}
        for (kind, tenant), rank in ((("nginx", "a"), 10), (("haproxy", "a"), 11),
                                     (("nginx", "b"), 10), (("haproxy", "b"), 11)):
            with self.subTest(forwarder=kind, tenant=tenant):
                saved[(kind, tenant)] = self.sglang_flow(self.call(kind, tenant), rank,
                                                         f"sglang-{kind}-{tenant}")
        # Same rank, same namespace, another tenant: not seen, from either kind.
        for mine, theirs in ((("haproxy", "b"), ("nginx", "a")),
                             (("nginx", "b"), ("haproxy", "a")),
                             (("haproxy", "a"), ("nginx", "b")),
                             (("nginx", "a"), ("haproxy", "b"))):
            rank = 10 if theirs[0] == "nginx" else 11
            ks = saved[theirs]
            with self.subTest(asked_by=mine, saved_by=theirs):
                call = self.call(*mine)
                self.assertEqual(call("POST", f"/{rank}/exists",
                                      {"keys": ks, "namespace": "kv"})[::2],
                                 (200, compact({"exists": [False] * 4})))
                self.assertEqual(call("POST", f"/{rank}/get_page_indices",
                                      {"keys": ks, "namespace": "kv"})[::2],
                                 (200, compact({"indices": [None] * 4})))
        # Naming the other tenant in the path: 403, through the forwarder as directly.
        status, _, _ = self.call("haproxy", "b")("POST", "/team_a/10/exists",
                                                 {"keys": saved[("nginx", "a")]})
        self.assertEqual(status, 403)
        # Nor can a client on an engine host pick a tenant by sending a token: the
        # forwarder replaces it.
        status, _, body = self.call("nginx", "b")("POST", "/10/exists",
                                                  {"keys": saved[("nginx", "a")]},
                                                  {"Authorization": f"Bearer {TOKEN_A}"})
        self.assertEqual((status, body), (200, compact({"exists": [False] * 4})))
        # The owners still see theirs.
        self.assertEqual(self.call("haproxy", "a")("POST", "/10/exists",
                                                   {"keys": saved[("nginx", "a")]})[::2],
                         (200, compact({"exists": [True] * 4})))

    def test_c_a_forwarder_that_trusts_another_ca_reaches_nothing(self):
        nginx = self.start_nginx_forwarder(TOKEN_A, os.path.join(self.dir, "other-ca.pem"))
        wrong_name = self.start_nginx_forwarder(TOKEN_A, self.ca, name="other.metad.test")
        haproxy = self.start_haproxy_forwarder(TOKEN_A, os.path.join(self.dir, "other-ca.pem"))
        before = self.requests_served()
        for what, proc, statuses in (("nginx, other CA", nginx, (502,)),
                                     ("nginx, other name", wrong_name, (502,)),
                                     # 503 once its health check has marked it down
                                     ("haproxy, other CA", haproxy, (502, 503))):
            with self.subTest(what):
                call = RequestsCaller(f"http://127.0.0.1:{proc.port}")
                self.addCleanup(call.close)
                for path, obj in (("/keys/batch_exists", {"keys": ["k"]}),
                                  ("/10/exists", {"keys": ["k"], "namespace": "kv"})):
                    self.assertIn(call("POST", path, obj)[0], statuses)
                self.assertIn(call("GET", "/health")[0], statuses)
        # (19: the chain ends in a CA this forwarder does not trust)
        self.assertIn("upstream SSL certificate verify error", nginx.log())
        self.assertIn(f'upstream SSL certificate does not match "other.metad.test"',
                      wrong_name.log())
        self.assertEqual(self.requests_served() - before, 0)

    def test_d_plain_http_to_the_tls_port_gets_no_answer(self):
        before = self.requests_served()
        request = (f"POST /keys/batch_exists HTTP/1.1\r\nHost: {NAME}\r\n"
                   f"Authorization: Bearer {TOKEN_A}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: 12\r\n\r\n{{\"keys\":[]}}").encode()
        with socket.create_connection(("127.0.0.1", self.central_port), timeout=5) as s:
            s.sendall(request)
            got = b""
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    got += chunk
            except (ConnectionResetError, socket.timeout):
                pass
        self.assertFalse(got.startswith(b"HTTP/"), got[:200])
        self.assertEqual(self.requests_served() - before, 0)

    def test_e_no_token_in_any_log(self):
        # Something of both tenants went through, whatever ran before.
        self.assertEqual(self.call("nginx", "a")("POST", "/keys/batch_exists",
                                                 {"keys": []})[0], 200)
        self.assertEqual(self.call("haproxy", "b")("POST", "/20/exists",
                                                   {"keys": [], "namespace": "kv"})[0], 404)
        self.assertTrue(self.server.wait_log(r"batch_exists"), "no access log line")
        logs = {"server": self.server.log(), "central haproxy": self.central.log()}
        for (kind, tenant), proc in self.forwarders.items():
            logs[f"{kind} {tenant}"] = proc.log()
        for where, text in logs.items():
            for token in (TOKEN_A, TOKEN_A2, TOKEN_B, OPERATOR, ADMIN):
                with self.subTest(log=where):
                    self.assertNotIn(token, text)

    def reload_server(self, team_a_hashes):
        pattern = re.compile(r"tenants: (\d+ from |.*stay in force)")

        def reloads():
            return sum(1 for line in list(self.server.stderr_lines) if pattern.search(line))
        before = reloads()
        self.write_tenants(team_a_hashes)
        self.server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while reloads() == before:
            self.assertLess(time.monotonic(), deadline, self.server.log()[-2000:])
            time.sleep(0.02)
        self.assertNotIn("stay in force", [line for line in list(self.server.stderr_lines)
                                           if pattern.search(line)][-1])

    def test_g_rotating_a_tenants_token_fails_no_request(self):
        """deploy/README.md's rotation: the new hash beside the old, the forwarder moved
        (nginx -s reload), the old hash removed; a request every step of the way."""
        nginx, other = self.forwarders[("nginx", "a")], self.forwarders[("haproxy", "a")]
        self.addCleanup(self.reload_server, sha(TOKEN_A))
        self.addCleanup(write_secret, nginx.include,
                        f'proxy_set_header Authorization "Bearer {TOKEN_A}";\n')

        def ok_through(proc):
            call = RequestsCaller(f"http://127.0.0.1:{proc.port}")  # a fresh connection
            try:
                return call("POST", "/keys/batch_exists", {"keys": []})[0]
            finally:
                call.close()

        self.reload_server(f"{sha(TOKEN_A)},{sha(TOKEN_A2)}")
        self.assertEqual((ok_through(nginx), ok_through(other)), (200, 200))
        write_secret(nginx.include, f'proxy_set_header Authorization "Bearer {TOKEN_A2}";\n')
        nginx.proc.send_signal(signal.SIGHUP)  # nginx -s reload
        deadline = time.monotonic() + 5
        # Until the old worker (the old token) has gone: the new one took the include.
        while not re.search(r"worker process \d+ exited with code 0", nginx.log()):
            self.assertEqual(ok_through(nginx), 200)
            self.assertLess(time.monotonic(), deadline, nginx.log()[-2000:])
            time.sleep(0.02)
        self.assertEqual(ok_through(nginx), 200)
        # The old hash removed: the moved forwarder works, one still on the old token
        # gets 401 (whatever it sends, its engines can do nothing).
        self.reload_server(sha(TOKEN_A2))
        self.assertEqual((ok_through(nginx), ok_through(other)), (200, 401))

    def test_f_the_central_port_speaks_tls_1_2_and_up_only(self):
        for version, ok in (("-tls1_2", True), ("-tls1_3", True), ("-tls1_1", False)):
            with self.subTest(version=version):
                run = subprocess.run(
                    [OPENSSL, "s_client", "-connect", f"127.0.0.1:{self.central_port}",
                     "-servername", NAME, "-verify_return_error", "-CAfile", self.ca,
                     "-verify_hostname", NAME, version, "-cipher", "DEFAULT:@SECLEVEL=0"],
                    input=b"", capture_output=True, timeout=30)
                out = run.stdout.decode() + run.stderr.decode()
                self.assertEqual(run.returncode == 0 and "Verify return code: 0 (ok)" in out,
                                 ok, out[-2000:])
                if not ok:  # refused by the server, not by this client
                    self.assertIn("alert protocol version", out)


if __name__ == "__main__":
    unittest.main()
