"""End-to-end: tenants bound to credentials (--tenants-file, issue 34 phase 1).

Over sockets against the real binary: no token or an unknown one is a 401; a token names
its tenant, and SGLang's /{rank}/... acts on that tenant's pools (tenant A's keys are not
visible to tenant B: the GHSA-qj2w-6f36-hc5w probe); /{B}/{rank}/... with A's token is a
403; vLLM's API on each tenant's own state (the vllm tenant's: the unnamed one), apart on
every endpoint, the admin naming a tenant with X-Metad-Tenant; ranks=N; pages=N (both
APIs, other tenants untouched, pages given back, reloads, a restart, concurrent clients
on four cores, vLLM's --eviction lru); the operator's
endpoints and the admin token; SIGHUP adding a tenant and rotating a token under an open
keep-alive connection; a bad file on SIGHUP keeping the old table, and at start-up
stopping the start (exit 2); /metrics' per-tenant figures (keys, pages, requests,
lookups) read over a socket with the operator's token. A wire suite: it runs once per
transport (METAD_IO), as issue 34 asks.

Run: cd tests/e2e && METAD_BIN=... /usr/bin/python3 -m unittest test_tenants
"""

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import time
import unittest

import requests

from metad_harness import (SOCKET_TIMEOUT_S, MetadServer, RawConnection, compact, raw_request,
                           run_to_exit, wait_until)

TOKEN_A = "tenant-a-token-0123456789abcdef"
TOKEN_A2 = "tenant-a-rotated-fedcba9876543210"
TOKEN_B = "tenant-b-token-aaaaaaaaaaaaaaaa"
TOKEN_C = "tenant-c-token-cccccccccccccccc"
OPERATOR = "operator-read-token-1111111111"
ADMIN = "admin-token-2222222222222222"
UNAUTHORIZED = b'{"detail":"Missing or invalid bearer token"}'
KEY = hashlib.sha256(b"tenant A's page").hexdigest()


def sha(token):
    """What the file holds: printf %s "$TOKEN" | sha256sum."""
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


class TenantsTestCase(unittest.TestCase):
    """A fresh server per test, with a tenants file in a temporary directory."""

    DEFAULT_FILE = (f"# the cluster's tenants\n"
                    f"\n"
                    f"team_a {sha(TOKEN_A)} ranks=2 vllm\n"
                    f"team_b {sha(TOKEN_B)}   # SGLang only\n")

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="metad-tenants-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.path = os.path.join(self.dir, "tenants")
        self.write(self.DEFAULT_FILE)
        self.session = requests.Session()
        self.addCleanup(self.session.close)

    def write(self, text):
        """Replaces the file as an operator should: a new file renamed over the old."""
        tmp = self.path + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)

    def start(self, *extra):
        auth = os.path.join(self.dir, "operator")
        admin = os.path.join(self.dir, "admin")
        with open(auth, "w") as f:
            f.write(OPERATOR + "\n")
        with open(admin, "w") as f:
            f.write(ADMIN)
        self.server = MetadServer(("--tenants-file", self.path, "--auth-token-file", auth,
                                   "--admin-token-file", admin, *extra))
        self.addCleanup(self._stop)
        return self.server

    def _stop(self):
        code = self.server.stop()
        self.assertEqual(code, 0, f"exit code after SIGTERM; stderr:\n{self.server.log()[-3000:]}")

    def post(self, path, body, token=None, session=None):
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers.update(bearer(token))
        data = body if isinstance(body, bytes) else compact(body)
        return (session or self.session).post(self.server.base_url + path, data=data,
                                              headers=headers, timeout=SOCKET_TIMEOUT_S)

    def get(self, path, token=None):
        return self.session.get(self.server.base_url + path,
                                headers=bearer(token) if token else {}, timeout=SOCKET_TIMEOUT_S)

    def reload(self, text):
        """Writes `text`, sends SIGHUP and waits for the server to say it took it or not;
        returns that log line."""
        pattern = re.compile(r"tenants: (\d+ from |.*stay in force)")
        before = sum(1 for line in list(self.server.stderr_lines) if pattern.search(line))
        self.write(text)
        self.server.proc.send_signal(signal.SIGHUP)
        self.assertTrue(wait_until(lambda: sum(1 for line in list(self.server.stderr_lines)
                                               if pattern.search(line)) > before, 5.0),
                        f"no reload line; stderr:\n{self.server.log()[-2000:]}")
        return [line for line in list(self.server.stderr_lines) if pattern.search(line)][-1]

    def assert_401(self, r):
        self.assertEqual((r.status_code, r.content), (401, UNAUTHORIZED), r.content)
        self.assertEqual(r.headers.get("WWW-Authenticate"), "Bearer")

    def assert_403(self, r, detail):
        self.assertEqual(r.status_code, 403, r.content)
        self.assertEqual(r.reason, "Forbidden")
        self.assertEqual(r.headers.get("Content-Type"), "application/json")
        self.assertEqual(r.json(), {"detail": detail})

    def save(self, rank, key, token, prefix=""):
        """SGLang's save of one key on `rank`: reserve, then confirm; its page."""
        r = self.post(f"{prefix}/{rank}/reserve_and_allocate_page_indices",
                      {"keys": [[key, ""]], "namespace": "kv"}, token)
        self.assertEqual(r.status_code, 200, r.content)
        [[exists, page]] = r.json()["indices"]
        self.assertEqual((exists, page >= 0), (False, True))
        r = self.post(f"{prefix}/{rank}/confirm_write",
                      {"written_keys_to_confirm": [[key, page]], "pages_to_release": [],
                       "namespace": "kv"}, token)
        self.assertEqual(r.status_code, 204, r.content)
        return page


class CredentialsTest(TenantsTestCase):

    def test_no_token_or_an_unknown_one_is_401(self):
        self.start()
        calls = [("POST", "/0/exists", {"keys": []}), ("POST", "/team_a/0/exists", {"keys": []}),
                 ("POST", "/keys/batch_exists", {"keys": []}), ("POST", "/rank/0/initialize",
                                                                {"num_pages": 4}),
                 ("GET", "/metrics", None), ("GET", "/stats", None), ("POST", "/nowhere", {}),
                 ("POST", "/0/clear", {"namespace": "kv"}), ("POST", "/clear", b"")]
        for auth in (None, "Bearer", "Bearer ", "Basic " + TOKEN_A, "Bearer " + TOKEN_A + "x",
                     "Bearer " + sha(TOKEN_A), "Bearer " + TOKEN_A[:-1]):
            for method, path, body in calls:
                with self.subTest(auth=auth, path=path):
                    headers = {} if auth is None else {"Authorization": auth}
                    data = body if isinstance(body, bytes) or body is None else compact(body)
                    r = self.session.request(method, self.server.base_url + path, data=data,
                                             headers=headers, timeout=SOCKET_TIMEOUT_S)
                    self.assert_401(r)
        # /health and the status page need none.
        self.assertEqual(self.get("/health").status_code, 200)
        self.assertEqual(self.get("/").status_code, 200)
        # A tenant's token on an unknown path: the 404 (its token is known).
        self.assertEqual(self.post("/nowhere", {}, TOKEN_B).status_code, 404)
        # The scheme is case-insensitive, as without tenants.
        r = self.session.post(self.server.base_url + "/0/initialize", data=b'{"num_pages":4}',
                              headers={"Authorization": "bEaReR " + TOKEN_B})
        self.assertEqual(r.status_code, 204, r.content)

    def test_a_token_acts_on_its_own_tenant_only(self):
        """The GHSA-qj2w-6f36-hc5w probe: tenant B cannot see or reach tenant A's keys."""
        self.start()
        self.assertEqual(self.post("/0/initialize", {"num_pages": 8}, TOKEN_A).status_code, 204)
        page = self.save(0, KEY, TOKEN_A)
        # /{rank}/... and /team_a/{rank}/... are one state space for A's token.
        for prefix in ("", "/team_a"):
            r = self.post(f"{prefix}/0/exists", {"keys": [KEY]}, TOKEN_A)
            self.assertEqual(r.json(), {"exists": [True]}, prefix)
            r = self.post(f"{prefix}/0/get_page_indices", {"keys": [KEY]}, TOKEN_A)
            self.assertEqual(r.json(), {"indices": [page]}, prefix)
        # B's rank 0 is B's own pool: not initialized yet, then empty.
        r = self.post("/0/exists", {"keys": [KEY]}, TOKEN_B)
        self.assertEqual(r.status_code, 404, r.content)
        self.assertEqual(self.post("/0/initialize", {"num_pages": 8}, TOKEN_B).status_code, 204)
        self.assertEqual(self.post("/0/exists", {"keys": [KEY]}, TOKEN_B).json(),
                         {"exists": [False]})
        self.assertEqual(self.post("/0/get_page_indices", {"keys": [KEY]}, TOKEN_B).json(),
                         {"indices": [None]})
        self.assertEqual(self.post("/0/inspect", {"keys": [KEY]}, TOKEN_B).json()["keys"][0]["state"],
                         "absent")
        # B deleting or clearing "its" rank 0 leaves A's key.
        self.assertEqual(self.post("/0/delete_keys", {"keys": [KEY]}, TOKEN_B).status_code, 204)
        self.assertEqual(self.post("/0/exists", {"keys": [KEY]}, TOKEN_A).json(),
                         {"exists": [True]})
        # Naming A's tenant in the path with B's token: 403, and nothing is read or changed.
        detail = ("tenant team_b's token may not use tenant team_a's pools: a token acts on "
                  "its own tenant's (/team_b/{rank}/... or /{rank}/...)")
        for op, body in (("exists", {"keys": [KEY]}), ("get_page_indices", {"keys": [KEY]}),
                         ("delete_keys", {"keys": [KEY]}),
                         ("initialize", {"num_pages": 4}), ("inspect", {"keys": [KEY]}),
                         ("reserve_and_allocate_page_indices", {"keys": [["x", ""]]}),
                         ("confirm_write", {"written_keys_to_confirm": [[KEY, page]]})):
            with self.subTest(op=op):
                self.assert_403(self.post(f"/team_a/0/{op}", body, TOKEN_B), detail)
        # clear takes the admin token (--admin-token-file): a tenant's is a 401 there.
        self.assert_401(self.post("/team_a/0/clear", {"namespace": "kv"}, TOKEN_B))
        # A tenant that does not exist is another tenant's name too.
        self.assert_403(self.post("/team_z/0/exists", {"keys": [KEY]}, TOKEN_B),
                        detail.replace("team_a's", "team_z's"))
        self.assertEqual(self.post("/team_a/0/exists", {"keys": [KEY]}, TOKEN_A).json(),
                         {"exists": [True]})
        # The operator sees both tenants' pools.
        pools = self.get("/stats", OPERATOR).json()["sglang"]["pools"]
        self.assertEqual(sorted((p["tenant"], p["rank"], p["bound"]) for p in pools),
                         [("team_a", 0, 1), ("team_b", 0, 0)])

    def vllm_save(self, token, rank, keys, num_pages=4):
        """vLLM's save on `rank` of `token`'s own state: initialize, allocate, confirm; the
        pages."""
        r = self.post(f"/rank/{rank}/initialize", {"num_pages": num_pages}, token)
        self.assertEqual(r.status_code, 200, r.content)
        r = self.post("/keys/batch_allocate", {"rank": rank, "keys": [[k, ""] for k in keys]},
                      token)
        self.assertEqual(r.status_code, 200, r.content)
        pages = [page for _, page in r.json()["results"]]
        r = self.post("/keys/confirm_write",
                      {"rank": rank, "confirmations": [list(kp) for kp in zip(keys, pages)]},
                      token)
        self.assertEqual(r.status_code, 204, r.content)
        return pages

    def admin(self, path, body, tenant=None):
        headers = {"Content-Type": "application/json", **bearer(ADMIN)}
        if tenant is not None:
            headers["X-Metad-Tenant"] = tenant
        data = body if isinstance(body, bytes) else compact(body)
        return self.session.post(self.server.base_url + path, data=data, headers=headers,
                                 timeout=SOCKET_TIMEOUT_S)

    def test_each_tenant_has_its_own_vllm_state(self):
        """The GHSA-qj2w-6f36-hc5w probe on vLLM's API: B's rank 0 and keys are B's own, on
        every endpoint; A's (the vllm tenant's, the unnamed state) never show."""
        self.start()
        self.assertEqual(self.vllm_save(TOKEN_A, 0, [KEY]), [0])
        # B asks about A's key and rank: nothing of A's is there.
        self.assertEqual(self.post("/keys/batch_exists", {"keys": [KEY]}, TOKEN_B).json(),
                         {"exists": [False]})
        for path, body in (("/keys/get_locations", {"rank": 0, "keys": [KEY]}),
                           ("/keys/batch_allocate", {"rank": 0, "keys": [[KEY, ""]]}),
                           ("/keys/confirm_write", {"rank": 0, "confirmations": [[KEY, 0]]})):
            with self.subTest(path=path):
                self.assertEqual(self.post(path, body, TOKEN_B).status_code, 404)
        self.assertEqual(self.get("/rank/0", TOKEN_B).status_code, 404)
        r = self.post("/keys/inspect", {"keys": [KEY]}, TOKEN_B).json()
        self.assertEqual((r["keys"][0]["state"], r["keys"][0]["ranks"]), ("absent", []), r)
        # B's own rank 0, of another size, and the same key: a page of B's pool.
        self.assertEqual(self.vllm_save(TOKEN_B, 0, ["j", KEY], num_pages=8), [0, 1])
        self.assertEqual(self.get("/rank/0", TOKEN_B).json()["num_pages"], 8)
        self.assertEqual(self.get("/rank/0", TOKEN_A).json()["num_pages"], 4)
        self.assertEqual(self.post("/keys/get_locations", {"rank": 0, "keys": [KEY]},
                                   TOKEN_B).json(), {"locations": [1]})
        self.assertEqual(self.post("/keys/get_locations", {"rank": 0, "keys": [KEY]},
                                   TOKEN_A).json(), {"locations": [0]})
        self.assertEqual(self.get("/stats", TOKEN_B).json()["pages_total"], 8)
        self.assertEqual(self.get("/stats", TOKEN_A).json()["keys"], 1)
        # With --admin-token-file, /clear and /keys/delete take it, and no tenant's; the
        # admin names the tenant with X-Metad-Tenant (none: the unnamed state, A's here).
        self.assert_401(self.post("/clear", b"", TOKEN_A))
        self.assert_401(self.post("/keys/delete", {"keys": [KEY]}, TOKEN_B))
        self.assertEqual(self.admin("/keys/delete", {"keys": ["j"]}, "team_b").json(),
                         {"deleted": 1})
        self.assertEqual(self.post("/keys/batch_exists", {"keys": [KEY, "j"]}, TOKEN_B).json(),
                         {"exists": [True, False]})
        self.assertEqual(self.post("/keys/batch_exists", {"keys": [KEY]}, TOKEN_A).json(),
                         {"exists": [True]})
        r = self.admin("/clear", b"", "nobody")
        self.assertEqual((r.status_code, r.json()), (404, {
            "detail": "X-Metad-Tenant: no tenant nobody has vLLM state on this server"}))
        self.assertEqual(self.admin("/clear", b"", "team_b").status_code, 204)
        self.assertEqual(self.get("/rank/0", TOKEN_B).status_code, 404)
        self.assertEqual(self.post("/keys/batch_exists", {"keys": [KEY]}, TOKEN_A).json(),
                         {"exists": [True]})
        # A file where nobody holds the unnamed state: A gets a state of its own (empty);
        # the unnamed one stays, and comes back with the word vllm.
        self.reload(f"team_a {sha(TOKEN_A)}\nteam_b {sha(TOKEN_B)}\n")
        self.assertEqual(self.post("/keys/batch_exists", {"keys": [KEY]}, TOKEN_A).json(),
                         {"exists": [False]})
        self.reload(self.DEFAULT_FILE)
        self.assertEqual(self.post("/keys/batch_exists", {"keys": [KEY]}, TOKEN_A).json(),
                         {"exists": [True]})
        self.assertEqual(self.admin("/clear", b"").status_code, 204)
        self.assertEqual(self.post("/keys/batch_exists", {"keys": [KEY]}, TOKEN_A).json(),
                         {"exists": [False]})

    def test_each_tenants_vllm_state_comes_back_apart_after_restarts(self):
        """Restarts (on another core count too) give each tenant back its own vLLM state, and
        a tenant's clear stays its own."""
        data = os.path.join(self.dir, "data")
        self.start("--data-dir", data, "--threads", "2")
        self.assertEqual(self.vllm_save(TOKEN_A, 0, [KEY]), [0])
        self.assertEqual(self.vllm_save(TOKEN_B, 0, ["j", KEY], num_pages=8), [0, 1])
        self.assertEqual(self.vllm_save(TOKEN_B, 1, [KEY], num_pages=8), [0])

        def check(b_keys):
            self.assertEqual(self.post("/keys/batch_exists", {"keys": [KEY, "j"]}, TOKEN_A).json(),
                             {"exists": [True, False]})
            self.assertEqual(self.get("/rank/0", TOKEN_A).json()["num_pages"], 4)
            self.assertEqual(self.post("/keys/get_locations", {"rank": 0, "keys": [KEY]},
                                       TOKEN_A).json(), {"locations": [0]})
            self.assertEqual(self.post("/keys/batch_exists", {"keys": [KEY, "j"]},
                                       TOKEN_B).json(), {"exists": b_keys})

        check([True, True])
        for threads in ("3", "1"):
            self._stop()
            self.start("--data-dir", data, "--threads", threads)
            check([True, True])
            self.assertEqual(self.post("/keys/get_locations", {"rank": 0, "keys": [KEY, "j"]},
                                       TOKEN_B).json(), {"locations": [1, 0]})
        self.assertEqual(self.admin("/clear", b"", "team_b").status_code, 204)
        self._stop()
        self.start("--data-dir", data, "--threads", "2")
        check([False, False])
        self.assertEqual(self.get("/rank/0", TOKEN_B).status_code, 404)

    def test_operators_endpoints_take_the_operators_tokens(self):
        self.start()
        for path in ("/metrics", "/status.json", "/ready"):
            with self.subTest(path=path):
                self.assert_403(self.get(path, TOKEN_A),
                                f"{path} shows every tenant's state: it takes "
                                f"--auth-token-file's or --admin-token-file's token, not a "
                                f"tenant's (tenant team_a)")
                self.assertEqual(self.get(path, OPERATOR).status_code, 200)
                self.assertEqual(self.get(path, ADMIN).status_code, 200)
        # /stats is each tenant's own vLLM state; the operator's, the unnamed one.
        for token in (TOKEN_A, OPERATOR, ADMIN):
            self.assertEqual(self.get("/stats", token).status_code, 200)
        # The operator's token is no tenant's: the API refuses it.
        self.assert_401(self.post("/0/exists", {"keys": []}, OPERATOR))
        self.assert_401(self.post("/keys/batch_exists", {"keys": []}, OPERATOR))
        self.assert_401(self.post("/0/initialize", {"num_pages": 4}, ADMIN))

    def test_admin_names_the_tenant_in_the_path(self):
        self.start()
        self.assertEqual(self.post("/0/initialize", {"num_pages": 8}, TOKEN_A).status_code, 204)
        self.save(0, KEY, TOKEN_A)
        # With --admin-token-file, a tenant cannot clear even its own pools.
        for path in ("/0/clear", "/team_a/0/clear"):
            self.assert_401(self.post(path, {"namespace": "kv"}, TOKEN_A))
        # /{rank}/clear with the admin token is the default tenant's (none here: 404).
        self.assertEqual(self.post("/0/clear", {"namespace": "kv"}, ADMIN).status_code, 404)
        self.assertEqual(self.post("/0/exists", {"keys": [KEY]}, TOKEN_A).json(),
                         {"exists": [True]})
        # A tenant removed from the file loses its token at once; its state stays until the
        # admin clears it, naming it in the path.
        self.reload(f"team_b {sha(TOKEN_B)}\n")
        self.assert_401(self.post("/0/exists", {"keys": [KEY]}, TOKEN_A))
        pools = self.get("/stats", OPERATOR).json()["sglang"]["pools"]
        self.assertEqual([(p["tenant"], p["bound"]) for p in pools], [("team_a", 1)])
        self.assertEqual(self.post("/team_a/0/clear", {"namespace": "kv"}, ADMIN).status_code, 204)
        pools = self.get("/stats", OPERATOR).json()["sglang"]["pools"]
        self.assertEqual([(p["tenant"], p["bound"]) for p in pools], [("team_a", 0)])

    def test_without_an_admin_token_a_tenant_clears_its_own_pools(self):
        auth = os.path.join(self.dir, "operator")
        with open(auth, "w") as f:
            f.write(OPERATOR)
        self.server = MetadServer(("--tenants-file", self.path, "--auth-token-file", auth))
        self.addCleanup(self._stop)
        for token in (TOKEN_A, TOKEN_B):
            self.assertEqual(self.post("/0/initialize", {"num_pages": 8}, token).status_code, 204)
            self.save(0, KEY, token)
        self.assertEqual(self.post("/0/clear", {"namespace": "kv"}, TOKEN_B).status_code, 204)
        self.assertEqual(self.post("/0/exists", {"keys": [KEY]}, TOKEN_B).json(),
                         {"exists": [False]})
        self.assertEqual(self.post("/0/exists", {"keys": [KEY]}, TOKEN_A).json(),
                         {"exists": [True]})
        self.assertEqual(self.post("/team_b/0/clear", {"namespace": "kv"}, TOKEN_A).status_code,
                         403)
        # vLLM's /clear: each tenant's own state then.
        for token in (TOKEN_A, TOKEN_B):
            self.assertEqual(self.vllm_save(token, 0, [KEY]), [0])
        self.assertEqual(self.post("/clear", b"", TOKEN_B).status_code, 204)
        self.assertEqual(self.post("/keys/batch_exists", {"keys": [KEY]}, TOKEN_B).json(),
                         {"exists": [False]})
        self.assertEqual(self.post("/keys/batch_exists", {"keys": [KEY]}, TOKEN_A).json(),
                         {"exists": [True]})


class QuotaTest(TenantsTestCase):

    def test_ranks_quota_bounds_sglang_pools_and_vllm_ranks(self):
        self.start()
        init = lambda rank, ns="kv", token=TOKEN_A: self.post(  # noqa: E731
            f"/{rank}/initialize", {"num_pages": 4, "namespace": ns}, token)
        self.assertEqual(init(0).status_code, 204)
        self.assertEqual(init(1).status_code, 204)
        # Another namespace of a rank it holds is no new rank; re-initializing neither.
        self.assertEqual(init(1, "mamba").status_code, 204)
        self.assertEqual(init(0).status_code, 204)
        r = init(2)
        self.assert_403(r, "Rank 2 namespace 'kv' not initialized: tenant team_a has SGLang pools "
                           "on as many ranks as its quota allows (ranks=2 in --tenants-file)")
        self.assertEqual(self.post("/2/exists", {"keys": []}, TOKEN_A).status_code, 404)
        # Another tenant has its own count (team_b has no quota).
        for rank in range(5):
            self.assertEqual(init(rank, token=TOKEN_B).status_code, 204)
        # vLLM's ranks, for the vllm tenant: the same N, counted apart.
        for rank in (0, 1):
            r = self.post(f"/rank/{rank}/initialize", {"num_pages": 4}, TOKEN_A)
            self.assertEqual(r.status_code, 200, r.content)
        self.assert_403(self.post("/rank/7/initialize", {"num_pages": 4}, TOKEN_A),
                        "Rank 7 not initialized: tenant team_a has as many vLLM ranks as its "
                        "quota allows (ranks=2 in --tenants-file)")
        self.assertEqual(self.post("/rank/1/initialize", {"num_pages": 8}, TOKEN_A).status_code, 200)
        # A raised quota takes effect with the reload; the count stays.
        self.reload(f"team_a {sha(TOKEN_A)} ranks=3 vllm\nteam_b {sha(TOKEN_B)}\n")
        self.assertEqual(init(2).status_code, 204)
        self.assertEqual(init(3).status_code, 403)
        self.assertEqual(self.post("/rank/7/initialize", {"num_pages": 4}, TOKEN_A).status_code, 200)
        self.assertEqual(self.post("/rank/8/initialize", {"num_pages": 4}, TOKEN_A).status_code, 403)

    def test_ranks_quota_counts_what_a_restart_recovered(self):
        data = os.path.join(self.dir, "data")
        self.start("--data-dir", data)
        for rank in (0, 1):
            self.assertEqual(self.post(f"/{rank}/initialize", {"num_pages": 4}, TOKEN_A).status_code,
                             204)
        self._stop()
        self.start("--data-dir", data)
        self.assertEqual(self.post("/1/initialize", {"num_pages": 4, "namespace": "swa"},
                                   TOKEN_A).status_code, 204)
        self.assertEqual(self.post("/2/initialize", {"num_pages": 4}, TOKEN_A).status_code, 403)


class PagesQuotaTest(TenantsTestCase):
    """pages=N: the pages a tenant holds (reserved + bound) over all its SGLang pools and,
    for the vllm tenant, vLLM's ranks; past it an allocation is answered as a full pool's."""

    FILE = (f"team_a {sha(TOKEN_A)} pages=4 vllm\n"
            f"team_b {sha(TOKEN_B)} pages=2\n"
            f"team_c {sha(TOKEN_C)}\n")

    def reserve(self, rank, keys, token):
        r = self.post(f"/{rank}/reserve_and_allocate_page_indices",
                      {"keys": [[k, ""] for k in keys], "namespace": "kv"}, token)
        self.assertEqual(r.status_code, 200, r.content)
        return [page for _, page in r.json()["indices"]]

    def allocate(self, rank, keys, token=TOKEN_A):
        r = self.post("/keys/batch_allocate", {"rank": rank, "keys": [[k, ""] for k in keys]},
                      token)
        self.assertEqual(r.status_code, 200, r.content)
        return [page for _, page in r.json()["results"]]

    def init(self, rank, token, pages=8):
        self.assertEqual(self.post(f"/{rank}/initialize", {"num_pages": pages}, token).status_code,
                         204)

    def test_pages_quota_bounds_each_tenant_alone_on_both_apis(self):
        self.write(self.FILE)
        self.start()
        # team_a: SGLang pools on two ranks (two cores) and vLLM's rank 0 share its 4 pages.
        self.init(0, TOKEN_A)
        self.init(1, TOKEN_A)
        self.assertEqual(self.reserve(0, ["a1", "a2"], TOKEN_A), [7, 6])
        self.assertEqual(self.reserve(1, ["a3"], TOKEN_A), [7])
        r = self.post("/rank/0/initialize", {"num_pages": 8}, TOKEN_A)
        self.assertEqual(r.status_code, 200, r.content)
        self.assertEqual(self.allocate(0, ["v1"]), [0])
        # At the quota: -1, as a full pool answers (its pools have free pages).
        self.assertEqual(self.reserve(1, ["a4"], TOKEN_A), [-1])
        self.assertEqual(self.allocate(0, ["v2"]), [-1])
        # team_b's quota is its own; team_c has none: neither is touched by team_a's.
        self.init(0, TOKEN_B)
        self.assertEqual(self.reserve(0, ["b1", "b2"], TOKEN_B), [7, 6])
        self.assertEqual(self.reserve(0, ["b3"], TOKEN_B), [-1])
        self.init(0, TOKEN_C)
        self.assertEqual(self.reserve(0, [f"c{i}" for i in range(8)], TOKEN_C), list(range(7, -1, -1)))
        # team_a frees: an SGLang release, then a vLLM release; each lets one more in.
        r = self.post("/0/confirm_write", {"written_keys_to_confirm": [["a1", 7]],
                                           "pages_to_release": [6], "namespace": "kv"}, TOKEN_A)
        self.assertEqual(r.status_code, 204, r.content)
        self.assertEqual(self.allocate(0, ["v2"]), [1])
        self.assertEqual(self.reserve(1, ["a4"], TOKEN_A), [-1])
        r = self.post("/keys/confirm_write", {"rank": 0, "confirmations": [],
                                              "pages_to_release": [1]}, TOKEN_A)
        self.assertEqual(r.status_code, 204, r.content)
        self.assertEqual(self.reserve(1, ["a4"], TOKEN_A), [6])
        # A bound key of the pool: at the quota a reserve evicts it, the tenant's own.
        r = self.post("/1/confirm_write", {"written_keys_to_confirm": [["a3", 7]],
                                           "pages_to_release": [], "namespace": "kv"}, TOKEN_A)
        self.assertEqual(r.status_code, 204, r.content)
        self.assertEqual(self.reserve(1, ["a5"], TOKEN_A), [7])
        self.assertEqual(self.post("/1/exists", {"keys": ["a3"]}, TOKEN_A).json(),
                         {"exists": [False]})
        self.assertEqual(self.reserve(0, ["b3"], TOKEN_B), [-1])  # team_b still at its 2
        # SIGHUP: a raised quota applies at once; a lowered one refuses until below it.
        self.reload(self.FILE.replace("pages=4", "pages=6").replace("pages=2", "pages=1"))
        self.assertEqual(self.reserve(0, ["a6", "a7"], TOKEN_A), [6, 5])  # 6: released
        self.assertEqual(self.reserve(1, ["a8"], TOKEN_A), [-1])
        # team_b holds 2, over its new 1: -1 until it gives pages back, then one fits.
        self.assertEqual(self.reserve(0, ["b4"], TOKEN_B), [-1])
        r = self.post("/0/confirm_write", {"written_keys_to_confirm": [],
                                           "pages_to_release": [7, 6], "namespace": "kv"}, TOKEN_B)
        self.assertEqual(r.status_code, 204, r.content)
        self.assertEqual(self.reserve(0, ["b4", "b5"], TOKEN_B), [6, -1])

    def test_pages_quota_counts_what_a_restart_recovered(self):
        self.write(self.FILE)
        data = os.path.join(self.dir, "data")
        self.start("--data-dir", data)
        self.init(0, TOKEN_A)
        self.init(1, TOKEN_A)
        self.assertEqual(self.reserve(0, ["a1", "a2", "a3"], TOKEN_A), [7, 6, 5])
        self.save(1, "a4", TOKEN_A)
        self.assertEqual(self.reserve(1, ["a5"], TOKEN_A), [7])  # evicts a4: still 4 held
        r = self.post("/0/confirm_write", {"written_keys_to_confirm": [],
                                           "pages_to_release": [7], "namespace": "kv"}, TOKEN_A)
        self.assertEqual(r.status_code, 204, r.content)
        # One page left: the first new key takes it; the second is answered as by a full
        # pool (pool 0 has no bound key). The log records the cap, for the replay.
        self.assertEqual(self.reserve(0, ["a6", "a7"], TOKEN_A), [7, -1])
        self._stop()
        self.start("--data-dir", data)
        self.assertEqual(self.reserve(0, ["a8"], TOKEN_A), [-1])
        r = self.post("/0/inspect", {"keys": ["a6", "a7"], "namespace": "kv"}, TOKEN_A)
        self.assertEqual([(k["state"], k["reserved_page"]) for k in r.json()["keys"]],
                         [("in_flight", 7), ("absent", None)])
        r = self.post("/0/confirm_write", {"written_keys_to_confirm": [],
                                           "pages_to_release": [7, 6], "namespace": "kv"}, TOKEN_A)
        self.assertEqual(r.status_code, 204, r.content)
        self.assertEqual(self.reserve(0, ["a8", "a9", "a10"], TOKEN_A), [6, 7, -1])  # LIFO

    def test_concurrent_allocations_on_four_cores_take_exactly_the_quota(self):
        """Eight clients, vLLM's batch_allocate and SGLang's reserve on ranks of four cores,
        nothing freed: the tenant's count is shared, so exactly pages=N are handed out."""
        quota = 60
        self.write(f"team_a {sha(TOKEN_A)} pages={quota} vllm\n")
        self.start("--threads", "4")
        for rank in range(4):
            self.init(rank, TOKEN_A, pages=64)
            r = self.post(f"/rank/{rank}/initialize", {"num_pages": 64}, TOKEN_A)
            self.assertEqual(r.status_code, 200, r.content)

        def client(n):
            session = requests.Session()
            granted, i = 0, 0
            try:
                while True:  # batches of 1 to 3 new keys, then single keys until refused
                    size = 1 + (n + i) % 3 if i < 6 else 1
                    keys = [f"c{n}-{i}-{j}" for j in range(size)]
                    rank = (n + i) % 4
                    i += 1
                    if n % 2:
                        r = self.post("/keys/batch_allocate",
                                      {"rank": rank, "keys": [[k, ""] for k in keys]}, TOKEN_A,
                                      session=session)
                        pages = [p for _, p in r.json()["results"]]
                    else:
                        r = self.post(f"/{rank}/reserve_and_allocate_page_indices",
                                      {"keys": [[k, ""] for k in keys], "namespace": "kv"},
                                      TOKEN_A, session=session)
                        pages = [p for _, p in r.json()["indices"]]
                    granted += sum(1 for p in pages if p >= 0)
                    if size == 1 and pages == [-1]:
                        return granted
            finally:
                session.close()

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            granted = sum(pool.map(client, range(8)))
        self.assertEqual(granted, quota)
        samples = TenantMetricsTest.scrape_tenants(self)
        self.assertEqual(samples[("hf3fs_metad_tenant_pages", "team_a", "reserved")], quota)

    def test_vllm_evicts_its_own_least_recently_used_keys_with_eviction_lru(self):
        self.write(self.FILE)
        self.start("--eviction", "lru", "--read-lease-ms", "0")
        r = self.post("/rank/0/initialize", {"num_pages": 8}, TOKEN_A)
        self.assertEqual(r.status_code, 200, r.content)
        for key in ("k1", "k2", "k3", "k4"):
            [page] = self.allocate(0, [key])
            r = self.post("/keys/confirm_write", {"rank": 0, "confirmations": [[key, page]],
                                                  "pages_to_release": []}, TOKEN_A)
            self.assertEqual(r.status_code, 204, r.content)
        self.init(0, TOKEN_C)  # another tenant's keys, never evicted for team_a
        self.save(0, "c1", TOKEN_C)
        # The 4 pages are held: two new keys evict the two least recently used.
        self.assertEqual(self.allocate(0, ["k5", "k6"]), [0, 1])
        self.assertEqual(self.post("/keys/batch_exists", {"keys": ["k1", "k2", "k3", "k4"]},
                                   TOKEN_A).json(), {"exists": [False, False, True, True]})
        self.assertEqual(self.post("/0/exists", {"keys": ["c1"]}, TOKEN_C).json(),
                         {"exists": [True]})
        # team_b's own vLLM state, the same key names: its pages=2 holds there, and its
        # eviction takes its own least recently used key, never team_a's or team_c's.
        for token in (TOKEN_B, TOKEN_C):
            r = self.post("/rank/0/initialize", {"num_pages": 8}, token)
            self.assertEqual(r.status_code, 200, r.content)
            for key in ("k3", "k4"):
                [page] = self.allocate(0, [key], token)
                r = self.post("/keys/confirm_write", {"rank": 0, "confirmations": [[key, page]],
                                                      "pages_to_release": []}, token)
                self.assertEqual(r.status_code, 204, r.content)
        self.assertEqual(self.allocate(0, ["k7"], TOKEN_B), [0])  # k3's page, evicted
        for token, seen in ((TOKEN_B, [False, True]), (TOKEN_A, [True, True]),
                            (TOKEN_C, [True, True])):
            self.assertEqual(self.post("/keys/batch_exists", {"keys": ["k3", "k4"]},
                                       token).json(), {"exists": seen})


TENANT_SERIES = re.compile(
    r'^(hf3fs_metad_tenant_\w+)\{tenant="([^"]*)"(?:,\w+="(\w+)")?\} (\d+)$')


class TenantMetricsTest(TenantsTestCase):

    def scrape_tenants(self):
        """GET /metrics over a plain socket with the operator's token: the
        hf3fs_metad_tenant_* samples as {(family, tenant, label value or None): value}."""
        with socket.create_connection(("127.0.0.1", self.server.port),
                                      timeout=SOCKET_TIMEOUT_S) as sock:
            sock.sendall(raw_request("GET", "/metrics", headers={
                "Authorization": f"Bearer {OPERATOR}", "Connection": "close"}))
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200 OK"), head)
        text = body.decode()
        for family in ("keys", "pages", "requests_total", "lookup_keys_total"):
            self.assertIn(f"# TYPE hf3fs_metad_tenant_{family} ", text)
        samples = {}
        for line in text.splitlines():
            m = TENANT_SERIES.match(line)
            if m:
                samples[(m[1], m[2], m[3])] = int(m[4])
        return samples

    def figures(self, samples, tenant):
        """One tenant's figures, by name."""
        f = {}
        for (family, t, label), value in samples.items():
            if t == tenant:
                f[family.removeprefix("hf3fs_metad_tenant_") + (f".{label}" if label else "")] = value
        return f

    def test_metrics_show_each_tenants_keys_pages_requests_and_lookups(self):
        self.start()
        self.assertEqual(self.scrape_tenants(), {})  # nothing held, no tenant's request yet
        # team_a holds vLLM's API: one rank, two keys allocated, one confirmed; then probes.
        self.assertEqual(self.post("/rank/0/initialize", {"num_pages": 8}, TOKEN_A).status_code, 200)
        r = self.post("/keys/batch_allocate", {"rank": 0, "keys": [["k1", ""], ["k2", ""]]},
                      TOKEN_A)
        self.assertEqual(r.json(), {"rank": 0, "results": [["k1", 0], ["k2", 1]]})
        r = self.post("/keys/confirm_write", {"rank": 0, "confirmations": [["k1", 0]]}, TOKEN_A)
        self.assertEqual(r.status_code, 204)
        self.assertEqual(self.post("/keys/batch_exists", {"keys": ["k1", "k2", "k3"]},
                                   TOKEN_A).json(), {"exists": [True, False, False]})
        a = self.figures(self.scrape_tenants(), "team_a")
        self.assertEqual(a, {"keys": 1, "pages.reserved": 1, "pages.bound": 1,
                             "requests_total.vllm": 4, "requests_total.sglang": 0,
                             "lookup_keys_total.hit": 1, "lookup_keys_total.miss": 2})
        # team_b: SGLang only, two keys saved, one probe that finds one of two.
        self.assertEqual(self.post("/0/initialize", {"num_pages": 8}, TOKEN_B).status_code, 204)
        self.save(0, "b1", TOKEN_B)
        self.save(0, "b2", TOKEN_B)
        self.assertEqual(self.post("/0/exists", {"keys": ["b1", "x"]}, TOKEN_B).json(),
                         {"exists": [True, False]})
        # team_a on SGLang too: its pool's key joins its vLLM keys; its probe its lookups.
        self.assertEqual(self.post("/0/initialize", {"num_pages": 8}, TOKEN_A).status_code, 204)
        self.save(0, "a1", TOKEN_A)
        self.assertEqual(self.post("/0/exists", {"keys": ["a1", "b1"]}, TOKEN_A).json(),
                         {"exists": [True, False]})
        # B on vLLM's API: its own state (a probe that finds nothing of A's, and a rank of
        # its own). Refused requests belong to no tenant: A naming B's pools.
        self.assertEqual(self.post("/keys/batch_exists", {"keys": ["k1"]}, TOKEN_B).json(),
                         {"exists": [False]})
        self.assertEqual(self.post("/rank/3/initialize", {"num_pages": 8}, TOKEN_B).status_code,
                         200)
        r = self.post("/keys/batch_allocate", {"rank": 3, "keys": [["k1", ""]]}, TOKEN_B)
        self.assertEqual(r.json(), {"rank": 3, "results": [["k1", 0]]})
        self.assertEqual(self.post("/team_b/0/exists", {"keys": ["b1"]}, TOKEN_A).status_code,
                         403)
        samples = self.scrape_tenants()
        self.assertEqual(self.figures(samples, "team_a"),
                         {"keys": 2, "pages.reserved": 1, "pages.bound": 2,
                          "requests_total.vllm": 4, "requests_total.sglang": 4,
                          "lookup_keys_total.hit": 2, "lookup_keys_total.miss": 3})
        self.assertEqual(self.figures(samples, "team_b"),
                         {"keys": 2, "pages.reserved": 1, "pages.bound": 2,
                          "requests_total.vllm": 3, "requests_total.sglang": 6,
                          "lookup_keys_total.hit": 1, "lookup_keys_total.miss": 2})
        # Two tenants, far under the bound: no other series, no _other.
        self.assertEqual({t for _, t, _ in samples}, {"team_a", "team_b"})
        # A tenant's token cannot read them.
        self.assertEqual(self.get("/metrics", TOKEN_A).status_code, 403)


class ReloadTest(TenantsTestCase):

    def test_sighup_adds_a_tenant_and_rotates_a_token_on_an_open_connection(self):
        self.start()
        with RawConnection(self.server.port) as conn:
            def call(token, path="/0/initialize", body=None):
                body = compact(body if body is not None else {"num_pages": 4})
                conn.send(raw_request("POST", path, body, {"Authorization": f"Bearer {token}"}))
                status, headers, _ = conn.read_response()
                self.assertNotEqual(headers.get("connection"), "close")
                return status

            self.assertEqual(call(TOKEN_A), 204)
            self.assertEqual(call(TOKEN_C), 401)
            self.assertEqual(call(TOKEN_A2), 401)
            # Step 1: team_a accepts its old and its new token; team_c is added.
            line = self.reload(f"team_a {sha(TOKEN_A)},{sha(TOKEN_A2)} ranks=2 vllm\n"
                               f"team_b {sha(TOKEN_B)}\n"
                               f"team_c {sha(TOKEN_C)}\n")
            self.assertIn("tenants: 3 from", line)
            self.assertEqual(call(TOKEN_C), 204)
            self.assertEqual(call(TOKEN_A), 204)
            self.assertEqual(call(TOKEN_A2), 204)
            # Both of team_a's tokens reach one tenant's pools.
            self.assertEqual(call(TOKEN_A2, "/team_a/0/exists", {"keys": []}), 200)
            self.assertEqual(call(TOKEN_A2, "/team_b/0/exists", {"keys": []}), 403)
            # Step 2: every forwarder has the new token; the old hash goes: 401 at once,
            # on the same connection, which stays open for the next request.
            self.reload(f"team_a {sha(TOKEN_A2)} ranks=2 vllm\n"
                        f"team_b {sha(TOKEN_B)}\n"
                        f"team_c {sha(TOKEN_C)}\n")
            self.assertEqual(call(TOKEN_A), 401)
            self.assertEqual(call(TOKEN_A2), 204)
            self.assertEqual(call(TOKEN_B), 204)
            # Tenant usage survived the reloads: team_a's rank 0 still counts against ranks=2.
            self.assertEqual(call(TOKEN_A2, "/1/initialize"), 204)
            self.assertEqual(call(TOKEN_A2, "/2/initialize"), 403)

    def test_a_bad_file_on_sighup_keeps_the_old_table(self):
        self.start()
        self.assertEqual(self.post("/0/initialize", {"num_pages": 4}, TOKEN_A).status_code, 204)
        bad = (f"team_a {sha(TOKEN_A)} vllm\n"
               f"team_c {sha(TOKEN_C)}\n"
               f"team_b {sha(TOKEN_B)[:-1]}\n")
        line = self.reload(bad)
        self.assertIn(f"tenants: {self.path}: line 3: '{sha(TOKEN_B)[:-1]}' is not a SHA-256 in "
                      f"hex", line)
        self.assertIn("the tenants as loaded before stay in force", line)
        self.assertTrue(self.server.alive())
        # The old table: team_b still works, team_c (only in the bad file) does not.
        self.assertEqual(self.post("/0/initialize", {"num_pages": 4}, TOKEN_B).status_code, 204)
        self.assert_401(self.post("/0/initialize", {"num_pages": 4}, TOKEN_C))
        # A missing file (mid-rename by a careless editor) keeps it too.
        os.unlink(self.path)
        self.server.proc.send_signal(signal.SIGHUP)
        self.assertTrue(self.server.wait_log(r"tenants: .*cannot open it: the tenants as loaded "
                                             r"before stay in force"))
        self.assertEqual(self.post("/0/exists", {"keys": []}, TOKEN_A).status_code, 200)
        # Then a good file is taken again.
        self.reload(self.DEFAULT_FILE.replace("team_b", "team_c").replace(sha(TOKEN_B),
                                                                          sha(TOKEN_C)))
        self.assertEqual(self.post("/0/initialize", {"num_pages": 4}, TOKEN_C).status_code, 204)
        self.assert_401(self.post("/0/exists", {"keys": []}, TOKEN_B))


class StartTest(TenantsTestCase):

    def test_a_bad_file_stops_the_start_naming_the_line(self):
        cases = {
            "9a " + sha(TOKEN_A): "line 1: '9a' is not a tenant name",
            "# c\na " + sha(TOKEN_A) + "\na " + sha(TOKEN_B): "line 3: tenant a is named on line 2",
            "a " + sha(TOKEN_A) + "\nb " + sha(TOKEN_A): "line 2: this SHA-256 is tenant a's",
            "a " + sha(TOKEN_A) + " pages=abc": "line 1: 'pages=abc': pages= takes an integer in "
                                                "[0, 281474976710656]",
            "a " + sha(TOKEN_A) + "\nb " + sha(TOKEN_B) + " pages=-1": "line 2: 'pages=-1': pages= "
                                                                       "takes an integer",
            "a " + sha(TOKEN_A) + " pages=1 pages=2": "line 1: pages= is given twice",
            "a " + TOKEN_A: f"line 1: '{TOKEN_A}' is not a SHA-256 in hex",
            "a " + sha(TOKEN_A) + " vllm\nb " + sha(TOKEN_B) + " vllm": "line 2: vllm: tenant a",
        }
        for text, message in cases.items():
            with self.subTest(text=text):
                self.write(text)
                code, stderr, started = run_to_exit(("--tenants-file", self.path))
                self.assertFalse(started)
                self.assertEqual(code, 2, stderr)
                self.assertIn(f"--tenants-file: {self.path}: {message}", stderr)
        code, stderr, _ = run_to_exit(("--tenants-file", os.path.join(self.dir, "missing")))
        self.assertEqual(code, 2, stderr)
        self.assertIn("cannot open it", stderr)

    def test_without_a_tenants_file_sighup_is_not_handled(self):
        """Nothing changes without --tenants-file: SIGHUP keeps its default action."""
        self.server = MetadServer(())
        self.server.proc.send_signal(signal.SIGHUP)
        self.assertEqual(self.server.proc.wait(timeout=10), -signal.SIGHUP)
        self.server.stop()


if __name__ == "__main__":
    unittest.main()
