# ctest: once
"""What an operator looks at (issue 36): hit ratio counters, POST /keys/inspect and the
status page at GET /.

- Counters against a model: a seeded workload of vLLM saves (complete on both ranks, or
  on one only), SGLang saves (default tenant and a named one), then lookups of known and
  unknown keys; the model says which key each lookup finds, and
  hf3fs_metad_lookup_keys_total (per endpoint, hit and miss) and the hit ratio read from
  /metrics must be what it computed. Allocations from free pages and from eviction
  (--eviction lru, a pool smaller than the keys) likewise.
- Inspect on both APIs, for keys in every state: absent (free), reserved, bound
  (complete), incomplete (and since when), leased (and until when); SGLang's bound, in
  flight, leased and absent, under the default tenant and a named one; the token rule
  and the batch bound.
- The page in headless Chromium (Debian's chromium) against a running server with
  state: no console message, no script error, and the figures it shows are the
  server's (/status.json, /stats); text a client controls (an SGLang namespace with
  markup, shown in a pool row and a warning line) is shown as text. A screenshot is
  kept as an artefact (test-artifacts/status-page.png beside METAD_BIN). Skipped, saying
  so, only when chromium is absent (scripts/setup.sh --test installs it).

METAD_BIN as for the other suites; loopback only.
"""

import html.parser
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
import unittest

import requests

from metad_harness import Client, MetadServer, compact, key, keys
from test_operations import TOKEN, Metrics

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
INSPECT_MAX = 256


def lookups(metrics):
    """{(endpoint, tenant, result): value} of hf3fs_metad_lookup_keys_total."""
    return {(lbl["endpoint"], lbl.get("tenant", ""), lbl["result"]): v
            for lbl, v in metrics.series("hf3fs_metad_lookup_keys_total")}


class Server:
    """A server for one test, with a requests session; stopped at cleanup."""

    def __init__(self, tc, *args):
        self.proc = MetadServer(args)
        self.url = self.proc.base_url
        self.client = Client(self.url)
        tc.addCleanup(self.stop, tc)

    def stop(self, tc):
        self.client.close()
        tc.assertEqual(self.proc.stop(), 0, self.proc.log()[-3000:])

    def post(self, path, obj, headers=None):
        return requests.post(self.url + path, data=compact(obj), headers=headers, timeout=10)

    def ok(self, path, obj, status=200):
        r = self.post(path, obj)
        assert r.status_code == status, (path, obj, r.status_code, r.text)
        return r.json() if status == 200 else None

    def get(self, path, headers=None):
        r = requests.get(self.url + path, headers=headers, timeout=10)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r

    def metrics(self):
        return Metrics(self.get("/metrics").text)


# --- 1. the counters against a model --------------------------------------------------

class HitRatioTest(unittest.TestCase):

    def test_replayed_workload_hit_ratio_matches_the_model(self):
        seed = int(os.environ.get("HIT_SEED", "36"))
        rng = random.Random(seed)
        s = Server(self, "--threads", "3")
        ranks = (0, 1)
        for r in ranks:
            s.ok(f"/rank/{r}/initialize", {"role": "worker", "num_pages": 512})
        complete, confirmed = set(), {r: set() for r in ranks}
        fresh_vllm = 0
        # Saves: 60 keys on both ranks (complete), 20 on rank 0 only (incomplete).
        for batch in range(10):
            ks = keys(8, f"hit-{seed}-{batch}")
            both = batch < 7 or rng.random() < 0.5
            for r in (ranks if both else ranks[:1]):
                got = s.ok("/keys/batch_allocate", {"rank": r, "keys": [[k, ""] for k in ks]})
                pages = dict(got["results"])
                fresh_vllm += len(ks)
                s.ok("/keys/confirm_write", {"rank": r, "confirmations": [[k, pages[k]] for k in ks],
                                             "pages_to_release": []}, status=204)
                confirmed[r].update(ks)
            if both:
                complete.update(ks)
        # A re-allocation of saved keys takes no page (hits keep theirs).
        s.ok("/keys/batch_allocate", {"rank": 0, "keys": sorted(complete)[:4]})
        # SGLang: the default tenant's pool and tenant "t1"'s.
        bound = {"": set(), "t1": set()}
        fresh_sglang = 0
        for tenant in bound:
            prefix = f"/{tenant}" if tenant else ""
            s.ok(f"{prefix}/0/initialize", {"num_pages": 256}, status=204)
            for batch in range(4):
                ks = keys(6, f"sg-{tenant}-{batch}")
                got = s.ok(f"{prefix}/0/reserve_and_allocate_page_indices",
                           {"keys": [[k, ""] for k in ks]})
                fresh_sglang += len(ks)
                written = [[k, p] for k, (_, p) in zip(ks, got["indices"])][:5]  # one fails
                s.ok(f"{prefix}/0/confirm_write", {"written_keys_to_confirm": written}, status=204)
                bound[tenant].update(k for k, _ in written)
        # Lookups: known and unknown keys mixed, duplicates included.
        universe = sorted(complete | confirmed[0]) + keys(40, f"never-{seed}")
        sg_universe = {t: sorted(b) + keys(10, f"sg-never-{t}") for t, b in bound.items()}
        want = {}

        def count(endpoint, tenant, hits, n):
            for result, v in (("hit", hits), ("miss", n - hits)):
                want[(endpoint, tenant, result)] = want.get((endpoint, tenant, result), 0) + v

        for _ in range(120):
            op = rng.choice(("exists", "locations", "sg_exists", "sg_get"))
            if op in ("exists", "locations"):
                ks = [rng.choice(universe) for _ in range(rng.randint(0, 20))]
                if op == "exists":
                    got = s.ok("/keys/batch_exists", {"keys": ks})["exists"]
                    model = [k in complete for k in ks]
                    self.assertEqual(got, model)
                    count("batch_exists", "", sum(model), len(ks))
                else:
                    r = rng.choice(ranks)
                    got = s.ok("/keys/get_locations", {"rank": r, "keys": ks})["locations"]
                    model = [k in complete and k in confirmed[r] for k in ks]
                    self.assertEqual([p is not None for p in got], model)
                    count("get_locations", "", sum(model), len(ks))
            else:
                tenant = rng.choice(sorted(bound))
                prefix = f"/{tenant}" if tenant else ""
                ks = [rng.choice(sg_universe[tenant]) for _ in range(rng.randint(0, 12))]
                model = [k in bound[tenant] for k in ks]
                if op == "sg_exists":
                    got = s.ok(f"{prefix}/0/exists", {"keys": ks})["exists"]
                    self.assertEqual(got, model)
                    count("sglang_exists", tenant, sum(model), len(ks))
                else:
                    got = s.ok(f"{prefix}/0/get_page_indices", {"keys": ks})["indices"]
                    self.assertEqual([p is not None for p in got], model)
                    count("sglang_get_page_indices", tenant, sum(model), len(ks))
        # Requests the counters leave out: an unknown rank (404), a bad body (400), an
        # unknown pool (404).
        self.assertEqual(s.post("/keys/get_locations", {"rank": 7, "keys": ["x"]}).status_code, 404)
        self.assertEqual(s.post("/keys/batch_exists", {"keys": [1]}).status_code, 400)
        self.assertEqual(s.post("/5/exists", {"keys": ["x"]}).status_code, 404)

        m = s.metrics()
        got = lookups(m)
        for series, value in sorted(want.items()):
            with self.subTest(series=series):
                self.assertEqual(got.get(series, 0), value, f"seed {seed}")
        # The hit ratio, as a dashboard computes it from /metrics.
        hit = sum(v for (_, _, res), v in got.items() if res == "hit")
        total = sum(got.values())
        want_hit = sum(v for (_, _, res), v in want.items() if res == "hit")
        self.assertEqual((hit, total), (want_hit, sum(want.values())))
        self.assertGreater(hit, 0)
        self.assertLess(hit, total)
        # Pages handed out: all from free pages here.
        self.assertEqual(m.get("hf3fs_metad_allocated_pages_total", api="vllm", source="free"),
                         fresh_vllm)
        self.assertEqual(m.get("hf3fs_metad_allocated_pages_total", api="sglang", source="free"),
                         fresh_sglang)
        self.assertEqual(m.sum("hf3fs_metad_allocated_pages_total", source="eviction"), 0)
        # /status.json reports the same counts.
        status = s.get("/status.json").json()
        self.assertEqual((status["lookups"]["hit"], status["lookups"]["hit"] + status["lookups"]["miss"]),
                         (hit, total))

    def test_allocations_from_eviction_are_counted(self):
        s = Server(self, "--eviction", "lru", "--read-lease-ms", "0", "--incomplete-grace-ms", "0")
        s.ok("/rank/0/initialize", {"role": "worker", "num_pages": 8})
        for batch in range(3):  # 3 saves of 6 keys into 8 pages
            ks = keys(6, f"evict-{batch}")
            got = s.ok("/keys/batch_allocate", {"rank": 0, "keys": ks})
            pages = dict(got["results"])
            self.assertNotIn(-1, pages.values())
            s.ok("/keys/confirm_write", {"rank": 0, "confirmations": [[k, pages[k]] for k in ks]},
                 status=204)
        # 6 free; then 2 free + 4 evicted; then 2 free (the first save's other 2 pages)... the
        # totals: 18 pages handed out, the evicted ones as many as keys were evicted.
        m = s.metrics()
        evicted = m.get("hf3fs_metad_evicted_keys_total")
        self.assertGreater(evicted, 0)
        self.assertEqual(m.get("hf3fs_metad_allocated_pages_total", api="vllm", source="eviction"),
                         evicted)
        self.assertEqual(m.sum("hf3fs_metad_allocated_pages_total", api="vllm"), 18)
        # SGLang evicts the least recently used key of a full pool.
        s.ok("/0/initialize", {"num_pages": 2}, status=204)
        for batch in range(3):
            ks = [f"sg-{batch}-{i}" for i in range(2)]
            got = s.ok("/0/reserve_and_allocate_page_indices", {"keys": ks})
            s.ok("/0/confirm_write",
                 {"written_keys_to_confirm": [[k, p] for k, (_, p) in zip(ks, got["indices"])]},
                 status=204)
        m = s.metrics()
        self.assertEqual(m.get("hf3fs_metad_allocated_pages_total", api="sglang", source="free"), 2)
        self.assertEqual(m.get("hf3fs_metad_allocated_pages_total", api="sglang", source="eviction"), 4)


# --- 2. inspect ----------------------------------------------------------------------

class InspectTest(unittest.TestCase):

    def check_ms(self, value, low, high):
        self.assertIsInstance(value, int)
        self.assertGreaterEqual(value, low - 50)
        self.assertLessEqual(value, high + 50)

    def test_vllm_keys_in_every_state(self):
        s = Server(self, "--read-lease-ms", "60000", "--reservation-ttl", "600")
        for r in (0, 1):
            s.ok(f"/rank/{r}/initialize", {"role": "worker", "num_pages": 16})
        done, half, held, leased, free = keys(5, "inspect")
        t0 = int(time.time() * 1000)
        for r in (0, 1):
            got = s.ok("/keys/batch_allocate", {"rank": r, "keys": [done, half, leased, held]})
            pages = dict(got["results"])
            confirm = [[done, pages[done]], [leased, pages[leased]]] + ([[half, pages[half]]] if r == 0 else [])
            s.ok("/keys/confirm_write", {"rank": r, "confirmations": confirm}, status=204)
        t1 = int(time.time() * 1000)
        self.assertEqual(s.ok("/keys/get_locations", {"rank": 1, "keys": [leased]})["locations"], [2])
        t2 = int(time.time() * 1000)
        got = s.ok("/keys/inspect", {"keys": [done, half, held, leased, free, done]})["keys"]
        self.assertEqual([k["key"] for k in got], [done, half, held, leased, free, done])
        self.assertEqual(got[0], got[5])
        by = {k["key"]: k for k in got}
        d = by[done]
        self.assertEqual((d["exists"], d["state"], d["tp_world_size"], d["confirmations"]),
                         (True, "complete", 2, 2))
        self.assertEqual(d["ranks"], [{"rank": 0, "page": 0, "state": "bound"},
                                      {"rank": 1, "page": 0, "state": "bound"}])
        self.assertIsNone(d["incomplete_since"])
        self.assertIsNone(d["leased_until"])
        h = by[half]
        self.assertEqual((h["exists"], h["state"], h["confirmations"]), (False, "incomplete", 1))
        self.assertEqual(h["ranks"][0], {"rank": 0, "page": 1, "state": "bound"})
        self.assertEqual((h["ranks"][1]["rank"], h["ranks"][1]["page"], h["ranks"][1]["state"]),
                         (1, 1, "reserved"))
        self.check_ms(h["incomplete_since"], t0, t1)
        self.check_ms(h["ranks"][1]["reserved_until"], t0 + 600_000, t1 + 600_000)
        r = by[held]
        self.assertEqual((r["exists"], r["state"], r["confirmations"]), (False, "reserved", 0))
        self.assertEqual([(x["rank"], x["page"], x["state"]) for x in r["ranks"]],
                         [(0, 3, "reserved"), (1, 3, "reserved")])
        lk = by[leased]
        self.assertEqual(lk["state"], "complete")
        self.check_ms(lk["leased_until"], t1 + 60_000, t2 + 60_000)
        self.check_ms(lk["last_used"], t1, t2)
        f = by[free]
        self.assertEqual(f, {"key": free, "exists": False, "state": "absent", "tp_world_size": 0,
                             "confirmations": 0, "ranks": [], "incomplete_since": None,
                             "last_used": None, "leased_until": None})
        # Inspecting is not a use: nothing changed, the same answer again (times are
        # converted from the server's monotonic clock on each call: within a millisecond).
        again = s.ok("/keys/inspect", {"keys": [done, half, held, leased, free, done]})["keys"]

        def times_apart(a, b):
            if isinstance(a, dict):
                return a.keys() == b.keys() and all(times_apart(a[k], b[k]) for k in a)
            if isinstance(a, list):
                return len(a) == len(b) and all(times_apart(x, y) for x, y in zip(a, b))
            if isinstance(a, int) and not isinstance(a, bool) and a > 10**12:
                return abs(a - b) <= 2
            return a == b

        self.assertTrue(times_apart(again, got), (again, got))
        # The bounded batch, and the body rules of batch_exists.
        self.assertEqual(s.ok("/keys/inspect", {"keys": keys(INSPECT_MAX)})["keys"][0]["state"], "absent")
        r = s.post("/keys/inspect", {"keys": keys(INSPECT_MAX + 1)})
        self.assertEqual((r.status_code, r.json()),
                         (400, {"detail": f"Too many keys: {INSPECT_MAX + 1}; an inspection takes at most {INSPECT_MAX}"}))
        for bad in ({"keys": "x"}, {"keys": [1]}, {"keys": [["a", ""]]}):
            self.assertEqual(s.post("/keys/inspect", bad).status_code, 400, bad)
        self.assertEqual(requests.post(s.url + "/keys/inspect", data=b"{", timeout=10).status_code, 400)
        self.assertEqual(requests.get(s.url + "/keys/inspect", timeout=10).status_code, 405)

    def test_sglang_keys_in_every_state_on_both_prefixes(self):
        s = Server(self, "--sglang-read-lease-ms", "30000")
        for prefix in ("", "/tenantA"):
            s.ok(f"{prefix}/0/initialize", {"num_pages": 8, "namespace": "kv"}, status=204)
            got = s.ok(f"{prefix}/0/reserve_and_allocate_page_indices",
                       {"keys": [["b", ""], ["f", ""], ["l", ""]], "namespace": "kv"})["indices"]
            self.assertEqual(got, [[False, 7], [False, 6], [False, 5]])
            s.ok(f"{prefix}/0/confirm_write",
                 {"written_keys_to_confirm": [["b", 7], ["l", 5]], "namespace": "kv"}, status=204)
            t0 = int(time.time() * 1000)
            self.assertEqual(s.ok(f"{prefix}/0/get_page_indices", {"keys": ["l"]})["indices"], [5])
            t1 = int(time.time() * 1000)
            got = s.ok(f"{prefix}/0/inspect", {"keys": ["b", "f", "l", "z"], "namespace": "kv"})["keys"]
            b, f, lk, z = got
            self.assertEqual(b, {"key": "b", "exists": True, "state": "bound", "page": 7,
                                 "leased_until": None, "reserved_page": None,
                                 "reserved_until": None, "reserved_before_clear": False})
            self.assertEqual((f["state"], f["exists"], f["page"], f["reserved_page"]),
                             ("in_flight", False, None, 6))
            self.assertIsInstance(f["reserved_until"], int)  # --reservation-ttl 600 by default
            self.assertEqual((lk["state"], lk["page"]), ("bound", 5))
            self.check_ms(lk["leased_until"], t0 + 30_000, t1 + 30_000)
            self.assertEqual((z["state"], z["page"], z["reserved_page"]), ("absent", None, None))
            # Another namespace is another pool: 404 with the reference's text.
            r = s.post(f"{prefix}/0/inspect", {"keys": ["b"], "namespace": "mamba"})
            self.assertEqual(r.status_code, 404)
            self.assertIn("not initialized", r.json()["detail"])
            r = s.post(f"{prefix}/0/inspect", {"keys": keys(INSPECT_MAX + 1)})
            self.assertEqual(r.status_code, 400)
            self.assertIn("at most 256", r.json()["detail"])
        # A cleared pool: the in-flight page stays, its reservation will not bind.
        s.ok("/0/clear", {"namespace": "kv"}, status=204)
        f = s.ok("/0/inspect", {"keys": ["f"]})["keys"][0]
        self.assertEqual((f["state"], f["reserved_page"], f["reserved_before_clear"]), ("in_flight", 6, True))

    def test_inspect_needs_the_token_as_the_other_read_endpoints(self):
        directory = tempfile.mkdtemp(prefix="metad-inspect-")
        self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
        token_file = os.path.join(directory, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        s = Server(self, "--auth-token-file", token_file)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for path, body in (("/keys/inspect", {"keys": ["a"]}), ("/0/inspect", {"keys": ["a"]})):
            self.assertEqual(s.post(path, body).status_code, 401, path)
            self.assertNotEqual(s.post(path, body, headers=auth).status_code, 401, path)
        self.assertEqual(requests.get(s.url + "/status.json", timeout=10).status_code, 401)
        self.assertEqual(requests.get(s.url + "/status.json", headers=auth, timeout=10).status_code, 200)
        # The page itself carries no data: it needs no token.
        r = requests.get(s.url + "/", timeout=10)
        self.assertEqual(r.status_code, 200)
        self.assertTrue(r.headers["Content-Type"].startswith("text/html"))
        self.assertIn("default-src 'none'", r.headers["Content-Security-Policy"])


# --- 3. the page in headless Chromium --------------------------------------------------

class _Dom(html.parser.HTMLParser):
    """The text of each element with an id, the cells of each table row that has a
    data-* attribute (keyed "data-x=value"), the attributes of <body>, every tag seen."""

    VOID = {"br", "meta", "input", "link", "img", "hr", "col", "area", "base", "source", "wbr"}

    def __init__(self):
        super().__init__()
        self.by_id, self.rows, self.body, self.tags = {}, {}, {}, []
        self._stack = []  # [tag, id, text parts]
        self._row = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "body":
            self.body = a
        if tag == "tr":
            self._row = next((f"{k}={v}" for k, v in a.items() if k.startswith("data-")), None)
            if self._row:
                self.rows[self._row] = []
        if tag not in self.VOID:
            self._stack.append([tag, a.get("id"), []])

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        while self._stack:
            t, ident, parts = self._stack.pop()
            text = "".join(parts)
            if ident:
                self.by_id[ident] = text
            if self._stack:
                self._stack[-1][2].append(text)
            if t == "td" and self._row:
                self.rows[self._row].append(text)
            if t == "tr":
                self._row = None
            if t == tag:
                break

    def handle_data(self, data):
        if self._stack:
            self._stack[-1][2].append(data)

    def cells(self, row):
        return self.rows[row]


@unittest.skipIf(CHROMIUM is None, "chromium is absent (apt-get install chromium; "
                 "scripts/setup.sh --test installs it): the status page is not rendered")
class StatusPageTest(unittest.TestCase):

    def artefact_dir(self):
        binary = os.environ.get("METAD_BIN", "")
        base = os.path.dirname(os.path.abspath(binary)) if binary else tempfile.gettempdir()
        path = os.path.join(base, "test-artifacts")
        os.makedirs(path, exist_ok=True)
        return path

    def render(self, url, screenshot=None):
        """(DOM text, console lines) of the page after 5 s of virtual time."""
        profile = tempfile.mkdtemp(prefix="metad-chromium-")
        self.addCleanup(shutil.rmtree, profile, ignore_errors=True)
        args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
                "--enable-logging=stderr", "--v=0", "--window-size=1280,1500",
                "--virtual-time-budget=5000", "--dump-dom"]
        if screenshot:
            args.append(f"--screenshot={screenshot}")
        run = subprocess.run(args + [url], capture_output=True, timeout=90, cwd=profile)
        self.assertEqual(run.returncode, 0, run.stderr.decode(errors="replace")[-3000:])
        console = [line for line in run.stderr.decode(errors="replace").split("\n")
                   if ":CONSOLE" in line]
        return run.stdout.decode(), console

    def test_the_page_shows_the_servers_figures(self):
        s = Server(self, "--threads", "2")
        # State: two ranks, saves complete and incomplete, lookups, an SGLang pool whose
        # namespace carries markup, a grown rank (a warning line).
        for r in (0, 1):
            s.ok(f"/rank/{r}/initialize", {"role": "worker", "num_pages": 64})
        ks = keys(12, "page")
        for r in (0, 1):
            pages = dict(s.ok("/keys/batch_allocate", {"rank": r, "keys": ks})["results"])
            mine = ks if r == 0 else ks[:8]
            s.ok("/keys/confirm_write", {"rank": r, "confirmations": [[k, pages[k]] for k in mine]},
                 status=204)
        s.ok("/keys/batch_exists", {"keys": ks + keys(4, "absent")})  # 8 of 16
        s.ok("/keys/get_locations", {"rank": 1, "keys": ks[:10]})     # 8 of 10
        s.ok("/rank/1/initialize", {"role": "worker", "num_pages": 80})  # grown: a warning
        evil = '<img src=x onerror="document.body.setAttribute(\'data-xss\',\'1\')">'
        s.ok("/3/initialize", {"num_pages": 10, "namespace": evil}, status=204)
        s.ok("/3/initialize", {"num_pages": 4, "namespace": evil}, status=204)  # smaller: a warning
        got = s.ok("/3/reserve_and_allocate_page_indices", {"keys": ["x", "y"], "namespace": evil})
        s.ok("/3/confirm_write", {"written_keys_to_confirm": [["x", got["indices"][0][1]]],
                                  "namespace": evil}, status=204)
        s.ok("/3/exists", {"keys": ["x", "y", "z"], "namespace": evil})  # 1 of 3

        shot = os.path.join(self.artefact_dir(), "status-page.png")
        if os.path.exists(shot):
            os.remove(shot)
        dom_text, console = self.render(s.url + "/", screenshot=shot)
        self.assertEqual(console, [], "console messages")
        dom = _Dom()
        dom.feed(dom_text)
        self.assertTrue(os.path.getsize(shot) > 10_000, shot)
        print(f"\nstatus page screenshot: {shot}")
        self.assertNotIn("data-errors", dom.body, dom.by_id.get("errors"))
        self.assertGreaterEqual(int(dom.body.get("data-loaded", "0")), 2, "polled at least twice")
        self.assertNotIn("data-xss", dom.body)
        self.assertNotIn("img", dom.tags)

        status = s.get("/status.json").json()
        stats = s.get("/stats").json()
        self.assertEqual(dom.by_id["role"], "standalone")
        self.assertEqual(dom.by_id["version"], status["version"])
        self.assertEqual(dom.by_id["cores"], "2")
        self.assertRegex(dom.by_id["uptime"], r"^\d+s$")
        # Hit ratio of the exists lookups: 8 of 16 (vLLM) and 1 of 3 (SGLang).
        self.assertEqual(dom.by_id["hit-ratio"], f"{100 * 9 / 19:.1f}%")
        self.assertEqual(dom.cells("data-lookup=batch_exists"), ["batch_exists", "8", "8", "50.0%"])
        self.assertEqual(dom.cells("data-lookup=get_locations"), ["get_locations", "8", "2", "80.0%"])
        self.assertEqual(dom.cells("data-lookup=sglang_exists"), ["sglang_exists", "1", "2", "33.3%"])
        self.assertEqual(dom.by_id["memory-max"].split(" ")[0], str(status["memory"]["max"]))
        self.assertTrue(dom.by_id["memory-used"].split(" ")[0].isdigit())
        # The ranks' rows are /stats' (which the page's own polls do not change).
        for row in stats["ranks"]:
            cells = dom.cells(f"data-rank={row['rank']}")
            self.assertEqual(cells[:5], [str(row["rank"]), str(row["num_pages"]), str(row["free"]),
                                         str(row["reserved"]), str(row["bound"])])
        all_row = dom.cells("data-rank=all")
        self.assertEqual(all_row[1:6], [str(stats["pages_total"]), str(stats["pages_free"]),
                                        str(stats["pages_reserved"]), str(stats["pages_bound"]),
                                        str(stats["incomplete_pages"])])
        self.assertEqual(stats["incomplete_pages"], 4)
        # The SGLang pool, its namespace shown as the text it is.
        pool = stats["sglang"]["pools"][0]
        cells = dom.cells(f"data-pool=3 {evil}")
        self.assertEqual(cells[:5], [f"3 {evil}", str(pool["num_pages"]), str(pool["free"]),
                                     str(pool["in_flight"]), str(pool["bound"])])
        # Endpoints: the server's request counts (those the page's polls do not move).
        self.assertEqual(dom.cells("data-endpoint=batch_exists")[:2], ["batch_exists", "1"])
        self.assertEqual(dom.cells("data-endpoint=initialize")[:2], ["initialize", "3"])
        # The warnings, newest first, markup as text.
        warnings = dom.by_id["warnings"]
        self.assertIn("rank 1 initialized again with 80 pages: grown from 64", warnings)
        self.assertIn(f"namespace '{evil}' initialized with different num_pages", warnings)

    def test_with_a_token_the_page_asks_for_it_and_shows_nothing(self):
        directory = tempfile.mkdtemp(prefix="metad-page-")
        self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
        token_file = os.path.join(directory, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        s = Server(self, "--auth-token-file", token_file)
        dom_text, console = self.render(s.url + "/")
        # The 401s of the page's polls are the only console lines Chromium writes.
        self.assertTrue(all("401" in line for line in console), console)
        dom = _Dom()
        dom.feed(dom_text)
        self.assertEqual(dom.body.get("data-auth"), "needed")
        self.assertNotIn("data-loaded", dom.body)
        self.assertEqual(dom.by_id["headline"], "token needed")
        self.assertEqual(dom.by_id.get("role", ""), "")


if __name__ == "__main__":
    unittest.main()
