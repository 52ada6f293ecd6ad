#!/usr/bin/env python3
"""Fan-out benchmark (scripts/bench.sh --fanout): what extra core threads cost.

For each --threads count, starts the server pinned to the CPUs given (every thread on
them, wrapping around), warms it up, then drives each endpoint for a few seconds from
this process (which bench.sh pins elsewhere) over 8 keep-alive connections and reports
per request: cross-core messages (hf3fs_metad_cross_core_messages_total), server CPU
(utime + stime from /proc), and the rate. Then, at a fixed --threads, the same for
--directory-cores 1, 2, 4, 8: the slope of CPU against messages is the cost of one hop.

Standard library only. Usage:
  fanout.py BINARY --threads 1,2,4,8,16,32 --seconds 3 [--server-cpus 0]
"""

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def start(binary, args, cpus):
    cmd = ["taskset", "-c", cpus, binary, "--port", "0", "--log-level", "warn", *args]
    # --log-level warn hides the "listening" line: ask the kernel for the port instead.
    proc = subprocess.Popen(cmd + ["--summary-interval-ms", "0"], stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        port = listening_port(proc.pid)
        if port:
            return proc, port
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd} exited: {proc.stderr.read()}")
        time.sleep(0.05)
    raise RuntimeError(f"{cmd}: no listener")


def listening_port(pid):
    """The TCP port a process listens on (from /proc/net/tcp and its socket inodes)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    except OSError:
        return None
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:  # LISTEN
                return int(parts[1].split(":")[1], 16)
    return None


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def messages(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith("hf3fs_metad_cross_core_messages_total "):
            return float(line.split()[1])
    return 0.0


def post(conn, path, body):
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    if response.status not in (200, 204):
        raise RuntimeError(f"{path}: {response.status}")


def keys(n, tag):
    return [f"{tag:08x}{i:024x}" for i in range(n)]


def workloads(ranks):
    """(name, [(path, body)] sent round-robin). Keys are saved first so lookups hit."""
    saved = keys(1250, 1)
    exists = json.dumps({"keys": saved})
    locations = [json.dumps({"rank": r, "keys": saved[:128]}) for r in range(ranks)]
    return [
        ("batch_exists/1250", [("/keys/batch_exists", exists)]),
        ("get_locations/128", [("/keys/get_locations", b) for b in locations]),
        ("health", [("/health", None)]),
    ]


def prepare(port, ranks):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for r in range(ranks):
        post(conn, f"/rank/{r}/initialize", json.dumps({"role": "worker", "num_pages": 4096}))
    saved = keys(1250, 1)
    for r in range(ranks):
        for start_at in range(0, len(saved), 128):
            chunk = saved[start_at:start_at + 128]
            conn.request("POST", "/keys/batch_allocate",
                         json.dumps({"rank": r, "keys": [[k, ""] for k in chunk]}),
                         {"Content-Type": "application/json"})
            results = json.loads(conn.getresponse().read())["results"]
            post(conn, "/keys/confirm_write",
                 json.dumps({"rank": r, "confirmations": results, "pages_to_release": []}))
    conn.close()


def drive(port, pid, requests, seconds, connections=8):
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(connections)]
    for c in conns:  # connect (and spread over the cores' listeners) before measuring
        path, body = requests[0]
        (c.request("GET", path) if body is None else c.request("POST", path, body))
        c.getresponse().read()
    m0, cpu0, t0 = messages(port), cpu_seconds(pid), time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        for c in conns:
            path, body = requests[n % len(requests)]
            if body is None:
                c.request("GET", path)
            else:
                c.request("POST", path, body, {"Content-Type": "application/json"})
            c.getresponse().read()
            n += 1
    elapsed = time.monotonic() - t0
    cpu = cpu_seconds(pid) - cpu0
    # The closing scrape hops to every core once: not the requests' doing.
    hops = messages(port) - m0
    for c in conns:
        c.close()
    return n, hops, cpu, elapsed


def measure(binary, args, cpus, ranks, seconds, threads):
    proc, port = start(binary, args, cpus)
    try:
        prepare(port, ranks)
        rows = []
        for name, requests in workloads(ranks):
            n, hops, cpu, elapsed = drive(port, proc.pid, requests, seconds)
            rows.append((name, max(0.0, (hops - threads) / n), cpu * 1e6 / n, n / elapsed))
        return rows
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--threads", default="1,2,4,8,16,32")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--slope-threads", type=int, default=8)
    opts = ap.parse_args()

    print("| --threads | endpoint | messages/req | server CPU µs/req | req/s |")
    print("|---:|---|---:|---:|---:|")
    for threads in (int(t) for t in opts.threads.split(",")):
        for name, hops, cpu, rate in measure(opts.binary, ["--threads", str(threads)],
                                             opts.server_cpus, opts.ranks, opts.seconds, threads):
            print(f"| {threads} | {name} | {hops:.2f} | {cpu:.0f} | {rate:.0f} |", flush=True)

    t = opts.slope_threads
    points = []
    print(f"\n| --threads {t}, --directory-cores | batch_exists messages/req | CPU µs/req |")
    print("|---:|---:|---:|")
    for d in (1, 2, 4, 8):
        if d > t:
            break
        rows = measure(opts.binary, ["--threads", str(t), "--directory-cores", str(d)],
                       opts.server_cpus, opts.ranks, opts.seconds, t)
        name, hops, cpu, _ = rows[0]
        points.append((hops, cpu))
        print(f"| {d} | {hops:.2f} | {cpu:.0f} |", flush=True)
    if len(points) >= 2:
        mx = sum(p[0] for p in points) / len(points)
        my = sum(p[1] for p in points) / len(points)
        sxx = sum((p[0] - mx) ** 2 for p in points)
        slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
        print(f"\nOne cross-core message costs ~{slope:.1f} µs of server CPU "
              f"(least-squares slope over {len(points)} points); the rest of a "
              f"batch_exists is ~{my - slope * mx:.0f} µs.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
