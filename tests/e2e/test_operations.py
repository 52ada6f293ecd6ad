"""End-to-end tests of the operations features of hf3fs-metad (issue 6).

/health, /ready and /metrics (Prometheus text, checked by promtool when installed), bearer
token access control, the unix socket listener, Debian's nginx as a keep-alive reverse
proxy over TCP and over the unix socket, header and idle timeouts (slowloris), the
per-core connection limit, and the graceful stop. Every test starts its own server with
the flags it needs (METAD_BIN, METAD_IO as for the other suites); loopback only.
Standard library plus `requests`.
"""

import http.client
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import unittest

import requests

from metad_harness import (SOCKET_TIMEOUT_S, START_TIMEOUT_S, STOP_TIMEOUT_S, Client,
                           MetadServer, RawConnection, compact, key, keys, raw_request,
                           rss_bytes, transport_independent)

PROMTOOL = "/usr/bin/promtool"
NGINX = "/usr/sbin/nginx"

TOKEN = "s3cret-Token_0123456789abcdef"
ADMIN_TOKEN = "adm1n-Token_fedcba9876543210"
UNAUTHORIZED_BODY = b'{"detail":"Missing or invalid bearer token"}'

_TCP_LINE = re.compile(r"listening on 127\.0\.0\.1:(\d+)")
_UNIX_LINE = re.compile(r"listening on unix:(\S+)")


class OpsServer(MetadServer):
    """MetadServer that also waits for the unix listener (--unix) and accepts --no-tcp
    (then `port` is None)."""

    def _wait_listening(self):
        want_tcp = "--no-tcp" not in self.args
        want_unix = "--unix" in self.args
        port, unix = None, False
        deadline = time.monotonic() + START_TIMEOUT_S
        while (want_tcp and port is None) or (want_unix and not unix):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{self.args}: listeners not up within {START_TIMEOUT_S} s; "
                                   f"stderr:\n{self.log()}")
            try:
                line = self._lines.get(timeout=left)
            except Exception:  # queue.Empty
                continue
            if line is None:
                raise RuntimeError(f"{self.args}: exited with {self.proc.wait()} before "
                                   f"listening; stderr:\n{self.log()}")
            match = _TCP_LINE.search(line)
            if match:
                port = int(match.group(1))
            if _UNIX_LINE.search(line):
                unix = True
        return port

    def wait_log(self, pattern, timeout=5.0):
        """True once a stderr line matches `pattern` (a regex) within `timeout`."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(rx.search(line) for line in list(self.stderr_lines)):
                return True
            time.sleep(0.02)
        return False


# --- clients -------------------------------------------------------------------------

class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over AF_UNIX (keep-alive like any HTTPConnection)."""

    def __init__(self, path, timeout=SOCKET_TIMEOUT_S):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


class HttpCaller:
    """call(method, path, obj=None, headers=None) -> (status, headers, body) over one
    keep-alive http.client connection (TCP or unix)."""

    def __init__(self, conn):
        self.conn = conn

    @classmethod
    def tcp(cls, port):
        return cls(http.client.HTTPConnection("127.0.0.1", port, timeout=SOCKET_TIMEOUT_S))

    @classmethod
    def unix(cls, path):
        return cls(UnixHTTPConnection(path))

    def __call__(self, method, path, obj=None, headers=None):
        hdrs = dict(headers or {})
        body = None
        if method == "POST":
            body = compact(obj) if obj is not None else b""
            hdrs.setdefault("Content-Type", "application/json")
        self.conn.request(method, path, body=body, headers=hdrs)
        resp = self.conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data

    def close(self):
        self.conn.close()


class RequestsCaller:
    """The same interface over a requests.Session (the way vLLM's client talks)."""

    def __init__(self, base_url, headers=None):
        self.base_url = base_url
        self.session = requests.Session()
        self.headers = dict(headers or {})

    def __call__(self, method, path, obj=None, headers=None):
        hdrs = dict(self.headers)
        hdrs.update(headers or {})
        data = None
        if method == "POST":
            data = compact(obj) if obj is not None else b""
            hdrs.setdefault("Content-Type", "application/json")
        r = self.session.request(method, self.base_url + path, data=data, headers=hdrs,
                                 timeout=SOCKET_TIMEOUT_S)
        return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content

    def close(self):
        self.session.close()


# --- Prometheus text -----------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')


class Metrics:
    """One scrape: samples by (name, sorted labels), and the declared TYPE of families."""

    def __init__(self, text):
        self.text = text
        self.samples = {}
        self.types = {}
        for line in text.split("\n"):
            if not line:
                continue
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                assert name not in self.types, f"TYPE twice for {name}"
                self.types[name] = kind
                continue
            if line.startswith("#"):
                continue
            match = _SAMPLE.match(line)
            assert match, f"unparsable sample line {line!r}"
            name, label_text, value = match.groups()
            labels = {}
            if label_text:
                pairs = _LABEL.findall(label_text)
                rebuilt = ",".join(f'{k}="{v}"' for k, v in pairs)
                assert rebuilt == label_text, f"unparsable labels in {line!r}"
                labels = dict(pairs)
            series = (name, tuple(sorted(labels.items())))
            assert series not in self.samples, f"duplicate series {line!r}"
            self.samples[series] = float(value)

    def get(self, name, **labels):
        """The value of one series; 0 if absent (counters that never moved are omitted)."""
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def series(self, name):
        """[(labels dict, value)] of every series of `name`."""
        return [(dict(lbl), v) for (n, lbl), v in self.samples.items() if n == name]

    def sum(self, name, **match):
        return sum(v for lbl, v in self.series(name)
                   if all(lbl.get(k) == str(want) for k, want in match.items()))


# --- the vLLM request sequence ---------------------------------------------------------

def vllm_sequence(tc, call, tag, ranks=(0, 1), num_pages=64, n=8):
    """What one engine with TP=len(ranks) does, through `call`: clear, scheduler init,
    worker inits, a miss, a save on every rank (allocate -> confirm), exists, loads
    (get_locations), then a failed save whose release includes a cache-hit page. Checks
    every answer byte for byte; returns the number of requests made."""
    made = 0

    def expect(method, path, obj, status, body):
        nonlocal made
        made += 1
        got_status, headers, got = call(method, path, obj)
        tc.assertEqual((got_status, got), (status, body), f"{method} {path} {obj}")
        if status != 204:
            tc.assertEqual(headers.get("content-type", "").split(";")[0], "application/json")

    ks = keys(n, tag)
    expect("POST", "/clear", None, 204, b"")
    expect("POST", "/rank/0/initialize", {"num_pages": 0, "role": "scheduler"}, 200,
           b'{"message":"Scheduler role does not require initialization"}')
    for r in ranks:
        expect("POST", f"/rank/{r}/initialize", {"num_pages": num_pages, "role": "worker"}, 200,
               compact({"message": f"Rank {r} initialized with {num_pages} pages"}))
    expect("POST", "/keys/batch_exists", {"keys": ks}, 200, compact({"exists": [False] * n}))
    for r in ranks:
        expect("POST", "/keys/batch_allocate", {"rank": r, "keys": [[k, ""] for k in ks]}, 200,
               compact({"rank": r, "results": [[k, i] for i, k in enumerate(ks)]}))
        expect("POST", "/keys/confirm_write",
               {"rank": r, "confirmations": [[k, i] for i, k in enumerate(ks)],
                "pages_to_release": []}, 204, b"")
    expect("POST", "/keys/batch_exists", {"keys": ks}, 200, compact({"exists": [True] * n}))
    for r in ranks:
        expect("POST", "/keys/get_locations", {"rank": r, "keys": ks}, 200,
               compact({"locations": list(range(n))}))
    # A failed save on the first rank: two hits and two new keys; the connector releases
    # every page of the task, the hits' pages included (those must stay bound).
    r = ranks[0]
    fresh = keys(2, tag + "/failed")
    task = ks[:2] + fresh
    expect("POST", "/keys/batch_allocate", {"rank": r, "keys": [[k, ""] for k in task]}, 200,
           compact({"rank": r, "results": [[ks[0], 0], [ks[1], 1], [fresh[0], n],
                                           [fresh[1], n + 1]]}))
    expect("POST", "/keys/confirm_write",
           {"rank": r, "confirmations": [], "pages_to_release": [0, 1, n, n + 1]}, 204, b"")
    expect("GET", f"/rank/{r}", None, 200,
           compact({"num_pages": num_pages, "free": num_pages - n, "reserved": 0, "bound": n, "incomplete": 0}))
    expect("POST", "/keys/get_locations", {"rank": r, "keys": task}, 200,
           compact({"locations": [0, 1, None, None]}))
    return made


# --- base class ------------------------------------------------------------------------

class OpsTestCase(unittest.TestCase):
    """Helpers to start servers (stopped, and checked to exit 0, at cleanup), temp dirs
    and raw connections."""

    def tmpdir(self):
        path = tempfile.mkdtemp(prefix="metad-ops-")
        self.addCleanup(shutil.rmtree, path, ignore_errors=True)
        return path

    def start(self, *args):
        server = OpsServer(args)
        self.addCleanup(self._stop, server)
        return server

    def _stop(self, server):
        code = server.stop()
        self.assertEqual(code, 0, f"exit code after SIGTERM; stderr tail:\n{server.log()[-3000:]}")

    def write_file(self, directory, name, text):
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def scrape(self, server, headers=None):
        """GET /metrics on a fresh connection; checks the content type, returns Metrics."""
        r = requests.get(server.base_url + "/metrics", headers=headers, timeout=SOCKET_TIMEOUT_S)
        self.assertEqual(r.status_code, 200, r.content)
        self.assertEqual(r.headers.get("Content-Type"), "text/plain; version=0.0.4; charset=utf-8")
        return Metrics(r.text)

    def assert_closed_without_answer(self, conn, timeout):
        self.assertTrue(conn.closed_by_peer(timeout=timeout),
                        f"connection not closed within {timeout} s; got {conn.buf!r}")
        self.assertEqual(conn.buf, b"")


def request_ok(port):
    """One request on a fresh connection; True if it is answered 200 {"exists":[]}."""
    with RawConnection(port, timeout=5.0) as conn:
        conn.send(raw_request("POST", "/keys/batch_exists", compact({"keys": []})))
        status, _, body = conn.read_response()
    return (status, body) == (200, b'{"exists":[]}')


# --- 1. metrics ------------------------------------------------------------------------

class MetricsTest(OpsTestCase):

    def test_health_and_ready(self):
        server = self.start()
        client = Client(server.base_url)
        self.addCleanup(client.close)
        for path, body in (("/health", b'{"status":"ok"}'), ("/ready", b'{"status":"ready"}')):
            with self.subTest(path=path):
                r = client.request("GET", path)
                self.assertEqual((r.status_code, r.content), (200, body))
                self.assertEqual(r.headers.get("Content-Type"), "application/json")

    def test_promtool_accepts_the_exposition(self):
        server = self.start()
        client = Client(server.base_url)
        self.addCleanup(client.close)
        # Populate every family: a rank, a key, a refused release, an error, latencies.
        self.assertEqual(client.initialize(3, 16).status_code, 200)
        k = keys(1, "promtool")
        self.assertEqual(client.batch_allocate(3, k).status_code, 200)
        self.assertEqual(client.confirm_write(3, [(k[0], 0)], [0]).status_code, 204)
        self.assertEqual(client.request("GET", "/nope").status_code, 404)
        text = self.scrape(server).text
        if not os.path.exists(PROMTOOL):
            self.skipTest(f"{PROMTOOL} absent (Debian package prometheus)")
        run = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(),
                             capture_output=True, timeout=30)
        self.assertEqual(run.returncode, 0,
                         f"promtool: {run.stdout.decode()}{run.stderr.decode()}\n{text}")

    def test_metrics_move_with_requests(self):
        server = self.start()
        client = Client(server.base_url)
        self.addCleanup(client.close)

        def get_text():
            r = client.request("GET", "/metrics")
            self.assertEqual(r.status_code, 200)
            return Metrics(r.text)

        before = get_text()
        for family, kind in (("hf3fs_metad_requests_total", "counter"),
                             ("hf3fs_metad_request_duration_seconds", "histogram"),
                             ("hf3fs_metad_keys", "gauge"), ("hf3fs_metad_ranks", "gauge"),
                             ("hf3fs_metad_refused_releases_total", "counter"),
                             ("hf3fs_metad_cross_core_messages_total", "counter"),
                             ("hf3fs_metad_connections_open", "gauge"),
                             ("hf3fs_metad_connections_accepted_total", "counter"),
                             ("hf3fs_metad_connections_rejected_total", "counter"),
                             ("hf3fs_metad_connections_timed_out_total", "counter"),
                             ("hf3fs_metad_pages", "gauge"),
                             ("hf3fs_metad_pool_pages", "gauge"),
                             ("hf3fs_metad_rank_series_omitted", "gauge")):
            with self.subTest(family=family):
                self.assertEqual(before.types.get(family), kind)

        rank, ks = 5, keys(4, "metrics")
        self.assertEqual(client.initialize(rank, 100).status_code, 200)
        self.assertEqual(client.post(f"/rank/{rank}/initialize",
                                     {"num_pages": 1, "role": "Worker"}).status_code, 400)
        self.assertEqual(client.batch_allocate(rank, ks).status_code, 200)
        self.assertEqual(client.batch_allocate(99, ks).status_code, 404)
        self.assertEqual(client.post("/no/such/path", {}).status_code, 404)
        self.assertEqual(client.confirm_write(rank, [(ks[0], 0), (ks[1], 1)]).status_code, 204)
        # A write-failure release of a bound page (1: refused, counted) and a reserved one.
        self.assertEqual(client.confirm_write(rank, [], [1, 2]).status_code, 204)
        info = client.rank_info(rank).json()
        after = get_text()

        expected = {("initialize", "200"): 1, ("initialize", "400"): 1,
                    ("batch_allocate", "200"): 1, ("batch_allocate", "404"): 1,
                    ("not_found", "404"): 1, ("confirm_write", "204"): 2,
                    ("rank_info", "200"): 1, ("metrics", "200"): 1}
        series = {(lbl["endpoint"], lbl["status"])
                  for lbl, _ in before.series("hf3fs_metad_requests_total") +
                  after.series("hf3fs_metad_requests_total")}
        for endpoint, status in sorted(series | set(expected)):
            with self.subTest(endpoint=endpoint, status=status):
                delta = (after.get("hf3fs_metad_requests_total", endpoint=endpoint, status=status) -
                         before.get("hf3fs_metad_requests_total", endpoint=endpoint, status=status))
                self.assertEqual(delta, expected.get((endpoint, status), 0))

        # Histograms: per endpoint, cumulative buckets, +Inf == _count == requests.
        endpoints = {lbl["endpoint"] for lbl, _ in after.series("hf3fs_metad_requests_total")}
        hist = "hf3fs_metad_request_duration_seconds"
        for endpoint in sorted(endpoints):
            with self.subTest(histogram=endpoint):
                count = after.get(hist + "_count", endpoint=endpoint)
                self.assertEqual(count, after.sum("hf3fs_metad_requests_total", endpoint=endpoint))
                buckets = sorted(((float(lbl["le"]), v) for lbl, v in after.series(hist + "_bucket")
                                  if lbl["endpoint"] == endpoint))
                self.assertEqual(buckets[-1], (float("inf"), count))
                values = [v for _, v in buckets]
                self.assertEqual(values, sorted(values), "buckets must be cumulative")
                self.assertGreaterEqual(after.get(hist + "_sum", endpoint=endpoint), 0.0)

        # Pages of the rank, as GET /rank/{r} says.
        self.assertEqual(info, {"num_pages": 100, "free": 97, "reserved": 1, "bound": 2, "incomplete": 0})
        for state, field in (("total", "num_pages"), ("free", "free"),
                             ("reserved", "reserved"), ("bound", "bound")):
            with self.subTest(pages=state):
                self.assertEqual(after.get("hf3fs_metad_pages", rank=str(rank), state=state),
                                 info[field])
                self.assertEqual(after.get("hf3fs_metad_pool_pages", state=state), info[field])
        self.assertEqual(after.get("hf3fs_metad_rank_series_omitted"), 0)
        self.assertEqual(after.get("hf3fs_metad_ranks"), 1)
        self.assertEqual(after.get("hf3fs_metad_keys") - before.get("hf3fs_metad_keys"), 2)
        self.assertEqual(after.get("hf3fs_metad_refused_releases_total") -
                         before.get("hf3fs_metad_refused_releases_total"), 1)
        self.assertGreaterEqual(after.get("hf3fs_metad_cross_core_messages_total"),
                                before.get("hf3fs_metad_cross_core_messages_total"))
        # Per core: one series per core thread; this client's connection is open.
        threads = int(server.args[server.args.index("--threads") + 1])
        for family in ("hf3fs_metad_connections_open", "hf3fs_metad_connections_accepted_total",
                       "hf3fs_metad_connections_rejected_total",
                       "hf3fs_metad_connections_timed_out_total"):
            with self.subTest(per_core=family):
                self.assertEqual(sorted(lbl["core"] for lbl, _ in after.series(family)),
                                 [str(c) for c in range(threads)])
        self.assertGreaterEqual(after.sum("hf3fs_metad_connections_open"), 1)
        self.assertGreaterEqual(after.sum("hf3fs_metad_connections_accepted_total"), 1)

        # /clear empties the gauges.
        self.assertEqual(client.clear().status_code, 204)
        cleared = get_text()
        self.assertEqual(cleared.series("hf3fs_metad_pages"), [])
        self.assertEqual(cleared.sum("hf3fs_metad_pool_pages"), 0)
        self.assertEqual((cleared.get("hf3fs_metad_ranks"), cleared.get("hf3fs_metad_keys")),
                         (0, 0))


# The most ranks /stats lists and /metrics gives per-rank series (kRankRowsMax).
RANK_ROWS_MAX = 1024


def initialize_ranks(port, ranks, connections=32, batch=500):
    """POST /rank/{r}/initialize (1 page) for every r, pipelined over raw connections.

    A connection's requests are handled one at a time and most hop to another core, so
    it is the number of connections that makes this quick (~1 s for 50k ranks).
    Returns the failures (empty when every rank answered 200)."""
    body = compact({"role": "worker", "num_pages": 1})
    failures = []

    def run(part):
        try:
            with RawConnection(port, timeout=30) as c:
                for i in range(0, len(part), batch):
                    chunk = part[i:i + batch]
                    c.send(b"".join(raw_request("POST", f"/rank/{r}/initialize", body)
                                    for r in chunk))
                    for r in chunk:
                        status, _, answer = c.read_response()
                        if status != 200:
                            failures.append((r, status, answer))
        except Exception as e:  # reported by the caller
            failures.append((None, type(e).__name__, str(e)))

    threads = [threading.Thread(target=run, args=(ranks[k::connections],))
               for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


@transport_independent
class ManyRanksTest(OpsTestCase):
    """With tens of thousands of ranks, /stats lists the RANK_ROWS_MAX lowest ranks and
    /metrics gives only those per-rank series, both with totals over every rank; the
    answers stay small and scraping them does not stall /health on the other core. (The
    full lists were 7 MB and 19 MB with 100k ranks, and /health waited up to 216 ms.)"""

    RANKS = 50_000
    BODY_BYTES_MAX = 256 << 10
    # Server CPU per scrape (/stats or /metrics): the full lists took 150-300 ms with
    # 50-100k ranks, and a core busy rendering them kept /health waiting as long. CPU
    # time, unlike /health's wall-clock latency, does not grow with the host's load.
    SCRAPE_CPU_MS_MAX = 40
    # /health must still be answered while scraping: a stall, not scheduling noise.
    HEALTH_MS_MAX = 1000

    def get(self, port, path):
        with RawConnection(port, timeout=30) as c:
            c.send(raw_request("GET", path))
            status, _, body = c.read_response()
        self.assertEqual(status, 200, body[:300])
        return body

    def test_stats_and_metrics_stay_small_and_quick(self):
        server = self.start("--threads", "2", "--ranks-max", "100000")
        # Ranks in no order, spread over both cores, some negative; ranks[:RANKS // 2]
        # are not the lowest, so the lowest must be picked, not the first seen.
        ranks = [r - 1000 for r in range(self.RANKS)]
        ranks = ranks[1::2] + ranks[::2][::-1]
        self.assertEqual(initialize_ranks(server.port, ranks)[:5], [])
        lowest = sorted(ranks)[:RANK_ROWS_MAX]
        # Some pages in other states: rank -1000 (listed) and the highest (not listed).
        client = Client(server.base_url)
        self.addCleanup(client.close)
        for r in (-1000, max(ranks)):
            self.assertEqual(client.batch_allocate(r, keys(1, f"many/{r}")).status_code, 200)
        self.assertEqual(client.confirm_write(-1000, [(key(0, "many/-1000"), 0)]).status_code,
                         204)

        body = self.get(server.port, "/stats")
        self.assertLess(len(body), self.BODY_BYTES_MAX)
        st = json.loads(body)
        self.assertEqual([row["rank"] for row in st["ranks"]], lowest)
        self.assertEqual(st["ranks"][0], {"rank": -1000, "num_pages": 1, "free": 0,
                                          "reserved": 0, "bound": 1})
        self.assertEqual((st["ranks_total"], st["ranks_truncated"]), (self.RANKS, True))
        self.assertEqual((st["pages_total"], st["pages_free"], st["pages_reserved"],
                          st["pages_bound"]), (self.RANKS, self.RANKS - 2, 1, 1))
        # A rank left out of the list is one GET /rank/{r} away.
        self.assertEqual(client.rank_info(max(ranks)).json(),
                         {"num_pages": 1, "free": 0, "reserved": 1, "bound": 0, "incomplete": 0})

        text = self.get(server.port, "/metrics")
        self.assertLess(len(text), self.BODY_BYTES_MAX)
        m = Metrics(text.decode())
        self.assertEqual(sorted({int(lbl["rank"]) for lbl, _ in m.series("hf3fs_metad_pages")}),
                         lowest)
        self.assertEqual(len(m.series("hf3fs_metad_pages")), 4 * RANK_ROWS_MAX)
        self.assertEqual(m.get("hf3fs_metad_rank_series_omitted"), self.RANKS - RANK_ROWS_MAX)
        self.assertEqual(m.get("hf3fs_metad_ranks"), self.RANKS)
        for state, n in (("total", self.RANKS), ("free", self.RANKS - 2), ("reserved", 1),
                         ("bound", 1)):
            with self.subTest(pool=state):
                self.assertEqual(m.get("hf3fs_metad_pool_pages", state=state), n)
        if os.path.exists(PROMTOOL):
            run = subprocess.run([PROMTOOL, "check", "metrics"], input=text,
                                 capture_output=True, timeout=30)
            self.assertEqual(run.returncode, 0, f"promtool: {run.stdout.decode()}"
                                                f"{run.stderr.decode()}")

        # /health on fresh connections (either core) while another thread scrapes.
        stop = threading.Event()
        scrapes, errors = [0], []

        def scrape():
            try:
                while not stop.is_set():
                    for path in ("/stats", "/metrics"):
                        self.get(server.port, path)
                        scrapes[0] += 1
            except Exception as e:  # reported below
                errors.append(e)

        scraper = threading.Thread(target=scrape)
        cpu_before = cpu_seconds(server.proc.pid)
        scraper.start()
        worst, deadline = 0.0, time.monotonic() + 2.0
        try:
            while time.monotonic() < deadline:
                t = time.monotonic()
                with RawConnection(server.port, timeout=10) as c:
                    c.send(raw_request("GET", "/health"))
                    self.assertEqual(c.read_response()[0], 200)
                worst = max(worst, time.monotonic() - t)
                time.sleep(0.002)
        finally:
            stop.set()
            scraper.join()
        cpu_ms = (cpu_seconds(server.proc.pid) - cpu_before) * 1000
        self.assertEqual(errors, [])
        self.assertGreater(scrapes[0], 4, "the scraper did not get to scrape")
        if sanitized(server.proc.pid):
            return  # time says nothing under a sanitizer
        # The /health requests' own CPU is in cpu_ms too: a bound on the scrapes' share.
        self.assertLess(cpu_ms / scrapes[0], self.SCRAPE_CPU_MS_MAX,
                        f"{cpu_ms:.0f} ms of server CPU for {scrapes[0]} scrapes")
        self.assertLess(worst * 1000, self.HEALTH_MS_MAX,
                        f"/health took {worst * 1000:.1f} ms while /stats and /metrics "
                        f"were scraped ({scrapes[0]} scrapes)")


# --- 2. access control -------------------------------------------------------------------

# Every endpoint but /health, with a body that would succeed (or at least be answered)
# if the token were right.
GUARDED = (
    ("POST", "/rank/0/initialize", {"num_pages": 8, "role": "worker"}),
    ("POST", "/rank/0/initialize", {"num_pages": 0, "role": "scheduler"}),
    ("POST", "/keys/batch_allocate", {"rank": 0, "keys": [["k", ""]]}),
    ("POST", "/keys/confirm_write", {"rank": 0, "confirmations": [], "pages_to_release": []}),
    ("POST", "/keys/batch_exists", {"keys": ["k"]}),
    ("POST", "/keys/get_locations", {"rank": 0, "keys": ["k"]}),
    ("POST", "/clear", None),
    ("POST", "/keys/delete", {"keys": ["k"]}),
    ("GET", "/rank/0", None),
    ("GET", "/stats", None),
    ("GET", "/ready", None),
    ("GET", "/metrics", None),
    ("POST", "/no/such/path", {}),
    ("GET", "/keys/batch_exists", None),
)

BAD_AUTHORIZATION = (
    None,
    "",
    "Bearer",
    "Bearer ",
    "Bearer wrong",
    f"Bearer {TOKEN}x",
    f"Bearer {TOKEN[:-1]}",
    f"Basic {TOKEN}",
    TOKEN,
    f"Bearer {ADMIN_TOKEN}",
)


class FanOutTest(OpsTestCase):
    """A request that names no rank visits the directory's cores only (--directory-cores,
    default 2), whatever --threads is: cross-core messages per batch_exists stay at most
    one per directory core plus the way home."""

    def messages_per_request(self, *args):
        server = self.start(*args)
        client = Client(server.base_url)
        self.addCleanup(client.close)
        ks = keys(200, "fan-out")
        self.assertEqual(client.batch_exists(ks).status_code, 200)
        before = self.scrape(server).get("hf3fs_metad_cross_core_messages_total")
        n = 60
        for _ in range(n):
            self.assertEqual(client.batch_exists(ks).status_code, 200)
        after = self.scrape(server).get("hf3fs_metad_cross_core_messages_total")
        return after - before, n

    def test_batch_exists_visits_a_bounded_number_of_cores(self):
        for threads, directory_cores in ((8, None), (16, None), (16, 1), (3, 3)):
            with self.subTest(threads=threads, directory_cores=directory_cores):
                args = ("--threads", str(threads))
                if directory_cores:
                    args += ("--directory-cores", str(directory_cores))
                messages, n = self.messages_per_request(*args)
                bound = (directory_cores or 2) + 1
                # A scrape hops to every core once: the second one's count lands in `after`.
                self.assertLessEqual(messages, bound * n + threads, f"{messages} messages")
                if directory_cores == 3:
                    self.assertGreater(messages, 2 * n, "the keys should spread over 3 cores")


class AuthTest(OpsTestCase):

    def setUp(self):
        d = self.tmpdir()
        # The auth token file ends with a newline (as `echo` writes it); the admin one not.
        self.auth_file = self.write_file(d, "token", TOKEN + "\n")
        self.admin_file = self.write_file(d, "admin-token", ADMIN_TOKEN)

    def assert_unauthorized(self, call, method, path, obj, headers):
        status, hdrs, body = call(method, path, obj, headers)
        self.assertEqual((status, body), (401, UNAUTHORIZED_BODY))
        self.assertEqual(hdrs.get("www-authenticate"), "Bearer")
        self.assertEqual(hdrs.get("content-type"), "application/json")

    def test_every_endpoint_needs_the_token(self):
        server = self.start("--auth-token-file", self.auth_file)
        call = RequestsCaller(server.base_url)
        self.addCleanup(call.close)
        for method, path, obj in GUARDED:
            for auth in BAD_AUTHORIZATION:
                with self.subTest(method=method, path=path, authorization=auth):
                    headers = {} if auth is None else {"Authorization": auth}
                    self.assert_unauthorized(call, method, path, obj, headers)
        good = {"Authorization": f"Bearer {TOKEN}"}
        # Nothing was applied: the rank does not exist.
        self.assertEqual(call("GET", "/rank/0", None, good)[0], 404)
        # /health needs none, and ignores a wrong one.
        for headers in ({}, {"Authorization": "Bearer wrong"}, good):
            with self.subTest(health=headers):
                self.assertEqual(call("GET", "/health", None, headers)[::2],
                                 (200, b'{"status":"ok"}'))
        # The right token: everything works, /clear included (no admin token set).
        authed = RequestsCaller(server.base_url, good)
        self.addCleanup(authed.close)
        vllm_sequence(self, authed, "auth")
        self.assertEqual(authed("GET", "/ready")[::2], (200, b'{"status":"ready"}'))
        self.assertEqual(authed("GET", "/metrics")[0], 200)

    def test_admin_token_guards_clear(self):
        server = self.start("--auth-token-file", self.auth_file,
                            "--admin-token-file", self.admin_file)
        call = RequestsCaller(server.base_url)
        self.addCleanup(call.close)
        user = {"Authorization": f"Bearer {TOKEN}"}
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        self.assertEqual(call("POST", "/rank/7/initialize", {"num_pages": 4}, user)[0], 200)
        for name, headers in (("none", {}), ("user", user), ("wrong", {"Authorization": "Bearer x"})):
            with self.subTest(clear_with=name):
                self.assert_unauthorized(call, "POST", "/clear", None, headers)
                self.assertEqual(call("GET", "/rank/7", None, user)[::2],
                                 (200, b'{"num_pages":4,"free":4,"reserved":0,"bound":0,"incomplete":0}'))
        self.assertEqual(call("POST", "/clear", None, admin)[::2], (204, b""))
        self.assertEqual(call("GET", "/rank/7", None, user)[0], 404)

    def test_bad_token_files_exit_2(self):
        d = self.tmpdir()
        empty = self.write_file(d, "empty", "")
        blank = self.write_file(d, "blank", "  \n")
        missing = os.path.join(d, "missing")
        binary = os.environ.get("METAD_BIN")
        if not binary:
            self.skipTest("METAD_BIN is not set")
        for flag in ("--auth-token-file", "--admin-token-file"):
            for path in (empty, blank, missing):
                with self.subTest(flag=flag, file=os.path.basename(path)):
                    run = subprocess.run([binary, "--port", "0", flag, path],
                                         stdin=subprocess.DEVNULL, capture_output=True,
                                         timeout=STOP_TIMEOUT_S)
                    self.assertEqual(run.returncode, 2, run.stderr)


# --- 3. unix socket ---------------------------------------------------------------------

class UnixSocketTest(OpsTestCase):

    def test_unix_only(self):
        sock = os.path.join(self.tmpdir(), "metad.sock")
        server = self.start("--unix", sock, "--no-tcp")
        self.assertTrue(stat.S_ISSOCK(os.stat(sock).st_mode))
        self.assertIsNone(server.port)
        call = HttpCaller.unix(sock)
        self.addCleanup(call.close)
        self.assertEqual(call("GET", "/health")[::2], (200, b'{"status":"ok"}'))
        vllm_sequence(self, call, "unix")
        self.assertEqual(call("GET", "/metrics")[0], 200)

    def test_no_tcp_needs_unix(self):
        binary = os.environ.get("METAD_BIN")
        if not binary:
            self.skipTest("METAD_BIN is not set")
        run = subprocess.run([binary, "--port", "0", "--no-tcp"], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=STOP_TIMEOUT_S)
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertIn(b"--unix", run.stderr)

    def test_tcp_and_unix_share_state(self):
        sock = os.path.join(self.tmpdir(), "metad.sock")
        server = self.start("--unix", sock)
        tcp, unix = HttpCaller.tcp(server.port), HttpCaller.unix(sock)
        self.addCleanup(tcp.close)
        self.addCleanup(unix.close)
        ks = keys(3, "shared")
        self.assertEqual(tcp("POST", "/rank/2/initialize", {"num_pages": 8})[0], 200)
        status, _, body = unix("POST", "/keys/batch_allocate", {"rank": 2, "keys": ks})
        self.assertEqual((status, body), (200, compact({"rank": 2, "results": [[k, i] for i, k in
                                                                             enumerate(ks)]})))
        self.assertEqual(tcp("POST", "/keys/confirm_write",
                             {"rank": 2, "confirmations": [[k, i] for i, k in enumerate(ks)]})[0],
                         204)
        expect_info = compact({"num_pages": 8, "free": 5, "reserved": 0, "bound": 3, "incomplete": 0})
        for name, call in (("tcp", tcp), ("unix", unix)):
            with self.subTest(via=name):
                self.assertEqual(call("POST", "/keys/batch_exists", {"keys": ks})[::2],
                                 (200, b'{"exists":[true,true,true]}'))
                self.assertEqual(call("GET", "/rank/2")[::2], (200, expect_info))
        self.assertEqual(unix("POST", "/clear")[0], 204)
        self.assertEqual(tcp("GET", "/rank/2")[0], 404)


# --- 4. nginx -----------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NGINX_CONF = """\
worker_processes 1;
{user}
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{blocks}
}}
"""

NGINX_BLOCK = """\
    upstream {name} {{
        server {target};
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://{name};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
{extra}        }}
    }}
"""


def wait_listening(proc, what, ports, log):
    """Until every port accepts a connection; RuntimeError (with log()) if `proc` exits or
    START_TIMEOUT_S passes first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    for port in ports:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{what} not listening on {port}:\n{log()}")
                time.sleep(0.05)


def stop_process(proc, soft_signal):
    """`soft_signal`, then SIGTERM, then SIGKILL, each given half the stop timeout; the
    exit code."""
    for sig in (soft_signal, signal.SIGTERM):
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            return proc.wait(timeout=STOP_TIMEOUT_S / 2)
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    return proc.wait()


class Nginx:
    """Debian's nginx in the foreground with a generated config in `directory`."""

    def __init__(self, directory, routes):
        """routes: [(name, upstream target, extra location lines)] -> self.ports[name]."""
        self.dir = directory
        self.ports = {}
        blocks = []
        for name, target, extra in routes:
            self.ports[name] = free_port()
            blocks.append(NGINX_BLOCK.format(name=name, target=target, port=self.ports[name],
                                             extra="".join(f"            {line}\n"
                                                           for line in extra)))
        # As root the workers would run as nobody, who cannot reach a socket in a 0700
        # temp dir.
        user = "user root;" if os.geteuid() == 0 else ""
        self.conf = os.path.join(directory, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(NGINX_CONF.format(user=user, dir=directory, blocks="".join(blocks)))
        self.proc = subprocess.Popen(
            [NGINX, "-p", directory, "-c", self.conf, "-e", os.path.join(directory, "error.log"),
             "-g", "daemon off;"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        try:
            self._wait_listening()
        except Exception:
            self.stop()
            raise

    def _wait_listening(self):
        wait_listening(self.proc, "nginx", self.ports.values(), self.log)

    def log(self):
        try:
            with open(os.path.join(self.dir, "error.log")) as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        """Graceful stop (SIGQUIT), then SIGTERM, then SIGKILL; the exit code."""
        return stop_process(self.proc, signal.SIGQUIT)


@unittest.skipUnless(os.path.exists(NGINX),
                     f"{NGINX} absent: install nginx-light (scripts/setup.sh --bench) to run "
                     "the reverse-proxy tests")
class NginxTest(OpsTestCase):

    def start_nginx(self, routes):
        nginx = Nginx(self.tmpdir(), routes)
        self.addCleanup(self._stop_nginx, nginx)
        return nginx

    def _stop_nginx(self, nginx):
        code = nginx.stop()
        self.assertEqual(code, 0, f"nginx exit code; error log:\n{nginx.log()}")

    def test_vllm_sequence_through_nginx(self):
        d = self.tmpdir()
        os.chmod(d, 0o755)
        open_sock = os.path.join(d, "open.sock")
        auth_sock = os.path.join(d, "auth.sock")
        token_file = self.write_file(d, "token", TOKEN + "\n")
        open_server = self.start("--unix", open_sock)
        auth_server = self.start("--unix", auth_sock, "--auth-token-file", token_file)
        auth_header = [f'proxy_set_header Authorization "Bearer {TOKEN}";']
        nginx = self.start_nginx([
            ("metad_tcp", f"127.0.0.1:{open_server.port}", []),
            ("metad_unix", f"unix:{open_sock}", []),
            ("metad_auth_unix", f"unix:{auth_sock}", auth_header),
            ("metad_auth_tcp", f"127.0.0.1:{auth_server.port}", auth_header),
        ])
        # The client itself sends no token: the auth server refuses it directly.
        direct = RequestsCaller(auth_server.base_url)
        self.addCleanup(direct.close)
        self.assertEqual(direct("POST", "/keys/batch_exists", {"keys": []})[::2],
                         (401, UNAUTHORIZED_BODY))

        for name, server in (("metad_tcp", open_server), ("metad_unix", open_server),
                             ("metad_auth_unix", auth_server), ("metad_auth_tcp", auth_server)):
            with self.subTest(route=name):
                before = self.scrape(server, {"Authorization": f"Bearer {TOKEN}"})
                call = RequestsCaller(f"http://127.0.0.1:{nginx.ports[name]}")
                try:
                    made = vllm_sequence(self, call, name)
                    made += 2
                    self.assertEqual(call("GET", "/health")[::2], (200, b'{"status":"ok"}'))
                    self.assertEqual(call("GET", "/ready")[::2], (200, b'{"status":"ready"}'))
                finally:
                    call.close()
                after = self.scrape(server, {"Authorization": f"Bearer {TOKEN}"})
                # Keep-alive upstream: far fewer connections than requests (the scrape
                # itself is one).
                accepted = (after.sum("hf3fs_metad_connections_accepted_total") -
                            before.sum("hf3fs_metad_connections_accepted_total"))
                self.assertLessEqual(accepted, 3, f"{made} requests took {accepted} connections")
                self.assertEqual(after.sum("hf3fs_metad_requests_total", status=401) -
                                 before.sum("hf3fs_metad_requests_total", status=401), 0)

    def test_as_shipped_nginx_cannot_clear_or_delete(self):
        """deploy/: the server has a user and an admin token, nginx adds the user one.
        Through nginx everything but the destructive endpoints works, whatever
        Authorization header the client sends; on the host, the admin token clears."""
        d = self.tmpdir()
        os.chmod(d, 0o755)
        sock = os.path.join(d, "metad.sock")
        server = self.start("--unix", sock,
                            "--auth-token-file", self.write_file(d, "token", TOKEN + "\n"),
                            "--admin-token-file", self.write_file(d, "admin", ADMIN_TOKEN))
        nginx = self.start_nginx([
            ("metad", f"unix:{sock}", [f'proxy_set_header Authorization "Bearer {TOKEN}";'])])
        call = RequestsCaller(f"http://127.0.0.1:{nginx.ports['metad']}")
        self.addCleanup(call.close)
        self.assertEqual(call("POST", "/rank/0/initialize", {"num_pages": 4})[0], 200)
        self.assertEqual(call("POST", "/keys/batch_allocate", {"rank": 0, "keys": ["k"]})[0], 200)
        for client_header in ({}, {"Authorization": f"Bearer {ADMIN_TOKEN}"}):
            for path, obj in (("/clear", None), ("/keys/delete", {"keys": ["k"]})):
                with self.subTest(path=path, client_header=client_header):
                    self.assertEqual(call("POST", path, obj, client_header)[::2],
                                     (401, UNAUTHORIZED_BODY))
        self.assertEqual(call("GET", "/rank/0")[::2],
                         (200, b'{"num_pages":4,"free":3,"reserved":1,"bound":0,"incomplete":0}'))
        admin = HttpCaller.unix(sock)
        self.addCleanup(admin.close)
        self.assertEqual(admin("POST", "/clear", None,
                               {"Authorization": f"Bearer {ADMIN_TOKEN}"})[::2], (204, b""))
        self.assertEqual(call("GET", "/rank/0")[0], 404)

    def test_deploy_example_parses(self):
        example = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "nginx",
                               "hf3fs-metad.conf")
        if not os.path.exists(example):
            self.skipTest("deploy/nginx/hf3fs-metad.conf absent")
        d = self.tmpdir()
        # nginx resolves upstream names as it reads them: point the forwarder at loopback.
        with open(example) as f:
            shipped = self.write_file(d, "hf3fs-metad.conf",
                                      f.read().replace("METAD_HOST", "127.0.0.1"))
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(user="", dir=d, blocks=f"    include {shipped};\n"))
        run = subprocess.run([NGINX, "-t", "-p", d, "-c", conf, "-e", os.path.join(d, "error.log")],
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        self.assertEqual(run.returncode, 0, run.stderr.decode())


# --- 5. timeouts (slowloris) ---------------------------------------------------------------

SLOW_REQUEST = (b"POST /keys/batch_exists HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nX-Slow: " + b"a" * 200 + b"\r\n")


def dribble_until_closed(port, sent_at_once, dribble, served_check, limit_s=5.0):
    """Sends `sent_at_once`, then one byte of `dribble` every 100 ms until the server ends
    the connection. Calls `served_check()` once, ~0.2 s in. Returns (seconds from the
    first byte to the end, bytes the server sent, what served_check returned)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S)
    received = b""
    served = None
    try:
        start = time.monotonic()
        if sent_at_once:
            sock.sendall(sent_at_once)
        i = 0
        while time.monotonic() - start < limit_s:
            if i < len(dribble):
                try:
                    sock.sendall(dribble[i:i + 1])
                except (BrokenPipeError, ConnectionResetError):
                    return time.monotonic() - start, received, served
                i += 1
            readable, _, _ = select.select([sock], [], [], 0.1)
            if readable:
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if not chunk:
                    return time.monotonic() - start, received, served
                received += chunk
            if served is None and time.monotonic() - start > 0.2:
                served = served_check()
        return None, received, served
    finally:
        sock.close()


class TimeoutTest(OpsTestCase):

    def test_slowloris_is_cut_off_while_others_are_served(self):
        server = self.start("--header-timeout-ms", "500")
        before = self.scrape(server)
        body = compact({"keys": ["x" * 32]})
        cases = (
            ("request line", b"", SLOW_REQUEST),
            ("headers", SLOW_REQUEST[:34], SLOW_REQUEST[34:]),
            ("body", SLOW_REQUEST + b"Content-Length: %d\r\n\r\n" % (len(body) + 60),
             body + b" " * 60),
        )
        for name, at_once, dribble in cases:
            with self.subTest(slow=name):
                elapsed, received, served = dribble_until_closed(
                    server.port, at_once, dribble, lambda: request_ok(server.port))
                self.assertIsNotNone(elapsed, f"not disconnected within 5 s; got {received!r}")
                self.assertGreaterEqual(elapsed, 0.3)
                self.assertLessEqual(elapsed, 3.0)
                self.assertTrue(served, "another client was not served meanwhile")
                if received:  # an error answer before the close is fine; not a success
                    self.assertNotRegex(received[:12], rb"^HTTP/1\.1 2")
        self.assertTrue(request_ok(server.port))
        after = self.scrape(server)
        self.assertGreaterEqual(after.sum("hf3fs_metad_connections_timed_out_total") -
                                before.sum("hf3fs_metad_connections_timed_out_total"), len(cases))

    def test_idle_connections_are_closed(self):
        server = self.start("--idle-timeout-ms", "500")
        before = self.scrape(server)
        cases = (("after a request", True), ("never used", False))
        for name, use in cases:
            with self.subTest(idle=name):
                with RawConnection(server.port) as conn:
                    if use:
                        conn.send(raw_request("POST", "/keys/batch_exists", compact({"keys": []})))
                        self.assertEqual(conn.read_response()[0], 200)
                    start = time.monotonic()
                    self.assert_closed_without_answer(conn, timeout=5.0)
                    elapsed = time.monotonic() - start
                if use:  # a never-used connection may have been accepted a bit earlier
                    self.assertGreaterEqual(elapsed, 0.3)
                self.assertLessEqual(elapsed, 3.0)
        # A busy keep-alive connection (a request every 100 ms) is not idle.
        with RawConnection(server.port) as conn:
            for _ in range(10):
                conn.send(raw_request("POST", "/keys/batch_exists", compact({"keys": []})))
                self.assertEqual(conn.read_response()[0], 200)
                time.sleep(0.1)
        after = self.scrape(server)
        self.assertGreaterEqual(after.sum("hf3fs_metad_connections_timed_out_total") -
                                before.sum("hf3fs_metad_connections_timed_out_total"), len(cases))


# --- 6. connection limit ---------------------------------------------------------------------

def cpu_seconds(pid):
    """User + system CPU seconds a process (all its threads) has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sanitized(pid):
    """Whether the server runs under a sanitizer's runtime (its own allocator, and its
    own use of file descriptors)."""
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    return any(lib in maps for lib in ("libasan", "libtsan", "libubsan"))


class HostileClientMemoryTest(OpsTestCase):
    """A client that pipelines requests and never reads its answers holds a bounded
    amount of the server's memory: past 1 MiB of unsent answers the server stops reading
    that connection until they drain (both transports)."""

    def test_a_pipelining_client_that_never_reads_is_bounded(self):
        server = self.start("--threads", "1")
        request = raw_request("GET", "/metrics")
        sock = socket.create_connection(("127.0.0.1", server.port))
        self.addCleanup(sock.close)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        start_rss = rss_bytes(server.proc.pid)
        chunk = request * 2000
        sent, deadline = 0, time.monotonic() + 4.0
        while time.monotonic() < deadline:
            if not select.select([], [sock], [], 0.2)[1]:
                continue  # the server stopped reading: its buffers are full
            try:
                sent += sock.send(chunk)
            except BlockingIOError:
                pass
        grown = rss_bytes(server.proc.pid) - start_rss
        self.assertGreater(sent, len(request) * 1000, "the test did not get to pipeline")
        self.assertLess(grown, 64 << 20, f"RSS grew {grown >> 20} MiB after {sent} bytes of "
                                          "pipelined requests that were never read")
        # Other clients are served meanwhile.
        self.assertTrue(request_ok(server.port))


    def test_a_connection_keeps_serving_after_an_answer_over_1_mib(self):
        # Regression: once such an answer drained, the uring loop gave its send buffer
        # back but kept the count of bytes sent, so the next answer's send started past
        # the end of the empty buffer and the connection died.
        server = self.start("--threads", "1")
        body = compact({"keys": [f"{i:x}" for i in range(300_000)]})
        with RawConnection(server.port, timeout=30) as c:
            for _ in range(2):
                c.send(raw_request("POST", "/keys/batch_exists", body))
                status, _, answer = c.read_response()
                self.assertEqual(status, 200)
                self.assertGreater(len(answer), 1 << 20)
                c.send(raw_request("GET", "/health"))
                self.assertEqual(c.read_response()[::2], (200, b'{"status":"ok"}'))

    def test_idle_connections_give_back_what_a_big_request_took(self):
        server = self.start("--threads", "1")
        if sanitized(server.proc.pid):
            self.skipTest("RSS says nothing under a sanitizer's allocator")
        body = compact({"keys": [f"{i:032x}" for i in range(600_000)]})  # ~21 MB
        conns = [RawConnection(server.port, timeout=60) for _ in range(6)]
        self.addCleanup(lambda: [c.close() for c in conns])
        conns[0].send(raw_request("GET", "/health"))
        conns[0].read_response()
        before = rss_bytes(server.proc.pid)
        for c in conns:
            c.send(raw_request("POST", "/keys/batch_exists", body))
            self.assertEqual(c.read_response()[0], 200)
        # A small request on the core lets its JSON parser shrink back too.
        self.assertTrue(request_ok(server.port))
        time.sleep(2)
        held = rss_bytes(server.proc.pid) - before
        self.assertLess(held, 6 * (4 << 20),
                        f"six idle connections hold {held >> 20} MiB after 21 MB requests")


@transport_independent
class MemoryBudgetTest(OpsTestCase):
    """--memory-max bounds what clients can make the server hold: pools cost what they
    hold, an allocation past it is answered as by a full pool, a request body that does
    not fit a 503 before it is sent, and everything else is still served. --ranks-max and
    --key-bytes-max bound the rest."""

    def test_pools_of_2_to_the_40_pages_cost_what_they_hold(self):
        """24 vLLM ranks and 24 SGLang pools of 2^40 pages (half of them grown to it from 8)
        add less than 64 MiB: a pool holds the pages it hands out, not num_pages. Each is
        allocated from in its order and confirmed."""
        huge = 1 << 40
        server = self.start("--threads", "2", "--memory-max", "1GiB")
        client = Client(server.base_url)
        self.addCleanup(client.close)
        session = requests.Session()
        self.addCleanup(session.close)
        before = rss_bytes(server.proc.pid)
        for rank in range(24):
            first = 8 if rank % 2 else huge
            for n in (first, huge):
                self.assertEqual(client.initialize(rank, n).status_code, 200)
                r = session.post(f"{server.base_url}/{rank}/initialize", data=compact({"num_pages": n}))
                self.assertEqual(r.status_code, 204, r.content)
        ks = keys(2, "huge")
        for rank in range(24):
            r = client.batch_allocate(rank, ks)
            self.assertEqual(r.json()["results"], [[ks[0], 0], [ks[1], 1]])
            self.assertEqual(client.confirm_write(rank, [(ks[0], 0), (ks[1], 1)]).status_code, 204)
            r = session.post(f"{server.base_url}/{rank}/reserve_and_allocate_page_indices",
                             data=compact({"keys": ks}))
            self.assertEqual(r.json(), {"indices": [[False, huge - 1], [False, huge - 2]]})
            r = session.post(f"{server.base_url}/{rank}/confirm_write",
                             data=compact({"written_keys_to_confirm": [[ks[0], huge - 1], [ks[1], huge - 2]]}))
            self.assertEqual(r.status_code, 204, r.content)
        self.assertEqual(client.batch_exists(ks).json(), {"exists": [True, True]})
        added = rss_bytes(server.proc.pid) - before
        self.assertLess(added, 64 << 20, f"RSS grew by {added >> 20} MiB")
        info = client.rank_info(3).json()
        self.assertEqual((info["num_pages"], info["free"], info["bound"]), (huge, huge - 2, 2))
        m = self.scrape(server)
        self.assertEqual(m.get("hf3fs_metad_memory_refusals_total", what="rank"), 0)

    def test_clients_storing_the_longest_keys_stay_within_the_budget(self):
        """Keys of --key-bytes-max bytes (4096) stored as fast as clients can, in requests
        under 64 KiB (bodies that size are not charged themselves), on both APIs at once,
        under --memory-max 1GiB: the server's resident size never passes the budget. Past
        it, vLLM's new keys get -1 (hits keep their pages) and an SGLang pool only evicts
        (no fresh page), as full pools do; the refusals are counted."""
        budget = 1 << 30
        huge = 1 << 40
        server = self.start("--threads", "2", "--memory-max", "1GiB")
        client = Client(server.base_url)
        self.addCleanup(client.close)
        self.assertEqual(client.initialize(0, huge).status_code, 200)
        self.assertEqual(client.post_raw("/1/initialize", compact({"num_pages": huge})).status_code,
                         204)
        pad = "k" * (4096 - 8)
        per_request, pipelined = 15, 8  # 61 KB bodies, 8 requests in flight per connection
        failures = []

        def long_keys(first):
            return [f"{pad}{i:08d}" for i in range(first, first + per_request)]

        def round_trip(conn, requests_):  # pipelined: bodies of the answers, in order
            conn.send(b"".join(raw_request("POST", path, body) for path, body in requests_))
            answers = [conn.read_response() for _ in requests_]
            conn.buf = b""
            return answers

        def vllm_writer():  # rank 0: new keys until a round gets only -1s
            with RawConnection(server.port) as conn:
                for b in range(3000):
                    batches = [long_keys((b * pipelined + i) * per_request) for i in range(pipelined)]
                    answers = round_trip(conn, [
                        ("/keys/batch_allocate",
                         ('{"rank":0,"keys":[' + ",".join(f'["{k}",""]' for k in ks) + "]}").encode())
                        for ks in batches])
                    full = [body.count(b",-1]") == per_request for _, _, body in answers]
                    if any(status != 200 for status, _, _ in answers):
                        return failures.append(("vllm", answers[0][0], answers[0][2][:200]))
                    # No check that every request after a refused one is refused too:
                    # the SGLang writer's evictions free key bytes meanwhile, and once the
                    # sampled resident size shows it a new key fits the budget again (seen
                    # once under ASan in a fresh-clone run). Each request is all or nothing.
                    if not any(full) and any(b",-1]" in body for _, _, body in answers):
                        return failures.append(("vllm", "served in part"))
                    if full[0]:
                        break
                else:
                    return failures.append(("vllm", "never refused"))
            # Hits keep their pages past the budget.
            first = long_keys(0)[:3]
            r = client.batch_allocate(0, first)
            if [p for _, p in r.json()["results"]] != [0, 1, 2]:
                failures.append(("vllm", "hits lost their pages", r.content[:200]))

        def sglang_writer():  # pool 1: reserve and bind until a round only evicts
            lowest = huge
            with RawConnection(server.port) as conn:
                for b in range(3000):
                    batches = [long_keys(50_000_000 + (b * pipelined + i) * per_request)
                               for i in range(pipelined)]
                    answers = round_trip(conn, [
                        ("/1/reserve_and_allocate_page_indices",
                         ('{"keys":[' + ",".join(f'"{k}"' for k in ks) + "]}").encode())
                        for ks in batches])
                    if any(status != 200 for status, _, _ in answers):
                        return failures.append(("sglang", answers[0][0], answers[0][2][:200]))
                    confirms, fresh = [], []
                    for ks, (_, _, body) in zip(batches, answers):
                        pages = [p for _, p in json.loads(body)["indices"]]
                        if -1 in pages:
                            return failures.append(("sglang", "-1 with keys left to evict"))
                        fresh.append(min(pages) < lowest)
                        lowest = min(lowest, min(pages))
                        pairs = ",".join(f'["{k}",{p}]' for k, p in zip(ks, pages))
                        confirms.append(("/1/confirm_write",
                                         ('{"written_keys_to_confirm":[' + pairs + "]}").encode()))
                    if any(status != 204 for status, _, _ in round_trip(conn, confirms)):
                        return failures.append(("sglang", "a confirm failed"))
                    # No check that pages stay evicted-only once they were: the evictions
                    # free the evicted keys' bytes, and once the sampled resident size
                    # shows it a fresh page fits the budget again (seen once under ASan).
                    if not fresh[0]:
                        return  # evictions only: no page below those handed out
                failures.append(("sglang", "never refused"))

        writers = [threading.Thread(target=vllm_writer), threading.Thread(target=sglang_writer)]
        for w in writers:
            w.start()
        peak = 0
        while any(w.is_alive() for w in writers):
            peak = max(peak, rss_bytes(server.proc.pid))
            time.sleep(0.02)
        for w in writers:
            w.join()
        peak = max(peak, rss_bytes(server.proc.pid))
        self.assertEqual(failures, [])
        # The resident size is the server's own only without a sanitizer: ASan's shadow
        # memory (an eighth of what the heap touches) and its quarantine of freed blocks
        # count in it too (1,119 MiB once under ASan). The release stage checks the peak.
        if not sanitized(server.proc.pid):
            self.assertLessEqual(peak, budget, f"RSS {peak >> 20} MiB")
        m = self.scrape(server)
        self.assertGreaterEqual(m.get("hf3fs_metad_memory_refusals_total", what="allocation"), 2)

    def test_a_body_over_the_budget_is_refused_before_it_is_sent(self):
        server = self.start("--threads", "1", "--memory-max", "1GiB",
                            "--body-bytes-max", str(4 << 30))
        with RawConnection(server.port) as conn:
            # Only the head: the server answers without waiting for the 1.5 GiB.
            conn.send(raw_request("POST", "/keys/batch_exists", b"",
                                  headers={"Content-Length": str(3 << 29)}))
            status, headers, body = conn.read_response()
            self.assertEqual(status, 503, body)
            self.assertEqual(headers.get("connection"), "close")
            self.assertRegex(body, rb'^\{"detail":"Request body of 1610612736 bytes refused: '
                                   rb'.*--memory-max 1073741824.*"\}$')
            self.assertTrue(conn.closed_by_peer(timeout=5.0))
        # The same body within the budget is read and answered.
        body = compact({"keys": ["k" * 32] * 100_000})
        with RawConnection(server.port) as conn:
            conn.send(raw_request("POST", "/keys/batch_exists", body))
            self.assertEqual(conn.read_response()[0], 200)
        self.assertTrue(request_ok(server.port))
        m = self.scrape(server)
        self.assertEqual(m.get("hf3fs_metad_memory_refusals_total", what="body"), 1)

    def test_rank_count_and_key_length_limits(self):
        server = self.start("--threads", "2", "--ranks-max", "3", "--key-bytes-max", "40")
        client = Client(server.base_url)
        self.addCleanup(client.close)
        for rank in (0, 1, 2):
            self.assertEqual(client.initialize(rank, 8).status_code, 200)
        r = client.initialize(3, 8)
        self.assertEqual(r.status_code, 400, r.content)
        self.assertEqual(r.json(), {"detail": "Rank 3 not initialized: 3 ranks exist already, "
                                              "the limit set by --ranks-max"})
        self.assertEqual(client.rank_info(3).status_code, 404)
        self.assertEqual(client.initialize(2, 16).status_code, 200)  # growing is not creating
        longest, too_long = "k" * 40, "k" * 41
        detail = {"detail": "Key at index 1 is 41 bytes long; the limit is 40"}
        for name, call in (
                ("batch_allocate", lambda ks: client.batch_allocate(0, ks)),
                ("confirm_write", lambda ks: client.confirm_write(0, [(k, 7) for k in ks])),
                ("batch_exists", client.batch_exists),
                ("get_locations", lambda ks: client.get_locations(0, ks)),
                ("keys/delete", lambda ks: client.post("/keys/delete", {"keys": ks}))):
            with self.subTest(endpoint=name):
                r = call([longest, too_long])
                self.assertEqual((r.status_code, r.json()), (400, detail))
        self.assertEqual(client.rank_info(0).json()["free"], 8)  # nothing changed
        r = client.batch_allocate(0, [longest])
        self.assertEqual(r.json(), {"rank": 0, "results": [[longest, 0]]})
        # After /clear the ranks can be created anew.
        self.assertEqual(client.clear().status_code, 204)
        for rank in (3, 4, 5):
            self.assertEqual(client.initialize(rank, 8).status_code, 200)


    def test_bad_limit_values_exit_2(self):
        binary = os.environ.get("METAD_BIN")
        if not binary:
            self.skipTest("METAD_BIN is not set")
        for flag, value in (("--memory-max", "1GB"), ("--memory-max", "0"),
                            ("--memory-max", "GiB"), ("--memory-max", "2048TiB"),
                            ("--ranks-max", "0"), ("--key-bytes-max", "-1")):
            with self.subTest(flag=flag, value=value):
                run = subprocess.run([binary, "--port", "0", flag, value],
                                     stdin=subprocess.DEVNULL, capture_output=True,
                                     timeout=STOP_TIMEOUT_S)
                self.assertEqual(run.returncode, 2, run.stderr)
                self.assertIn(flag.encode(), run.stderr)


class DescriptorLimitTest(OpsTestCase):
    """Out of file descriptors (EMFILE), the server pauses accepting instead of retrying
    at once: it neither burns a core nor floods its log, and the connections waiting in
    the listen backlog are served once descriptors free up."""

    NOFILE = 64

    def test_out_of_descriptors_pauses_accepting_then_recovers(self):
        nofile = self.NOFILE
        server = OpsServer(("--threads", "1"), preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_NOFILE, (nofile, nofile)))
        self.addCleanup(self._stop, server)
        if sanitized(server.proc.pid):
            # Their runtimes need descriptors too (UBSan's vptr check probes memory
            # through a pipe, and reports an error when it cannot open one).
            self.skipTest("a sanitizer runtime at the descriptor limit reports false errors")
        conns = []
        self.addCleanup(lambda: [c.close() for c in conns])
        for _ in range(nofile + 40):  # more than the server can hold: the rest wait
            conn = RawConnection(server.port)
            conn.send(raw_request("GET", "/health"))
            conns.append(conn)
        time.sleep(0.5)
        readable = set(select.select([c.sock for c in conns], [], [], 0)[0])
        answered = [c for c in conns if c.sock in readable]
        self.assertGreater(len(answered), 10)
        self.assertLess(len(answered), len(conns))
        before = cpu_seconds(server.proc.pid)
        time.sleep(1.5)
        used = cpu_seconds(server.proc.pid) - before
        self.assertLess(used, 0.5, f"the server spent {used:.2f} s of CPU in 1.5 s while out of "
                                   "descriptors")
        self.assertLessEqual(server.log().count("accept failed"), 4, server.log()[-2000:])
        for c in answered:
            self.assertEqual(c.read_response()[0], 200)
            c.close()
            conns.remove(c)
        # The waiting connections are accepted and answered now that descriptors are free.
        for c in conns:
            self.assertEqual(c.read_response()[0], 200)


class ConnectionLimitTest(OpsTestCase):

    def test_limit_per_core(self):
        limit = 5
        server = self.start("--threads", "1", "--connections-max", str(limit))
        conns = []
        self.addCleanup(lambda: [c.close() for c in conns])
        for _ in range(limit):
            conn = RawConnection(server.port)
            conns.append(conn)
            conn.send(raw_request("GET", "/health"))
            self.assertEqual(conn.read_response()[::2], (200, b'{"status":"ok"}'))
        # One more: accepted by the kernel, closed by the server without an answer.
        with RawConnection(server.port) as extra:
            try:
                extra.send(raw_request("GET", "/health"))
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.assert_closed_without_answer(extra, timeout=2.0)
        # The others still work.
        for conn in conns:
            conn.send(raw_request("GET", "/health"))
            self.assertEqual(conn.read_response()[0], 200)
        # Closing one makes room (the server notices the close asynchronously: retry).
        conns.pop().close()
        deadline = time.monotonic() + 3.0
        while True:
            conn = RawConnection(server.port)
            try:
                conn.send(raw_request("GET", "/metrics"))
                status, _, body = conn.read_response()
                conns.append(conn)
                break
            except (ConnectionError, OSError):
                conn.close()
                if time.monotonic() > deadline:
                    self.fail("no new connection accepted after closing one")
                time.sleep(0.05)
        self.assertEqual(status, 200)
        metrics = Metrics(body.decode())
        self.assertEqual(metrics.get("hf3fs_metad_connections_open", core="0"), limit)
        self.assertGreaterEqual(metrics.get("hf3fs_metad_connections_rejected_total", core="0"), 1)
        self.assertGreaterEqual(metrics.get("hf3fs_metad_connections_accepted_total", core="0"),
                                limit + 1)


# --- logs --------------------------------------------------------------------------------

_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (error|warn|info|debug) core=-?\d+ \S")


class LoggingTest(OpsTestCase):

    REQUESTS = (  # (method, path, body, endpoint label, status)
        ("POST", "/rank/5/initialize", {"num_pages": 10}, "initialize", 200),
        ("POST", "/keys/batch_exists", {"keys": 1}, "batch_exists", 400),
        ("GET", "/no/such/path", None, "not_found", 404),
        ("GET", "/health", None, "health", 200),
    )

    def make_requests(self, server):
        call = RequestsCaller(server.base_url)
        try:
            for method, path, obj, _, status in self.REQUESTS:
                self.assertEqual(call(method, path, obj)[0], status)
        finally:
            call.close()

    def assert_log_lines_well_formed(self, server):
        for line in list(server.stderr_lines):
            self.assertRegex(line, _LOG_LINE)

    def test_access_log_and_summary(self):
        server = self.start("--access-log", "--summary-interval-ms", "200")
        self.make_requests(server)
        for method, path, _, endpoint, status in self.REQUESTS:
            with self.subTest(access=path):
                self.assertTrue(server.wait_log(rf" access {endpoint} {status} .*{re.escape(path)}"),
                                server.log())
        self.assertTrue(server.wait_log(r" summary: .*req/s.*10 of 10 pages free", timeout=5.0),
                        server.log())
        self.assert_log_lines_well_formed(server)

    def test_summary_is_quiet_while_idle(self):
        server = self.start("--summary-interval-ms", "100")
        self.make_requests(server)
        self.assertTrue(server.wait_log(r" summary: .*10 of 10 pages free", timeout=5.0),
                        server.log())
        # Past the interval that saw the last request (the tick is 250 ms), nothing
        # happens: no more lines.
        time.sleep(0.8)
        before = [line for line in list(server.stderr_lines) if " summary:" in line]
        time.sleep(1.0)
        after = [line for line in list(server.stderr_lines) if " summary:" in line]
        self.assertEqual(after, before, server.log())
        # A request makes the next interval's line appear again.
        self.make_requests(server)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if len([line for line in list(server.stderr_lines) if " summary:" in line]) > len(after):
                break
            time.sleep(0.05)
        else:
            self.fail("no summary line after new requests\n" + server.log())

    def test_quiet_by_default(self):
        server = self.start("--summary-interval-ms", "0")
        self.make_requests(server)
        time.sleep(0.5)
        lines = list(server.stderr_lines)
        self.assertEqual([line for line in lines if " access " in line or " summary:" in line], [])
        self.assert_log_lines_well_formed(server)


# --- 7. graceful stop ------------------------------------------------------------------------

class GracefulStopTest(OpsTestCase):

    def test_in_flight_requests_finish_on_sigterm(self):
        server = self.start()
        client = Client(server.base_url)
        self.addCleanup(client.close)
        ks = keys(2, "stop")
        self.assertEqual(client.initialize(0, 8).status_code, 200)
        self.assertEqual(client.batch_allocate(0, ks).status_code, 200)
        self.assertEqual(client.confirm_write(0, [(ks[0], 0), (ks[1], 1)]).status_code, 204)
        client.close()

        body = compact({"keys": ks})
        exists = raw_request("POST", "/keys/batch_exists", body)
        ready = raw_request("GET", "/ready")
        idle, slow_exists, slow_ready = (RawConnection(server.port) for _ in range(3))
        for conn in (idle, slow_exists, slow_ready):
            self.addCleanup(conn.close)
            conn.send(raw_request("GET", "/health"))  # established and accepted
            self.assertEqual(conn.read_response()[0], 200)
        # Two requests in flight: all but their last bytes have arrived.
        slow_exists.send(exists[:-3])
        slow_ready.send(ready[:-2])
        time.sleep(0.2)
        server.proc.send_signal(signal.SIGTERM)
        self.assertTrue(server.wait_log(r"draining"), server.log())
        slow_exists.send(exists[-3:])
        slow_ready.send(ready[-2:])
        self.assertEqual(slow_exists.read_response()[::2], (200, b'{"exists":[true,true]}'))
        status, headers, text = slow_ready.read_response()
        self.assertEqual(status, 503, text)
        self.assertEqual(headers.get("content-type"), "application/json")
        self.assertRegex(text, rb'^\{"detail":".+"\}$')
        for name, conn in (("idle", idle), ("exists", slow_exists), ("ready", slow_ready)):
            with self.subTest(closed=name):
                self.assertTrue(conn.closed_by_peer(timeout=5.0))
        self.assertEqual(server.proc.wait(timeout=STOP_TIMEOUT_S), 0, server.log())
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=1).close()

    def test_sigterm_under_multi_rank_write_load_answers_every_request(self):
        data = self.tmpdir()
        args = ("--threads", "2", "--data-dir", data, "--durability", "sync",
                "--incomplete-grace-ms", "0")
        server = self.start(*args)
        ranks = range(12)  # one writer per rank, so each rank's counts are the writer's
        setup = Client(server.base_url)
        for rank in ranks:
            self.assertEqual(setup.initialize(rank, 1 << 20).status_code, 200)
        setup.close()

        writers = [StopLoadWriter(server.port, rank, depth=1 + rank % 4) for rank in ranks]
        for w in writers:
            w.start()
        for w in writers:  # every writer is in full swing
            self.assertTrue(w.warmed_up.wait(timeout=SOCKET_TIMEOUT_S), w.failure)
        signalled_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        for w in writers:
            w.join(timeout=SOCKET_TIMEOUT_S)
            self.assertFalse(w.is_alive(), f"writer of rank {w.rank} still running")
        self.assertEqual(server.proc.wait(timeout=STOP_TIMEOUT_S), 0, server.log()[-3000:])

        for w in writers:
            self.assertIsNone(w.failure, f"rank {w.rank}")
        before = [r for w in writers for r in w.sent if r.sent_at < signalled_at]
        after = [r for w in writers for r in w.sent if r.sent_at >= signalled_at]
        lost = [r for r in before if r.status is None]
        self.assertEqual(len(lost), 0, f"{len(lost)} of {len(before)} requests sent before "
                         f"SIGTERM got no answer ({len(after)} sent after it, "
                         f"{sum(r.status is None for r in after)} of those unanswered):"
                         + lost_requests_in_context(writers, lost, signalled_at))
        for r in before + after:
            if r.status is not None:
                self.assertEqual(r.status, 204 if r.kind == "confirm" else 200, r.kind)

        # What went unanswered was not applied: after a restart on the same data, each
        # rank holds exactly the keys whose requests were answered.
        again = self.start(*args)
        check = Client(again.base_url)
        self.addCleanup(check.close)
        for w in writers:
            allocated = sum(len(r.keys) for r in w.sent if r.kind == "allocate" and r.status)
            confirmed = sum(len(r.keys) for r in w.sent if r.kind == "confirm" and r.status)
            info = check.rank_info(w.rank).json()
            with self.subTest(rank=w.rank):
                self.assertEqual(info["bound"], confirmed, info)
                self.assertEqual(info["bound"] + info["reserved"], allocated, info)


def lost_requests_in_context(writers, lost, signalled_at):
    """For a failure message: each lost request after the writer's requests just before
    it, as kind, status ('C': the answer said close) @ ms sent after (-: before) SIGTERM."""
    lines = []
    for r in lost[:10]:
        sent = next(w for w in writers if w.rank == r.rank).sent
        i = sent.index(r)
        lines.append(f"\nrank {r.rank}: " + ", ".join(
            f"{o.kind} {o.status}{' C' if o.closing else ''} "
            f"@{(o.sent_at - signalled_at) * 1e3:.2f}" for o in sent[max(0, i - 3):i + 1]))
    return "".join(lines)


class StopLoadWriter(threading.Thread):
    """A vLLM-like writer for the stop-under-load test: on its own keep-alive connection,
    batch_allocate then confirm_write of fresh keys on one rank, `depth` requests
    pipelined at a time, until the server closes the connection or says
    `connection: close`. Records every request it sent in full (when sendall returned)
    and every answer."""

    class Sent:
        def __init__(self, kind, rank, keys, sent_at):
            self.kind, self.rank, self.keys, self.sent_at = kind, rank, keys, sent_at
            self.status = None
            self.body = None
            self.closing = False

    def __init__(self, port, rank, depth):
        super().__init__(daemon=True)
        self.port, self.rank, self.depth = port, rank, depth
        self.sent = []
        self.failure = None
        self.warmed_up = threading.Event()

    def run(self):
        try:
            with RawConnection(self.port) as conn:
                # As urllib3 (vLLM's client) does. Without it, Nagle keeps a pipelined
                # request in this side's kernel until the previous one is acknowledged:
                # sendall() returned, yet the server may not have it when the stop comes.
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._write(conn)
        except Exception as e:  # reported by the test, not lost in the thread
            self.failure = repr(e)
            self.warmed_up.set()

    def _exchange(self, conn, requests_):
        """Sends the requests back to back, then reads their answers in order. False once
        the connection is over (closed by the server, or an answer said close)."""
        pending = []
        for kind, keys_, body, path in requests_:
            try:
                conn.send(raw_request("POST", path, compact(body)))
            except (BrokenPipeError, ConnectionResetError):
                break
            pending.append(self.Sent(kind, self.rank, keys_, time.monotonic()))
            self.sent.append(pending[-1])
        for r in pending:
            try:
                status, headers, body = conn.read_response()
            except ConnectionError:
                return False
            r.status, r.body = status, body
            r.closing = headers.get("connection", "").lower() == "close"
            if r.closing:
                return False
        return len(pending) == len(requests_)

    def _write(self, conn):
        serial = 0
        while True:
            batch = [key(serial + i, f"stop-load/{self.rank}") for i in range(self.depth)]
            serial += self.depth
            allocs = [("allocate", [k], {"rank": self.rank, "keys": [[k, ""]]},
                       "/keys/batch_allocate") for k in batch]
            if not self._exchange(conn, allocs):
                return
            confirms = []
            for r in self.sent[-self.depth:]:
                (k, page), = json.loads(r.body)["results"]
                if page < 0:
                    raise AssertionError(f"rank {self.rank}: no page for {k}")
                confirms.append(("confirm", [k], {"rank": self.rank, "confirmations": [[k, page]],
                                                  "pages_to_release": []},
                                 "/keys/confirm_write"))
            if not self._exchange(conn, confirms):
                return
            if serial >= 40 * self.depth:
                self.warmed_up.set()


if __name__ == "__main__":
    unittest.main()
