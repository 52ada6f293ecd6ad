#!/usr/bin/python3
"""Soak: mixed vLLM connector traffic on 256+ keep-alive connections for a bounded time.

Starts hf3fs-metad (or targets --url), initialises every engine's TP worker ranks, then
runs, per engine, one scheduler connection (batch_exists over a prompt's keys) and, per
TP worker, a save connection (batch_allocate → confirm_write, or release on a simulated
write failure) and a load connection (get_locations). Keys come from one shared space
with a skewed popularity (common prefixes), so hits, duplicates and exhaustion happen.

Every answer is checked as it arrives — status, shape, and against a mirror of what each
worker holds (a page handed out is never held by another key of that rank; a key this
rank holds keeps its page; a location is the page the worker confirmed) — and anything
unexpected counts as an error. Reports requests, errors (must be 0) and the server's
VmRSS at start, after warm-up and at the end, then ends with the page invariant check:
for every rank free + reserved + bound == num_pages and the counts equal the mirror, and
get_locations over every key used shows no page at two keys.

    /usr/bin/python3 bench/soak/soak.py --binary build/hf3fs-metad --seconds 60
    /usr/bin/python3 bench/soak/soak.py --binary build/hf3fs-metad --minutes 30 --connections 512

Exit status 0 only with zero errors and a clean invariant check. Standard library only.
"""

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")
IO_TIMEOUT_S = 30.0


# --- the server ----------------------------------------------------------------------

class Server:
    def __init__(self, binary, threads, io, pages_max):
        # info prints the listening line. The mirror holds a page until this client
        # releases it: stale-key reclamation, which frees the pages of keys a failed save
        # left incomplete once --incomplete-grace-ms has passed, is off (the lifecycle
        # tests cover it).
        args = [binary, "--port", "0", "--log-level", "info", "--incomplete-grace-ms", "0"]
        if threads:
            args += ["--threads", str(threads)]
        if io:
            args += ["--io", io]
        if pages_max:
            args += ["--pages-per-rank-max", str(pages_max)]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self.tail = []
        self.port = None
        ready = threading.Event()

        def drain():
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace").rstrip()
                self.tail = (self.tail + [line])[-50:]
                m = LISTENING.search(line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(15) or self.port is None:
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "\n".join(self.tail))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


# --- a minimal HTTP/1.1 keep-alive client ------------------------------------------------

class Conn:
    def __init__(self, host, port):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def open(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 24)

    def close(self):
        if self.writer:
            self.writer.close()

    async def request(self, method, path, obj=None):
        body = b"" if obj is None else json.dumps(obj, separators=(",", ":")).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nConnection: keep-alive\r\n"
        if method == "POST":
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        return await asyncio.wait_for(self._response(), IO_TIMEOUT_S)

    async def _response(self):
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        body = await self.reader.readexactly(length) if length else b""
        return status, (json.loads(body) if body else None)


# --- the workload --------------------------------------------------------------------------

class Stats:
    def __init__(self):
        self.requests = {}
        self.errors = 0
        self.error_samples = []
        self.pages_served = 0
        self.pages_refused = 0
        self.hits = 0
        self.write_failures = 0
        self.found = 0

    def count(self, what):
        self.requests[what] = self.requests.get(what, 0) + 1

    def error(self, text):
        self.errors += 1
        if len(self.error_samples) < 20:
            self.error_samples.append(text)


class Worker:
    """One TP rank's mirror: what this worker holds on the server (only its own save
    connection changes that rank, so the mirror is exact between its requests)."""

    def __init__(self, rank, num_pages):
        self.rank = rank
        self.num_pages = num_pages
        self.page_of = {}  # key → page (reserved or confirmed)
        self.key_of = {}  # page → key
        self.confirmed = set()


class Soak:
    def __init__(self, args, port):
        self.args = args
        self.port = port
        self.stats = Stats()
        self.rng = random.Random(args.seed)
        self.keys = [f"{self.rng.getrandbits(128):032x}" for _ in range(args.keys)]
        self.used = set()
        tp = args.tp
        per_engine = 1 + 2 * tp
        self.engines = max(1, -(-args.connections // per_engine))
        self.workers = [[Worker(e * 1000 + i, args.pages) for i in range(tp)] for e in range(self.engines)]
        self.deadline = 0.0

    def prompt(self, rng, n):
        """A prompt's block keys: a popular shared prefix, then a less popular tail."""
        start = int(rng.paretovariate(1.2) * 4) % len(self.keys)
        keys = [self.keys[(start + i * 7) % len(self.keys)] for i in range(n)]
        self.used.update(keys)
        return keys

    def check(self, ok, what):
        if not ok:
            self.stats.error(what)
        return ok

    async def save_loop(self, worker, seed):
        rng = random.Random(seed)
        conn = Conn("127.0.0.1", self.port)
        await conn.open()
        try:
            while time.monotonic() < self.deadline:
                keys = self.prompt(rng, rng.randint(8, 128))
                status, body = await conn.request("POST", "/keys/batch_allocate",
                                                  {"rank": worker.rank, "keys": [[k, ""] for k in keys]})
                self.stats.count("batch_allocate")
                distinct = list(dict.fromkeys(keys))
                if not self.check(status == 200 and body["rank"] == worker.rank
                                  and [k for k, _ in body["results"]] == distinct,
                                  f"allocate rank {worker.rank}: {status} {str(body)[:200]}"):
                    continue
                task, hits = [], []
                for key, page in body["results"]:
                    if page == -1:
                        self.stats.pages_refused += 1
                        self.check(key not in worker.page_of, f"rank {worker.rank}: held key {key} got -1")
                        continue
                    if not self.check(0 <= page < worker.num_pages, f"rank {worker.rank}: page {page} out of range"):
                        continue
                    held = worker.page_of.get(key)
                    if held is not None:
                        self.check(held == page, f"rank {worker.rank}: key {key} moved from page {held} to {page}")
                        if key in worker.confirmed:
                            self.stats.hits += 1
                            hits.append(page)
                            continue  # a cache hit: nothing to write
                    else:
                        owner = worker.key_of.get(page)
                        self.check(owner is None, f"rank {worker.rank}: page {page} handed to {key} "
                                                  f"while held by {owner}")
                        worker.page_of[key] = page
                        worker.key_of[page] = key
                        self.stats.pages_served += 1
                    task.append([key, page])
                await asyncio.sleep(0)  # "write the pages"
                if rng.random() < self.args.write_failure:
                    self.stats.write_failures += 1
                    # Like vLLM's connector, release every page of the task, cache hits
                    # included: the server must keep the hits (they are bound).
                    body = {"rank": worker.rank, "confirmations": [],
                            "pages_to_release": [p for _, p in task] + hits}
                    for key, page in task:
                        if key not in worker.confirmed:
                            del worker.page_of[key]
                            del worker.key_of[page]
                else:
                    body = {"rank": worker.rank, "confirmations": task, "pages_to_release": []}
                    worker.confirmed.update(k for k, _ in task)
                status, answer = await conn.request("POST", "/keys/confirm_write", body)
                self.stats.count("confirm_write")
                self.check(status == 204, f"confirm rank {worker.rank}: {status} {str(answer)[:200]}")
        finally:
            conn.close()

    async def load_loop(self, worker, seed):
        rng = random.Random(seed)
        conn = Conn("127.0.0.1", self.port)
        await conn.open()
        try:
            while time.monotonic() < self.deadline:
                keys = self.prompt(rng, rng.randint(8, 128))
                status, body = await conn.request("POST", "/keys/get_locations", {"rank": worker.rank, "keys": keys})
                self.stats.count("get_locations")
                if not self.check(status == 200 and len(body["locations"]) == len(keys),
                                  f"locations rank {worker.rank}: {status} {str(body)[:200]}"):
                    continue
                for key, page in zip(keys, body["locations"]):
                    if page is not None:
                        self.stats.found += 1
                        self.check(worker.page_of.get(key) == page,
                                   f"rank {worker.rank}: location of {key} is {page}, "
                                   f"the worker holds {worker.page_of.get(key)}")
        finally:
            conn.close()

    async def scheduler_loop(self, seed):
        rng = random.Random(seed)
        conn = Conn("127.0.0.1", self.port)
        await conn.open()
        try:
            while time.monotonic() < self.deadline:
                keys = self.prompt(rng, rng.randint(16, 1250))
                status, body = await conn.request("POST", "/keys/batch_exists", {"keys": keys})
                self.stats.count("batch_exists")
                self.check(status == 200 and len(body["exists"]) == len(keys)
                           and all(isinstance(x, bool) for x in body["exists"]),
                           f"exists: {status} {str(body)[:200]}")
        finally:
            conn.close()

    async def setup(self):
        conn = Conn("127.0.0.1", self.port)
        await conn.open()
        try:
            status, _ = await conn.request("POST", "/clear", {})
            self.check(status == 204, f"clear: {status}")
            for engine in self.workers:
                status, _ = await conn.request("POST", "/rank/0/initialize", {"num_pages": 0, "role": "scheduler"})
                self.check(status == 200, f"scheduler init: {status}")
                for w in engine:
                    status, body = await conn.request("POST", f"/rank/{w.rank}/initialize",
                                                      {"num_pages": w.num_pages, "role": "worker"})
                    self.check(status == 200, f"init rank {w.rank}: {status} {body}")
        finally:
            conn.close()

    async def traffic(self, seconds):
        self.deadline = time.monotonic() + seconds
        tasks = []
        seed = self.args.seed * 7919
        for e, engine in enumerate(self.workers):
            tasks.append(self.scheduler_loop(seed + e))
            for i, w in enumerate(engine):
                tasks.append(self.save_loop(w, seed + 100000 + e * 100 + i))
                tasks.append(self.load_loop(w, seed + 200000 + e * 100 + i))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                self.stats.error(f"connection failed: {type(r).__name__}: {r}")
        return len(tasks)

    async def final_check(self):
        """The page invariant through the API, on every rank."""
        conn = Conn("127.0.0.1", self.port)
        await conn.open()
        problems = []
        used = sorted(self.used)
        try:
            for engine in self.workers:
                for w in engine:
                    status, info = await conn.request("GET", f"/rank/{w.rank}")
                    if status != 200:
                        problems.append(f"rank {w.rank}: GET /rank answered {status}")
                        continue
                    if info["free"] + info["reserved"] + info["bound"] != info["num_pages"]:
                        problems.append(f"rank {w.rank}: counts do not add up: {info}")
                    if not 0 <= info.pop("incomplete", -1) <= info["bound"]:
                        problems.append(f"rank {w.rank}: incomplete pages out of range")
                    mirror = {"num_pages": w.num_pages, "free": w.num_pages - len(w.page_of),
                              "reserved": len(w.page_of) - len(w.confirmed), "bound": len(w.confirmed)}
                    if info != mirror:
                        problems.append(f"rank {w.rank}: server {info} != client mirror {mirror}")
                    seen = {}
                    for i in range(0, len(used), 2000):
                        batch = used[i:i + 2000]
                        status, body = await conn.request("POST", "/keys/get_locations",
                                                          {"rank": w.rank, "keys": batch})
                        if status != 200:
                            problems.append(f"rank {w.rank}: get_locations answered {status}")
                            break
                        for key, page in zip(batch, body["locations"]):
                            if page is None:
                                continue
                            if page in seen:
                                problems.append(f"rank {w.rank}: page {page} at two keys: {seen[page]}, {key}")
                            seen[page] = key
                            if w.page_of.get(key) != page:
                                problems.append(f"rank {w.rank}: key {key} at page {page}, mirror says "
                                                f"{w.page_of.get(key)}")
        finally:
            conn.close()
        return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", help="hf3fs-metad to start (default: $METAD_BIN)")
    ap.add_argument("--url", help="use a running server at http://127.0.0.1:PORT instead")
    ap.add_argument("--pid", type=int, help="with --url: the server's pid, for VmRSS")
    ap.add_argument("--minutes", type=float)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--connections", type=int, default=256)
    ap.add_argument("--tp", type=int, default=4, help="TP workers per engine")
    ap.add_argument("--pages", type=int, default=1024, help="pages per worker rank")
    ap.add_argument("--keys", type=int, default=50000, help="size of the shared key space")
    ap.add_argument("--write-failure", type=float, default=0.05, help="share of save tasks that fail")
    ap.add_argument("--threads", type=int, default=0, help="server --threads (default: its own)")
    ap.add_argument("--io", choices=["auto", "uring", "epoll"], default=None)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    seconds = args.seconds if args.seconds is not None else (args.minutes or 1.0) * 60

    server = None
    if args.url:
        port = int(args.url.rsplit(":", 1)[1].strip("/"))
        pid = args.pid
    else:
        binary = args.binary or os.environ.get("METAD_BIN")
        if not binary:
            ap.error("--binary or METAD_BIN or --url is required")
        server = Server(binary, args.threads, args.io, None)
        port, pid = server.port, server.proc.pid

    soak = Soak(args, port)
    ok = False
    try:
        asyncio.run(soak.setup())
        rss_start = rss_kib(pid) if pid else None
        warm = min(10.0, seconds / 5)
        print(f"soak: {soak.engines} engines x (1 scheduler + {args.tp} workers x 2) connections, "
              f"{args.pages} pages per rank, {args.keys} keys, {seconds:.0f} s; server VmRSS at start "
              f"{rss_start} KiB", flush=True)
        samples = []
        stop_sampling = threading.Event()

        def sample():
            while not stop_sampling.wait(1.0):
                samples.append((time.monotonic(), rss_kib(pid) if pid else None))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        began = time.monotonic()
        connections = asyncio.run(soak.traffic(seconds))
        elapsed = time.monotonic() - began
        stop_sampling.set()
        sampler.join()
        rss_end = rss_kib(pid) if pid else None
        after_warm = [r for t, r in samples if t - began >= warm and r is not None]
        rss_warm = after_warm[0] if after_warm else None
        rss_max = max((r for _, r in samples if r is not None), default=None)
        problems = asyncio.run(soak.final_check())
        total = sum(soak.stats.requests.values())
        s = soak.stats
        print(f"soak: {connections} connections, {total} requests in {elapsed:.1f} s "
              f"({total / elapsed:.0f}/s): " + ", ".join(f"{k} {v}" for k, v in sorted(s.requests.items())))
        print(f"soak: pages served {s.pages_served}, refused (-1) {s.pages_refused}, hits {s.hits}, "
              f"failed writes {s.write_failures}, locations found {s.found}")
        print(f"soak: server VmRSS KiB: start {rss_start}, after {warm:.0f} s warm-up {rss_warm}, "
              f"max {rss_max}, end {rss_end}")
        print(f"soak: errors {s.errors}")
        for text in s.error_samples:
            print(f"  error: {text}")
        if problems:
            print(f"soak: invariant check FAILED ({len(problems)} problems)")
            for p in problems[:20]:
                print(f"  {p}")
        else:
            ranks = sum(len(e) for e in soak.workers)
            print(f"soak: invariant check passed on {ranks} ranks ({len(soak.used)} keys checked per rank)")
        ok = s.errors == 0 and not problems
    finally:
        if server:
            code = server.stop()
            if code != 0:
                print(f"soak: server exit code {code} after SIGTERM; stderr tail:\n" + "\n".join(server.tail))
                ok = False
    print("soak: PASS" if ok else "soak: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
