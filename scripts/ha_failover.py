#!/usr/bin/env python3
"""The long failover run (docs/replication.md, "Test plan": T1): kill -9 the leader of a replicated
pair under load, N rounds. Run through scripts/ha-failover.sh.

Set-up, all on 127.0.0.1: a 1-member etcd tuned as deploy/etcd (1 s lease), nodes a and
b with --repl-listen (same command line apart from node id, ports, data dir), HAProxy
with deploy/haproxy/hf3fs-metad-ha.cfg in front (active /ready checks every 100 ms), and
W vLLM-like writers (engines sharing worker rank 0) at a fixed rate of save tasks through
HAProxy, with vLLM's retry schedule (attempts at 0, 0.01, 0.61, 1.81 s on a lost
connection or a 5xx).
Every acknowledged answer goes into an ack ledger (tests/e2e/failover_harness.py).

Each round: kill -9 the current leader -> wait for the other to serve -> check the ledger
against it -> restart the killed node with the same command line (it resyncs as standby)
-> wait until /sync lists it again. Any exit with status 75 (cannot follow) is restarted
0.2 s later and counted, as systemd does with deploy/ha/ha.conf. --restart-after-ms N
restarts the killed node N ms after the kill instead (deploy/ha/ha.conf: 200), so it
comes back inside its own lease; whichever node then serves is the new leader.

Per round: kill -> new leader /ready 200 (ms), kill -> first API 200 through HAProxy
(ms), kill -> first write answered through HAProxy (a probe allocate + release; ms), the
longest writer call of the round (its retries included), restart -> back in /sync (ms),
exits 75, acknowledged bindings checked and lost (missing, moved or aliased on the new
leader, or a 4xx to the confirm of an acked allocation), client calls that still failed
after all retries. A table, the median and max, per-round CSV and a summary go to
--out. Exit status 1 if any acknowledged write was lost, 2 if the run could not go on (no
takeover, no write answered, a node that would not rejoin); a stopped run still checks
the ledger on whichever node answers /ready 200.

--no-repl: baseline for a binary without replication: nodes without --repl-listen, and the
killed leader is restarted at once (no standby can take over), so "new leader" is the
restarted node recovering from its data dir.
"""

import argparse
import csv
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

import requests  # noqa: E402

from failover_harness import (EXIT_DIVERGED, Cluster, Diverged, Ledger, Node,  # noqa: E402
                              Supervisor, Writer, check_ledger, initialize, ready,
                              takeover_any, wait_until)
import test_ha  # noqa: E402
from test_ha import HAPROXY, Etcd, free_port  # noqa: E402

FIELDS = ["round", "killed", "new_leader", "ready_ms", "api_ms", "write_ms", "worst_call_ms",
          "rejoin_ms", "exits_75", "keys_checked", "lost", "client_failures", "retried_calls"]


def log(text):
    stamp = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
    print(f"[{stamp}] {text}", flush=True)


def start_haproxy(out, port_a, port_b):
    """deploy/haproxy/hf3fs-metad-ha.cfg with the two nodes on loopback ports (as
    tests/e2e/test_ha.py runs it); returns (process, URL)."""
    try:
        return test_ha.start_haproxy(out, port_a, port_b, os.path.join(out, "haproxy.log"))
    except RuntimeError as e:
        raise SystemExit(str(e))


class Run:
    def __init__(self, opts):
        self.opts = opts
        self.out = opts.out
        self.etcd = None
        self.haproxy = None
        self.nodes = {}
        self.writers = []
        self.ledger = Ledger()
        self.rows = []
        self.cluster = None

    # --- set-up and tear-down -----------------------------------------------------------

    def setup(self):
        o = self.opts
        self.etcd = Etcd()
        log(f"etcd {self.etcd.url}")
        self.cluster = Cluster(self.etcd.url, "failover")
        extra = ["--sync-timeout-ms", str(o.sync_timeout_ms)] if not o.no_repl else []
        extra += o.node_arg
        nodes_dir = os.path.join(self.out, "nodes")
        for node_id in ("a", "b"):
            n = Node(node_id, self.etcd.url, "failover", nodes_dir, free_port(), free_port(),
                     extra)
            if o.no_repl:
                i = n.args.index("--repl-listen")
                del n.args[i:i + 2]
            self.nodes[node_id] = n
        a, b = self.nodes["a"], self.nodes["b"]
        self.supervisor = Supervisor([a, b], restart_s=0.2)
        self.start_node(a)
        if not wait_until(lambda: ready(a.base_url), 10):
            raise RuntimeError(f"a did not lead:\n{a.log(30)}")
        self.start_node(b)
        if not o.no_repl:
            self.wait_rejoined(b, a, timeout=o.rejoin_timeout)
        log(f"a leads at {a.base_url}, b at {b.base_url}"
            + ("" if o.no_repl else f", in /sync: {self.cluster.sync()}"))
        self.haproxy, self.proxy = start_haproxy(self.out, a.port, b.port)
        # Both servers start "up" in HAProxy; the standby's first failed check (100 ms)
        # marks it down. Until then a request may reach it and get its 503.
        if not wait_until(lambda: all(self.api_status(self.proxy) == 200 for _ in range(20)),
                          10, step=0.1):
            raise RuntimeError("HAProxy does not send everything to the leader")
        log(f"HAProxy {self.proxy}")
        # One worker rank, as TP=1 engines share it (a key is complete once every
        # initialised worker rank confirmed it, so each writer of its own rank would
        # leave its keys incomplete). Each writer is one engine's worker.
        r = initialize(self.proxy, 0, o.pages)
        if r.status_code != 200:
            raise RuntimeError(f"initialize 0: {r.status_code} {r.text}")
        for i in range(o.writers):
            w = Writer(self.proxy, 0, self.ledger, f"w{i}", keys_per_task=o.keys_per_task,
                       rate=o.rate, retry=True)
            w.start()
            self.writers.append(w)
        log(f"{o.writers} writers on rank 0 at {o.rate} save tasks/s each "
            f"({o.keys_per_task} keys), through HAProxy")
        time.sleep(o.settle)

    def teardown(self):
        for w in self.writers:
            w.stop()
        for w in self.writers:
            w.join(10)
        for n in self.nodes.values():
            if n.alive():
                n.stop()
            shutil.rmtree(n.data, ignore_errors=True)  # keep the logs, not the state
        if self.haproxy:
            self.haproxy.kill()
            self.haproxy.wait()
        if self.etcd:
            try:
                shutil.copy(os.path.join(self.etcd.dir, "etcd.log"), self.out)
            except OSError:
                pass
            self.etcd.stop()

    # --- helpers ------------------------------------------------------------------------

    @staticmethod
    def api_status(url):
        try:
            return requests.post(url + "/keys/batch_exists", data=b'{"keys":[]}',
                                 headers={"Content-Type": "application/json"},
                                 timeout=2).status_code
        except requests.RequestException:
            return None

    def start_node(self, node):
        node.start()
        if not node.wait_listening() and node.exit_code() != EXIT_DIVERGED:
            raise RuntimeError(f"{node.id} did not start (exit {node.exit_code()}):\n"
                               f"{node.log(30)}")

    def wait_rejoined(self, node, leader, timeout):
        """Until /sync lists node under leader, the nodes supervised (exit 75 -> restart
        0.2 s later, counted in self.supervisor.exits)."""
        try:
            ok = self.supervisor.until(lambda: self.cluster.in_sync(node.id, leader.id),
                                       timeout)
        except Diverged as e:
            raise RuntimeError(str(e)) from None
        if not ok:
            raise RuntimeError(f"{node.id} not in /sync of {leader.id} after {timeout} s; "
                               f"/sync {self.cluster.sync()}\n{node.log(30)}")

    def client_counts(self):
        failures = sum(len(w.failures) for w in self.writers)
        retried = sum(w.retried_calls for w in self.writers)
        return failures, retried

    def check(self, node):
        """The ledger against node; (keys checked, lost)."""
        problems_before = len(self.ledger.problems)
        bound, _ = self.ledger.snapshot()
        result = check_ledger(node.base_url, bound)
        lost = (result["lost"] + result["moved"] + result["duplicate_pages"]
                + result["ledger_duplicates"] + result["errors"])
        if lost:
            log(f"LEDGER on {node.id}: {json.dumps(result)}")
        return result["checked"], lost, problems_before

    # --- one round ----------------------------------------------------------------------

    def round(self, i):
        o = self.opts
        value, _ = self.cluster.leader()
        if value is None:
            raise RuntimeError("no leader before the round")
        old = self.nodes[value["node"]]
        other = self.nodes["b" if old.id == "a" else "a"]
        exits0 = dict(self.supervisor.exits)
        if not o.no_repl and not self.cluster.in_sync(other.id, old.id):
            # Only a standby listed in /sync may take over: a standby that dropped out
            # (stopped acking for --sync-timeout-ms, or exited 75) is waited for first.
            log(f"{other.id} is not in /sync before round {i} ({self.cluster.sync()}); "
                f"waiting (exit status {other.exit_code()})")
            self.wait_rejoined(other, old, o.rejoin_timeout)
        failures0, retried0 = self.client_counts()
        problems0 = len(self.ledger.problems)

        # kill -9; the killed node comes back at once (--no-repl: nobody else can lead),
        # --restart-after-ms later (a supervisor's restart delay), or, by default, only
        # once the other node serves.
        t0 = time.monotonic()
        old.kill()
        restarted = None
        if o.no_repl or o.restart_after_ms is not None:
            time.sleep((o.restart_after_ms or 0) / 1000.0)
            restarted = time.monotonic()
            old.start()
        try:
            new, ready_ms, api_ms, write_ms = takeover_any(self.supervisor, self.proxy, t0,
                                                           o.takeover_timeout)
        except Diverged as e:
            raise RuntimeError(f"round {i}: {e}") from None
        if new is None or api_ms is None or write_ms is None:
            raise RuntimeError(f"round {i}: no node served within {o.takeover_timeout} s "
                               f"(ready {ready_ms}, api {api_ms}, write {write_ms}):\n"
                               f"{(new or other).log(40)}")
        checked, lost, _ = self.check(new)

        rejoin_ms = None
        if not o.no_repl:
            if restarted is None:
                restarted = time.monotonic()
                old.start()
            standby = other if new is old else old
            self.wait_rejoined(standby, new, o.rejoin_timeout)
            rejoin_ms = (time.monotonic() - restarted) * 1000.0
        per_node = {k: v - exits0.get(k, 0) for k, v in self.supervisor.exits.items()
                    if v != exits0.get(k, 0)}
        if per_node:
            log(f"  exits 75 this round (restarted 0.2 s later): {per_node}")
        exits = sum(per_node.values())
        # Let calls that were retrying across the gap finish before counting them.
        time.sleep(o.settle)
        failures1, retried1 = self.client_counts()
        slow = sorted((call for w in self.writers for call in list(w.slow_calls)
                       if call[0] >= t0), key=lambda call: -call[1])
        for end, took, path, attempts in slow[:3]:
            log(f"  slow call: {path} {took * 1000:.0f} ms, ended +{(end - t0) * 1000:.0f} ms "
                "after the kill; tries (start ms, ms, outcome): "
                + ", ".join(f"({a * 1000:.0f}, {d * 1000:.0f}, {o})" for a, d, o in attempts))
        lost += len(self.ledger.problems) - problems0
        for text in self.ledger.problems[problems0:]:
            log(f"writer saw: {text}")
        row = {"round": i, "killed": old.id, "new_leader": new.id,
               "ready_ms": round(ready_ms), "api_ms": round(api_ms),
               "write_ms": round(write_ms),
               "worst_call_ms": round(1000 * max([call[1] for call in slow] or [0])),
               "rejoin_ms": "" if rejoin_ms is None else round(rejoin_ms),
               "exits_75": exits, "keys_checked": checked, "lost": lost,
               "client_failures": failures1 - failures0,
               "retried_calls": retried1 - retried0}
        self.rows.append(row)
        log(", ".join(f"{k} {v}" for k, v in row.items()))
        for w in self.writers:
            for when, path, error in list(w.failures):
                if when >= t0:
                    log(f"  client failure: {w.tag} {path} given up at "
                        f"+{(when - t0) * 1000:.0f} ms: {error}")

    # --- report -------------------------------------------------------------------------

    def report(self, final):
        o = self.opts
        with open(os.path.join(self.out, "rounds.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(self.rows)
        widths = {k: max(len(k), *(len(str(r[k])) for r in self.rows)) if self.rows else len(k)
                  for k in FIELDS}
        lines = ["  ".join(k.rjust(widths[k]) for k in FIELDS)]
        lines += ["  ".join(str(r[k]).rjust(widths[k]) for k in FIELDS) for r in self.rows]

        def stat(k):
            values = [r[k] for r in self.rows if r[k] != ""]
            if not values:
                return "n/a"
            return f"median {statistics.median(values):.0f} ms, max {max(values)} ms"

        failures, retried = self.client_counts()
        lost = sum(r["lost"] for r in self.rows) + final["lost"]
        over = sum(1 for r in self.rows if r["api_ms"] > 1810)
        lines += [
            "",
            f"binary {o.binary}; rounds {len(self.rows)}/{o.rounds}; writers {o.writers} x "
            f"{o.rate} tasks/s x {o.keys_per_task} keys through HAProxy"
            + ("; --no-repl baseline (restart, no standby)" if o.no_repl else ""),
            f"kill -> new leader /ready 200:        {stat('ready_ms')}",
            f"kill -> first API 200 via HAProxy:    {stat('api_ms')}"
            f" ({over} round(s) over vLLM's 1.81 s retry window)",
            f"kill -> first write via HAProxy:      {stat('write_ms')}",
            f"longest writer call (with retries):   {stat('worst_call_ms')}",
            f"restart -> both in /sync again:       {stat('rejoin_ms')}",
            f"exits 75 (restarted):                 {sum(r['exits_75'] for r in self.rows)}",
            f"acknowledged bindings lost:           {lost} (final check: {final['checked']} "
            f"keys on {final['node']}, {final['lost']} lost)",
            f"client calls failed after retries:    {failures} of "
            f"{sum(w.calls for w in self.writers)} ({retried} needed a retry)",
        ]
        text = "\n".join(lines)
        print("\n" + text, flush=True)
        with open(os.path.join(self.out, "summary.txt"), "w") as f:
            f.write(text + "\n")
        return lost


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "hf3fs-metad"))
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default=None,
                   help="results dir (default /tmp/ha-failover-<date>)")
    p.add_argument("--writers", type=int, default=2, help="writer threads (rank 0)")
    p.add_argument("--rate", type=float, default=20.0, help="save tasks/s per writer")
    p.add_argument("--keys-per-task", type=int, default=16)
    p.add_argument("--pages", type=int, default=1 << 20, help="num_pages of each rank")
    p.add_argument("--threads", default="2", help="--threads of each node")
    p.add_argument("--sync-timeout-ms", type=int, default=500)
    p.add_argument("--settle", type=float, default=2.5,
                   help="seconds of load after each rejoin before the next kill")
    p.add_argument("--takeover-timeout", type=float, default=15.0)
    p.add_argument("--rejoin-timeout", type=float, default=60.0)
    p.add_argument("--node-arg", action="append", default=[],
                   help="one more argument for both nodes (repeatable)")
    p.add_argument("--restart-after-ms", type=int, default=None,
                   help="restart the killed node this long after the kill, as systemd's "
                        "RestartSec (deploy/ha/ha.conf: 200), instead of after the other "
                        "node serves")
    p.add_argument("--no-repl", action="store_true",
                   help="baseline without replication (see the top of this file)")
    o = p.parse_args()
    o.out = o.out or f"/tmp/ha-failover-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    if not os.access(o.binary, os.X_OK):
        p.error(f"--binary {o.binary}: not an executable (build it, or pass --binary)")
    os.makedirs(o.out, exist_ok=True)
    os.environ["METAD_BIN"] = os.path.abspath(o.binary)
    os.environ["METAD_THREADS"] = o.threads
    log(f"results in {o.out}")

    run = Run(o)
    broken = None
    final = {"checked": 0, "lost": 0, "node": "-"}
    try:
        run.setup()
        for i in range(1, o.rounds + 1):
            run.round(i)
        for w in run.writers:
            w.stop()
        for w in run.writers:
            w.join(10)
        value, _ = run.cluster.leader()
        leader = run.nodes[value["node"]]
        checked, lost, _ = run.check(leader)
        final = {"checked": checked, "lost": lost, "node": leader.id}
    except (RuntimeError, requests.RequestException) as e:
        broken = str(e)
        log(f"RUN STOPPED: {broken}")
        for w in run.writers:
            w.stop()
        # Reads may still be served where writes are not: check what is there.
        for n in run.nodes.values():
            if n.alive() and ready(n.base_url):
                try:
                    checked, lost, _ = run.check(n)
                    final = {"checked": checked, "lost": lost, "node": n.id}
                except requests.RequestException as e2:
                    log(f"final ledger check on {n.id} failed: {e2}")
                break
    finally:
        run.teardown()
    lost = run.report(final)
    if broken:
        with open(os.path.join(o.out, "summary.txt"), "a") as f:
            f.write(f"run stopped early: {broken}\n")
    return 1 if lost else 2 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
