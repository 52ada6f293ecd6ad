"""End-to-end: SGLang's HiCache 3FS backend against hf3fs-metad (docs/sglang-api.md).

The client below makes the calls of SGLang's Hf3fsGlobalMetadataClient (a keep-alive
requests.Session with its Retry policy, compact JSON, `{base_url}/{rank}/{op}`), and
batch_set/batch_get follow HiCacheHF3FS's save and load. Also: errors byte for byte,
tenants, and vLLM's and SGLang's flows against one server at once.

Run: cd tests/e2e && METAD_BIN=... METAD_IO=uring|epoll /usr/bin/python3 -m unittest test_sglang
"""

import hashlib
import json
import re
import threading
import time
import unittest

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from metad_harness import (Client, MetadTestCase, compact, keys, raw_request,
                           transport_independent)

NOT_FOUND = b'{"detail":"Not Found"}'


def page_hash(i, tag=""):
    """A page key as SGLang makes them: 64 lowercase hex characters (SHA-256)."""
    return hashlib.sha256(f"{tag}/{i}".encode()).hexdigest()


def page_hashes(n, tag=""):
    return [page_hash(i, tag) for i in range(n)]


def not_initialized(rank, ns):
    return (f'{{"detail":"Rank {rank} namespace \'{ns}\' not initialized. '
            f'Please call /{rank}/initialize first."}}').encode()


class SglangClient:
    """The calls of SGLang's Hf3fsGlobalMetadataClient."""

    def __init__(self, base_url):
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        retry = Retry(total=3, backoff_factor=0.3, status_forcelist=[500, 502, 503, 504],
                      allowed_methods=["GET", "POST"])
        adapter = HTTPAdapter(pool_connections=256, pool_maxsize=256, max_retries=retry)
        self.session.mount("http://", adapter)
        self.calls = []  # (rank, op) of every call, for the tests

    def close(self):
        self.session.close()

    def post_raw(self, rank, op, data):
        return self.session.post(f"{self.base_url}/{rank}/{op}", data=data,
                                 headers={"Content-Type": "application/json"}, timeout=10)

    def _post(self, rank, op, body):
        self.calls.append((rank, op))
        r = self.post_raw(rank, op, compact(body))
        r.raise_for_status()
        return None if r.status_code == 204 else r.json()

    def initialize(self, rank, num_pages, namespace="kv"):
        self._post(rank, "initialize", {"num_pages": num_pages, "namespace": namespace})

    def reserve_and_allocate_page_indices(self, rank, ks, namespace="kv"):
        r = self._post(rank, "reserve_and_allocate_page_indices",
                       {"keys": [[k, ""] for k in ks], "namespace": namespace})
        return [tuple(x) for x in r["indices"]]

    def confirm_write(self, rank, written, release, namespace="kv"):
        self._post(rank, "confirm_write", {"written_keys_to_confirm": [list(w) for w in written],
                                           "pages_to_release": list(release),
                                           "namespace": namespace})

    def delete_keys(self, rank, ks, namespace="kv"):
        self._post(rank, "delete_keys", {"keys": list(ks), "namespace": namespace})

    def exists(self, rank, ks, namespace="kv"):
        return self._post(rank, "exists", {"keys": list(ks), "namespace": namespace})["exists"]

    def clear(self, rank, namespace="kv"):
        self._post(rank, "clear", {"namespace": namespace})

    def get_page_indices(self, rank, ks, namespace="kv"):
        return self._post(rank, "get_page_indices",
                          {"keys": list(ks), "namespace": namespace})["indices"]


def batch_set(client, rank, ks, fail=(), namespace="kv", storage=None):
    """HiCacheHF3FS._batch_set: reserve, write the new pages (those in `fail` fail), then
    one confirm_write unless every key was a hit or -1. Returns one success per key."""
    indices = client.reserve_and_allocate_page_indices(rank, ks, namespace)
    written, release, ok = [], [], []
    for k, (exists, page) in zip(ks, indices):
        if exists:
            ok.append(True)
        elif page < 0:
            ok.append(False)
        elif k in fail:
            release.append(page)
            ok.append(False)
        else:
            if storage is not None:
                storage[(rank, namespace, page)] = k
            written.append((k, page))
            ok.append(True)
    if written or release:
        client.confirm_write(rank, written, release, namespace)
    return ok


def batch_get(client, rank, ks, namespace="kv", storage=None):
    """HiCacheHF3FS's load: the exists prefix, then get_page_indices for it; the pages
    read (and checked against what was written there, when `storage` is given)."""
    hits = client.exists(rank, ks, namespace)
    prefix = 0
    while prefix < len(hits) and hits[prefix]:
        prefix += 1
    if prefix == 0:
        return []
    pages = client.get_page_indices(rank, ks[:prefix], namespace)
    if storage is not None:
        for k, p in zip(ks, pages):
            if p is not None:
                assert storage[(rank, namespace, p)] == k, (k, p)
    return pages


class SglangTestCase(MetadTestCase):
    """A fresh tenant per test, so that no test sees another's pools (vLLM's /clear,
    which the harness calls between tests, leaves SGLang's pools alone by design)."""

    tenant_serial = 0

    def setUp(self):
        super().setUp()
        type(self).tenant_serial += 1
        self.tenant = f"t{type(self).tenant_serial}_{self._testMethodName[:40]}"
        self.sg = SglangClient(f"{self.server.base_url}/{self.tenant}")
        self.addCleanup(self.sg.close)

    def post(self, path, body, headers=None):
        hdrs = {"Content-Type": "application/json"}
        hdrs.update(headers or {})
        data = body if isinstance(body, bytes) else compact(body)
        return self.client.session.post(self.server.base_url + path, data=data, headers=hdrs,
                                        timeout=10)

    def assert_bytes(self, r, status, body):
        self.assertEqual(r.status_code, status, r.content)
        self.assertEqual(r.content, body)
        if status != 204:
            self.assert_json_type(r.headers)


class SaveAndLoadTest(SglangTestCase):

    def test_save_of_128_pages_then_hits(self):
        self.sg.initialize(0, 1000)
        ks = page_hashes(128)
        store = {}
        self.assertEqual(batch_set(self.sg, 0, ks, storage=store), [True] * 128)
        # LIFO from the top: the first key of the first batch gets page 999.
        self.assertEqual(self.sg.get_page_indices(0, ks[:3]), [999, 998, 997])
        self.assertEqual(self.sg.exists(0, ks), [True] * 128)
        self.sg.calls.clear()
        # The same batch again: every key a hit, no confirm_write.
        self.assertEqual(batch_set(self.sg, 0, ks), [True] * 128)
        self.assertEqual([op for _, op in self.sg.calls], ["reserve_and_allocate_page_indices"])
        self.assertEqual(len(batch_get(self.sg, 0, ks, storage=store)), 128)

    def test_mha_zero_copy_keys_come_in_pairs(self):
        self.sg.initialize(1, 64)
        ks = [f"{h}-{kv}" for h in page_hashes(16) for kv in "kv"]
        self.assertEqual(batch_set(self.sg, 1, ks), [True] * 32)
        self.assertEqual(self.sg.exists(1, ks[:6] + [page_hash(99) + "-k"]), [True] * 6 + [False])

    def test_failed_write_releases_its_page(self):
        self.sg.initialize(0, 8)
        ks = page_hashes(4)
        self.assertEqual(batch_set(self.sg, 0, ks, fail={ks[1], ks[2]}),
                         [True, False, False, True])
        self.assertEqual(self.sg.exists(0, ks), [True, False, False, True])
        # Pages 6 and 5 went back on top of the stack: the last released comes out first.
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["x", "y", "z"]),
                         [(False, 5), (False, 6), (False, 3)])

    def test_exists_prefix_then_get_page_indices(self):
        self.sg.initialize(2, 32)
        ks = page_hashes(16)
        store = {}
        batch_set(self.sg, 2, ks[:10], storage=store)
        self.assertEqual(self.sg.exists(2, ks), [True] * 10 + [False] * 6)
        pages = batch_get(self.sg, 2, ks, storage=store)
        self.assertEqual(pages, list(range(31, 21, -1)))
        self.assertEqual(self.sg.get_page_indices(2, [ks[0], ks[12], ks[0]]), [31, None, 31])

    def test_full_pool_evicts_the_least_recently_used(self):
        self.sg.initialize(0, 4)
        ks = page_hashes(4)
        batch_set(self.sg, 0, ks)  # pages 3, 2, 1, 0
        self.sg.get_page_indices(0, [ks[0]])  # ks[1] is now the oldest
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["new"]), [(False, 2)])
        self.assertEqual(self.sg.exists(0, ks), [True, False, True, True])
        # Only in-flight pages left and the hits of this batch: -1, never a hit evicted.
        self.sg.reserve_and_allocate_page_indices(0, ["n1", "n2", "n3"])
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["n4"]), [(False, -1)])

    def test_mla_only_rank_0_writes_and_every_rank_reads(self):
        self.sg.initialize(0, 256)  # every TP rank initializes rank 0
        ranks = [SglangClient(f"{self.server.base_url}/{self.tenant}") for _ in range(4)]
        try:
            for client in ranks:
                client.initialize(0, 256)
            ks = page_hashes(64, "mla")
            store = {}
            self.assertEqual(batch_set(ranks[0], 0, ks, storage=store), [True] * 64)
            # The other ranks skip the backup: no calls. Every rank reads rank 0.
            for client in ranks[1:]:
                self.assertEqual(len(batch_get(client, 0, ks, storage=store)), 64)
            r = self.post(f"/{self.tenant}/1/exists", {"keys": ks[:1], "namespace": "kv"})
            self.assert_bytes(r, 404, not_initialized(1, "kv"))
        finally:
            for client in ranks:
                client.close()

    def test_extra_pools_of_a_hybrid_model(self):
        self.sg.initialize(0, 16)
        self.sg.initialize(0, 4, "mamba")
        ks = page_hashes(6)
        mamba = [f"{h}_mamba" for h in ks]
        self.assertEqual(batch_set(self.sg, 0, ks), [True] * 6)
        # 4 pages: a batch of 6 gets 4 (no bound key to evict), the next one evicts.
        self.assertEqual(batch_set(self.sg, 0, mamba, namespace="mamba"), [True] * 4 + [False] * 2)
        self.assertEqual(batch_set(self.sg, 0, mamba[4:], namespace="mamba"), [True] * 2)
        self.assertEqual(self.sg.exists(0, mamba, "mamba"), [False, False, True, True, True, True])
        self.assertEqual(self.sg.exists(0, ks), [True] * 6)
        self.assertEqual(self.sg.exists(0, mamba), [False] * 6)
        self.sg.clear(0, "mamba")
        self.assertEqual(self.sg.exists(0, mamba, "mamba"), [False] * 6)
        self.assertEqual(self.sg.exists(0, ks), [True] * 6)
        with self.assertRaises(requests.HTTPError) as e:
            self.sg.exists(0, ks, "swa")
        self.assertEqual(e.exception.response.content, not_initialized(0, "swa"))

    def test_delete_keys_frees_the_page(self):
        self.sg.initialize(3, 4)
        ks = page_hashes(2)
        batch_set(self.sg, 3, ks)
        self.sg.delete_keys(3, [ks[0], "unknown"])
        self.assertEqual(self.sg.exists(3, ks), [False, True])
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(3, ["x"]), [(False, 3)])

    def test_reinitialize_larger_grows_smaller_is_ignored(self):
        self.sg.initialize(0, 2)
        self.sg.initialize(0, 4)
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, list("abcde")),
                         [(False, 3), (False, 2), (False, 1), (False, 0), (False, -1)])
        self.sg.initialize(0, 1)  # 204, kept, a warning
        self.assertTrue(self.server.wait_log(r"initialized with different num_pages"))

    def test_clear_discards_writes_reserved_before_it(self):
        self.sg.initialize(0, 2)
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["a"]), [(False, 1)])
        self.sg.clear(0)
        # Page 1 stayed out of the free stack until its (stale) writer came back; its
        # confirm binds nothing and frees it.
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["b"]), [(False, 0)])
        self.sg.confirm_write(0, [("a", 1)], [])
        self.assertEqual(self.sg.exists(0, ["a"]), [False])
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["c"]), [(False, 1)])


class TenantTest(SglangTestCase):

    def test_default_tenant_and_named_tenants_are_separate(self):
        rank = 700 + self.tenant_serial  # the default tenant outlives a test: a fresh rank
        default = SglangClient(self.server.base_url + "/")
        other = SglangClient(f"{self.server.base_url}/{self.tenant}x")
        try:
            default.initialize(rank, 4)
            self.sg.initialize(rank, 8)
            batch_set(default, rank, ["a"])
            self.assertEqual(self.sg.exists(rank, ["a"]), [False])
            self.assertEqual(default.exists(rank, ["a"]), [True])
            self.assertEqual(self.sg.reserve_and_allocate_page_indices(rank, ["a"]), [(False, 7)])
            with self.assertRaises(requests.HTTPError):
                other.exists(rank, ["a"])
            stats = self.client.request("GET", "/stats").json()["sglang"]
            mine = [p for p in stats["pools"] if p["rank"] == rank]
            self.assertIn({"tenant": "", "rank": rank, "namespace": "kv", "num_pages": 4,
                           "free": 3, "in_flight": 0, "bound": 1}, mine)
            self.assertIn({"tenant": self.tenant, "rank": rank, "namespace": "kv",
                           "num_pages": 8, "free": 7, "in_flight": 1, "bound": 0}, mine)
            default.clear(rank)
        finally:
            default.close()
            other.close()

    def test_rank_spellings_alias(self):
        self.sg.initialize(1, 4)
        r = self.post(f"/{self.tenant}/+01/reserve_and_allocate_page_indices",
                      {"keys": [["a", ""]], "namespace": "kv"})
        self.assert_bytes(r, 200, b'{"indices":[[false,3]]}')
        r = self.post(f"/{self.tenant}/-0/exists", {"keys": ["a"]})
        self.assert_bytes(r, 404, not_initialized(0, "kv"))


class ErrorTest(SglangTestCase):

    def test_uninitialized_pool_is_404_for_every_operation(self):
        for op in ("exists", "reserve_and_allocate_page_indices", "confirm_write", "delete_keys",
                   "clear", "get_page_indices"):
            with self.subTest(op=op):
                r = self.post(f"/{self.tenant}/+05/{op}", {"namespace": "kv"})
                self.assert_bytes(r, 404, not_initialized(5, "kv"))
        r = self.post(f"/{self.tenant}/5/clear", {"namespace": "a'b\"c"})
        self.assert_bytes(r, 404, b'{"detail":"Rank 5 namespace \'a\'b\\"c\' not initialized. '
                                  b'Please call /5/initialize first."}')

    def test_bad_input_is_a_400_and_changes_nothing(self):
        self.sg.initialize(0, 4)
        base = f"/{self.tenant}/0/"
        cases = [
            ("initialize", b'{"num_pages":"4"}', "Invalid initialization parameters"),
            ("initialize", b'{"num_pages":4.0}', "Invalid initialization parameters"),
            ("initialize", b'{"num_pages":null}', "Invalid initialization parameters"),
            ("initialize", b'{"num_pages":-1}', "Invalid initialization parameters"),
            ("initialize", b'{"num_pages":281474976710657}', "Invalid initialization parameters"),  # 2^48 + 1: past the default ceiling
            ("initialize", b'{"num_pages":4,"namespace":null}', "Invalid namespace"),
            ("initialize", b'{"num_pages":4,"namespace":""}', "Invalid namespace"),
            ("initialize", ('{"num_pages":4,"namespace":"' + "n" * 129 + '"}').encode(),
             "Invalid namespace"),
            ("exists", b'{"keys":"ab"}', "Invalid keys format"),
            ("exists", b'{"keys":[["a"]]}', "Invalid keys format"),
            ("exists", b'{"keys":[1,true,null]}', "Invalid keys format"),
            ("exists", b'', "Invalid JSON body: empty body"),
            ("exists", b'{"keys":[]', "Invalid JSON body: syntax error or trailing content"),
            ("exists", b'{"keys":[]} {}', "Invalid JSON body: syntax error or trailing content"),
            ("exists", b'[]', "Invalid JSON body: expected an object"),
            ("reserve_and_allocate_page_indices", b'{"keys":[["a",""],["b"]]}',
             "Invalid key at index 1: expected a [key, prefix_key] pair of strings or a string"),
            ("reserve_and_allocate_page_indices", b'{"keys":[["a",""]],"namespace":5}',
             "Invalid namespace"),
            ("confirm_write", b'{"written_keys_to_confirm":null}',
             "Invalid request format: 'written_keys_to_confirm' must be a list of [key, page] "
             "pairs"),
            ("confirm_write", b'{"pages_to_release":"x"}',
             "Invalid request format: 'pages_to_release' must be a list of page numbers"),
            ("confirm_write", b'{"pages_to_release":[4]}',
             "Page 4 at index 0 of pages_to_release is out of range: the pool has 4 pages"),
            ("delete_keys", b'{"keys":[5]}', "Invalid keys format"),
            ("get_page_indices", b'{"keys":"a"}', "Invalid keys format"),
            ("clear", b'{"namespace":[]}', "Invalid namespace"),
        ]
        for op, body, detail in cases:
            with self.subTest(op=op, body=body):
                r = self.post(base + op, body)
                self.assert_bytes(r, 400, compact({"detail": detail}))
        # Nothing changed, and the connection stayed open throughout.
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["a"]), [(False, 3)])

    def test_paths(self):
        r = self.post("/99999999999999999999/exists", {})
        self.assert_bytes(r, 400, b'{"detail":"Invalid rank in path"}')
        r = self.post(f"/{self.tenant}/abc/exists", {})
        self.assert_bytes(r, 400, b'{"detail":"Invalid rank in path"}')
        for path in ("/abc/exists", "/0/nope", "/0/exists/", "/0/0/exists", "/keys/x",
                     "/9tenant/0/exists", "/rank/0/exists"):
            with self.subTest(path=path):
                self.assert_bytes(self.post(path, {}), 404, NOT_FOUND)
        r = self.client.request("GET", "/0/exists")
        self.assert_bytes(r, 405, b'{"detail":"Method Not Allowed"}')
        self.assertEqual(r.headers["allow"], "POST")

    def test_client_gets_4xx_without_retries(self):
        before = self.metric('endpoint="sglang_tenant_exists",status="404"')
        with self.assertRaises(requests.HTTPError):
            self.sg.exists(9, ["a"])
        self.assertEqual(self.metric('endpoint="sglang_tenant_exists",status="404"'), before + 1)

    def test_raw_initialize_answer_is_a_bare_204(self):
        with self.raw() as conn:
            body = b'{"num_pages":2,"namespace":"kv"}'
            conn.send(raw_request("POST", f"/{self.tenant}/0/initialize", body,
                                  {"Content-Type": "application/json"}))
            status, headers, body = conn.read_response()
            self.assertEqual((status, body), (204, b""))
            self.assertNotIn("content-length", headers)
            self.assertNotIn("content-type", headers)

    def metric(self, labels):
        text = self.client.request("GET", "/metrics").text
        m = re.search(r"^hf3fs_metad_requests_total\{" + re.escape(labels) + r"\} (\d+)$", text,
                      re.M)
        return int(m.group(1)) if m else 0


class MixedTest(SglangTestCase):

    def test_vllm_and_sglang_flows_at_once(self):
        self.assertEqual(self.client.initialize(0, 4096).status_code, 200)
        self.assertEqual(self.client.initialize(1, 4096).status_code, 200)
        self.sg.initialize(0, 4096)
        self.sg.initialize(1, 4096)
        errors = []

        def vllm(worker):
            try:
                c = Client(self.server.base_url)
                for b in range(8):
                    ks = keys(32, f"v{worker}.{b}")
                    for rank in (0, 1):
                        r = c.batch_allocate(rank, ks).json()["results"]
                        assert all(p >= 0 for _, p in r), r
                        assert c.confirm_write(rank, r).status_code == 204
                    assert c.batch_exists(ks).json()["exists"] == [True] * 32
                c.close()
            except Exception as e:  # reported below
                errors.append(("vllm", worker, repr(e)))

        def sglang(worker):
            try:
                c = SglangClient(f"{self.server.base_url}/{self.tenant}")
                store = {}
                for b in range(8):
                    ks = page_hashes(32, f"s{worker}.{b}")
                    for rank in (0, 1):
                        assert batch_set(c, rank, ks, storage=store) == [True] * 32
                        assert len(batch_get(c, rank, ks, storage=store)) == 32
                c.close()
            except Exception as e:  # reported below
                errors.append(("sglang", worker, repr(e)))

        threads = [threading.Thread(target=f, args=(w,)) for w in range(3) for f in (vllm, sglang)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        # vLLM's keys and SGLang's pools saw only their own.
        self.assertEqual(self.client.batch_exists(page_hashes(1, "s0.0")).json()["exists"],
                         [False])
        self.assertEqual(self.sg.exists(0, keys(1, "v0.0")), [False])
        pools = self.client.request("GET", "/stats").json()["sglang"]["pools"]
        mine = {p["rank"]: p for p in pools if p["tenant"] == self.tenant}
        self.assertEqual(mine[0]["bound"], 3 * 8 * 32)
        self.assertEqual(mine[1]["in_flight"], 0)
        # vLLM's /clear leaves SGLang's pools; SGLang's clear leaves vLLM's ranks.
        self.reset()
        self.assertEqual(len(batch_get(self.sg, 0, page_hashes(32, "s1.3"))), 32)
        self.client.initialize(0, 8)
        k = keys(1, "after")
        r = self.client.batch_allocate(0, k).json()["results"]
        self.client.confirm_write(0, r)
        self.sg.clear(0)
        self.assertEqual(self.client.batch_exists(k).json()["exists"], [True])
        self.assertEqual(self.sg.exists(0, page_hashes(1, "s1.3")), [False])


@transport_independent
class ReleaseQuarantineTest(SglangTestCase):
    """--release-quarantine-ms (docs/sglang-api.md, confirm_write): a page released by
    pages_to_release is held for no key while the quarantine runs, so that a client's or
    a proxy's replay of the release cannot free a page another writer was given since."""

    QUARANTINE_MS = 1000
    extra_args = ("--release-quarantine-ms", str(QUARANTINE_MS))  # after the harness's 0

    def test_quarantine_a_replayed_release_changes_nothing(self):
        self.sg.initialize(0, 64)
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["ka"]), [(False, 63)])
        # A's write failed: it releases its page; the answer is lost and the request
        # replayed below, byte for byte.
        release = compact({"written_keys_to_confirm": [], "pages_to_release": [63],
                           "namespace": "kv"})
        self.assertEqual(self.sg.post_raw(0, "confirm_write", release).status_code, 204)
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["kb"]), [(False, 62)])
        self.assertEqual(self.sg.post_raw(0, "confirm_write", release).status_code, 204)
        # C gets neither B's page nor the quarantined one.
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["kc"]), [(False, 61)])
        self.sg.confirm_write(0, [("kb", 62), ("kc", 61)], [])
        self.assertEqual(self.sg.get_page_indices(0, ["kb", "kc"]), [62, 61])
        pools = self.client.request("GET", "/stats").json()["sglang"]["pools"]
        pool = next(p for p in pools if p["tenant"] == self.tenant)
        self.assertEqual((pool["free"], pool["in_flight"], pool["bound"]), (62, 0, 2))
        # Once its quarantine is over (ended on a tick), the page is on top again.
        time.sleep(self.QUARANTINE_MS / 1000 + 1.0)
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["kd"]), [(False, 63)])

    def test_quarantine_full_pool_evicts_first_and_uses_it_last(self):
        self.sg.initialize(0, 3)
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["a", "b", "c"]),
                         [(False, 2), (False, 1), (False, 0)])
        self.sg.confirm_write(0, [("a", 2), ("b", 1)], [0])
        # No free page: the least recently used key goes before the quarantined page.
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["d"]), [(False, 2)])
        self.assertEqual(self.sg.exists(0, ["a", "b"]), [False, True])
        # Nothing left to evict (b is this batch's hit): the quarantined page, then -1.
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["b", "e", "f"]),
                         [(True, 1), (False, 0), (False, -1)])


class ReleaseQuarantineOffTest(SglangTestCase):
    """--release-quarantine-ms 0: the reference's page order exactly (SGLang's own tests
    assert it): the page released last is handed out next, replay hazard included."""

    extra_args = ("--release-quarantine-ms", "0")

    def test_quarantine_off_keeps_the_reference_order(self):
        self.sg.initialize(0, 64)
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["ka", "kx"]),
                         [(False, 63), (False, 62)])
        self.sg.confirm_write(0, [], [63, 62])
        self.assertEqual(self.sg.reserve_and_allocate_page_indices(0, ["kb", "ky"]),
                         [(False, 62), (False, 63)])


class PersistenceTest(unittest.TestCase):
    """With --data-dir, SGLang pools survive a restart (SIGTERM and SIGKILL)."""

    def test_pools_survive_restarts(self):
        import shutil
        import tempfile
        from metad_harness import MetadServer
        data = tempfile.mkdtemp(prefix="metad-sglang-")
        self.addCleanup(shutil.rmtree, data, True)
        args = ("--data-dir", data)
        server = MetadServer(args)
        sg = SglangClient(f"{server.base_url}/llama")
        sg.initialize(0, 16)
        sg.initialize(0, 4, "mamba")
        ks = page_hashes(8)
        batch_set(sg, 0, ks, fail={ks[3]})
        in_flight = sg.reserve_and_allocate_page_indices(0, ["open"])
        sg.close()
        self.assertEqual(server.stop(), 0)
        for stop in ("kill", "stop"):
            server = MetadServer(args)
            sg = SglangClient(f"{server.base_url}/llama")
            self.assertEqual(sg.exists(0, ks), [True] * 3 + [False] + [True] * 4)
            self.assertEqual(sg.get_page_indices(0, ks[:2]), [15, 14])
            self.assertEqual(sg.exists(0, [], "mamba"), [])
            if stop == "kill":
                # The open reservation is still in flight: its writer may confirm it.
                self.assertEqual(sg.exists(0, ["open"]), [False])
                sg.confirm_write(0, [("open", in_flight[0][1])], [])
            # ... and after a SIGKILL the binding is there.
            self.assertEqual(sg.exists(0, ["open"]), [True])
            sg.close()
            getattr(server, stop)()


    def test_sglang_persistence_flags(self):
        import os
        import shutil
        import tempfile
        from metad_harness import MetadServer, run_to_exit
        data = tempfile.mkdtemp(prefix="metad-sglang-")
        self.addCleanup(shutil.rmtree, data, True)
        # A file at P (the reference's JSON) is imported: test_sglang_import.py. Neither
        # a file nor a directory is refused.
        fifo = os.path.join(data, "fifo")
        os.mkfifo(fifo)
        code, err, started = run_to_exit(("--persistence-path", fifo))
        self.assertFalse(started)
        self.assertEqual(code, 2)
        self.assertIn("--persistence-path", err)
        # A directory: the state persists there.
        args = ("--persistence-path", os.path.join(data, "state"), "--save-interval", "60")
        server = MetadServer(args)
        sg = SglangClient(server.base_url)
        sg.initialize(0, 4)
        batch_set(sg, 0, ["a"])
        sg.close()
        self.assertEqual(server.stop(), 0)
        server = MetadServer(args)
        sg = SglangClient(server.base_url)
        self.assertEqual(sg.get_page_indices(0, ["a"]), [3])
        sg.close()
        self.assertEqual(server.stop(), 0)


class MonitoringTest(SglangTestCase):

    def test_stats_and_metrics_show_pools(self):
        self.sg.initialize(4, 10, "indexer")
        self.sg.reserve_and_allocate_page_indices(4, ["a", "b"], "indexer")
        stats = self.client.request("GET", "/stats").json()
        sg = stats["sglang"]
        self.assertIn({"tenant": self.tenant, "rank": 4, "namespace": "indexer",
                       "num_pages": 10, "free": 8, "in_flight": 2, "bound": 0}, sg["pools"])
        self.assertGreaterEqual(sg["pools_total"], 1)
        text = self.client.request("GET", "/metrics").text
        self.assertIn(f'hf3fs_metad_sglang_pool_pages{{tenant="{self.tenant}",rank="4",'
                      f'namespace="indexer",state="in_flight"}} 2', text)
        self.assertRegex(text, r'endpoint="sglang_tenant_reserve",status="200"\} [1-9]')


if __name__ == "__main__":
    unittest.main()
