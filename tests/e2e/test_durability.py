# ctest: once
"""Durability of hf3fs-metad (--data-dir): nothing acknowledged is ever lost.

Every test starts the real binary on a fresh data directory and restarts it there:
cleanly (SIGTERM) or as a crash (SIGKILL), with the same or another --threads count
(recovery must work whatever the former core count was).

- Sequential tests mirror every request into reference_model.py and compare every
  answer exactly, before and after each restart: GET /rank, batch_allocate hits (same
  pages), get_locations, batch_exists, and lowest-free-first allocation afterwards.
- The crash test runs a bounded mixed workload from several client threads, kill -9s the
  server at a random moment, restarts it (several rounds, alternating --threads and
  --snapshot-log-bytes), and checks that every acknowledged initialise, reservation and
  confirmation is there, and the page invariants (free + reserved + bound == num_pages,
  no page bound to two keys, no page both free and held).
- Snapshots and log segments (--snapshot-log-bytes 4096), torn and corrupt log tails,
  disk full (a small tmpfs; RLIMIT_FSIZE where mounting is not possible), --durability
  none, two servers on one directory.

Seeds of the random parts are printed; replay with METAD_DUR_SEED=<seed>.
Environment: METAD_BIN, METAD_IO (as every e2e suite), METAD_DUR_SEED, METAD_DUR_ROUNDS
(crash rounds, default 5), METAD_DUR_NO_MOUNT=1 (disk full through RLIMIT_FSIZE even as root). Standard library + requests only; the disk-full tests need
root for mount(8) and otherwise fall back to RLIMIT_FSIZE.
"""

import errno
import os
import random
import re
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import requests

from metad_harness import (START_TIMEOUT_S, Client, MetadServer, compact, key, keys,
                           rss_bytes, run_to_exit)
from reference_model import Model

STORAGE_PREFIX = "Storage unavailable"
INT64_MIN = -(2**63)


def env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value else default


def note(text):
    print(f"\n[test_durability] {text}", file=sys.stderr, flush=True)


def pick_seed(name):
    seed = env_int("METAD_DUR_SEED", 0) or random.SystemRandom().randrange(1, 2**31)
    note(f"{name}: seed {seed} (replay with METAD_DUR_SEED={seed})")
    return seed


# --- the data directory's files ------------------------------------------------------

def current_generation_dir(data_dir):
    with open(os.path.join(data_dir, "CURRENT")) as f:
        return os.path.join(data_dir, f"g{int(f.read().strip())}")


_FILE = re.compile(r"^core-(\d+)\.(snap|log)-(\d+)$")


def data_files(data_dir):
    """{(core, kind, segment): path} of the committed generation ("snap"/"log")."""
    gdir = current_generation_dir(data_dir)
    found = {}
    for name in os.listdir(gdir):
        m = _FILE.match(name)
        if m:
            found[(int(m.group(1)), m.group(2), int(m.group(3)))] = os.path.join(gdir, name)
    return found


def newest(data_dir, kind, core=0):
    files = {seg: p for (c, k, seg), p in data_files(data_dir).items() if c == core and k == kind}
    return files[max(files)]


def frames(path):
    """Offsets and lengths of the [u32 length][u32 crc32c][payload] frames of a file."""
    with open(path, "rb") as f:
        data = f.read()
    out, offset = [], 0
    while offset + 8 <= len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        if offset + 8 + length > len(data):
            break
        out.append((offset, 8 + length))
        offset += 8 + length
    return out, len(data)


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0x5A]))
    return old


def put_byte(path, offset, byte):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(byte)


def append_bytes(path, data):
    with open(path, "ab") as f:
        f.write(data)


# --- mirrored client -------------------------------------------------------------------

class Mirror:
    """Sends each request to the server and to the reference model; the answers must be
    equal (status and parsed JSON). Remembers every rank and key it used, for verify()."""

    def __init__(self, tc, server, model=None):
        self.tc = tc
        self.model = model or Model()
        self.ranks = []  # every rank a request named, in first-use order
        self.keys = []   # every key, in first-use order
        self._seen_keys = set()
        self.client = None
        self.attach(server)

    def attach(self, server):
        if self.client:
            self.client.close()
        self.client = Client(server.base_url)
        self.server = server

    def close(self):
        if self.client:
            self.client.close()
            self.client = None

    def _use(self, rank=None, ks=()):
        if rank is not None and rank not in self.ranks:
            self.ranks.append(rank)
        for k in ks:
            if k not in self._seen_keys:
                self._seen_keys.add(k)
                self.keys.append(k)

    def send(self, method, path, obj=None):
        """The raw server response (the model is not involved)."""
        body = compact(obj) if obj is not None else b""
        if method == "GET":
            return self.client.request("GET", path)
        return self.client.post_raw(path, body)

    def call(self, method, path, obj=None):
        body = compact(obj) if obj is not None else b""
        r = self.send(method, path, obj)
        want = self.model.handle(method, path, body)
        got = r.json() if r.content else None
        if not want.matches(r.status_code, got):
            self.tc.fail(f"{method} {path} {body[:200]!r}: server answered {r.status_code} "
                         f"{r.content[:400]!r}, the model {want!r}\nserver stderr tail:\n"
                         f"{self.server.log()[-2000:]}")
        return r.status_code, got

    # The request shapes of vLLM's client.
    def init(self, rank, num_pages):
        self._use(rank)
        return self.call("POST", f"/rank/{rank}/initialize", {"num_pages": num_pages, "role": "worker"})

    def allocate(self, rank, ks):
        self._use(rank, ks)
        status, body = self.call("POST", "/keys/batch_allocate", {"rank": rank, "keys": [[k, ""] for k in ks]})
        return [p for _, p in body["results"]] if status == 200 else None

    def confirm(self, rank, confirmations, releases=()):
        self._use(rank, [k for k, _ in confirmations])
        return self.call("POST", "/keys/confirm_write", {
            "rank": rank, "confirmations": [[k, p] for k, p in confirmations],
            "pages_to_release": list(releases)})[0]

    def save(self, rank, ks):
        pages = self.allocate(rank, ks)
        self.tc.assertNotIn(-1, pages)
        self.tc.assertEqual(self.confirm(rank, list(zip(ks, pages))), 204)
        return pages

    def write_failure(self, rank, ks):
        """The connector's failed save: allocate, then release every page."""
        pages = self.allocate(rank, ks)
        self.tc.assertEqual(self.confirm(rank, [], [p for p in pages if p >= 0]), 204)
        return pages

    def exists(self, ks):
        self._use(None, ks)
        return self.call("POST", "/keys/batch_exists", {"keys": list(ks)})[1]

    def locations(self, rank, ks):
        self._use(rank, ks)
        return self.call("POST", "/keys/get_locations", {"rank": rank, "keys": list(ks)})[1]

    def rank_info(self, rank):
        self._use(rank)
        return self.call("GET", f"/rank/{rank}")

    def clear(self):
        return self.call("POST", "/clear")[0]

    def verify(self, skip_ranks=(), read_only=False):
        """The server's state equals the model's: rank counts, every held key's page (a
        batch_allocate of held keys must return their pages and take nothing; not when
        read_only), every location, every key's existence."""
        ranks = [r for r in self.ranks if r not in skip_ranks]
        for r in ranks:
            self.rank_info(r)
        for r in ranks:
            state = self.model.ranks.get(r)
            if state and state.page_of and not read_only:
                held = sorted(state.page_of)
                for i in range(0, len(held), 2000):
                    self.allocate(r, held[i:i + 2000])
            self.rank_info(r)
            if state and self.keys:
                self.locations(r, self.keys)
        if self.keys:
            self.exists(self.keys)


# --- base class ------------------------------------------------------------------------

class DurabilityCase(unittest.TestCase):

    def tmpdir(self):
        path = tempfile.mkdtemp(prefix="metad-dur-")
        self.addCleanup(shutil.rmtree, path, ignore_errors=True)
        return path

    def start(self, data_dir, threads=2, *extra, preexec_fn=None):
        args = ["--threads", str(threads), *extra]
        if data_dir is not None:
            args = ["--data-dir", data_dir, *args]
        server = MetadServer(args, preexec_fn=preexec_fn)
        self.addCleanup(self._reap, server)
        return server

    @staticmethod
    def _reap(server):
        if server.alive():
            server.kill()

    def stop(self, server):
        code = server.stop()
        self.assertEqual(code, 0, f"exit code after SIGTERM; stderr tail:\n{server.log()[-3000:]}")

    def crash(self, server):
        self.assertTrue(server.alive(), f"server died before the crash:\n{server.log()[-3000:]}")
        server.kill()

    def assert_recovered_before_listening(self, server):
        lines = list(server.stderr_lines)
        listening = next(i for i, line in enumerate(lines) if "listening on" in line)
        recovered = [i for i, line in enumerate(lines) if re.search(r"recover", line, re.I)]
        self.assertTrue(recovered and recovered[0] < listening,
                        "no recovery line before the 'listening on' line:\n" + "\n".join(lines))

    def assert_storage_unavailable(self, r, what):
        self.assertEqual(r.status_code, 503, f"{what}: {r.status_code} {r.content[:300]!r}")
        self.assertEqual(r.headers.get("Content-Type", "").split(";")[0], "application/json")
        body = r.json()
        self.assertEqual(list(body), ["detail"], r.content)
        self.assertTrue(body["detail"].startswith(STORAGE_PREFIX) and len(body["detail"]) > len(STORAGE_PREFIX),
                        f"{what}: detail {body['detail']!r}")


# --- 1. restart keeps state --------------------------------------------------------------

STATE_RANKS = {0: 32, -3: 16, 7: 48, INT64_MIN: 8, 12345678901: 24}


def build_state(tc, m):
    """A bit of everything, through the model: ranks (negative, int64 extremes, grown,
    shrunk), complete keys, incomplete ones, reservations, releases, hits whose
    release is refused."""
    for r, n in STATE_RANKS.items():
        tc.assertEqual(m.init(r, n)[0], 200)
    tc.assertEqual(m.init(7, 64)[0], 200)   # grown
    tc.assertEqual(m.init(7, 64)[0], 200)   # same: no change
    tc.assertEqual(m.init(-3, 8)[0], 200)   # shrunk (nothing bound past page 8 yet)
    ranks = list(STATE_RANKS)
    a, b, c, d, e = (keys(n, tag) for n, tag in ((7, "A"), (4, "B"), (5, "C"), (4, "D"), (3, "E")))
    for r in ranks:                     # complete on every rank
        m.save(r, a)
    for r in ranks:                     # reserved everywhere, confirmed on two ranks
        m.allocate(r, b)
    m.confirm(0, [(k, p) for k, p in zip(b, m.allocate(0, b))])
    m.confirm(-3, [(k, p) for k, p in zip(b, m.allocate(-3, b))])
    m.write_failure(0, c)               # released again
    m.write_failure(7, c)
    m.allocate(7, d)                    # left reserved
    m.allocate(-3, d)
    hits = m.allocate(0, a[:3])         # the write-failure path on cache hits:
    m.confirm(0, [], hits)              # bound pages are not freed
    pe = m.allocate(INT64_MIN, e)       # one confirmed, one released, one reserved
    m.confirm(INT64_MIN, [(e[0], pe[0])], [pe[1]])
    m.exists(a + b + c + d + e)


class RestartTest(DurabilityCase):

    RANKS = STATE_RANKS

    def build_state(self, m):
        build_state(self, m)

    def test_restart_keeps_state_across_core_counts(self):
        data = self.tmpdir()
        server = self.start(data, 2)
        m = Mirror(self, server)
        self.addCleanup(m.close)
        self.build_state(m)
        m.verify()
        self.stop(server)
        for threads in (3, 1):
            server = self.start(data, threads)
            self.assert_recovered_before_listening(server)
            m.attach(server)
            m.verify()
            self.stop(server)
        # New allocations continue lowest-free-first from the recovered state (the model
        # says which pages), then survive another restart.
        server = self.start(data, 2)
        m.attach(server)
        f = keys(6, "F")
        for r in self.RANKS:
            m.allocate(r, f)
        m.confirm(7, list(zip(f[:2], m.allocate(7, f[:2]))))
        m.verify()
        self.stop(server)
        server = self.start(data, 2)
        m.attach(server)
        m.verify()
        self.stop(server)

    def test_pools_of_2_to_the_40_pages_survive_restarts(self):
        """A vLLM rank and an SGLang pool of 2^40 pages: created in O(1), allocated from in
        their order (vLLM lowest first, SGLang highest first), confirmed, and the same
        after a restart from the log and one from a snapshot (neither materialises the
        pages), where allocation goes on in the same order."""
        huge = 1 << 40
        data = self.tmpdir()
        server = self.start(data, 2)
        base = server.base_url
        session = requests.Session()
        self.addCleanup(session.close)

        def post(path, obj):
            r = session.post(base + path, data=compact(obj), timeout=30)
            self.assertIn(r.status_code, (200, 204), r.content)
            return r.json() if r.status_code == 200 else None

        def save(tag, n):
            ks = keys(n, tag)
            got = post("/keys/batch_allocate", {"rank": 5, "keys": [[k, ""] for k in ks]})
            pages = [p for _, p in got["results"]]
            post("/keys/confirm_write", {"rank": 5, "confirmations": list(zip(ks, pages))})
            sg = post("/3/reserve_and_allocate_page_indices", {"keys": ks})["indices"]
            sg_pages = [p for _, p in sg]
            post("/3/confirm_write", {"written_keys_to_confirm": list(zip(ks, sg_pages))})
            return ks, pages, sg_pages

        post("/rank/5/initialize", {"role": "worker", "num_pages": huge})
        post("/3/initialize", {"num_pages": huge})
        a, pages, sg_pages = save("A", 5)
        self.assertEqual(pages, [0, 1, 2, 3, 4])
        self.assertEqual(sg_pages, [huge - 1 - i for i in range(5)])
        self.stop(server)
        expected = {"num_pages": huge, "free": huge - 5, "reserved": 0, "bound": 5}
        for extra in ((), ("--snapshot-log-bytes", "4096")):
            server = self.start(data, 2, *extra)
            base = server.base_url
            r = session.get(base + "/rank/5", timeout=30)
            self.assertEqual({k: r.json()[k] for k in expected}, expected)
            self.assertEqual(post("/keys/get_locations", {"rank": 5, "keys": a}), {"locations": pages})
            self.assertEqual(post("/3/get_page_indices", {"keys": a}), {"indices": sg_pages})
            stats = session.get(base + "/stats", timeout=30).json()["sglang"]
            self.assertEqual(stats["pages_total"], huge)
            self.assertEqual(stats["pages_bound"], len(a))
            # Allocation goes on in order; the next restart holds these too.
            tag = "B" if not extra else "C"
            b, b_pages, b_sg = save(tag, 3)
            first = pages[-1] + 1
            self.assertEqual(b_pages, [first, first + 1, first + 2])
            self.assertEqual(b_sg, [sg_pages[-1] - 1 - i for i in range(3)])
            a, pages, sg_pages = a + b, pages + b_pages, sg_pages + b_sg
            expected = {"num_pages": huge, "free": huge - len(a), "reserved": 0, "bound": len(a)}
            rss = rss_bytes(server.proc.pid)
            self.assertLess(rss, 256 << 20, f"RSS {rss >> 20} MiB")
            self.stop(server)
        server = self.start(data, 2)
        base = server.base_url
        self.assertEqual(post("/keys/get_locations", {"rank": 5, "keys": a}), {"locations": pages})
        self.assertEqual(post("/3/get_page_indices", {"keys": a}), {"indices": sg_pages})
        self.stop(server)

    def test_crash_after_acknowledged_requests_keeps_state(self):
        data = self.tmpdir()
        server = self.start(data, 3)
        m = Mirror(self, server)
        self.addCleanup(m.close)
        self.build_state(m)
        self.crash(server)
        server = self.start(data, 2)
        m.attach(server)
        m.verify()
        self.crash(server)
        server = self.start(data, 1)
        m.attach(server)
        m.verify()
        self.stop(server)

    def test_clear_survives_restart(self):
        data = self.tmpdir()
        server = self.start(data, 2)
        m = Mirror(self, server)
        self.addCleanup(m.close)
        self.build_state(m)
        self.assertEqual(m.clear(), 204)
        # After the clear: a rank again with fewer pages than before (a replay that
        # missed the clear would refuse it), keys seen before the clear.
        self.assertEqual(m.init(7, 4)[0], 200)
        m.save(7, keys(2, "A"))
        m.verify()
        self.crash(server)
        server = self.start(data, 3)
        m.attach(server)
        m.verify()
        self.stop(server)
        server = self.start(data, 1)
        m.attach(server)
        m.verify()
        self.stop(server)

    def test_without_data_dir_state_is_in_memory_only(self):
        server = self.start(None, 1)
        self.assertTrue(server.wait_log(r"memory only", timeout=2.0),
                        f"no 'memory only' start-up line:\n{server.log()}")
        self.stop(server)

    def test_snapshot_log_bytes_minimum(self):
        code, err, started = run_to_exit(["--data-dir", self.tmpdir(), "--snapshot-log-bytes", "4095"])
        self.assertFalse(started, "--snapshot-log-bytes 4095 accepted (minimum 4096)")
        self.assertGreater(code, 0, err)


# --- 2. crash test ---------------------------------------------------------------------------

class Disconnected(Exception):
    """The server went away mid-request: the outcome of that request is unknown."""


class Ledger:
    """What the server acknowledged (and what it was merely sent), per rank and key.

    Every key belongs to one client thread, which runs its requests one at a time, so a
    key's history is sequential; the dicts are shared, guarded by a lock."""

    def __init__(self, ranks):
        self.lock = threading.Lock()
        self.ranks = list(ranks)
        self.pages_acked = {r: 0 for r in ranks}  # largest acknowledged num_pages
        self.pages_sent = {r: 0 for r in ranks}   # largest num_pages ever sent
        self.held = {r: {} for r in ranks}        # key → page, held for certain (reserved/bound)
        self.uncertain = {r: set() for r in ranks}  # keys whose hold on the rank is unknown
        self.sent = {r: set() for r in ranks}     # every key ever sent to a rank
        self.confirm_acked = {}                   # key → ranks that acknowledged its confirmation
        self.confirm_sent = {}                    # key → ranks a confirmation was sent to
        self.all_keys = []
        self.owner = {}                           # key → thread

    def new_keys(self, t, ks):
        with self.lock:
            for k in ks:
                self.owner[k] = t
                self.all_keys.append(k)

    def complete_acked(self, k):
        return len(self.confirm_acked.get(k, ())) == len(self.ranks)


class Worker(threading.Thread):
    """One client: a bounded random mix of vLLM-shaped requests on its own keys (every key
    is saved on every rank, so that it becomes complete: tp_world_size == all ranks);
    it grows only its own rank. Records only acknowledged results."""

    MAX_OPS = 150

    def __init__(self, t, base_url, ledger, rng, tag, barrier, own_rank, own_pages):
        super().__init__(daemon=True)
        self.t, self.base_url, self.ledger, self.rng, self.tag = t, base_url, ledger, rng, tag
        self.barrier, self.own_rank, self.own_pages = barrier, own_rank, own_pages
        self.error = None
        self.acked = 0
        self.seq = 0
        self.client = None

    def run(self):
        self.client = Client(self.base_url)
        try:
            self.grow(self.own_pages)
            self.barrier.wait(timeout=10)  # every rank exists before any confirmation
            for _ in range(self.MAX_OPS):
                choice = self.rng.random()
                if choice < 0.40:
                    self.op_save()
                elif choice < 0.55:
                    self.op_reserve()
                elif choice < 0.75:
                    self.op_write_failure()
                elif choice < 0.90:
                    self.op_hit_release()
                else:
                    self.grow(self.own_pages + self.rng.randint(1, 8))
        except (Disconnected, threading.BrokenBarrierError):
            pass
        except AssertionError as e:
            self.error = str(e)
        except Exception as e:  # noqa: BLE001 - reported as a test failure
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.barrier.abort()
            self.client.close()

    def post(self, what, fn, *args):
        try:
            r = fn(*args)
        except requests.RequestException as e:
            raise Disconnected(str(e)) from e
        return r

    def expect(self, r, status, what):
        if r.status_code != status:
            raise AssertionError(f"thread {self.t}: {what}: {r.status_code} {r.content[:300]!r}")
        self.acked += 1

    def fresh(self, n):
        ks = [key(self.seq + i, f"{self.tag}/t{self.t}") for i in range(n)]
        self.seq += n
        self.ledger.new_keys(self.t, ks)
        return ks

    def grow(self, pages):
        led = self.ledger
        with led.lock:
            led.pages_sent[self.own_rank] = max(led.pages_sent[self.own_rank], pages)
        r = self.post("initialize", self.client.initialize, self.own_rank, pages)
        self.expect(r, 200, f"initialize {self.own_rank} {pages}")
        with led.lock:
            led.pages_acked[self.own_rank] = max(led.pages_acked[self.own_rank], pages)
        self.own_pages = pages

    def allocate(self, rank, ks):
        """Returns the pages, or None if the pool could not serve the batch (all -1)."""
        led = self.ledger
        with led.lock:
            led.sent[rank].update(ks)
            led.uncertain[rank].update(ks)
        r = self.post("allocate", self.client.batch_allocate, rank, ks)
        self.expect(r, 200, f"batch_allocate rank {rank}")
        results = r.json()["results"]
        if [k for k, _ in results] != ks:
            raise AssertionError(f"thread {self.t}: batch_allocate results {results} for keys {ks}")
        pages = [p for _, p in results]
        with led.lock:
            led.uncertain[rank].difference_update(ks)
            if -1 in pages:
                if set(pages) != {-1}:
                    raise AssertionError(f"thread {self.t}: allocation not all-or-nothing: {pages}")
                return None
            for k, p in zip(ks, pages):
                led.held[rank][k] = p
        return pages

    def confirm(self, rank, ks, pages):
        led = self.ledger
        with led.lock:
            for k in ks:
                led.confirm_sent.setdefault(k, set()).add(rank)
        r = self.post("confirm", self.client.confirm_write, rank, list(zip(ks, pages)))
        self.expect(r, 204, f"confirm_write rank {rank}")
        with led.lock:
            for k in ks:
                led.confirm_acked.setdefault(k, set()).add(rank)

    def release(self, rank, ks, pages):
        """The connector's failed save: every page of the task back to the pool."""
        led = self.ledger
        with led.lock:
            for k in ks:
                del led.held[rank][k]
                led.uncertain[rank].add(k)
        r = self.post("release", self.client.confirm_write, rank, [], pages)
        self.expect(r, 204, f"confirm_write (release) rank {rank}")
        with led.lock:
            led.uncertain[rank].difference_update(ks)

    def op_save(self):
        ks = self.fresh(self.rng.randint(1, 4))
        ranks = self.ledger.ranks[:]
        self.rng.shuffle(ranks)
        pages = {}
        for r in ranks:
            got = self.allocate(r, ks)
            if got is None:
                return
            pages[r] = got
        self.rng.shuffle(ranks)
        for r in ranks:
            self.confirm(r, ks, pages[r])

    def op_reserve(self):
        ks = self.fresh(self.rng.randint(1, 4))
        for r in self.rng.sample(self.ledger.ranks, self.rng.randint(1, len(self.ledger.ranks))):
            self.allocate(r, ks)

    def op_write_failure(self):
        ks = self.fresh(self.rng.randint(1, 4))
        r = self.rng.choice(self.ledger.ranks)
        pages = self.allocate(r, ks)
        if pages is not None:
            self.release(r, ks, pages)

    def op_hit_release(self):
        """Cache hits (same pages), then the write-failure path releases them: the pages
        must stay bound."""
        led = self.ledger
        with led.lock:
            mine = [k for k in led.all_keys if led.owner[k] == self.t and led.complete_acked(k)]
        if not mine:
            return self.op_save()
        ks = self.rng.sample(mine, min(len(mine), self.rng.randint(1, 3)))
        r = self.rng.choice(led.ranks)
        want = [led.held[r][k] for k in ks]
        req = self.post("allocate", self.client.batch_allocate, r, ks)
        self.expect(req, 200, f"batch_allocate (hits) rank {r}")
        got = [p for _, p in req.json()["results"]]
        if got != want:
            raise AssertionError(f"thread {self.t}: hits on rank {r} answered {got}, want {want}")
        req = self.post("release", self.client.confirm_write, r, [], got)
        self.expect(req, 204, f"confirm_write (release hits) rank {r}")


class CrashTest(DurabilityCase):

    RANKS = [-7, 0, 3, 2**40 + 1]
    PAGES = 2048
    THREADS = [2, 1, 3, 2, 3, 1]
    SNAPSHOT_BYTES = [None, 4096, 16384, 4096, None, 8192]

    def test_kill9_rounds(self):
        seed = pick_seed("crash rounds")
        rng = random.Random(seed)
        rounds = env_int("METAD_DUR_ROUNDS", 5)
        data = self.tmpdir()
        ledger = Ledger(self.RANKS)
        own_pages = {r: self.PAGES for r in self.RANKS}
        history = []
        for rnd in range(rounds):
            threads = self.THREADS[rnd % len(self.THREADS)]
            snap = self.SNAPSHOT_BYTES[rnd % len(self.SNAPSHOT_BYTES)]
            extra = ["--snapshot-log-bytes", str(snap)] if snap else []
            server = self.start(data, threads, *extra)
            client = Client(server.base_url)
            try:
                self.verify(client, ledger, f"round {rnd} (after {history})", server)
                # Each thread grows its rank from what the server has now.
                for r in self.RANKS:
                    info = client.rank_info(r)
                    if info.status_code == 200:
                        own_pages[r] = info.json()["num_pages"]
            finally:
                client.close()
            barrier = threading.Barrier(len(self.RANKS))
            workers = [Worker(t, server.base_url, ledger, random.Random(rng.random()), f"r{rnd}",
                              barrier, r, own_pages[r]) for t, r in enumerate(self.RANKS)]
            delay = rng.uniform(0.2, 1.5)
            for w in workers:
                w.start()
            time.sleep(delay)
            self.crash(server)
            for w in workers:
                w.join(timeout=20)
                self.assertFalse(w.is_alive(), f"worker {w.t} hung after the kill")
            errors = [w.error for w in workers if w.error]
            self.assertFalse(errors, f"seed {seed} round {rnd}: {errors}\nstderr tail:\n{server.log()[-3000:]}")
            acked = sum(w.acked for w in workers)
            history.append(f"r{rnd}: threads {threads} snap {snap} kill at {delay:.2f}s, {acked} acked")
        held = sum(len(h) for h in ledger.held.values())
        unsure = sum(len(u) for u in ledger.uncertain.values())
        complete = sum(1 for k in ledger.all_keys if ledger.complete_acked(k))
        history.append(f"checked: {held} held (rank, key) pairs, {complete} complete keys, "
                       f"{unsure} of unknown outcome")
        note(f"crash rounds (seed {seed}): " + "; ".join(history))
        # Final checks: after a crash, then after clean restarts with other core counts.
        for threads in (3, 1):
            server = self.start(data, threads)
            client = Client(server.base_url)
            try:
                self.verify(client, ledger, f"final, threads {threads}", server)
            finally:
                client.close()
            self.stop(server)

    def verify(self, c, led, when, server):
        """Everything acknowledged is there; the page invariants hold."""
        ctx = f"{when}; stderr tail:\n{server.log()[-2500:]}"

        def ok(r, status, what):
            self.assertEqual(r.status_code, status, f"{what}: {r.status_code} {r.content[:300]!r}; {ctx}")
            return r.json() if r.content else None

        all_keys = list(led.all_keys)
        tp = len(led.ranks)
        for r in led.ranks:
            resp = c.rank_info(r)
            if resp.status_code == 404 and led.pages_acked[r] == 0:
                continue  # never acknowledged, never created
            info = ok(resp, 200, f"GET /rank/{r}")
            self.assertTrue(led.pages_acked[r] <= info["num_pages"] <= led.pages_sent[r],
                            f"rank {r}: num_pages {info['num_pages']}, acknowledged {led.pages_acked[r]}, "
                            f"largest sent {led.pages_sent[r]}; {ctx}")
            self.assertEqual(info["free"] + info["reserved"] + info["bound"], info["num_pages"],
                             f"rank {r}: {info}; {ctx}")
            self.assertTrue(min(info.values()) >= 0, f"rank {r}: {info}")
            held = dict(led.held[r])
            self.assertEqual(len(set(held.values())), len(held), "ledger: two keys share a page")
            self.assertLessEqual(len(held), info["reserved"] + info["bound"], f"rank {r}: {info}; {ctx}")
            # Every acknowledged reservation/confirmation: the same page, nothing taken.
            if held:
                hk = list(held)
                body = ok(c.batch_allocate(r, hk), 200, f"batch_allocate (held) rank {r}")
                got = dict((k, p) for k, p in body["results"])
                lost = {k: (held[k], got.get(k)) for k in hk if got.get(k) != held[k]}
                self.assertFalse(lost, f"rank {r}: {len(lost)} acknowledged pages changed "
                                       f"(key: (acknowledged, now)) e.g. {list(lost.items())[:5]}; {ctx}")
                self.assertEqual(ok(c.rank_info(r), 200, "GET /rank"), info,
                                 f"rank {r}: allocating held keys changed the counts; {ctx}")
            # Locations: only confirmed keys, each its acknowledged page, no page twice.
            bound = {}
            if all_keys:
                locs = ok(c.get_locations(r, all_keys), 200, f"get_locations rank {r}")["locations"]
                for k, loc in zip(all_keys, locs):
                    if loc is None:
                        self.assertFalse(led.complete_acked(k),
                                         f"rank {r}: acknowledged complete key {k} has no location; {ctx}")
                        continue
                    self.assertIn(r, led.confirm_sent.get(k, ()),
                                  f"rank {r}: key {k} has location {loc} but was never confirmed there; {ctx}")
                    if k in held:
                        self.assertEqual(loc, held[k], f"rank {r}: key {k} location; {ctx}")
                    self.assertNotIn(loc, bound, f"rank {r}: page {loc} bound to {bound.get(loc)} and {k}; {ctx}")
                    self.assertTrue(0 <= loc < info["num_pages"], f"rank {r}: location {loc}")
                    bound[loc] = k
            # No page both free and held: take every free page with new keys.
            n = info["free"]
            fresh = keys(n, f"fresh/{when}/{r}")
            if n:
                body = ok(c.batch_allocate(r, fresh), 200, f"batch_allocate ({n} fresh) rank {r}")
                pages = [p for _, p in body["results"]]
                self.assertNotIn(-1, pages, f"rank {r}: {n} free pages reported, not all allocatable; {ctx}")
                self.assertEqual(len(set(pages)), n, f"rank {r}: a free page handed out twice; {ctx}")
                clash = (set(pages) & set(held.values())) | (set(pages) & set(bound))
                self.assertFalse(clash, f"rank {r}: pages {sorted(clash)[:10]} were free and held; {ctx}")
                self.assertTrue(all(0 <= p < info["num_pages"] for p in pages))
            after = ok(c.rank_info(r), 200, "GET /rank")
            self.assertEqual(after, dict(info, free=0, reserved=info["reserved"] + n), f"rank {r}; {ctx}")
            body = ok(c.batch_allocate(r, [key(0, f"one-more/{when}/{r}")]), 200, "batch_allocate")
            self.assertEqual(body["results"][0][1], -1, f"rank {r}: a page beyond the free count; {ctx}")
            if n:
                ok(c.confirm_write(r, [], pages), 204, f"release {n} fresh pages, rank {r}")
            self.assertEqual(ok(c.rank_info(r), 200, "GET /rank"), info, f"rank {r}; {ctx}")
        if all_keys:
            exists = ok(c.batch_exists(all_keys), 200, "batch_exists")["exists"]
            for k, e in zip(all_keys, exists):
                if led.complete_acked(k):
                    self.assertTrue(e, f"acknowledged complete key {k} does not exist; {ctx}")
                elif len(led.confirm_sent.get(k, ())) < tp:
                    self.assertFalse(e, f"key {k} exists, confirmed on only "
                                        f"{sorted(led.confirm_sent.get(k, ()))}; {ctx}")


# --- 3. snapshots ----------------------------------------------------------------------------

class SnapshotTest(DurabilityCase):

    def traffic(self, m, ranks, tag, ops, rng):
        for i in range(ops):
            ks = keys(8, f"{tag}/{i}")
            choice = rng.random()
            if choice < 0.6:
                for r in ranks:
                    m.save(r, ks)
            elif choice < 0.8:
                m.write_failure(rng.choice(ranks), ks)
            else:
                m.allocate(rng.choice(ranks), ks)

    def test_segments_and_snapshots(self):
        seed = pick_seed("snapshots")
        rng = random.Random(seed)
        data = self.tmpdir()
        server = self.start(data, 2, "--snapshot-log-bytes", "4096")
        m = Mirror(self, server)
        self.addCleanup(m.close)
        ranks = [1, -2, 5]
        for r in ranks:
            m.init(r, 4096)
        # Snapshots start on the cores' periodic tick (~250 ms): traffic in steps spread
        # over a few seconds, until some core has written a third snapshot.
        seen_snaps = set()
        names = set()
        per_core = {}
        deadline = time.monotonic() + 8
        step = 0
        while not any(len(s) >= 3 for s in per_core.values()) and time.monotonic() < deadline:
            self.traffic(m, ranks, f"s{step}", 6, rng)
            step += 1
            for _ in range(4):
                time.sleep(0.1)
                files = data_files(data)
                names |= {os.path.basename(p) for p in files.values()}
                seen_snaps |= {(c, seg) for (c, kind, seg) in files if kind == "snap"}
            for c, seg in seen_snaps:
                per_core.setdefault(c, set()).add(seg)
        self.assertTrue(any(len(s) >= 3 for s in per_core.values()),
                        f"no core reached a third snapshot: snapshots seen {sorted(seen_snaps)}; files {sorted(names)}")
        # The log is truncated behind the snapshots: a few files per core, not all.
        deadline = time.monotonic() + 3
        while True:
            files = data_files(data)
            counts = {}
            for (c, kind, _seg) in files:
                counts[(c, kind)] = counts.get((c, kind), 0) + 1
            if max(counts.values()) <= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertLessEqual(max(counts.values()), 2, f"old segments kept: {sorted(files)}")
        m.verify()
        self.crash(server)
        server = self.start(data, 3, "--snapshot-log-bytes", "4096")
        m.attach(server)
        m.verify()
        self.traffic(m, ranks, "after-crash", 10, rng)
        self.stop(server)
        server = self.start(data, 1)
        m.attach(server)
        m.verify()
        self.stop(server)


# --- 4. torn and corrupt logs -------------------------------------------------------------

class LogDamageTest(DurabilityCase):

    def populate(self, m, tag, ranks=(4, -4)):
        for r in ranks:
            m.init(r, 256)
        ks = keys(3, tag)
        for r in ranks:
            m.save(r, ks)
        m.allocate(ranks[0], keys(2, tag + "/reserved"))
        m.write_failure(ranks[-1], keys(2, tag + "/failed"))

    def populated_and_stopped(self, tag):
        """A data directory holding populate()'s state, its server stopped: (dir, mirror)."""
        data = self.tmpdir()
        server = self.start(data, 1)
        m = Mirror(self, server)
        self.addCleanup(m.close)
        self.populate(m, tag)
        self.stop(server)
        return data, m

    def test_torn_tail_is_dropped_with_a_warning(self):
        data = self.tmpdir()
        server = self.start(data, 1)
        m = Mirror(self, server)
        self.addCleanup(m.close)
        variants = {
            "a few garbage bytes": lambda whole, first: b"\x17\x00\x00",
            "a truncated record": lambda whole, first: first[:8 + (len(first) - 8) // 2],
            "a whole record with a bad checksum": lambda whole, first: first[:-1] + bytes([first[-1] ^ 1]),
        }
        for i, (name, make) in enumerate(variants.items()):
            self.populate(m, f"torn{i}")
            self.stop(server)
            log = newest(data, "log")
            offsets, size = frames(log)
            self.assertGreaterEqual(len(offsets), 2, f"{log}: {offsets}")
            with open(log, "rb") as f:
                whole = f.read()
            first = whole[:offsets[0][1]]
            append_bytes(log, make(whole, first))
            server = self.start(data, 1)
            m.attach(server)
            base = os.path.basename(log)
            self.assertTrue(any(base in line and re.search(r"torn", line, re.I) for line in server.stderr_lines),
                            f"{name}: no warning naming {base}:\n{server.log()}")
            m.verify()
        self.stop(server)
        server = self.start(data, 2)
        m.attach(server)
        m.verify()
        self.stop(server)

    def assert_refused(self, data, path, offset, what):
        code, err, started = run_to_exit(["--data-dir", data, "--threads", "1"])
        self.assertFalse(started, f"{what}: the server started on a corrupt {path}:\n{err}")
        self.assertIsNotNone(code)
        self.assertGreater(code, 0, f"{what}: exit code {code} (want a clean non-zero exit):\n{err}")
        self.assertIn(os.path.basename(path), err, f"{what}: the message does not name the file:\n{err}")
        self.assertRegex(err, rf"offset\D{{0,3}}{offset}\b", f"{what}: the message does not name offset {offset}")

    def test_corrupt_record_stops_start_up(self):
        data, m = self.populated_and_stopped("corrupt")
        log = newest(data, "log")
        offsets, _ = frames(log)
        self.assertGreaterEqual(len(offsets), 3, f"{log}: {offsets}")
        for which in (0, 1):
            start, length = offsets[which]
            where = start + 8 + (length - 8) // 2  # inside the payload
            old = flip_byte(log, where)
            self.assert_refused(data, log, start, f"record {which} of the log")
            put_byte(log, where, old)
        # The refused starts changed nothing.
        server = self.start(data, 1)
        m.attach(server)
        m.verify()
        self.stop(server)
        # The same for the first record of a snapshot.
        snap = newest(data, "snap")
        offsets, _ = frames(snap)
        self.assertGreaterEqual(len(offsets), 3, f"{snap}: {offsets}")
        where = offsets[0][0] + 9
        old = flip_byte(snap, where)
        self.assert_refused(data, snap, 0, "record 0 of the snapshot")
        put_byte(snap, where, old)
        server = self.start(data, 2)
        m.attach(server)
        m.verify()
        self.stop(server)

    def test_damaged_length_in_the_middle_stops_start_up(self):
        """A length field damaged mid-log (huge, or past the end of the file) is not a
        torn tail: the records after it were acknowledged."""
        data, m = self.populated_and_stopped("length")
        log = newest(data, "log")
        offsets, size = frames(log)
        self.assertGreaterEqual(len(offsets), 3, f"{log}: {offsets}")
        start, _ = offsets[1]
        with open(log, "rb") as f:
            f.seek(start)
            old = f.read(4)
        for what, length in (("huge", 0x7FFFFFFF), ("past the end", size)):
            with open(log, "r+b") as f:
                f.seek(start)
                f.write(struct.pack("<I", length))
            self.assert_refused(data, log, start, f"a {what} length in record 1")
        with open(log, "r+b") as f:
            f.seek(start)
            f.write(old)
        server = self.start(data, 1)
        m.attach(server)
        m.verify()
        self.stop(server)

    def test_torn_write_in_an_earlier_segment_stops_start_up(self):
        """Only a core's last log segment may end in a torn write: a segment is complete
        before the next one is created."""
        data, m = self.populated_and_stopped("segment")
        log = newest(data, "log")
        offsets, size = frames(log)
        with open(log, "rb") as f:
            whole = f.read()
        first = whole[:offsets[0][1]]  # a rank initialization: replaying it again is harmless
        later = re.sub(r"log-(\d+)$", lambda g: f"log-{int(g.group(1)) + 1}", log)
        with open(later, "wb") as f:
            f.write(first)
        append_bytes(log, first[:len(first) // 2])
        self.assert_refused(data, log, size, "a torn record in a segment that is not the last")
        os.truncate(log, size)
        server = self.start(data, 1)
        m.attach(server)
        m.verify()
        self.stop(server)

    def test_missing_current_stops_start_up_and_deletes_nothing(self):
        data, m = self.populated_and_stopped("current")
        current = os.path.join(data, "CURRENT")
        with open(current) as f:
            committed = f.read()

        def listing():
            return sorted((root, tuple(sorted(files))) for root, _, files in os.walk(data))

        before = listing()
        for what, text in (("missing", None), ("empty", ""), ("garbage", "g7\n"),
                           ("zero", "0\n")):
            with self.subTest(current=what):
                if text is None:
                    os.remove(current)
                else:
                    with open(current, "w") as f:
                        f.write(text)
                code, err, started = run_to_exit(["--data-dir", data, "--threads", "1"])
                self.assertFalse(started, f"started with CURRENT {what}:\n{err}")
                self.assertGreater(code, 0, err)
                self.assertIn("CURRENT", err)
                self.assertIn(f"echo {committed.strip()} >", err)  # says how to mend it
                after = [entry for entry in listing() if entry[0] == data or "/g" in entry[0]]
                self.assertEqual([e for e in after if e[0] != data],
                                 [e for e in before if e[0] != data], "a start deleted files")
        with open(current, "w") as f:
            f.write(committed)
        server = self.start(data, 2)
        m.attach(server)
        m.verify()
        self.stop(server)

    def verify_dir(self, data):
        binary = os.environ["METAD_BIN"]
        run = subprocess.run([binary, "--verify-data-dir", data], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=START_TIMEOUT_S)
        return run.returncode, run.stdout + run.stderr

    def test_verify_data_dir_reports_the_state_or_the_damage(self):
        data = self.tmpdir()
        server = self.start(data, 2)
        m = Mirror(self, server)
        self.addCleanup(m.close)
        self.populate(m, "verify")
        stats = requests.get(server.base_url + "/stats", timeout=10).json()
        code, out = self.verify_dir(data)
        self.assertEqual(code, 1, out)
        self.assertIn("in use by a running hf3fs-metad", out)
        self.stop(server)
        code, out = self.verify_dir(data)
        self.assertEqual(code, 0, out)
        rows = stats["ranks"]
        self.assertIn(f"ranks {len(rows)}, pages {sum(r['num_pages'] for r in rows)}, "
                      f"bound {sum(r['bound'] for r in rows)}, "
                      f"reserved {sum(r['reserved'] for r in rows)}", out)
        self.assertIn(f"keys {stats['keys']} (complete {stats['keys'] - stats['incomplete_keys']}, "
                      f"incomplete {stats['incomplete_keys']})", out)
        log = newest(data, "log")
        offsets, _ = frames(log)
        start, length = offsets[1]
        old = flip_byte(log, start + 8 + (length - 8) // 2)
        code, out = self.verify_dir(data)
        self.assertEqual(code, 1, out)
        self.assertIn(os.path.basename(log), out)
        self.assertRegex(out, rf"offset\D{{0,3}}{start}\b")
        put_byte(log, start + 8 + (length - 8) // 2, old)
        self.assertEqual(self.verify_dir(data)[0], 0)
        # Verifying wrote nothing: the server starts on the same generation and state.
        server = self.start(data, 1)
        m.attach(server)
        m.verify()
        self.stop(server)

    def test_corrupt_last_snapshot_record_is_not_silently_dropped(self):
        """A snapshot is written whole (temporary file, fsync, rename): a bad last record
        is damage, not a torn write, and dropping it would lose acknowledged state."""
        data = self.tmpdir()
        server = self.start(data, 1)
        m = Mirror(self, server)
        self.addCleanup(m.close)
        m.init(11, 64)
        m.save(11, keys(4, "snap-last"))   # tp_world_size 1
        m.init(12, 64)                     # now 2 workers: a guessed tp would be wrong
        self.stop(server)
        server = self.start(data, 1)       # the state is now in the snapshot
        self.stop(server)
        snap = newest(data, "snap")
        offsets, _ = frames(snap)
        self.assertGreaterEqual(len(offsets), 3)
        start, length = offsets[-1]
        flip_byte(snap, start + 8 + (length - 8) // 2)
        code, err, started = run_to_exit(["--data-dir", data, "--threads", "1"])
        if not started:
            self.assertGreater(code, 0, err)
            self.assertIn(os.path.basename(snap), err)
            return
        # It started: then nothing acknowledged may be missing.
        server = self.start(data, 1)
        m.attach(server)
        try:
            m.verify()
        except AssertionError as e:
            raise AssertionError(f"started on a snapshot whose last record was damaged, and lost "
                                 f"state:\n{e}\nthat start's stderr:\n{err}") from None
        self.stop(server)


# --- 5. disk full --------------------------------------------------------------------------

class DiskFull:
    """A small tmpfs for the data directory (root), else RLIMIT_FSIZE on the server."""

    def __init__(self, tc):
        self.tc = tc
        self.root = tc.tmpdir()
        self.mounted = not os.environ.get("METAD_DUR_NO_MOUNT") and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", self.root],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
        if self.mounted:
            tc.addCleanup(subprocess.run, ["umount", "-l", self.root])
        self.data = os.path.join(self.root, "data")
        self.filler = os.path.join(self.root, "filler")
        if not self.mounted:
            note("mount -t tmpfs failed: disk full via RLIMIT_FSIZE (no recovery part)")

    def preexec(self):
        if self.mounted:
            return None
        limit = 16 * 1024

        def apply():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        return apply

    def fill(self):
        if not self.mounted:
            return
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for size in (65536, 4096, 1):  # until not even a byte fits
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError as e:
                    self.tc.assertEqual(e.errno, errno.ENOSPC, e)
        finally:
            os.close(fd)

    def free(self):
        os.unlink(self.filler)


class DiskFullTest(DurabilityCase):

    BIG = 600  # keys: an allocate record of ~22 KB, more than any slack, over RLIMIT_FSIZE

    def setup_state(self, m):
        m.init(5, 4096)
        m.init(6, 64)
        a = keys(4, "df/a")
        m.save(5, a)
        m.save(6, a)
        self.reserved = keys(3, "df/reserved")
        self.reserved_pages = m.allocate(5, self.reserved)
        m.allocate(6, keys(2, "df/reserved6"))
        m.verify()

    def refused_requests(self, m):
        """Every mutating request shape, each refused with 503; the reads still answer
        exactly as before (the model is not told about refused requests)."""
        c = m.client
        attempts = [
            ("initialize a new rank", lambda: c.initialize(9, 16)),
            ("grow a rank", lambda: c.initialize(6, 128)),
            ("allocate new keys", lambda: c.batch_allocate(5, keys(3, "df/new"))),
            ("confirm reserved keys", lambda: c.confirm_write(5, list(zip(self.reserved, self.reserved_pages)))),
            ("release reserved pages", lambda: c.confirm_write(5, [], self.reserved_pages)),
            ("allocate a big batch", lambda: c.batch_allocate(5, keys(self.BIG, "df/big2"))),
        ]
        for what, attempt in attempts:
            self.assert_storage_unavailable(attempt(), what)
            m.rank_info(5)
            m.rank_info(6)
            self.assertEqual(m.send("GET", "/rank/9").status_code, 404, f"after {what}")
            m.locations(5, m.keys)
            m.exists(m.keys)

    def test_first_refused_write_changes_nothing(self):
        disk = DiskFull(self)
        server = self.start(disk.data, 1, preexec_fn=disk.preexec())
        m = Mirror(self, server)
        self.addCleanup(m.close)
        self.setup_state(m)
        disk.fill()
        r = m.send("POST", "/keys/batch_allocate", {"rank": 5, "keys": keys(self.BIG, "df/big")})
        self.assert_storage_unavailable(r, "the first write after the disk filled")
        # 503 "nothing was changed": the counts, locations, existence.
        m.verify(read_only=True)
        self.assertTrue(server.alive())

    def test_refuses_writes_serves_reads_recovers(self):
        disk = DiskFull(self)
        server = self.start(disk.data, 1, preexec_fn=disk.preexec())
        m = Mirror(self, server)
        self.addCleanup(m.close)
        # A scratch rank for the request that discovers the full disk (that one is
        # test_first_refused_write_changes_nothing's business); the model knows the rank
        # exists (it counts toward tp_world_size) but not what that request did to it.
        m.init(99, 4096)
        self.setup_state(m)
        disk.fill()
        r = m.send("POST", "/keys/batch_allocate", {"rank": 99, "keys": keys(self.BIG, "df/big")})
        self.assert_storage_unavailable(r, "the first write after the disk filled")
        self.refused_requests(m)
        m.verify(skip_ranks={99}, read_only=True)
        self.assertTrue(server.alive(), server.log()[-2000:])
        if not disk.mounted:
            self.stop(server)
            self.skipTest("RLIMIT_FSIZE cannot be lifted: the recovery part needs a tmpfs")
        disk.free()
        # Writes succeed again within a few seconds; refused attempts change nothing.
        late = keys(2, "df/late")
        deadline = time.monotonic() + 5
        while True:
            r = m.send("POST", "/keys/batch_allocate", {"rank": 5, "keys": [[k, ""] for k in late]})
            if r.status_code != 503:
                break
            self.assertLess(time.monotonic(), deadline, "writes still refused 5 s after space returned")
            time.sleep(0.1)
        self.assertEqual(r.status_code, 200, r.content)
        got = m.allocate(5, late)  # now through the model: must be the same pages (hits)
        self.assertEqual(got, [p for _, p in r.json()["results"]])
        m.save(6, keys(2, "df/after"))
        m.save(5, keys(2, "df/after"))
        self.assertEqual(m.init(13, 8)[0], 200)
        m.verify(skip_ranks={99})
        self.crash(server)
        server = self.start(disk.data, 2)
        m.attach(server)
        m.verify(skip_ranks={99})
        self.assertEqual(m.send("GET", "/rank/9").status_code, 404, "a refused initialize came back")
        self.stop(server)


class NearlyFullRestartTest(DurabilityCase):
    """kill -9 with the disk nearly full, then a restart (issue 30, finding 9): start-up
    writes a new generation, room the running server never needed. The last run's logs
    had reserved room past their ends (fallocate, 16 MiB chunks) that a crash leaves
    allocated: start-up gives it back first, so the restart starts. Where the new
    generation still does not fit, start-up says exactly how much room it needs, and
    starts once that much is freed."""

    def test_kill9_on_a_nearly_full_disk_then_restart(self):
        root = self.tmpdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", root],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
            self.skipTest("mount -t tmpfs failed (needs root)")
        self.addCleanup(subprocess.run, ["umount", "-l", root])
        data = os.path.join(root, "data")
        server = self.start(data, 1)
        m = Mirror(self, server)
        self.addCleanup(m.close)
        build_state(self, m)
        m.verify()
        self.crash(server)
        # Fill the file system: not even a byte fits.
        disk = DiskFull.__new__(DiskFull)
        disk.tc, disk.root, disk.mounted = self, root, True
        disk.filler = os.path.join(root, "filler")
        disk.fill()
        server = self.start(data, 1)
        m.attach(server)
        m.verify(read_only=True)
        self.assertRegex(server.log(), r"recovery: \d+ bytes the last run's logs had reserved "
                                       r"given back")
        self.crash(server)  # before any write: the new log has reserved nothing yet

        # A restart on another core count cannot hard-link the snapshot: it needs room.
        os.unlink(disk.filler)
        disk.fill()
        code, err, started = run_to_exit(("--data-dir", data, "--threads", "2"))
        self.assertFalse(started, err)
        self.assertEqual(code, 1, err)
        found = re.search(r"no room for the new generation g\d+ in .*: its files need "
                          r"(\d+) bytes and (\d+) are free; free at least (\d+) more bytes", err)
        self.assertTrue(found, err)
        self.assertIn("nothing is lost", err)
        more = int(found.group(3))
        self.assertGreater(more, 0)
        # Exactly that much freed, it starts, state intact.
        size = os.path.getsize(disk.filler)
        os.truncate(disk.filler, max(0, size - more))
        server = self.start(data, 2)
        m.attach(server)
        m.verify(read_only=True)
        self.stop(server)


# --- 6. --durability none ----------------------------------------------------------------

class NoSyncTest(DurabilityCase):

    def test_durability_none_survives_clean_restart(self):
        data = self.tmpdir()
        server = self.start(data, 2, "--durability", "none")
        m = Mirror(self, server)
        self.addCleanup(m.close)
        build_state(self, m)
        self.stop(server)
        server = self.start(data, 3, "--durability", "none")
        m.attach(server)
        m.verify()
        m.save(7, keys(3, "none/after"))
        self.stop(server)
        server = self.start(data, 1)
        m.attach(server)
        m.verify()
        self.stop(server)


class FlushMetricsTest(DurabilityCase):

    def test_group_commits_show_in_the_metrics(self):
        server = self.start(self.tmpdir(), 2)
        base = server.base_url
        self.assertEqual(requests.post(base + "/rank/0/initialize", data='{"num_pages":8}').status_code, 200)
        self.assertEqual(requests.post(base + "/keys/batch_allocate",
                                       data='{"rank":0,"keys":["a","b"]}').status_code, 200)
        text = requests.get(base + "/metrics").text
        count = re.search(r"^hf3fs_metad_log_flush_seconds_count (\d+)$", text, re.M)
        self.assertIsNotNone(count, text)
        self.assertGreaterEqual(int(count.group(1)), 2, "one group commit per mutating request here")
        self.assertRegex(text, r"(?m)^hf3fs_metad_log_flush_failures_total 0$")
        self.stop(server)


# --- 7. one server per directory ---------------------------------------------------------

class LockTest(DurabilityCase):

    def test_second_server_on_the_same_directory_fails(self):
        data = self.tmpdir()
        server = self.start(data, 1)
        m = Mirror(self, server)
        self.addCleanup(m.close)
        m.init(1, 8)
        m.save(1, keys(2, "lock"))
        code, err, started = run_to_exit(["--data-dir", data, "--threads", "1"])
        self.assertFalse(started, f"a second server started on {data}:\n{err}")
        self.assertGreater(code, 0, err)
        self.assertIn(data, err, "the message does not name the directory")
        self.assertRegex(err, r"(?i)in use|lock|another", "the message does not say why")
        # The first is unharmed, before and after a restart.
        m.verify()
        m.save(1, keys(2, "lock/2"))
        self.stop(server)
        server = self.start(data, 2)
        m.attach(server)
        m.verify()
        self.stop(server)


if __name__ == "__main__":
    unittest.main()
