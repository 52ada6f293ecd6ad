#!/usr/bin/env python3
"""A/B: what the TLS hop of deploy/ costs per request (issue 34 item 6).

The engine host's nginx (deploy/nginx/hf3fs-metad-tls.conf) -> the central host's HAProxy
(deploy/haproxy/hf3fs-metad-central.cfg) -> hf3fs-metad on its unix socket, with
--tenants-file (the token is tenant A's, the vllm tenant), (a) as shipped, over verified
TLS between nginx and HAProxy, and (b) the same files with the TLS removed (nginx
`proxy_pass http://`, no proxy_ssl_*; HAProxy `bind` without `ssl crt`). Everything but
wrk runs on CPU 0 (server --cpus 0 --threads 1, one nginx worker, HAProxy one thread);
wrk on CPU 1. Load: bench/wrk/get_locations.lua (128 keys of a rank holding
METAD_BENCH_KEYS keys), populated through the path itself on the first run.

Alternates a, b RUNS times per load shape; prints every run and the medians.

Usage: METAD_BIN=build/hf3fs-metad python3 bench/deploy_tls_ab.py [--runs 3] [--seconds 10]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

from test_deploy_tls import (HAPROXY_CENTRAL, NAME, NGINX_TLS, TOKEN_A, Proc, make_ca,  # noqa: E402
                             make_server_cert, sha, substitute, write_secret)
from test_operations import OpsServer, free_port  # noqa: E402

WRK_SCRIPT = os.path.join(ROOT, "bench", "wrk", "get_locations.lua")
# (label, wrk threads, connections): an engine host's load (TP 8: up to 17 calls in
# flight), and one call at a time (the latency one call sees).
SHAPES = (("16 connections", 2, 16), ("1 connection", 1, 1))


def cpu_ticks(pids):
    """utime + stime of `pids` and their children (nginx's worker), in clock ticks."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                children = [int(c) for c in f.read().split()]
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12]) + cpu_ticks(children)
        except OSError:
            pass
    return total


def wrk(port, threads, conns, seconds, pids=()):
    t0 = cpu_ticks(pids)
    out = subprocess.run(["taskset", "-c", "1", "wrk", f"-t{threads}", f"-c{conns}",
                          f"-d{seconds}s", "--latency", "-s", WRK_SCRIPT,
                          f"http://127.0.0.1:{port}"], capture_output=True, text=True,
                         timeout=seconds + 600).stdout
    line = next((l for l in out.splitlines() if l.startswith("METAD_WRK")), None)
    if line is None:
        raise RuntimeError(out)
    cpu = cpu_ticks(pids) - t0
    fields = dict(re.findall(r"(\w+)=([\d.]+)", line))
    if float(fields["bad"]) != 0:
        raise RuntimeError(f"bad answers: {line}")
    cpu_us = cpu * 1e6 / os.sysconf("SC_CLK_TCK") / float(fields["requests"])
    return float(fields["rps"]), float(fields["p50_us"]), float(fields["p99_us"]), cpu_us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    args = ap.parse_args()
    os.environ.setdefault("METAD_BENCH_KEYS", "131072")
    os.sched_setaffinity(0, {0})  # the server and the proxies inherit CPU 0

    d = tempfile.mkdtemp(prefix="metad-tls-ab-")
    os.chmod(d, 0o755)
    make_ca(d, "ca")
    pem = make_server_cert(d, "ca", NAME)
    tenants = os.path.join(d, "tenants")
    with open(tenants, "w") as f:
        f.write(f"team_a {sha(TOKEN_A)} vllm\n")
    sock = os.path.join(d, "metad.sock")
    server = OpsServer(("--unix", sock, "--tenants-file", tenants, "--cpus", "0",
                        "--threads", "1"),
                       preexec_fn=lambda: os.umask(0))
    procs = []
    try:
        paths, pids = {}, {}
        for mode in ("tls", "plain"):
            central_port, port = free_port(), free_port()
            central = substitute(HAPROXY_CENTRAL, (
                ("bind :18443", f"bind 127.0.0.1:{central_port}"),
                ("/etc/haproxy/hf3fs-metad.pem", pem),
                ("unix@/run/hf3fs-metad/metad.sock", f"unix@{sock}"),
                ("\nglobal\n", "\nglobal\n    nbthread 1\n")))
            include = write_secret(os.path.join(d, f"token-{mode}.conf"),
                                   f'proxy_set_header Authorization "Bearer {TOKEN_A}";\n')
            nginx = substitute(NGINX_TLS, (
                ("server METAD_HOST:18443", f"server 127.0.0.1:{central_port}"),
                ("proxy_ssl_name METAD_HOST", f"proxy_ssl_name {NAME}"),
                ("listen 127.0.0.1:18000", f"listen 127.0.0.1:{port}"),
                ("/etc/nginx/hf3fs-metad-token.conf", include),
                ("/etc/nginx/hf3fs-metad-ca.pem", os.path.join(d, "ca.pem"))))
            if mode == "plain":
                central = central.replace(f" ssl crt {pem} alpn http/1.1", "")
                nginx = nginx.replace("proxy_pass https://", "proxy_pass http://")
                nginx = re.sub(r"\n\s*proxy_ssl_\w+ [^\n]*;", "", nginx)
                assert "ssl" not in re.sub(r"#[^\n]*", "", central.split("frontend")[1])
                assert "proxy_ssl" not in re.sub(r"#[^\n]*", "", nginx)
            for kind, text, p in (("haproxy", central, central_port), ("nginx", nginx, port)):
                pdir = tempfile.mkdtemp(dir=d, prefix=f"{kind}-{mode}-")
                os.chmod(pdir, 0o755)
                procs.append(Proc(kind, pdir, text, p))
            paths[mode] = port
            pids[mode] = [server.proc.pid] + [p.proc.pid for p in procs[-2:]]
        # Populate (the Lua setup, through the TLS path) and warm both paths up.
        for mode in ("tls", "plain"):
            wrk(paths[mode], 2, 16, 3)
        results = {}
        for label, threads, conns in SHAPES:
            for run in range(args.runs):
                for mode in ("tls", "plain"):
                    r = wrk(paths[mode], threads, conns, args.seconds, pids[mode])
                    results.setdefault((label, mode), []).append(r)
                    print(f"{label:16} {mode:5} run {run + 1}: {r[0]:9.0f} req/s  "
                          f"p50 {r[1]:7.0f} us  p99 {r[2]:7.0f} us  "
                          f"CPU {r[3]:5.1f} us/req (server+haproxy+nginx)", flush=True)
        print()
        print("| load | path | req/s (median; min–max) | p50 µs (median; min–max) | p99 µs (median) "
              "| CPU µs/request, server + HAProxy + nginx (median; min–max) |")
        print("|---|---|---:|---:|---:|---:|")
        for label, _, _ in SHAPES:
            med = {}
            for mode in ("tls", "plain"):
                rs = results[(label, mode)]
                rps, p50, p99, cpu = ([r[i] for r in rs] for i in range(4))
                med[mode] = (statistics.median(rps), statistics.median(p50),
                             statistics.median(cpu))
                print(f"| {label} | {'TLS' if mode == 'tls' else 'plain HTTP'} | "
                      f"{statistics.median(rps):,.0f} ({min(rps):,.0f}–{max(rps):,.0f}) | "
                      f"{statistics.median(p50):,.0f} ({min(p50):,.0f}–{max(p50):,.0f}) | "
                      f"{statistics.median(p99):,.0f} | "
                      f"{statistics.median(cpu):.1f} ({min(cpu):.1f}–{max(cpu):.1f}) |")
            print(f"| {label} | TLS / plain | {med['tls'][0] / med['plain'][0]:.3f} | "
                  f"{med['tls'][1] / med['plain'][1]:.3f} | | "
                  f"{med['tls'][2] / med['plain'][2]:.3f} |")
    finally:
        for p in reversed(procs):
            p.stop()
        server.stop()
        subprocess.run(["rm", "-rf", d])


if __name__ == "__main__":
    main()
