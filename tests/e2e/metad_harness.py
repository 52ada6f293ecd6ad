"""Shared helpers for the Python end-to-end tests of hf3fs-metad.

Starts the real binary (METAD_BIN, transport METAD_IO), talks to it the way vLLM's
Hf3fsGlobalMetadataClient does (requests.Session, keep-alive, compact JSON with
Content-Type: application/json), and offers a raw-socket connection for the protocol
cases requests cannot produce. Standard library plus `requests` only.
"""

import atexit
import collections
import hashlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
import unittest

import requests

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
SOCKET_TIMEOUT_S = 10.0
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

_LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")

# A sanitizer's report in a server's stderr (ASan, LSan, TSan, UBSan). A server that
# halts on it fails the test that saw it die; one that reports and lives on (a leak found
# at exit, a race while the test still passed) fails the whole run: watch_sanitizer records
# every such line and the process exits 1 after unittest has printed its summary.
_SANITIZER = re.compile(r"==\d+==ERROR: \w+Sanitizer|WARNING: ThreadSanitizer|: runtime error: ")
_sanitizer_reports = []


def watch_sanitizer(line, source=""):
    """Call with every stderr line of a server this suite started."""
    if _SANITIZER.search(line):
        _sanitizer_reports.append(f"{source}: {line}")


def _fail_on_sanitizer_reports():
    if _sanitizer_reports:
        import sys
        sys.stderr.write("\nSANITIZER REPORTS in servers' stderr (the run fails):\n  " +
                         "\n  ".join(_sanitizer_reports[:20]) + "\n")
        sys.stderr.flush()
        os._exit(1)


atexit.register(_fail_on_sanitizer_reports)


def wait_until(predicate, timeout, step=0.02):
    """Polls predicate until it is true or `timeout` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def free_port():
    """A loopback TCP port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid):
    """A process's resident set (VmRSS), bytes; 0 once it is gone."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def key(i, tag=""):
    """A vLLM-like block key: 32 lowercase hex characters."""
    return hashlib.md5(f"{tag}/{i}".encode()).hexdigest()


def keys(n, tag=""):
    return [key(i, tag) for i in range(n)]


def compact(obj):
    """Compact JSON like vLLM's client sends."""
    return json.dumps(obj, separators=(",", ":")).encode()


def server_args(extra_args=()):
    """The command line MetadServer runs: METAD_BIN on an ephemeral port, METAD_IO
    transport, METAD_THREADS (default 2) core threads, released pages free at once (the
    suites model that; QuarantineTest and the differential test run with a quarantine),
    then `extra_args` (a later flag wins, so extra_args may override these)."""
    binary = os.environ.get("METAD_BIN")
    if not binary:
        raise unittest.SkipTest("METAD_BIN is not set")
    io = os.environ.get("METAD_IO", "uring")
    return [binary, "--port", "0", "--threads", os.environ.get("METAD_THREADS", "2"), "--io", io,
            "--log-level", "info", "--release-quarantine-ms", "0", *extra_args]


def transport_independent(cls):
    """Marks a test class of a wire suite (run once per transport) whose outcome does not
    depend on the transport (state, limits, timers, scrapes): it runs on io_uring only,
    and the epoll run reports it skipped. Its time is then paid once per build."""
    if os.environ.get("METAD_IO", "uring") != "uring":
        return unittest.skip("transport-independent: runs on io_uring only")(cls)
    return cls


def run_to_exit(extra_args=(), timeout=START_TIMEOUT_S):
    """Runs the server expecting it to fail at start-up.

    Returns (exit code, stderr text, started): started is True if it printed its
    "listening on" line (it is then killed and the exit code is None).
    """
    proc = subprocess.Popen(server_args(extra_args), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = []
    started = False
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            lines.append(line)
            watch_sanitizer(line, "a server run to its exit")
            if _LISTENING.search(line):
                started = True
                proc.kill()
                break
    finally:
        timer.cancel()
        code = proc.wait()
        proc.stderr.close()
    return (None if started else code), "\n".join(lines), started


class MetadServer:
    """One running hf3fs-metad process."""

    def __init__(self, extra_args=(), preexec_fn=None):
        """preexec_fn: run in the child before exec (e.g. resource.setrlimit)."""
        self.args = server_args(extra_args)
        self.stderr_lines = collections.deque(maxlen=2000)
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=preexec_fn)
        self._lines = queue.Queue()
        self._drain = threading.Thread(target=self._drain_stderr, daemon=True)
        self._drain.start()
        try:
            self.port = self._wait_listening()
        except Exception:
            self.proc.kill()
            self.proc.wait()
            raise
        self.base_url = f"http://127.0.0.1:{self.port}"

    def _drain_stderr(self):
        # Reads stderr until EOF so the pipe never fills.
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            self.stderr_lines.append(line)
            watch_sanitizer(line, " ".join(self.args[-4:]))
            self._lines.put(line)
        self._lines.put(None)

    def _wait_listening(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{self.args}: no 'listening on' line within "
                                   f"{START_TIMEOUT_S} s; stderr:\n{self.log()}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"{self.args}: exited with {self.proc.wait()} before "
                                   f"listening; stderr:\n{self.log()}")
            match = _LISTENING.search(line)
            if match:
                return int(match.group(1))

    def log(self):
        return "\n".join(self.stderr_lines)

    def alive(self):
        return self.proc.poll() is None

    def wait_log(self, pattern, timeout=5.0):
        """True once a stderr line matches `pattern` (a regex) within `timeout`."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            if any(rx.search(line) for line in list(self.stderr_lines)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def kill(self):
        """SIGKILL (a crash: no drain, no flush); returns the exit code (-9)."""
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        self._drain.join(timeout=5)
        self.proc.stderr.close()
        return code

    def stop(self):
        """SIGTERM, then the exit code (None if it did not exit in time; then killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        self._drain.join(timeout=5)
        self.proc.stderr.close()
        return code


class Client:
    """The request shapes of vLLM's Hf3fsGlobalMetadataClient (one keep-alive session).

    Every method returns the requests.Response; tests check status and body themselves.

    fresh_connections: every request opens a new connection instead of reusing the
    session's idle one. Needed against a server with a short --idle-timeout-ms: the
    server may close a pooled connection just as the client sends on it, and `requests`
    does not retry a POST, so the request would fail with RemoteDisconnected (a race of
    the test, not a server fault).
    """

    def __init__(self, base_url, fresh_connections=False):
        self.base_url = base_url
        self.session = requests.Session()
        self.fresh_connections = fresh_connections

    def close(self):
        self.session.close()

    def _session(self):
        if self.fresh_connections:
            self.session.close()  # drops pooled connections; the session stays usable
        return self.session

    def post_raw(self, path, data, headers=None):
        hdrs = {"Content-Type": "application/json"}
        hdrs.update(headers or {})
        return self._session().post(self.base_url + path, data=data, headers=hdrs,
                                    timeout=SOCKET_TIMEOUT_S)

    def post(self, path, obj):
        return self.post_raw(path, compact(obj))

    def request(self, method, path, **kwargs):
        return self._session().request(method, self.base_url + path,
                                       timeout=SOCKET_TIMEOUT_S, **kwargs)

    def initialize(self, rank, num_pages, role="worker"):
        return self.post(f"/rank/{rank}/initialize", {"num_pages": num_pages, "role": role})

    def batch_allocate(self, rank, ks):
        return self.post("/keys/batch_allocate", {"rank": rank, "keys": [[k, ""] for k in ks]})

    def confirm_write(self, rank, confirmations, pages_to_release=()):
        return self.post("/keys/confirm_write", {
            "rank": rank,
            "confirmations": [[k, p] for k, p in confirmations],
            "pages_to_release": list(pages_to_release),
        })

    def batch_exists(self, ks):
        return self.post("/keys/batch_exists", {"keys": list(ks)})

    def get_locations(self, rank, ks):
        return self.post("/keys/get_locations", {"rank": rank, "keys": list(ks)})

    def rank_info(self, rank):
        return self.request("GET", f"/rank/{rank}")

    def clear(self):
        return self.post_raw("/clear", b"")


class RawConnection:
    """A plain TCP connection for byte-exact requests and response framing checks."""

    def __init__(self, port, timeout=SOCKET_TIMEOUT_S):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        """Reads more bytes; False at end of stream (EOF or reset)."""
        try:
            chunk = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return False
        if not chunk:
            return False
        self.buf += chunk
        return True

    def read_response(self):
        """One response: (status, headers with lower-case names, body bytes).

        Interim 1xx responses are returned like any other (no body). A final response
        must carry Content-Length unless it is a 204 (the spec requires it).
        """
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError(f"connection ended before a full response header; "
                                      f"got {self.buf!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        version, status = lines[0].split(" ", 2)[:2]
        if not version.startswith("HTTP/1."):
            raise AssertionError(f"bad status line {lines[0]!r}")
        status = int(status)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status < 200 or status == 204:
            if "content-length" in headers and headers["content-length"] != "0":
                raise AssertionError(f"{status} with a body length: {headers}")
            return status, headers, b""
        if "content-length" not in headers:
            raise AssertionError(f"{status} response without Content-Length: {headers}")
        length = int(headers["content-length"])
        while len(self.buf) < length:
            if not self._fill():
                raise ConnectionError(f"connection ended inside a body: {self.buf!r}")
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, headers, body

    def read_final_response(self):
        """Skips interim 1xx responses."""
        while True:
            status, headers, body = self.read_response()
            if status >= 200:
                return status, headers, body

    def closed_by_peer(self, timeout=5.0):
        """True if the server closes the connection (EOF or reset) within `timeout`,
        with no further bytes sent."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if self.buf:
                    return False
                if not self._fill():
                    return True
        except socket.timeout:
            return False


def raw_request(method, path, body=b"", headers=None, version="HTTP/1.1"):
    """Bytes of one request with a Content-Length body (unless headers say otherwise)."""
    hdrs = {"Host": "127.0.0.1"}
    if body or method == "POST":
        hdrs["Content-Type"] = "application/json"
        hdrs["Content-Length"] = str(len(body))
    hdrs.update(headers or {})
    head = f"{method} {path} {version}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in hdrs.items() if v is not None)
    return head.encode("latin-1") + b"\r\n" + body


class MetadTestCase(unittest.TestCase):
    """One server per test class; state cleared before every test."""

    extra_args = ()
    # A class whose server closes idle connections quickly sets this (see Client).
    fresh_connections = False
    server = None
    client = None

    @classmethod
    def setUpClass(cls):
        cls.server = MetadServer(cls.extra_args)
        cls.client = Client(cls.server.base_url, cls.fresh_connections)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        code = cls.server.stop()
        if code != 0:
            raise AssertionError(f"server exit code {code} after SIGTERM (want 0); "
                                 f"stderr tail:\n{cls.server.log()[-4000:]}")

    def setUp(self):
        # Registered first so it also runs when setUp itself fails.
        self.addCleanup(self.check_server_alive)
        self.reset()

    def check_server_alive(self):
        if self.server.alive():
            return
        # Report the crash against this test, and give the next tests a fresh server so
        # one crash does not fail the rest of the class.
        cls = type(self)
        dead = cls.server
        code = dead.stop()
        cls.client.close()
        cls.server = MetadServer(cls.extra_args)
        cls.client = Client(cls.server.base_url, cls.fresh_connections)
        self.fail(f"server died during this test (exit code {code}); stderr tail:\n"
                  f"{dead.log()[-4000:]}")

    @property
    def port(self):
        return self.server.port

    def raw(self):
        return RawConnection(self.port)

    # --- helpers --------------------------------------------------------------------

    def reset(self):
        r = self.client.clear()
        self.assertEqual(r.status_code, 204, r.content)
        self.assertEqual(r.content, b"")

    def assert_json_type(self, headers):
        ctype = headers.get("content-type", headers.get("Content-Type", ""))
        self.assertEqual(ctype.split(";")[0].strip().lower(), "application/json",
                         f"content-type {ctype!r}")

    def assert_status(self, r, status):
        self.assertEqual(r.status_code, status,
                         f"{r.request.method} {r.request.url}: body {r.content!r}")

    def assert_ok(self, r, status=200):
        """A success: the status and (unless 204) a JSON body, which is returned."""
        self.assert_status(r, status)
        if status == 204:
            self.assertEqual(r.content, b"")
            self.assertIsNone(r.headers.get("Content-Length"),
                              "a 204 must carry no Content-Length")
            return None
        self.assert_json_type(r.headers)
        self.assertEqual(r.headers.get("Content-Length"), str(len(r.content)))
        return r.json()

    def assert_body(self, r, status, expected):
        """Exact status and byte-exact compact JSON body."""
        self.assert_status(r, status)
        self.assert_json_type(r.headers)
        self.assertEqual(r.content, compact(expected))

    def assert_error(self, r, status, detail=None, prefix=None, one_of=None):
        """An error answer: status, application/json, {"detail": str} only.

        detail: exact text; prefix: text must start with it and say more; one_of: the
        exact text is one of these; none of them: any non-empty string.
        """
        self.assert_status(r, status)
        self.assert_json_type(r.headers)
        body = r.json()
        self.assertIsInstance(body, dict, r.content)
        self.assertEqual(list(body), ["detail"], r.content)
        text = body["detail"]
        self.assertIsInstance(text, str, r.content)
        self.assertTrue(text, "empty detail")
        if detail is not None:
            self.assertEqual(r.content, compact({"detail": detail}))
        if prefix is not None:
            self.assertTrue(text.startswith(prefix) and len(text) > len(prefix),
                            f"detail {text!r} does not start with {prefix!r} + reason")
        if one_of is not None:
            self.assertIn(text, one_of)
        return text

    def rank_info(self, rank):
        return self.assert_ok(self.client.rank_info(rank))

    def free_pages(self, rank):
        return self.rank_info(rank)["free"]

    def assert_rank(self, rank, num_pages, free, reserved, bound, incomplete=None):
        """incomplete: the bound pages of incomplete keys; None checks only its range."""
        info = self.rank_info(rank)
        self.assertIn("incomplete", info)
        if incomplete is None:
            self.assertTrue(0 <= info["incomplete"] <= bound, info)
            incomplete = info["incomplete"]
        self.assertEqual(info, {"num_pages": num_pages, "free": free,
                                "reserved": reserved, "bound": bound, "incomplete": incomplete})
        return info

    def init_worker(self, rank, num_pages):
        self.assert_body(self.client.initialize(rank, num_pages), 200,
                         {"message": f"Rank {rank} initialized with {num_pages} pages"})

    def allocate(self, rank, ks):
        """batch_allocate; returns the pages (-1 = none) in result order, after checking
        the response shape (rank echoed, one entry per distinct key, first-occurrence
        order)."""
        body = self.assert_ok(self.client.batch_allocate(rank, ks))
        distinct = list(dict.fromkeys(ks))
        self.assertEqual(body["rank"], rank)
        self.assertEqual([k for k, _ in body["results"]], distinct)
        return [p for _, p in body["results"]]

    def confirm(self, rank, confirmations, pages_to_release=()):
        self.assert_ok(self.client.confirm_write(rank, confirmations, pages_to_release), 204)

    def exists(self, ks):
        body = self.assert_ok(self.client.batch_exists(ks))
        self.assertEqual(list(body), ["exists"])
        self.assertEqual(len(body["exists"]), len(ks))
        return body["exists"]

    def locations(self, rank, ks):
        body = self.assert_ok(self.client.get_locations(rank, ks))
        self.assertEqual(list(body), ["locations"])
        self.assertEqual(len(body["locations"]), len(ks))
        return body["locations"]

    def save(self, rank, ks):
        """The connector's successful save task: allocate, then confirm every page."""
        pages = self.allocate(rank, ks)
        self.assertNotIn(-1, pages)
        self.confirm(rank, list(zip(dict.fromkeys(ks), pages)))
        return pages

    def assert_served(self):
        """A fresh connection is served normally."""
        with self.raw() as conn:
            conn.send(raw_request("POST", "/keys/batch_exists", compact({"keys": []})))
            status, headers, body = conn.read_response()
        self.assertEqual((status, body), (200, b'{"exists":[]}'))
