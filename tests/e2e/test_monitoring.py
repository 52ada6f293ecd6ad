# ctest: once
"""End-to-end tests of what deploy/ ships for monitoring and fleets (issue 19).

- deploy/prometheus: the alert rules pass `promtool check rules` and their unit tests
  (`promtool test rules`), every alert has a case that fires and one that does not, and
  every metric the rules and the Grafana dashboard (deploy/grafana) name is one a
  running server exports;
- a rank initialised again with another page count is counted in /metrics and logged;
- deploy/haproxy: the forwarder config parses (`haproxy -c`), and the vLLM request
  sequence runs through it, as shipped, against a started server with a token; through it
  nobody can clear or delete.

Skips what needs promtool (Debian package prometheus) or haproxy when they are absent.
METAD_BIN and METAD_IO as for the other suites; loopback only.
"""

import json
import os
import re
import signal
import subprocess
import time
import unittest

from metad_harness import Client, keys
from test_operations import (ADMIN_TOKEN, PROMTOOL, TOKEN, UNAUTHORIZED_BODY, OpsTestCase,
                             RequestsCaller, free_port, stop_process, vllm_sequence,
                             wait_listening)

HAPROXY = "/usr/sbin/haproxy"
DEPLOY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy")
RULES = os.path.join(DEPLOY, "prometheus", "hf3fs-metad-rules.yml")
RULE_TESTS = os.path.join(DEPLOY, "prometheus", "hf3fs-metad-rules.test.yml")
DASHBOARD = os.path.join(DEPLOY, "grafana", "hf3fs-metad.json")
HAPROXY_CFG = os.path.join(DEPLOY, "haproxy", "hf3fs-metad.cfg")

# Series Prometheus makes itself, not the server.
PROMETHEUS_SERIES = {"up"}
# Exported only by a node with --ha-etcd (and --repl-listen for the repl ones; this
# suite's server has neither): test_failover's case g checks them against a replicated
# leader's scrape, test_ha reads the foreign leader key's.
HA_SERIES = {"hf3fs_metad_ha_role", "hf3fs_metad_ha_serving", "hf3fs_metad_repl_in_sync",
             "hf3fs_metad_ha_foreign_leader_key", "hf3fs_metad_ha_foreign_leader_keys_total"}


# --- PromQL: the metric names an expression selects ----------------------------------

_PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                 "group_right", "offset", "bool", "inf", "nan"}
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def promql_metrics(expr):
    """Metric names in a PromQL expression: identifiers that are not functions,
    keywords, label names (in braces or grouping clauses) or inside strings, ranges or
    Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)            # strings
    text = re.sub(r"\{[^}]*\}", "", text)                       # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)                      # ranges, subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\w+", "", text)                           # $__rate_interval
    text = re.sub(r"\b\d+(\.\d+)?([eE][+-]?\d+)?[smhdwy]?\b", " ", text)  # numbers, offsets
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group(0)
        if word.lower() in _PROMQL_WORDS or text[match.end():].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def rule_expressions(path):
    """{alert name: expr} of a rules file (the forms it uses: `expr: ...` on one line, or
    a `>-` block indented below it), without a YAML library."""
    exprs, alert = {}, None
    with open(path) as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        m = re.match(r"\s*- alert: (\S+)", line)
        if m:
            alert = m.group(1)
        m = re.match(r"(\s*)expr: (.*)$", line)
        if not m:
            continue
        indent, value = len(m.group(1)), m.group(2).strip()
        if value in (">-", ">", "|", "|-"):
            block = []
            for follow in lines[i + 1:]:
                if follow.strip() and len(follow) - len(follow.lstrip()) <= indent:
                    break
                block.append(follow.strip())
            value = " ".join(block)
        exprs[alert] = value
    return exprs


def dashboard_expressions(path):
    """Every PromQL expression of a Grafana dashboard: panel targets' `expr`, and the
    metric of each templating `label_values(metric, label)` query."""
    with open(path) as f:
        dashboard = json.load(f)
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    found.append(value)
                elif key in ("query", "definition") and isinstance(value, str):
                    m = re.match(r"\s*label_values\((.*),\s*\w+\)\s*$", value)
                    if m:
                        found.append(m.group(1))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dashboard)
    return found


class MonitoringFilesTest(OpsTestCase):

    def run_promtool(self, *args):
        if not os.path.exists(PROMTOOL):
            self.skipTest(f"{PROMTOOL} absent (Debian package prometheus)")
        run = subprocess.run([PROMTOOL, *args], capture_output=True, timeout=60,
                             cwd=os.path.dirname(RULES))
        self.assertEqual(run.returncode, 0, f"promtool {' '.join(args)}:\n"
                         f"{run.stdout.decode()}{run.stderr.decode()}")

    def test_promtool_checks_the_rules(self):
        self.run_promtool("check", "rules", os.path.basename(RULES))

    def test_rule_unit_tests_pass(self):
        self.run_promtool("test", "rules", os.path.basename(RULE_TESTS))

    def test_every_alert_has_a_firing_and_a_quiet_case(self):
        alerts = set(rule_expressions(RULES))
        self.assertGreaterEqual(len(alerts), 10)
        fires, quiet = set(), set()
        with open(RULE_TESTS) as f:
            lines = f.read().split("\n")
        for i, line in enumerate(lines):
            m = re.match(r"\s*alertname: (\S+)", line)
            if m:
                (quiet if "exp_alerts: []" in lines[i + 1] else fires).add(m.group(1))
        for alert in sorted(alerts):
            with self.subTest(alert=alert):
                self.assertIn(alert, fires)
                self.assertIn(alert, quiet)
        self.assertEqual((fires | quiet) - alerts, set(), "tests of alerts that do not exist")

    def test_rules_and_dashboard_name_only_exported_metrics(self):
        server = self.start()
        client = Client(server.base_url)
        self.addCleanup(client.close)
        # Requests, so that the per-endpoint and per-rank families have series.
        k = keys(2, "monitoring")
        self.assertEqual(client.initialize(0, 8).status_code, 200)
        self.assertEqual(client.batch_allocate(0, k).status_code, 200)
        self.assertEqual(client.confirm_write(0, [(k[0], 0), (k[1], 1)]).status_code, 204)
        self.assertEqual(client.batch_exists(k).status_code, 200)
        self.assertEqual(client.get_locations(0, k).status_code, 200)
        scrape = self.scrape(server)
        exported = set()
        for name, kind in scrape.types.items():  # a histogram is selected by its series
            exported |= ({name + "_bucket", name + "_sum", name + "_count"}
                         if kind == "histogram" else {name})

        sources = [(f"rule {alert}", expr) for alert, expr in rule_expressions(RULES).items()]
        sources += [("dashboard", expr) for expr in dashboard_expressions(DASHBOARD)]
        self.assertGreaterEqual(len(sources), 30)
        used = set()
        for where, expr in sources:
            names = promql_metrics(expr)
            self.assertTrue(names, f"{where}: no metric found in {expr!r}")
            for name in sorted(names - PROMETHEUS_SERIES - HA_SERIES):
                with self.subTest(where=where, metric=name):
                    self.assertTrue(name in exported, f"{where}: {name} is not exported: {expr}")
            used |= names
        # The families the brief of the dashboard names are all on it.
        for family in ("hf3fs_metad_requests_total", "hf3fs_metad_request_duration_seconds_bucket",
                       "hf3fs_metad_pages", "hf3fs_metad_keys", "hf3fs_metad_incomplete_keys",
                       "hf3fs_metad_evicted_keys_total", "hf3fs_metad_expired_reservations_total",
                       "hf3fs_metad_connections_open", "hf3fs_metad_log_flush_seconds_bucket",
                       "hf3fs_metad_log_flush_failures_total", "hf3fs_metad_memory_used_bytes",
                       "hf3fs_metad_memory_budget_bytes", "hf3fs_metad_rank_reinitialized_total",
                       "hf3fs_metad_lookup_keys_total", "hf3fs_metad_allocated_pages_total",
                       "hf3fs_metad_tenant_lookup_keys_total", "hf3fs_metad_tenant_requests_total",
                       "hf3fs_metad_tenant_keys", "hf3fs_metad_tenant_pages"):
            with self.subTest(used=family):
                self.assertIn(family, used)

    def test_the_metric_name_scanner(self):
        cases = (
            ('up{job="x"} == 0', {"up"}),
            ('histogram_quantile(0.99, sum by (endpoint, le) (rate(a_bucket{le!="1"}[5m])))',
             {"a_bucket"}),
            ('a{s="free"} / on (job, rank) b{s="total"} < 0.05 unless on (job) rate(c[15m]) > 0',
             {"a", "b", "c"}),
            ("rate(a[10m]) > 4 * rate(a[1h] offset 10m) and rate(a[$__rate_interval]) > 1e3",
             {"a"}),
            ('sum(rate(a{instance=~"$instance"}[$__rate_interval]))', {"a"}),
        )
        for expr, want in cases:
            with self.subTest(expr=expr):
                self.assertEqual(promql_metrics(expr), want)


# --- a rank initialised again with another page count -----------------------------------

class RankReinitializedTest(OpsTestCase):

    def test_grown_and_shrunk_are_counted_and_logged(self):
        server = self.start()
        client = Client(server.base_url)
        self.addCleanup(client.close)

        def counts():
            m = self.scrape(server)
            return (m.get("hf3fs_metad_rank_reinitialized_total", change="grown"),
                    m.get("hf3fs_metad_rank_reinitialized_total", change="shrunk"))

        self.assertEqual(counts(), (0, 0))
        self.assertEqual(client.initialize(3, 8).status_code, 200)
        self.assertEqual(client.initialize(3, 8).status_code, 200)  # the same layout again
        self.assertEqual(client.initialize(3, 8, role="scheduler").status_code, 200)
        self.assertEqual(counts(), (0, 0))
        self.assertFalse(server.wait_log(r"initialized again", timeout=0.2))
        self.assertEqual(client.initialize(3, 16).status_code, 200)
        self.assertTrue(server.wait_log(
            r"warn .*rank 3 initialized again with 16 pages: grown from 8\. Do engines"),
            server.log())
        self.assertEqual(counts(), (1, 0))
        r = client.initialize(3, 4)
        self.assertEqual((r.status_code, r.content),
                         (200, b'{"message":"Rank 3 initialized with 4 pages"}'))
        self.assertTrue(server.wait_log(
            r"warn .*rank 3 initialized again with 4 pages: shrunk from 16, 0 key\(s\) bound"),
            server.log())
        self.assertEqual(counts(), (1, 1))


# --- HAProxy as the forwarder on an engine host -------------------------------------------

class Haproxy:
    """Debian's haproxy in the foreground (-db) on deploy/haproxy/hf3fs-metad.cfg, the
    upstream, listening port and token substituted."""

    def __init__(self, directory, upstream_port, token):
        with open(HAPROXY_CFG) as f:
            text = f.read()
        self.port = free_port()
        for shipped, ours in (("METAD_HOST:18000", f"127.0.0.1:{upstream_port}"),
                              ("bind 127.0.0.1:18000", f"bind 127.0.0.1:{self.port}"),
                              ("CHANGE-ME", token)):
            self._require(shipped, text)
            text = text.replace(shipped, ours)
        if os.geteuid() != 0:  # only root may switch users
            text = re.sub(r"\n\s*(user|group) haproxy\b", "", text)
        self.conf = os.path.join(directory, "haproxy.cfg")
        with open(self.conf, "w") as f:
            f.write(text)
        self.log_path = os.path.join(directory, "haproxy.log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([HAPROXY, "-db", "-f", self.conf],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            self._wait_listening()
        except Exception:
            self.stop()
            raise

    @staticmethod
    def _require(part, text):
        if part not in text:
            raise AssertionError(f"{HAPROXY_CFG} no longer contains {part!r}")

    def _wait_listening(self):
        wait_listening(self.proc, "haproxy", [self.port], self.log)

    def log(self):
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def stop(self):
        """Soft stop (SIGUSR1), then SIGTERM, then SIGKILL; the exit code."""
        return stop_process(self.proc, signal.SIGUSR1)


@unittest.skipUnless(os.path.exists(HAPROXY),
                     f"{HAPROXY} absent: install haproxy (scripts/setup.sh --test) to run the "
                     "forwarder tests")
class HaproxyTest(OpsTestCase):

    def start_haproxy(self, upstream_port):
        haproxy = Haproxy(self.tmpdir(), upstream_port, TOKEN)
        self.addCleanup(self._stop_haproxy, haproxy)
        return haproxy

    def _stop_haproxy(self, haproxy):
        code = haproxy.stop()
        self.assertEqual(code, 0, f"haproxy exit code; log:\n{haproxy.log()}")

    def token_file(self):
        return self.write_file(self.tmpdir(), "token", TOKEN + "\n")

    def test_deploy_config_parses(self):
        with open(HAPROXY_CFG) as f:
            text = f.read().replace("METAD_HOST", "127.0.0.1")
        conf = self.write_file(self.tmpdir(), "haproxy.cfg", text)
        run = subprocess.run([HAPROXY, "-c", "-f", conf], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=30)
        self.assertEqual(run.returncode, 0, run.stdout.decode() + run.stderr.decode())

    def test_vllm_sequence_through_haproxy(self):
        server = self.start("--auth-token-file", self.token_file())
        auth = {"Authorization": f"Bearer {TOKEN}"}
        haproxy = self.start_haproxy(server.port)
        # Its health check reaches /health without a token.
        deadline = time.monotonic() + 5.0
        while self.scrape(server, auth).get("hf3fs_metad_requests_total", endpoint="health",
                                            status="200") < 1:
            self.assertLess(time.monotonic(), deadline, f"no health check:\n{haproxy.log()}")
            time.sleep(0.05)

        before = self.scrape(server, auth)
        call = RequestsCaller(f"http://127.0.0.1:{haproxy.port}")  # sends no token
        try:
            made = vllm_sequence(self, call, "haproxy") + 1
            self.assertEqual(call("GET", "/health")[::2], (200, b'{"status":"ok"}'))
        finally:
            call.close()
        after = self.scrape(server, auth)

        def delta(name, **labels):
            return after.sum(name, **labels) - before.sum(name, **labels)

        # Keep-alive upstream: far fewer connections than requests. Each health check
        # opens one of its own (and is the only /health beside ours).
        checks = delta("hf3fs_metad_requests_total", endpoint="health") - 1
        accepted = delta("hf3fs_metad_connections_accepted_total") - checks
        self.assertLessEqual(accepted, 3, f"{made} requests took {accepted} connections")
        self.assertEqual(delta("hf3fs_metad_requests_total", status="401"), 0)

    def test_as_shipped_haproxy_cannot_clear_or_delete(self):
        d = self.tmpdir()
        server = self.start("--auth-token-file", self.token_file(),
                            "--admin-token-file", self.write_file(d, "admin", ADMIN_TOKEN))
        haproxy = self.start_haproxy(server.port)
        call = RequestsCaller(f"http://127.0.0.1:{haproxy.port}")
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
        admin = Client(server.base_url)
        self.addCleanup(admin.close)
        r = admin.request("POST", "/clear", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        self.assertEqual(r.status_code, 204)
        self.assertEqual(call("GET", "/rank/0")[0], 404)
