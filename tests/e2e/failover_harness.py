"""Pieces shared by the failover test (tests/e2e/test_failover.py) and the long failover
run (scripts/ha-failover.sh, which runs scripts/ha_failover.py).

- Node: one HA node of a replicated cluster with a FIXED command line (HTTP port, repl
  port, data dir chosen once), so a restart after kill -9 is "the same command line",
  as a supervisor would do it. Its stderr goes to a file (appended across restarts) and
  to memory; a start does not assume the node lives: a node that can no longer follow
  exits with status 75 (EXIT_DIVERGED) and is restarted by whoever supervises it.
- Cluster: reads the leader and /sync keys of one cluster from etcd.
- Ledger: every ACKNOWLEDGED answer of the vLLM calls (batch_allocate 200 -> reserved,
  confirm_write 204 -> bound or released), and check_ledger(), which compares it with
  what a (new) leader answers: every bound key present with the same page, no page bound
  to two keys, acknowledged reservations not handed out again.
- FailoverCase: the base of the replicated-pair suites (a leads, b its sync standby;
  pair(), write_then_kill(), assert_ledger()); it has no tests of its own.
- Blackhole, Prober, serving_switches: partitions without a network namespace, and the
  check that two nodes never answer at once (tests/e2e/test_partition.py).
- Writer: one vLLM worker in a thread: sequential save tasks on one rank (batch_allocate
  of fresh keys, then confirm_write of all pages, or on every Nth task the write-failure
  path: confirm_write releasing all pages), optionally at a fixed rate and with vLLM's
  retry schedule (attempts at 0, 0.01, 0.61, 1.81 s on a connection error or a 5xx).

Standard library plus `requests`; the command line comes from metad_harness.server_args
(METAD_BIN, METAD_IO, METAD_THREADS).
"""

import base64
import collections
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import unittest
import urllib.parse

import requests

from metad_harness import (Client, compact, free_port, key, keys, rss_bytes, server_args,
                           wait_until, watch_sanitizer)
from test_ha import HaCase

# The exit status of a node that can no longer follow the leader (its state diverged);
# a supervisor restarts it with the same command line and it resyncs as an empty standby.
EXIT_DIVERGED = 75

_LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")

# vLLM's Hf3fsGlobalMetadataClient: 3 retries of a POST on a lost connection or a
# 500/502/503/504, after 0, 0.6 and 1.2 s (urllib3 backoff); 0.01 stands for "at once".
VLLM_RETRY_SLEEPS = (0.01, 0.6, 1.2)
RETRY_STATUSES = (500, 502, 503, 504)


# Headers of the probes (ready(), Node.metrics()): a test whose nodes gate /ready and
# /metrics behind a token (--tenants-file with --auth-token-file) puts it here, and
# empties it when it ends.
PROBE_HEADERS = {}


def ready(base_url, timeout=1.0):
    """GET /ready answers 200 (the node leads and serves)."""
    try:
        return requests.get(base_url + "/ready", timeout=timeout,
                            headers=PROBE_HEADERS).status_code == 200
    except requests.RequestException:
        return False


class Node:
    """One hf3fs-metad HA node whose command line never changes between restarts."""

    def __init__(self, node_id, etcd_url, cluster, root, port, repl_port, extra=()):
        self.id = node_id
        self.port = port
        self.repl_port = repl_port
        self.data = os.path.join(root, node_id)
        os.makedirs(self.data, exist_ok=True)
        self.log_path = os.path.join(root, f"{node_id}.log")
        self.base_url = f"http://127.0.0.1:{port}"
        self.repl = f"127.0.0.1:{repl_port}"
        self.args = server_args(["--ha-etcd", etcd_url, "--ha-cluster", cluster,
                                 "--ha-node", node_id, "--data-dir", self.data,
                                 "--port", str(port), "--repl-listen", self.repl, *extra])
        self.proc = None
        self.lines = collections.deque(maxlen=5000)  # this start's stderr
        self.exits = []  # exit status of every earlier start, in order
        self.starts = 0
        self.killed = False  # the last exit was our kill(): no supervisor restarts it
        self._listening = threading.Event()
        self._drain = None

    def start(self):
        """Starts the process; does not wait (see wait_listening)."""
        assert self.proc is None or self.proc.poll() is not None, "still running"
        self._reap()
        self.starts += 1
        self.killed = False
        self.lines = collections.deque(maxlen=5000)
        self._listening = threading.Event()
        log = open(self.log_path, "ab")
        log.write(f"==== start {self.starts} at {time.time():.3f}: {' '.join(self.args)}\n"
                  .encode())
        log.flush()
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._drain = threading.Thread(target=self._drain_stderr,
                                       args=(self.proc, log, self.lines, self._listening),
                                       daemon=True)
        self._drain.start()
        return self

    @staticmethod
    def _drain_stderr(proc, log, lines, listening):
        with log:
            for raw in proc.stderr:
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace").rstrip("\n")
                lines.append(line)
                watch_sanitizer(line, "an HA node")
                if _LISTENING.search(line):
                    listening.set()
        proc.stderr.close()

    def wait_listening(self, timeout=10.0):
        """True once this start printed its "listening on" line; False if it exited first
        (see exit_code) or did not within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._listening.wait(0.02):
                return True
            if self.proc.poll() is not None:
                return self._listening.is_set()
        return False

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self):
        return None if self.proc is None else self.proc.poll()

    def _reap(self):
        if self.proc is not None and self.proc.poll() is not None and self._drain is not None:
            self._drain.join(timeout=5)
            self.exits.append(self.proc.returncode)
            self._drain = None

    def kill(self):
        """kill -9 (a crash: no drain, no lease revoke); returns the exit status."""
        self.killed = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        code = self.proc.wait()
        self._reap()
        return code

    def stop(self, timeout=10.0):
        """SIGTERM; the exit status, or None if it had to be killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        self._reap()
        return code

    def log(self, last=None):
        lines = list(self.lines)
        return "\n".join(lines if last is None else lines[-last:])

    def metrics(self):
        try:
            return requests.get(self.base_url + "/metrics", timeout=2,
                                headers=PROBE_HEADERS).text
        except requests.RequestException:
            return ""


class Blackhole:
    """A TCP forwarder 127.0.0.1:<port> -> target that a test can cut, standing in for an
    nft drop rule (docs/replication.md, "Test plan") without a network namespace. While cut it keeps
    every connection open and drops the bytes both ways, and accepts new connections and
    drops theirs too: the peers see timeouts, not resets, as behind a dropping firewall.
    heal() closes the connections that were cut (their TCP timeouts would have ended them;
    their dropped bytes cannot be resent) and forwards new ones again."""

    def __init__(self, target_host, target_port):
        self.target = (target_host, target_port)
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        self.lock = threading.Lock()
        self.is_cut = False
        self.links = []  # [client socket, target socket or None, cut]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            link = [client, None, False]
            with self.lock:
                if self.closed:
                    client.close()
                    return
                link[2] = self.is_cut
                self.links.append(link)
            if not link[2]:
                try:
                    link[1] = socket.create_connection(self.target, timeout=2)
                    link[1].settimeout(None)
                except OSError:
                    self._close(link)
                    continue
            threading.Thread(target=self._pump, args=(link, 0, 1), daemon=True).start()
            if link[1] is not None:
                threading.Thread(target=self._pump, args=(link, 1, 0), daemon=True).start()

    def _pump(self, link, src, dst):
        while True:
            try:
                data = link[src].recv(65536)
            except OSError:
                data = b""
            if not data:
                return self._close(link)
            if link[2] or link[dst] is None:
                continue  # cut: dropped
            try:
                link[dst].sendall(data)
            except OSError:
                return self._close(link)

    def _close(self, link):
        for s in link[:2]:
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
        with self.lock:
            if link in self.links:
                self.links.remove(link)

    def cut(self):
        with self.lock:
            self.is_cut = True
            for link in self.links:
                link[2] = True

    def heal(self):
        with self.lock:
            self.is_cut = False
            cut = [link for link in self.links if link[2]]
        for link in cut:
            self._close(link)

    def close(self):
        with self.lock:
            self.closed = True
            links = list(self.links)
        self.server.close()
        for link in links:
            self._close(link)


class Delayer:
    """A TCP forwarder 127.0.0.1:<port> -> target that holds every byte the client sends
    for `delay` seconds before forwarding it (the other way goes at once): a standby
    whose acks arrive late, as on a slow disk or link, with nothing lost."""

    def __init__(self, target_host, target_port, delay):
        self.target = (target_host, target_port)
        self.delay = delay
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.socks = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
                target = socket.create_connection(self.target, timeout=2)
                target.settimeout(None)
            except OSError:
                if self.closed:
                    return
                continue
            self.socks += [client, target]
            held = collections.deque()
            ready = threading.Condition()
            threading.Thread(target=self._read_up, args=(client, target, held, ready),
                             daemon=True).start()
            threading.Thread(target=self._send_up, args=(client, target, held, ready),
                             daemon=True).start()
            threading.Thread(target=self._down, args=(target, client), daemon=True).start()

    @staticmethod
    def _end(*socks):
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _read_up(self, client, target, held, ready):
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                data = b""
            with ready:
                held.append((time.monotonic() + self.delay, data))
                ready.notify()
            if not data:
                return

    def _send_up(self, client, target, held, ready):
        while True:
            with ready:
                while not held:
                    ready.wait()
                due, data = held.popleft()
            time.sleep(max(0.0, due - time.monotonic()))
            if not data:
                return self._end(client, target)
            try:
                target.sendall(data)
            except OSError:
                return self._end(client, target)

    def _down(self, target, client):
        while True:
            try:
                data = target.recv(65536)
                if data:
                    client.sendall(data)
                    continue
            except OSError:
                pass
            return self._end(client, target)

    def close(self):
        self.closed = True
        self.server.close()
        self._end(*self.socks)


# --- the replication protocol, enough for a hostile peer (src/repl/protocol.hpp) ---------

def _crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def repl_message(body):
    return struct.pack("<II", len(body), crc32c(body)) + body


def repl_hello(cluster, node, cores, core, epoch=0, generation=0, lsn=0, version=1):
    """A standby's hello for one core (type 1)."""
    c, n = cluster.encode(), node.encode()
    body = (bytes([1]) + struct.pack("<H", version) + bytes([len(c)]) + c + bytes([len(n)]) + n
            + struct.pack("<QQIIQ", epoch, generation, cores, core, lsn))
    return repl_message(body)


ANSWER_STATUS = {1: "stream", 2: "need_snapshot", 3: "wrong_epoch", 4: "refused", 5: "busy"}


def repl_answers(data):
    """The answers (status name, epoch, core) at the start of what a leader sent."""
    out = []
    while len(data) >= 8:
        length, _ = struct.unpack_from("<II", data)
        body = data[8:8 + length]
        if len(body) < length:
            break
        if body[0] == 2:
            status, epoch, _, core, _ = struct.unpack_from("<BQQIQ", body, 1)
            out.append((ANSWER_STATUS.get(status, status), epoch, core))
        data = data[8 + length:]
    return out


def read_until_closed(sock, timeout=3.0):
    """(bytes read, True if the peer ended the connection within `timeout`)."""
    sock.settimeout(0.05)
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return got, True
        if not data:
            return got, True
        got += data
    return got, False


class Cluster:
    """The etcd keys of one cluster (v3 JSON gateway)."""

    def __init__(self, etcd_url, name, post=None):
        """post(path, body): how to reach etcd (Etcd.post: TLS and a token); default a
        plain POST to etcd_url."""
        self.url = etcd_url
        self.name = name
        self._post = post or (lambda path, body: requests.post(self.url + path, json=body,
                                                               timeout=2))
        self.leader_key = f"/hf3fs-metad/{name}/leader"
        self.sync_key = f"/hf3fs-metad/{name}/sync"

    def _range(self, k):
        answer = self._post("/v3/kv/range",
                            {"key": base64.b64encode(k.encode()).decode()}).json()
        kvs = answer.get("kvs", [])
        return kvs[0] if kvs else None

    def leader(self):
        """(value dict, create_revision) of the leader key, or (None, None)."""
        kv = self._range(self.leader_key)
        if kv is None:
            return None, None
        return json.loads(base64.b64decode(kv["value"])), int(kv["create_revision"])

    def sync(self):
        """The /sync value as a dict, or None."""
        kv = self._range(self.sync_key)
        return None if kv is None else json.loads(base64.b64decode(kv["value"]))

    def in_sync(self, node_id, leader_id):
        """True when /sync names leader_id as leader and lists node_id as in sync."""
        try:
            s = self.sync()
        except (requests.RequestException, ValueError):
            return False
        return bool(s) and s.get("leader") == leader_id and node_id in s.get("sync", [])


class Ledger:
    """Acknowledged results only, per rank: what the cluster promised a client.

    reserved: key -> page from a batch_allocate 200 not yet settled by a confirm_write
    204; bound: key -> page after a confirm_write 204 that confirmed it; released: keys
    whose pages a confirm_write 204 released (vLLM's write-failure path)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reserved = collections.defaultdict(dict)
        self.bound = collections.defaultdict(dict)
        self.released = collections.defaultdict(set)
        self.problems = []  # contradictions seen by writers (e.g. a 400 on confirm)

    def on_allocate(self, rank, results):
        with self.lock:
            for k, page in results:
                if page >= 0 and k not in self.bound[rank]:
                    self.reserved[rank][k] = page

    def on_confirm(self, rank, confirmations, released_keys=()):
        with self.lock:
            for k, page in confirmations:
                self.bound[rank][k] = page
                self.reserved[rank].pop(k, None)
            for k in released_keys:
                self.reserved[rank].pop(k, None)
                self.released[rank].add(k)

    def on_unknown_release(self, rank, released_keys):
        """A releasing confirm_write got no answer: it may or may not have been applied,
        so its reservations are no longer known to be held."""
        with self.lock:
            for k in released_keys:
                self.reserved[rank].pop(k, None)

    def problem(self, text):
        with self.lock:
            self.problems.append(text)

    def snapshot(self):
        """({rank: {key: page}} bound, {rank: {key: page}} reserved), copies."""
        with self.lock:
            return ({r: dict(m) for r, m in self.bound.items()},
                    {r: dict(m) for r, m in self.reserved.items()})

    def bound_count(self):
        with self.lock:
            return sum(len(m) for m in self.bound.values())


def fill(node, ranks, pages, count):
    """Saves `count` keys on each of `ranks` ranks of `pages` pages with the C++ loader
    (METAD_FILL: bench/load/memory_main.cpp, after POST /clear): a large state in seconds,
    where Python's JSON would take minutes. Skips the test without METAD_FILL. Returns
    the seconds it took; fill_key(i) is its i-th key."""
    loader = os.environ.get("METAD_FILL")
    if not loader:
        raise unittest.SkipTest("METAD_FILL (the metad-memory loader) is not set")
    began = time.monotonic()
    run = subprocess.run([loader, "--pid", str(node.proc.pid), "--port", str(node.port),
                          "--ranks", str(ranks), "--pages", str(pages), "--keys", str(count),
                          "--batch", "8192"], capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise AssertionError(f"the fill failed ({run.returncode}): {run.stdout}{run.stderr}")
    return time.monotonic() - began


def fill_key(i):
    """The fill's key i: bench/common/keys.hpp's make_key (two splitmix64 halves, hex)."""
    mask = (1 << 64) - 1

    def splitmix64(x):
        x = (x + 0x9E3779B97F4A7C15) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    return f"{splitmix64(i):016x}{splitmix64(i ^ 0x5851F42D4C957F2D):016x}"


def _post(session, url, obj, timeout=5.0):
    return session.post(url, data=compact(obj), headers={"Content-Type": "application/json"},
                        timeout=timeout)


def check_ledger(base_url, bound, chunk=1000):
    """Compares acknowledged bindings with what the node at base_url answers.

    Returns a dict: checked (keys), lost (acked bound keys missing there), moved (present
    with another page), duplicate_pages (pages the answers bind to two keys of a rank),
    ledger_duplicates (pages the ACKS themselves gave to two keys), errors (non-200
    answers), details (a few examples)."""
    out = {"checked": 0, "lost": 0, "moved": 0, "duplicate_pages": 0,
           "ledger_duplicates": 0, "errors": 0, "details": []}
    session = requests.Session()
    try:
        for rank, pairs in sorted(bound.items()):
            acked_pages = collections.Counter(pairs.values())
            out["ledger_duplicates"] += sum(1 for n in acked_pages.values() if n > 1)
            items = sorted(pairs.items())
            seen = {}
            for i in range(0, len(items), chunk):
                part = items[i:i + chunk]
                ks = [k for k, _ in part]
                loc = _post(session, base_url + "/keys/get_locations", {"rank": rank, "keys": ks})
                ex = _post(session, base_url + "/keys/batch_exists", {"keys": ks})
                if loc.status_code != 200 or ex.status_code != 200:
                    out["errors"] += 1
                    out["details"].append(f"rank {rank}: get_locations {loc.status_code} "
                                          f"{loc.text[:200]}, batch_exists {ex.status_code}")
                    continue
                locations, exists = loc.json()["locations"], ex.json()["exists"]
                for (k, page), got, there in zip(part, locations, exists):
                    out["checked"] += 1
                    if got is None or not there:
                        out["lost"] += 1
                        if len(out["details"]) < 10:
                            out["details"].append(f"rank {rank} key {k} page {page}: "
                                                  f"location {got}, exists {there}")
                    elif got != page:
                        out["moved"] += 1
                        if len(out["details"]) < 10:
                            out["details"].append(f"rank {rank} key {k}: acked page {page}, "
                                                  f"now {got}")
                    if got is not None:
                        if got in seen and seen[got] != k:
                            out["duplicate_pages"] += 1
                            if len(out["details"]) < 10:
                                out["details"].append(f"rank {rank} page {got} bound to "
                                                      f"{seen[got]} and {k}")
                        seen[got] = k
    finally:
        session.close()
    return out


class Writer(threading.Thread):
    """One vLLM worker's save loop on one rank, recording acknowledged answers.

    url: where it sends (a node or the forwarder). rate: save tasks per second (None:
    back to back). retry: False -> stop at the first failed call (used to kill a leader
    under a live writer); True -> vLLM's retry schedule, and a call that still fails
    counts as a client-visible failure (the task is then abandoned, as vLLM's worker does
    on RuntimeError). Every `release_every`-th task takes the write-failure path."""

    def __init__(self, url, rank, ledger, tag, keys_per_task=8, rate=None, retry=False,
                 release_every=5, timeout=5.0):
        super().__init__(daemon=True, name=f"writer-{tag}")
        self.url = url
        self.rank = rank
        self.ledger = ledger
        self.tag = tag
        self.keys_per_task = keys_per_task
        self.rate = rate
        self.retry = retry
        self.release_every = release_every
        self.timeout = timeout
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.tasks = 0
        self.calls = 0
        self.failures = []  # (monotonic time of giving up, endpoint, last error)
        self.retried_calls = 0
        # (monotonic end, seconds, path, attempts) of logical calls over 0.1 s; attempts:
        # (start offset s, seconds, outcome) of each try.
        self.slow_calls = []
        self.stopped_by = None  # the error that ended a non-retrying writer
        self.session = requests.Session()

    def stop(self):
        self.stop_event.set()

    def _call(self, path, body):
        """One logical call with vLLM's retries: (response or None, last error text)."""
        began = time.monotonic()
        attempts = []
        try:
            return self._attempts(path, body, began, attempts)
        finally:
            took = time.monotonic() - began
            if took > 0.1:
                with self.lock:
                    self.slow_calls.append((time.monotonic(), took, path, attempts))

    def _attempts(self, path, body, began, attempts):
        sleeps = VLLM_RETRY_SLEEPS if self.retry else ()
        error = None
        for attempt in range(len(sleeps) + 1):
            if attempt:
                with self.lock:
                    if attempt == 1:
                        self.retried_calls += 1
                time.sleep(sleeps[attempt - 1])
            at = time.monotonic()
            try:
                r = _post(self.session, self.url + path, body, self.timeout)
            except requests.RequestException as e:
                error = f"{type(e).__name__}: {e}"[:300]
                attempts.append((at - began, time.monotonic() - at, type(e).__name__))
                continue
            attempts.append((at - began, time.monotonic() - at, r.status_code))
            if r.status_code in RETRY_STATUSES:
                error = f"{r.status_code} {r.text[:200]}"
                continue
            return r, None
        return None, error

    def _fail(self, path, error):
        with self.lock:
            self.failures.append((time.monotonic(), path, error))
        if not self.retry:
            self.stopped_by = f"{path}: {error}"
            self.stop_event.set()

    def run(self):
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            if self.rate:
                delay = next_at - time.monotonic()
                if delay > 0 and self.stop_event.wait(delay):
                    break
                next_at = max(next_at + 1.0 / self.rate, time.monotonic())  # no bursts
            self._task()
        self.session.close()

    def _task(self):
        n = self.tasks
        self.tasks += 1
        ks = [key(i, f"{self.tag}/{n}") for i in range(self.keys_per_task)]
        with self.lock:
            self.calls += 1
        r, error = self._call("/keys/batch_allocate",
                              {"rank": self.rank, "keys": [[k, ""] for k in ks]})
        if r is None:
            return self._fail("batch_allocate", error)
        if r.status_code != 200:
            self.ledger.problem(f"batch_allocate {r.status_code}: {r.text[:200]}")
            return self._fail("batch_allocate", f"{r.status_code} {r.text[:200]}")
        results = [(k, p) for k, p in r.json()["results"]]
        self.ledger.on_allocate(self.rank, results)
        pages = [(k, p) for k, p in results if p >= 0]
        if len(pages) != len(results):
            self.ledger.problem(f"batch_allocate gave -1 (pool full?): {results[:3]}")
        if not pages:
            return None
        failing = self.release_every and n % self.release_every == self.release_every - 1
        body = {"rank": self.rank, "confirmations": [] if failing else pages,
                "pages_to_release": [p for _, p in pages] if failing else []}
        with self.lock:
            self.calls += 1
        r, error = self._call("/keys/confirm_write", body)
        if r is None:
            if failing:
                self.ledger.on_unknown_release(self.rank, [k for k, _ in pages])
            return self._fail("confirm_write", error)
        if r.status_code != 204:
            # A 4xx to the confirm of an acknowledged reservation: the server no longer
            # knows what it acknowledged (e.g. a lost reservation after failover).
            self.ledger.problem(f"confirm_write {r.status_code} after an acked allocate: "
                                f"{r.text[:200]}")
            return self._fail("confirm_write", f"{r.status_code} {r.text[:200]}")
        if failing:
            self.ledger.on_confirm(self.rank, [], [k for k, _ in pages])
        else:
            self.ledger.on_confirm(self.rank, pages)
        return None


def initialize(url, rank, num_pages):
    r = _post(requests, url + f"/rank/{rank}/initialize",
              {"num_pages": num_pages, "role": "worker"})
    return r


def first_success(probe, t0, stop, step=0.005):
    """Polls probe() until it is true; returns ms since t0 (monotonic), or None if stop()
    says to give up first."""
    while not stop():
        if probe():
            return (time.monotonic() - t0) * 1000.0
        time.sleep(step)
    return None


def api_ok(base_url, session=None, timeout=1.0):
    """An API call answered 200 (batch_exists of nothing: needs no rank)."""
    try:
        s = session or requests
        r = s.post(base_url + "/keys/batch_exists", data=b'{"keys":[]}',
                   headers={"Content-Type": "application/json"}, timeout=timeout)
        return r.status_code == 200
    except requests.RequestException:
        return False


def write_once(url, session, tag, rank=0, timeout=1.0):
    """One real write: batch_allocate of a fresh key on `rank`, then confirm_write
    releasing its page (the write-failure path, so nothing stays). True if both were
    answered (200 with a page, 204) within `timeout` each."""
    k = key(0, f"probe/{tag}/{time.monotonic_ns()}")
    try:
        r = _post(session, url + "/keys/batch_allocate", {"rank": rank, "keys": [[k, ""]]},
                  timeout)
        if r.status_code != 200 or r.json()["results"][0][1] < 0:
            return False
        page = r.json()["results"][0][1]
        r = _post(session, url + "/keys/confirm_write",
                  {"rank": rank, "confirmations": [], "pages_to_release": [page]}, timeout)
        return r.status_code == 204
    except (requests.RequestException, ValueError, KeyError, IndexError):
        return False


def first_write(url, t0, timeout, rank=0):
    """kill at t0 -> the first write_once() answered at url, in ms; None if none within
    `timeout` s (each try waits up to 1 s per call)."""
    deadline = time.monotonic() + timeout
    session = requests.Session()
    try:
        return first_success(lambda: write_once(url, session, "first", rank), t0,
                             lambda: time.monotonic() > deadline)
    finally:
        session.close()


def measure_takeover(node_url, api_url, t0, timeout=15.0):
    """After a kill at t0: ms to the first /ready 200 of node_url, to the first API
    200 at api_url (the node itself or a forwarder) and to the first write answered
    there (write_once on rank 0), polled in three threads; None where none came."""
    deadline = time.monotonic() + timeout
    out = {}

    def poll(name, probe):
        session = requests.Session()
        try:
            out[name] = first_success(lambda: probe(session), t0,
                                      lambda: time.monotonic() > deadline)
        finally:
            session.close()

    def ready_probe(session):
        try:
            return session.get(node_url + "/ready", timeout=1.0).status_code == 200
        except requests.RequestException:
            return False

    threads = [threading.Thread(target=poll, args=("ready_ms", ready_probe)),
               threading.Thread(target=poll, args=("api_ms", lambda s: api_ok(api_url, s))),
               threading.Thread(target=poll, args=("write_ms", lambda s: write_once(
                   api_url, s, "takeover")))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out["ready_ms"], out["api_ms"], out["write_ms"]


class Prober(threading.Thread):
    """Asks one node an API question (batch_exists of nothing) every `period` s on its own
    thread and keeps (node id, sent, received, status), monotonic seconds; status None
    when no answer came within `timeout`. One thread per node, so that two nodes that
    answered at the same time would show as interleaved answers (see serving_switches)."""

    def __init__(self, node, period=0.01, timeout=0.5):
        super().__init__(daemon=True)
        self.node, self.period, self.timeout = node, period, timeout
        self.records = []
        self._done = threading.Event()

    def run(self):
        session = requests.Session()
        while not self._done.is_set():
            sent = time.monotonic()
            try:
                status = session.post(self.node.base_url + "/keys/batch_exists",
                                      data=b'{"keys":[]}', timeout=self.timeout).status_code
            except requests.RequestException:
                status = None
            self.records.append((self.node.id, sent, time.monotonic(), status))
            self._done.wait(self.period)
        session.close()

    def stop(self):
        self._done.set()
        self.join(5)

    def answered(self, status=200):
        return [r for r in self.records if r[3] == status]


def serving_switches(probers):
    """The 200s of every prober in the order they were sent, cut where the answering node
    changes: [(from id, its last 200's received, to id, the new one's first 200's sent)].
    Two leaders answering at once would show as a switch whose new first 200 was sent
    before the old last 200 came back, or as more switches than leadership changes."""
    answers = sorted((r for p in probers for r in p.answered()), key=lambda r: r[1])
    return [(p[0], p[2], q[0], q[1]) for p, q in zip(answers, answers[1:]) if p[0] != q[0]]


class Diverged(RuntimeError):
    """A supervised node exited with a status other than 75, or too often."""


class Supervisor:
    """systemd's Restart=always for the nodes, as deploy/ha/ha.conf sets it up: a node
    that exited with status 75 is started again restart_s later (RestartSec=200ms);
    exits[node id] counts those exits. Any other exit status raises Diverged; a node the
    caller killed (Node.kill) is left to the caller. Call poll() often."""

    def __init__(self, nodes, restart_s=0.2, limit=100):
        self.nodes = nodes
        self.restart_s = restart_s
        self.limit = limit
        self.exits = {}
        self._seen = {}  # node id -> monotonic time its exit was first seen

    def poll(self):
        for n in self.nodes:
            code = n.exit_code()
            if code is None or n.killed:
                self._seen.pop(n.id, None)
                continue
            if code != EXIT_DIVERGED:
                raise Diverged(f"{n.id} exited with status {code}:\n{n.log(30)}")
            seen = self._seen.setdefault(n.id, time.monotonic())
            if time.monotonic() - seen < self.restart_s:
                continue
            self.exits[n.id] = self.exits.get(n.id, 0) + 1
            if self.exits[n.id] > self.limit:
                raise Diverged(f"{n.id} exited 75 more than {self.limit} times:\n"
                               f"{n.log(30)}")
            del self._seen[n.id]
            n.start()

    def until(self, predicate, timeout):
        """Polls predicate() for up to timeout s, supervising meanwhile; its last value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()


def takeover_any(supervisor, api_url, t0, timeout):
    """After a kill at t0, the nodes supervised: polls each running node's /ready and an
    API call at api_url (a forwarder; None: the ready node) until a node is ready and an
    API call was answered 200, then for the first write answered there (write_once on
    rank 0). Returns (the ready node, kill -> its /ready 200 ms, kill -> first API 200
    ms, kill -> first write ms); None where none came within `timeout`."""
    deadline = time.monotonic() + timeout
    session = requests.Session()
    leader, ready_ms, api_ms = None, None, None
    try:
        while time.monotonic() < deadline and (leader is None or api_ms is None):
            supervisor.poll()
            if leader is None:
                for n in supervisor.nodes:
                    if n.alive() and ready(n.base_url, timeout=0.3):
                        leader, ready_ms = n, (time.monotonic() - t0) * 1000.0
                        break
            target = api_url or (leader.base_url if leader else None)
            if api_ms is None and target and api_ok(target, session, timeout=0.5):
                api_ms = (time.monotonic() - t0) * 1000.0
            time.sleep(0.005)
    finally:
        session.close()
    write_ms = None
    if leader is not None:
        write_ms = first_write(api_url or leader.base_url, t0,
                               max(0.0, deadline - time.monotonic()))
    return leader, ready_ms, api_ms, write_ms


# ---------------------------------------------------------------------------------------
# The base of the replicated-pair suites (test_failover and the ones after it).

NUM_PAGES = 1 << 16
SYNC_TIMEOUT_S = 5.0      # a started standby must be in /sync by then
TAKEOVER_TIMEOUT_S = 5.0  # kill -9 -> the standby serves (1 s lease + promotion)


def repl_supported():
    """(bool, why): METAD_BIN is set and its --help mentions --repl-listen."""
    binary = os.environ.get("METAD_BIN")
    if not binary:
        return False, "METAD_BIN is not set"
    try:
        out = subprocess.run([binary, "--help"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{binary} --help: {e}"
    if b"--repl-listen" not in out.stdout + out.stderr:
        return False, f"{binary} has no --repl-listen (replication not wired)"
    return True, ""


REPL, WHY = repl_supported()



class FailoverCase(HaCase):
    """Two replicated nodes on HaCase's etcd (one per class), a cluster named after the
    test and a temp dir; tearDown kills every node in self.nodes. No tests of its own:
    suites subclass it (decorated @unittest.skipUnless(REPL, WHY))."""

    def setUp(self):
        super().setUp()
        self.cluster_keys = Cluster(self.etcd.url, self.cluster, getattr(self.etcd, "post", None))

    # Cases a-d are about failover, not about dropping a slow standby: a loaded CI host's
    # fdatasync can stall past the default 500 ms, so they give the standby 3 s. Case e
    # (the drop) keeps the default.
    sync_timeout_ms = 3000
    # More flags for every node of a test (set in the test before pair()).
    node_flags = ()

    def node(self, node_id, cuttable=False, ack_delay=None, flags=()):
        """A node of this test's cluster. cuttable: its etcd traffic and the streams to
        its --repl-listen go through Blackholes (n.etcd_link, n.repl_link), so that
        cut(n) can partition it from etcd and from the other node while clients still
        reach its HTTP port. ack_delay: its standbys reach its --repl-listen through a
        Delayer holding what they send that many seconds (late acks). flags: more
        command-line flags for this node."""
        # The flags a node needs to reach this etcd (test_ha.Etcd: TLS and a password).
        etcd_flags = getattr(self.etcd, "node_flags", ())
        extra = ["--sync-timeout-ms", str(self.sync_timeout_ms), *etcd_flags, *self.node_flags,
                 *flags]
        etcd_url, repl_port = self.etcd.url, free_port()
        links = None
        if ack_delay is not None:  # its standbys reach it through a Delayer
            delayer = Delayer("127.0.0.1", repl_port, ack_delay)
            self.addCleanup(delayer.close)
            extra += ["--repl-advertise", delayer.address]
        if cuttable:
            at = urllib.parse.urlsplit(self.etcd.url.split(",")[0])
            links = (Blackhole(at.hostname, at.port), Blackhole("127.0.0.1", repl_port))
            for link in links:
                self.addCleanup(link.close)
            etcd_url = links[0].url  # bytes pass as they are: TLS goes through
            if self.etcd.url.startswith("https://"):
                etcd_url = etcd_url.replace("http://", "https://", 1)
            extra += ["--repl-advertise", links[1].address]
        n = Node(node_id, etcd_url, self.cluster, self.dir, free_port(), repl_port, extra)
        if links:
            n.etcd_link, n.repl_link = links
            n.repl = links[1].address  # what its leader key names
        self.nodes.append(n)
        return n

    def cut(self, node):
        """Partitions a cuttable node from etcd and from every replication stream (with
        two nodes, the streams into either node's --repl-listen are all there are)."""
        for n in [node, *self.nodes]:
            if hasattr(n, "repl_link"):
                n.repl_link.cut()
        node.etcd_link.cut()

    def heal(self, node):
        node.etcd_link.heal()
        for n in [node, *self.nodes]:
            if hasattr(n, "repl_link"):
                n.repl_link.heal()

    def started(self, node):
        node.start()
        self.assertTrue(node.wait_listening(), f"node {node.id} did not start "
                        f"(exit {node.exit_code()}):\n{node.log()}")
        return node

    def wait_in_sync(self, standby, leader, allow_diverged_exits=0, timeout=SYNC_TIMEOUT_S):
        """Waits until /sync lists `standby` under `leader`. A standby that exits with
        status 75 (cannot follow; resync) is restarted up to allow_diverged_exits times,
        each restart getting a fresh `timeout`; any other exit fails the test."""
        restarts = 0
        deadline = time.monotonic() + timeout
        while not self.cluster_keys.in_sync(standby.id, leader.id):
            code = standby.exit_code()
            if code is not None:
                self.assertEqual(code, EXIT_DIVERGED,
                                 f"{standby.id} exited with {code}:\n{standby.log()}")
                self.assertLess(restarts, allow_diverged_exits,
                                f"{standby.id} exited 75 again:\n{standby.log()}")
                restarts += 1
                sys.stderr.write(f"\n  {standby.id} exited 75, restarted; its last line: "
                                 f"{standby.log(1)}\n")
                standby.start()
                deadline = time.monotonic() + timeout
            self.assertLess(time.monotonic(), deadline,
                            f"{standby.id} not in /sync of {leader.id} after {timeout} s; "
                            f"/sync {self.cluster_keys.sync()}\n{standby.id}:\n"
                            f"{standby.log(40)}\n{leader.id}:\n{leader.log(40)}")
            time.sleep(0.02)
        return restarts

    def pair(self):
        """a leads, b is its sync standby."""
        a = self.started(self.node("a"))
        self.assertTrue(wait_until(lambda: ready(a.base_url), 5), a.log())
        b = self.started(self.node("b"))
        began = time.monotonic()
        self.wait_in_sync(b, a)
        sys.stderr.write(f"\n  b in /sync {(time.monotonic() - began) * 1000:.0f} ms "
                         f"after its start\n")
        return a, b

    def write_then_kill(self, leader, standby, ledger, tag, min_bound=1000, writers=2):
        """Runs `writers` writers (engines sharing rank 0) against `leader` until they
        have min_bound acked bindings more, then kills the leader under them; returns
        (kill -> standby /ready 200 ms, kill -> first API 200 ms)."""
        before = ledger.bound_count()
        ws = [Writer(leader.base_url, 0, ledger, f"{tag}-{i}") for i in range(writers)]
        for w in ws:
            w.start()
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= before + min_bound
                                   or not all(w.is_alive() for w in ws), 30),
                        "the writers made no progress")
        for w in ws:
            self.assertTrue(w.is_alive(), f"a writer stopped before the kill: "
                            f"{w.stopped_by}\n{leader.log(20)}")
        # Only a standby listed in /sync takes over; one that dropped out under the
        # writers (no ack within --sync-timeout-ms) would make the kill a plain outage.
        self.assertTrue(self.cluster_keys.in_sync(standby.id, leader.id),
                        f"{standby.id} fell out of /sync under the writers: "
                        f"{self.cluster_keys.sync()}\n{leader.id}:\n{leader.log(12)}\n"
                        f"{standby.id} (exit status {standby.exit_code()}):\n"
                        f"{standby.log(12)}")
        t0 = time.monotonic()
        leader.kill()
        ready_ms, api_ms, write_ms = measure_takeover(standby.base_url, standby.base_url, t0,
                                                      TAKEOVER_TIMEOUT_S)
        for w in ws:
            w.join(10)
            self.assertFalse(w.is_alive(), "a writer did not notice the kill")
        pending = sum(len(m) for m in ledger.snapshot()[1].values())
        sys.stderr.write(f"  kill -9 {leader.id}: {standby.id} /ready 200 after "
                         f"{ready_ms and round(ready_ms)} ms, first API 200 after "
                         f"{api_ms and round(api_ms)} ms, first write after "
                         f"{write_ms and round(write_ms)} ms; {sum(w.tasks for w in ws)} tasks, "
                         f"{ledger.bound_count()} keys acked bound, {pending} acked "
                         f"reservations pending\n")
        self.assertIsNotNone(ready_ms, f"{standby.id} did not serve within "
                             f"{TAKEOVER_TIMEOUT_S} s:\n{standby.log(40)}")
        self.assertIsNotNone(api_ms)
        self.assertIsNotNone(write_ms, f"{standby.id} serves, but no write was answered "
                             f"within {TAKEOVER_TIMEOUT_S} s of the kill:\n{standby.log(20)}")
        self.assertEqual(ledger.problems, [])
        return ready_ms, api_ms

    def assert_writes_go_on_alone(self, writer, ledger, t0, dropped_ms, what):
        """After the standby was dropped from /sync (dropped_ms after t0): the writer
        acknowledges 200 more bindings, and neither the drop nor the writer's longest
        call since t0 took 2 s (--sync-timeout-ms 500 plus an etcd write)."""
        before = ledger.bound_count()
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= before + 200
                                   or not writer.is_alive(), 10),
                        f"writes stopped with the standby out of /sync: {writer.stopped_by}")
        self.assertTrue(writer.is_alive(), f"the writer stopped: {writer.stopped_by}")
        stall_ms = max([took for end, took, _, _ in list(writer.slow_calls) if end >= t0]
                       or [0]) * 1000
        sys.stderr.write(f"\n  {what}: dropped from /sync after {dropped_ms:.0f} ms; longest "
                         f"write meanwhile {stall_ms:.0f} ms\n")
        self.assertLess(dropped_ms, 2000)
        self.assertLess(stall_ms, 2000)

    def assert_ledger(self, node, ledger, kills=1, unlisted=0):
        """Every acked binding on `node`, nothing aliased, acked reservations honoured.
        kills: failovers so far, each of which may have left one unanswered task;
        unlisted: bindings of rank 0 acknowledged but not in the ledger (a bulk fill whose
        sample the ledger holds), counted in the rank's total."""
        bound, reserved = ledger.snapshot()
        # What is checked is the node's state, not its availability: the check starts once
        # the node serves (right after etcd's quorum returns it may step down and back).
        self.assertTrue(wait_until(lambda: ready(node.base_url), 10),
                        f"{node.id} does not serve for the ledger check:\n{node.log(20)}")
        result = check_ledger(node.base_url, bound)
        self.assertEqual(result["errors"], 0, result["details"])
        self.assertEqual(result["checked"], ledger.bound_count())
        self.assertEqual((result["lost"], result["moved"], result["duplicate_pages"],
                          result["ledger_duplicates"], result["errors"]), (0, 0, 0, 0, 0),
                         result["details"])
        c = Client(node.base_url)
        try:
            # The rank holds the acked bindings, plus at most one task per writer and kill
            # that was in flight (its confirm may have been applied but not answered).
            info = c.rank_info(0).json()
            acked = len(bound.get(0, {})) + unlisted
            self.assertGreaterEqual(info["bound"], acked, info)
            self.assertLessEqual(info["bound"], acked + 8 * 2 * kills, info)
            # An acknowledged reservation (allocate answered, confirm not sent or not
            # answered) is still this writer's: its confirm succeeds on the new leader.
            pending = reserved.get(0, {})
            if pending:
                self.assertEqual(c.confirm_write(0, pending.items()).status_code, 204,
                                 f"acked reservations {pending} lost")
                ledger.on_confirm(0, pending.items())
            # A fresh allocation never gets a page the old leader acknowledged.
            taken = set(bound.get(0, {}).values()) | set(pending.values())
            fresh = keys(64, f"fresh-{node.id}-{node.starts}-{time.monotonic()}")
            answer = c.batch_allocate(0, fresh)
            self.assertEqual(answer.status_code, 200, answer.text)
            pages = [p for _, p in answer.json()["results"]]
            self.assertNotIn(-1, pages)
            self.assertEqual(set(pages) & taken, set(), "an acked page was handed out again")
            # Released again (the write-failure path): nothing kept.
            self.assertEqual(c.confirm_write(0, [], pages).status_code, 204)
        finally:
            c.close()

    # ---------------------------------------------------------------------------------
