#!/usr/bin/env python3
"""Instructions per request of the --quick rows under callgrind: a deterministic A/B for
a machine too noisy for throughput (a shared 2-vCPU host varies by +-30% run to run).

  bench/callgrind_rows.py BINARY [--shapes hex32,hex64] [--token T] [--sglang]
                          [-- SERVER FLAGS...]

Starts BINARY under `valgrind --tool=callgrind --instr-atstart=no` on one core with
`--io epoll` (valgrind does not follow io_uring), fills two vLLM ranks of 2^20 pages with
the same 4,096 confirmed keys per shape, then counts each row's instructions over 100
keep-alive requests between `callgrind_control -z` and `-d`, and prints one line per row:
the row and the instructions per request (per pair for the pairs). --token sends
`Authorization: Bearer T` on every request (with --auth-token-file or --tenants-file
among the server flags). --sglang: SGLang's rows instead (a pool /0/ of 2^20 pages
holding the keys; exists, get_page_indices, and the reserve→confirm pair of 128 fresh
keys). Needs valgrind (apt-get install valgrind).
"""
import argparse
import glob
import hashlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

REQUESTS = 100
KEYS = 4096


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def key(shape, i):
    h = hashlib.sha256(str(i).encode()).hexdigest()
    return h[:32] if shape == "hex32" else h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--shapes", default="hex32,hex64")
    ap.add_argument("--token", default="")
    ap.add_argument("--sglang", action="store_true")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:split])
    args.server_flags = argv[split + 1:]
    out = tempfile.mkdtemp(prefix="metad-callgrind.")
    port = free_port()
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/cg.%p",
         args.binary, "--port", str(port), "--cpus", "0", "--io", "epoll", "--log-level", "warn",
         *args.server_flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    conn = None
    for _ in range(600):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("GET", "/health")
            conn.getresponse().read()
            break
        except OSError:
            time.sleep(0.1)
    headers = {"content-type": "application/json"}
    if args.token:
        headers["authorization"] = "Bearer " + args.token

    def post(path, body, want):
        conn.request("POST", path, json.dumps(body), headers)
        r = conn.getresponse()
        data = r.read()
        assert r.status == want, (path, r.status, data[:200])
        return json.loads(data) if data else None

    shapes = args.shapes.split(",")
    if args.sglang:
        return sglang_rows(args, server, post, shapes)
    for rank in (0, 1):
        post(f"/rank/{rank}/initialize", {"role": "worker", "num_pages": 1 << 20}, 200)
        for shape in shapes:
            for b in range(0, KEYS, 512):
                ks = [[key(shape, i), ""] for i in range(b, b + 512)]
                got = post("/keys/batch_allocate", {"rank": rank, "keys": ks}, 200)
                post("/keys/confirm_write", {"rank": rank, "confirmations": got["results"]}, 204)

    rows = []
    for shape in shapes:
        ks = [key(shape, i * 7 % KEYS) for i in range(128)]
        fresh = iter(range(10**7, 10**9, 1000))
        rows += [
            (f"get_locations 128 {shape}",
             lambda ks=ks: post("/keys/get_locations", {"rank": 0, "keys": ks}, 200)),
            (f"batch_allocate 128 hits {shape}",
             lambda ks=ks: post("/keys/batch_allocate",
                                {"rank": 0, "keys": [[k, ""] for k in ks]}, 200)),
            (f"batch_exists 128 {shape}",
             lambda ks=ks: post("/keys/batch_exists", {"keys": ks}, 200)),
        ]

        def release_pair(shape=shape, fresh=fresh):
            base = next(fresh)
            got = post("/keys/batch_allocate",
                       {"rank": 1, "keys": [[key(shape, base + i), ""] for i in range(128)]}, 200)
            post("/keys/confirm_write", {"rank": 1, "confirmations": [],
                                         "pages_to_release": [p for _, p in got["results"]]}, 204)

        def confirm_pair(shape=shape, fresh=fresh):
            base = next(fresh)
            got = post("/keys/batch_allocate",
                       {"rank": 1, "keys": [[key(shape, base + i), ""] for i in range(128)]}, 200)
            post("/keys/confirm_write", {"rank": 1, "confirmations": got["results"]}, 204)

        rows += [(f"alloc-release pair 128 fresh {shape}", release_pair),
                 (f"alloc-confirm pair 128 fresh {shape}", confirm_pair)]
    measure(server, rows)


def measure(server, rows):
    def control(*a):
        subprocess.run(["callgrind_control", *a, str(server.pid)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)

    out = os.path.dirname(
        [a for a in server.args if a.startswith("--callgrind-out-file=")][0].split("=", 1)[1])
    control("-i", "on")
    for name, run in rows:
        run()  # warm
        control("-z")
        for _ in range(REQUESTS):
            run()
        control("-d", re.sub(r"[^A-Za-z0-9]+", "_", name))
    server.terminate()
    server.wait()
    dumps = sorted(glob.glob(f"{out}/cg.{server.pid}.*"), key=lambda f: int(f.rsplit(".", 1)[1]))
    for (name, _), dump in zip(rows, dumps):
        total = re.search(r"^(?:totals|summary): (\d+)", open(dump).read(), re.M)
        print(f"{name}\t{int(total.group(1)) // REQUESTS}")


def sglang_rows(args, server, post, shapes):
    post("/0/initialize", {"num_pages": 1 << 20}, 204)
    for shape in shapes:
        for b in range(0, KEYS, 512):
            ks = [key(shape, i) for i in range(b, b + 512)]
            got = post("/0/reserve_and_allocate_page_indices", {"keys": ks}, 200)
            post("/0/confirm_write", {"written_keys_to_confirm":
                                      [[k, p] for k, (_, p) in zip(ks, got["indices"])]}, 204)
    rows = []
    for shape in shapes:
        ks = [key(shape, i * 7 % KEYS) for i in range(128)]
        fresh = iter(range(10**7, 10**9, 1000))
        rows += [
            (f"sglang exists 128 {shape}", lambda ks=ks: post("/0/exists", {"keys": ks}, 200)),
            (f"sglang get_page_indices 128 {shape}",
             lambda ks=ks: post("/0/get_page_indices", {"keys": ks}, 200)),
        ]

        def pair(shape=shape, fresh=fresh):
            base = next(fresh)
            ks = [key(shape, base + i) for i in range(128)]
            got = post("/0/reserve_and_allocate_page_indices", {"keys": ks}, 200)
            post("/0/confirm_write", {"written_keys_to_confirm":
                                      [[k, p] for k, (_, p) in zip(ks, got["indices"])]}, 204)

        rows.append((f"sglang reserve-confirm pair 128 fresh {shape}", pair))
    measure(server, rows)


if __name__ == "__main__":
    main()
