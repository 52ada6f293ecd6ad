"""End-to-end tests of the key lifecycle features of hf3fs-metad.

POST /keys/delete, read leases (--read-lease-ms), least-recently-used eviction
(--eviction lru), reservation expiry (--reservation-ttl), GET /stats, their /metrics
counters, the admin token on /keys/delete, and their durability (--data-dir, kill -9,
restart with another --threads count).

Most tests mirror every request into LifecycleModel (reference_model.Model plus delete,
recency, leases and eviction as the feature description defines them) and compare every
answer exactly (Mirror from test_durability.py); they also assert the key values
explicitly. Every test starts its own server (a few ms), so counters start at 0.

Recency: the server stamps uses with a coarse millisecond clock, so where a test needs a
defined least-recently-used order it spaces the uses that define it by USE_GAP_S (more
than the clock's resolution). test_back_to_back_uses_across_cores_keep_lru_order checks
the unspaced case on its own.

Run: cd tests/e2e && METAD_BIN=... METAD_IO=uring|epoll /usr/bin/python3 -m unittest test_lifecycle -v
Standard library plus `requests`.
"""

import collections
import hashlib
import os
import random
import time
import unittest

import requests

from metad_harness import (SOCKET_TIMEOUT_S, Client, compact, key, keys,
                           transport_independent)
from reference_model import INVALID_KEYS_FORMAT, Answer, Model, _error, is_int64, parse_body
from test_durability import DurabilityCase, Mirror
from test_operations import Metrics


def _coarse_clock_resolution():
    """The resolution of CLOCK_MONOTONIC_COARSE (id 6 on Linux), the server's recency
    clock: a few ms, depending on the kernel's HZ."""
    try:
        return time.clock_getres(6)
    except (OSError, AttributeError):
        return 0.010


# More than the resolution of the server's recency clock, so that two uses separated by
# it get different timestamps.
USE_GAP_S = _coarse_clock_resolution() + 0.002
HUGE_LEASE_MS = "600000"
NEVER_FITS = "(more new keys than num_pages minus reserved pages)"


def gap():
    time.sleep(USE_GAP_S)


# --- the model -------------------------------------------------------------------------

class LifecycleModel(Model):
    """reference_model.Model plus the lifecycle features, as the feature description
    states them:

    - delete: distinct keys present in the directory (confirmed by >= 1 rank) and not
      leased are removed: every rank's confirmed page of the key is freed, reserved
      pages stay; the count is returned.
    - recency: a key is used when it becomes complete, when batch_exists finds it
      complete, when get_locations finds it complete (keys of one request in order).
    - leases: `leases` True models a --read-lease-ms far longer than the test (a lease,
      once taken by a get_locations that returned the key's page, never ends); False
      models --read-lease-ms 0.
    - eviction (lru): while the keys of a batch_allocate that need a new page do not fit
      in the free pool, and the batch could fit at all (new keys <= num_pages - reserved
      pages of the rank), the least recently used complete key without a lease is
      removed on every rank; then the allocation is answered as usual.
    - /stats, with counters that survive /clear but not a restart (restarted()).
    """

    def __init__(self, lru=False, leases=False):
        super().__init__()
        self.lru = lru
        self.leases = leases
        self.recency = collections.OrderedDict()  # complete keys, least recently used first
        self.leased = set()
        self.deleted_keys = 0
        self.evicted_keys = 0

    def handle(self, method, path, body=b""):
        bare = path.split("?", 1)[0]
        if bare == "/keys/delete":
            return self.delete(body) if method == "POST" else _error(405, "Method Not Allowed")
        if bare == "/stats":
            return self.stats() if method == "GET" else _error(405, "Method Not Allowed")
        return super().handle(method, path, body)

    # --- bookkeeping -------------------------------------------------------------------

    def touch(self, k):
        self.recency.pop(k, None)
        self.recency[k] = True

    def reserved_anywhere(self, k):
        return any(k in st.page_of and k not in st.confirmed for st in self.ranks.values())

    def remove_key(self, k):
        """The key leaves: directory entry, recency, lease, confirmed page on every rank."""
        del self.directory[k]
        self.recency.pop(k, None)
        self.leased.discard(k)
        for state in self.ranks.values():
            if k in state.confirmed:
                state.confirmed.remove(k)
                page = state.page_of.pop(k)
                del state.key_of[page]
                state.give_back(page)

    def restarted(self):
        """A restart: process counters and leases are not kept."""
        self.deleted_keys = self.evicted_keys = self.refused_releases = 0
        self.leased.clear()

    # --- endpoints ---------------------------------------------------------------------

    def clear(self):
        self.recency.clear()
        self.leased.clear()
        return super().clear()

    def confirm_write(self, body):
        obj = parse_body(body)
        before = {}
        if isinstance(obj, dict) and isinstance(obj.get("confirmations"), list):
            for item in obj["confirmations"]:
                if isinstance(item, list) and item and isinstance(item[0], str):
                    before.setdefault(item[0], self.complete(item[0]))
        answer = super().confirm_write(body)
        if answer.status == 204:
            for k, was_complete in before.items():
                if not was_complete and self.complete(k):
                    self.touch(k)
        return answer

    def batch_exists(self, body):
        answer = super().batch_exists(body)
        if answer.status == 200:
            for k, found in zip(parse_body(body).get("keys", []), answer.body["exists"]):
                if found:
                    self.touch(k)
        return answer

    def get_locations(self, body):
        answer = super().get_locations(body)
        if answer.status == 200:
            for k, page in zip(parse_body(body).get("keys", []), answer.body["locations"]):
                if self.complete(k):
                    self.touch(k)
                if page is not None and self.leases:
                    self.leased.add(k)
        return answer

    def batch_allocate(self, body):
        if self.lru:
            obj = parse_body(body)
            if isinstance(obj, dict) and is_int64(obj.get("rank")) and obj["rank"] in self.ranks:
                items = obj.get("keys", [])
                ks = []
                for item in items if isinstance(items, list) else ():
                    if isinstance(item, str):
                        ks.append(item)
                    elif isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
                        ks.append(item[0])
                    else:
                        ks = None
                        break
                if ks is not None and isinstance(items, list):
                    self.make_room(self.ranks[obj["rank"]], ks)
        return super().batch_allocate(body)

    def make_room(self, state, ks):
        while True:
            misses = [k for k in dict.fromkeys(ks) if k not in state.page_of]
            if len(misses) <= state.free_count():
                return
            reserved = len(state.page_of) - len(state.confirmed)
            if len(misses) > state.num_pages - reserved:
                return  # can never fit: -1 without evicting
            victim = next((k for k in self.recency if k not in self.leased), None)
            if victim is None:
                # Then incomplete keys that hold a page here and that no rank reserves.
                victim = next((k for k in self.directory if not self.complete(k)
                               and k in state.confirmed and not self.reserved_anywhere(k)), None)
            if victim is None:
                return
            self.remove_key(victim)
            self.evicted_keys += 1

    def delete(self, body):
        obj = parse_body(body)
        if isinstance(obj, Answer):
            return obj
        ks = obj.get("keys", [])
        if not isinstance(ks, list):
            return _error(400, INVALID_KEYS_FORMAT)
        bad = self._string_keys(ks)
        if bad:
            return bad
        n = 0
        for k in dict.fromkeys(ks):
            if k in self.directory and k not in self.leased:
                self.remove_key(k)
                n += 1
        self.deleted_keys += n
        return Answer(200, {"deleted": n})

    RANK_ROWS_MAX = 1024  # the server's kRankRowsMax

    def stats(self):
        ranks = [{"rank": r, **self.ranks[r].stats()} for r in sorted(self.ranks)]
        incomplete = [k for k in self.directory if not self.complete(k)]
        pool = {f"pages_{state}": sum(row[field] for row in ranks)
                for state, field in (("total", "num_pages"), ("free", "free"),
                                     ("reserved", "reserved"), ("bound", "bound"))}
        return Answer(200, {"ranks": ranks[:self.RANK_ROWS_MAX], "ranks_total": len(ranks),
                            "ranks_truncated": len(ranks) > self.RANK_ROWS_MAX, **pool,
                            "keys": len(self.directory),
                            "leased_keys": len(self.leased), "evicted_keys": self.evicted_keys,
                            "expired_reservations": 0, "deleted_keys": self.deleted_keys,
                            "refused_releases": self.refused_releases,
                            "incomplete_keys": len(incomplete),
                            "incomplete_pages": sum(len(self.directory[k][1]) for k in incomplete),
                            "stale_keys": 0})


class LifecycleMirror(Mirror):
    """Mirror (test_durability.py) with delete and /stats; `last` is the last raw
    response (for byte-exact checks)."""

    last = None

    def send(self, method, path, obj=None):
        self.last = super().send(method, path, obj)
        return self.last

    def attach_restarted(self, server):
        self.model.restarted()
        self.attach(server)

    def delete(self, ks):
        self._use(None, ks)
        status, body = self.call("POST", "/keys/delete", {"keys": list(ks)})
        self.tc.assertEqual(status, 200, body)
        self.tc.assertEqual(self.last.content, compact(body))
        return body["deleted"]

    def stats(self):
        status, body = self.call("GET", "/stats")
        self.tc.assertEqual(status, 200)
        return body

    def pages(self, rank, ks):
        """batch_allocate's pages (through the model); asserts the 200."""
        pages = self.allocate(rank, ks)
        self.tc.assertIsNotNone(pages, f"batch_allocate on rank {rank} failed")
        return pages

    def save_everywhere(self, ranks, ks):
        for r in ranks:
            self.save(r, ks)

    def alive(self, ks):
        return self.exists(ks)["exists"]


# --- base class ------------------------------------------------------------------------

class LifecycleCase(DurabilityCase):
    """A fresh server per mirror (DurabilityCase.start: killed at cleanup)."""

    def mirror(self, *args, threads=2, data_dir=None, lru=None, leases=None):
        """A server with `args` and a LifecycleMirror on it whose model follows the flags."""
        flags = list(args)
        if lru is None:
            lru = "lru" in flags and flags[flags.index("lru") - 1] == "--eviction"
        if leases is None:
            leases = "--read-lease-ms" not in flags or flags[flags.index("--read-lease-ms") + 1] != "0"
        server = self.start(data_dir, threads, *flags)
        m = LifecycleMirror(self, server, LifecycleModel(lru=lru, leases=leases))
        self.addCleanup(m.close)
        return server, m

    def assert_rank(self, m, rank, num_pages, free, reserved, bound, incomplete=None):
        """m.rank_info checks the answer against the model, incomplete pages included;
        `incomplete` also states them."""
        status, body = m.rank_info(rank)
        if incomplete is None:
            incomplete = body.get("incomplete")
        self.assertEqual((status, body), (200, {"num_pages": num_pages, "free": free,
                                                "reserved": reserved, "bound": bound,
                                                "incomplete": incomplete}))

    def assert_json_error(self, r, status, detail=None):
        self.assertEqual(r.status_code, status, r.content)
        self.assertEqual(r.headers.get("Content-Type", "").split(";")[0], "application/json")
        body = r.json()
        self.assertEqual(list(body), ["detail"], r.content)
        if detail is not None:
            self.assertEqual(body["detail"], detail)
        return body["detail"]

    def scrape(self, server):
        r = requests.get(server.base_url + "/metrics", timeout=SOCKET_TIMEOUT_S)
        self.assertEqual(r.status_code, 200)
        return Metrics(r.text)


# --- 1. delete -------------------------------------------------------------------------

class DeleteTest(LifecycleCase):

    def test_delete_frees_confirmed_pages_on_every_rank(self):
        _, m = self.mirror("--read-lease-ms", "0")
        m.init(0, 8)
        m.init(1, 8)
        ks = keys(4, "del")
        m.save_everywhere((0, 1), ks)
        self.assertEqual(m.alive(ks), [True] * 4)
        self.assertEqual(m.delete([ks[0], ks[2]]), 2)
        self.assertEqual(m.last.content, b'{"deleted":2}')
        self.assertEqual(m.last.headers.get("Content-Type"), "application/json")
        self.assertEqual(m.alive(ks), [False, True, False, True])
        for r in (0, 1):
            self.assertEqual(m.locations(r, ks), {"locations": [None, 1, None, 3]})
            self.assert_rank(m, r, 8, 6, 0, 2)
        st = m.stats()
        self.assertEqual((st["keys"], st["deleted_keys"], st["evicted_keys"]), (2, 2, 0))
        # A fresh page (a new reservation, lowest free first), not the old binding.
        self.assertEqual(m.pages(0, [ks[0]]), [0])
        self.assert_rank(m, 0, 8, 5, 1, 2)
        self.assertEqual(m.pages(0, [ks[2], ks[1]]), [2, 1])
        self.assert_rank(m, 0, 8, 4, 2, 2)
        self.assertEqual(m.alive([ks[0]]), [False])
        # Saved again on both ranks: complete again.
        m.confirm(0, [(ks[0], 0), (ks[2], 2)])
        m.save(1, [ks[0], ks[2]])
        self.assertEqual(m.alive(ks), [True] * 4)
        self.assertEqual(m.locations(1, ks), {"locations": [0, 1, 2, 3]})

    def test_delete_counts_distinct_existing_keys(self):
        _, m = self.mirror("--read-lease-ms", "0")
        m.init(0, 16)
        hexk = keys(3, "count")
        sha = [hashlib.sha256(f"count/{i}".encode()).hexdigest() for i in range(2)]
        odd = ["", "weird key \u00fc", "A" * 300]
        every = hexk + sha + odd
        m.save(0, every)
        self.assertEqual(m.delete([hexk[0], hexk[0], key("unknown"), hexk[1], hexk[0], sha[0],
                                   odd[1], odd[1], "never saved"]), 4)
        self.assertEqual(m.alive(every), [False, False, True, False, True, True, False, True])
        self.assertEqual(m.delete([hexk[0], hexk[1]]), 0, "deleted twice")
        self.assertEqual(m.delete([]), 0)
        self.assertEqual(m.call("POST", "/keys/delete", {}), (200, {"deleted": 0}))
        self.assertEqual(m.call("POST", "/keys/delete", {"other": [1, 2]}), (200, {"deleted": 0}))
        self.assertEqual(m.delete(every + every), 4)
        self.assert_rank(m, 0, 16, 16, 0, 0)
        st = m.stats()
        self.assertEqual((st["keys"], st["deleted_keys"]), (0, 8))

    def test_delete_key_confirmed_by_some_ranks_only(self):
        _, m = self.mirror("--read-lease-ms", "0")
        m.init(0, 8)
        m.init(1, 8)
        part, reserved_only = key("part"), key("reserved-only")
        self.assertEqual(m.pages(0, [part, reserved_only]), [0, 1])
        m.confirm(0, [(part, 0)])
        self.assertEqual(m.pages(1, [part]), [0])
        self.assertEqual(m.alive([part]), [False])
        # `part` is in the directory (one rank confirmed it); `reserved_only` is not.
        self.assertEqual(m.delete([part, reserved_only]), 1)
        self.assert_rank(m, 0, 8, 7, 1, 0)   # part's confirmed page freed; reserved_only kept
        self.assert_rank(m, 1, 8, 7, 1, 0)   # part's reserved page on rank 1 stays reserved
        self.assertEqual(m.pages(1, [part]), [0], "the reservation on rank 1 is kept")
        self.assert_rank(m, 1, 8, 7, 1, 0)
        self.assertEqual(m.pages(0, [part]), [0], "a fresh reservation on rank 0")
        self.assert_rank(m, 0, 8, 6, 2, 0)
        m.confirm(0, [(part, 0)])
        m.confirm(1, [(part, 0)])
        self.assertEqual(m.alive([part]), [True])
        self.assertEqual(m.delete([part]), 1)
        self.assert_rank(m, 0, 8, 7, 1, 0)
        self.assert_rank(m, 1, 8, 8, 0, 0)
        self.assertEqual(m.pages(0, [reserved_only]), [1])
        self.assertEqual(m.stats()["deleted_keys"], 2)

    def test_get_locations_without_lease_does_not_block_delete(self):
        _, m = self.mirror("--read-lease-ms", "0")
        m.init(0, 4)
        ks = keys(2, "nolease")
        m.save(0, ks)
        self.assertEqual(m.locations(0, ks), {"locations": [0, 1]})
        self.assertEqual(m.stats()["leased_keys"], 0)
        self.assertEqual(m.delete(ks), 2)
        self.assert_rank(m, 0, 4, 4, 0, 0)

    def test_bad_delete_requests_change_nothing(self):
        server, m = self.mirror("--read-lease-ms", "0")
        m.init(0, 8)
        m.init(1, 8)
        ks = keys(3, "bad")
        m.save_everywhere((0, 1), ks)
        before = m.stats()
        json_error = "Invalid JSON body: "
        bodies = [
            (compact({"keys": ks[0]}), INVALID_KEYS_FORMAT),
            (compact({"keys": {ks[0]: 1}}), INVALID_KEYS_FORMAT),
            (compact({"keys": 7}), INVALID_KEYS_FORMAT),
            (compact({"keys": None}), INVALID_KEYS_FORMAT),
            (compact({"keys": [ks[0], 1]}), None),
            (compact({"keys": [ks[0], ks[1], None]}), None),
            (compact({"keys": [ks[0], [ks[1], ""]]}), None),
            (compact({"keys": [True]}), None),
            (b'{"keys":[', json_error),
            (b"{", json_error),
            (b"", json_error),
            (b"[]", json_error),
            (b'"keys"', json_error),
            (compact({"keys": ks}) + b" x", json_error),
            (b'{"keys":[NaN]}', json_error),
            (b'{"keys":["' + ks[0].encode() + b'"],"other":[1,}', json_error),
        ]
        c = m.client
        for body, detail in bodies:
            with self.subTest(body=body[:60]):
                ex = c.post_raw("/keys/batch_exists", body)
                self.assertEqual(ex.status_code, 400, f"batch_exists accepted {body!r}")
                r = c.post_raw("/keys/delete", body)
                text = self.assert_json_error(r, 400)
                self.assertEqual(r.content, ex.content, "not batch_exists' answer")
                if detail is not None and detail.endswith(": "):
                    self.assertTrue(text.startswith(detail) and len(text) > len(detail), text)
                elif detail is not None:
                    self.assertEqual(text, detail)
                else:
                    self.assertTrue(text.startswith("Invalid key at index"), text)
                self.assertEqual(m.stats(), before)
        for method in ("GET", "PUT", "DELETE"):
            with self.subTest(method=method):
                r = c.request(method, "/keys/delete")
                self.assert_json_error(r, 405, "Method Not Allowed")
                self.assertEqual(r.headers.get("Allow"), "POST")
        self.assertEqual(m.stats(), before)
        self.assertEqual(m.alive(ks), [True] * 3)
        for r in (0, 1):
            self.assertEqual(m.locations(r, ks), {"locations": [0, 1, 2]})
        self.assertTrue(server.alive())


# --- 2. read leases --------------------------------------------------------------------

class LeaseTest(LifecycleCase):

    def test_get_locations_lease_refuses_delete(self):
        _, m = self.mirror("--read-lease-ms", HUGE_LEASE_MS)
        m.init(0, 8)
        m.init(1, 8)
        a, b, c = keys(3, "lease")
        m.save_everywhere((0, 1), [a, b, c])
        self.assertEqual(m.locations(1, [a]), {"locations": [0]})
        self.assertEqual(m.stats()["leased_keys"], 1)
        self.assertEqual(m.delete([a, b, c]), 2, "the leased key was deleted or counted")
        self.assertEqual(m.alive([a, b, c]), [True, False, False])
        for r in (0, 1):
            self.assertEqual(m.locations(r, [a, b]), {"locations": [0, None]})
            self.assert_rank(m, r, 8, 7, 0, 1)
        self.assertEqual(m.delete([a]), 0)
        st = m.stats()
        self.assertEqual((st["leased_keys"], st["deleted_keys"], st["keys"]), (1, 2, 1))

    def test_batch_exists_does_not_lease(self):
        _, m = self.mirror("--read-lease-ms", HUGE_LEASE_MS)
        m.init(0, 4)
        ks = keys(2, "exists")
        m.save(0, ks)
        self.assertEqual(m.alive(ks + ks), [True] * 4)
        self.assertEqual(m.stats()["leased_keys"], 0)
        self.assertEqual(m.delete(ks), 2)

    def test_get_locations_of_an_incomplete_key_does_not_lease(self):
        _, m = self.mirror("--read-lease-ms", HUGE_LEASE_MS)
        m.init(0, 4)
        m.init(1, 4)
        k = key("incomplete")
        m.save(0, [k])
        self.assertEqual(m.locations(0, [k]), {"locations": [None]})
        self.assertEqual(m.locations(1, [k]), {"locations": [None]})
        m.save(1, [k])
        self.assertEqual(m.alive([k]), [True])
        self.assertEqual(m.stats()["leased_keys"], 0)
        self.assertEqual(m.delete([k]), 1)

    def test_get_locations_on_an_unknown_rank_does_not_lease(self):
        # A 404 returns no pages, so it holds no lease (nothing is being read).
        _, m = self.mirror("--read-lease-ms", HUGE_LEASE_MS)
        m.init(0, 4)
        k = key("unknown-rank")
        m.save(0, [k])
        status, _ = m.call("POST", "/keys/get_locations", {"rank": 5, "keys": [k]})
        self.assertEqual(status, 404)
        leased = m.client.request("GET", "/stats").json()["leased_keys"]
        deleted = m.client.post("/keys/delete", {"keys": [k]}).json()["deleted"]
        self.assertEqual((leased, deleted), (0, 1),
                         "a get_locations answered 404 (rank 5 not initialized, no pages "
                         f"returned) leased the key: leased_keys {leased}, delete refused")

    def test_leased_keys_are_not_evicted(self):
        _, m = self.mirror("--eviction", "lru", "--read-lease-ms", HUGE_LEASE_MS)
        m.init(0, 4)
        ks = keys(4, "leased")
        for k in ks:
            m.save(0, [k])
            gap()
        # Oldest first: k0 (leased), k1, k2 (leased), k3.
        self.assertEqual(m.locations(0, [ks[0], ks[2]]), {"locations": [0, 2]})
        new = keys(3, "leased/new")
        self.assertEqual(m.pages(0, new[:2]), [1, 3])
        self.assertEqual(m.alive(ks), [True, False, True, False])
        m.confirm(0, list(zip(new[:2], [1, 3])))
        self.assertEqual(m.locations(0, new[:2]), {"locations": [1, 3]})
        # Every complete key is leased now: nothing can go.
        self.assertEqual(m.pages(0, new[2:]), [-1])
        self.assert_rank(m, 0, 4, 0, 0, 4)
        st = m.stats()
        self.assertEqual((st["leased_keys"], st["evicted_keys"], st["keys"]), (4, 2, 4))

    def test_lease_ends_after_read_lease_ms(self):
        lease_s = 0.5
        server = self.start(None, 2, "--read-lease-ms", str(int(lease_s * 1000)))
        c = Client(server.base_url)
        self.addCleanup(c.close)
        self.assertEqual(c.initialize(0, 4).status_code, 200)
        k = key("short-lease")
        self.assertEqual(c.batch_allocate(0, [k]).json()["results"], [[k, 0]])
        self.assertEqual(c.confirm_write(0, [(k, 0)]).status_code, 204)
        sent = time.monotonic()
        self.assertEqual(c.get_locations(0, [k]).json(), {"locations": [0]})
        self.assertEqual(c.post("/keys/delete", {"keys": [k]}).content, b'{"deleted":0}')
        self.assertEqual(c.request("GET", "/stats").json()["leased_keys"], 1)
        while True:
            body = c.post("/keys/delete", {"keys": [k]}).json()
            elapsed = time.monotonic() - sent
            if body["deleted"] == 1:
                break
            self.assertEqual(body, {"deleted": 0})
            self.assertLess(elapsed, lease_s + 2.0, "the lease did not end")
            time.sleep(0.02)
        # The server's clock is coarse (a few ms): allow that much early.
        self.assertGreaterEqual(elapsed, lease_s - 0.01, "the lease ended early")
        st = c.request("GET", "/stats").json()
        self.assertEqual((st["leased_keys"], st["deleted_keys"], st["keys"]), (0, 1, 0))
        self.assertEqual(c.batch_exists([k]).json(), {"exists": [False]})


# --- 3. eviction -----------------------------------------------------------------------

class EvictionTest(LifecycleCase):

    LRU = ("--eviction", "lru", "--read-lease-ms", "0")

    def test_lru_evicts_the_least_recently_completed_keys_on_every_rank(self):
        _, m = self.mirror(*self.LRU)
        m.init(0, 4)
        m.init(1, 4)
        ks = keys(4, "lru")
        for k in ks:
            m.save_everywhere((0, 1), [k])
            gap()
        n = keys(3, "lru/new")
        self.assertEqual(m.pages(0, [n[0]]), [0])
        # (Only the evicted key is looked up: a lookup of the others would be a use.)
        self.assertEqual(m.alive([ks[0]]), [False])
        self.assert_rank(m, 1, 4, 1, 0, 3)
        self.assertEqual(m.locations(1, [ks[0]]), {"locations": [None]})
        self.assertEqual(m.stats()["evicted_keys"], 1)
        self.assertEqual(m.pages(1, [n[0]]), [0], "rank 1 has the freed page: no eviction")
        self.assertEqual(m.stats()["evicted_keys"], 1)
        m.confirm(0, [(n[0], 0)])
        m.confirm(1, [(n[0], 0)])
        gap()
        self.assertEqual(m.pages(0, n[1:]), [1, 2])
        self.assertEqual(m.alive(ks + n[:1]), [False, False, False, True, True])
        st = m.stats()
        self.assertEqual((st["evicted_keys"], st["keys"]), (3, 2))
        self.assertEqual(st["ranks"], [
            {"rank": 0, "num_pages": 4, "free": 0, "reserved": 2, "bound": 2},
            {"rank": 1, "num_pages": 4, "free": 2, "reserved": 0, "bound": 2}])

    def test_batch_exists_and_get_locations_uses_reorder(self):
        _, m = self.mirror(*self.LRU)
        m.init(0, 4)
        ks = keys(4, "order")
        for k in ks:
            m.save(0, [k])
            gap()
        self.assertEqual(m.alive([key("absent"), ks[0]]), [False, True])
        gap()
        self.assertEqual(m.locations(0, [ks[1]]), {"locations": [1]})
        gap()
        # Least recently used first now: k2, k3, k0, k1.
        n = keys(5, "order/new")
        self.assertEqual(m.pages(0, [n[0]]), [2])
        self.assertEqual(m.pages(0, [n[1]]), [3])
        self.assertEqual(m.pages(0, [n[2]]), [0])
        self.assertEqual(m.alive(ks), [False, True, False, False])
        # Reserved keys are not candidates; k1 is the last complete key.
        self.assertEqual(m.pages(0, [n[3]]), [1])
        # Four reservations on four pages: can never fit, -1.
        self.assertEqual(m.pages(0, [n[4]]), [-1])
        self.assertEqual(m.stats()["evicted_keys"], 4)

    def test_eviction_removes_the_key_on_every_rank(self):
        _, m = self.mirror(*self.LRU, threads=3)
        ranks = (-5, 0, 7)
        m.init(-5, 6)
        m.init(0, 2)
        m.init(7, 6)
        ks = keys(2, "everywhere")
        for k in ks:
            m.save_everywhere(ranks, [k])
            gap()
        self.assertEqual(m.pages(0, [key("everywhere/new")]), [0])
        self.assertEqual(m.alive(ks), [False, True])
        for r in (-5, 7):
            self.assert_rank(m, r, 6, 5, 0, 1)
            self.assertEqual(m.locations(r, ks), {"locations": [None, 1]})
        self.assertEqual(m.pages(7, [ks[0]]), [0], "a fresh page for the evicted key")
        self.assert_rank(m, 7, 6, 4, 1, 1)
        st = m.stats()
        self.assertEqual((st["evicted_keys"], st["keys"]), (1, 1))

    def test_keys_being_written_are_not_evicted(self):
        _, m = self.mirror(*self.LRU)
        m.init(0, 4)
        m.init(1, 4)
        w_res, w_inc = key("w/reserved"), key("w/incomplete")
        self.assertEqual(m.pages(0, [w_res]), [0])          # reserved on rank 0
        m.save(0, [w_inc])                                   # page 1, confirmed by 1 of 2 ranks
        self.assertEqual(m.pages(1, [w_inc]), [0])          # ... and being written on rank 1
        gap()
        done = keys(2, "w/complete")
        for k in done:
            m.save_everywhere((0, 1), [k])
            gap()
        n = keys(3, "w/new")
        self.assertEqual(m.pages(0, n[:2]), [2, 3])
        self.assertEqual(m.alive(done), [False, False])
        self.assertEqual(m.pages(0, [w_res, w_inc]), [0, 1], "a key being written lost its page")
        self.assertEqual(m.pages(0, [n[2]]), [-1])
        self.assert_rank(m, 0, 4, 0, 3, 1)
        self.assertEqual(m.stats()["evicted_keys"], 2)
        # Once complete, it is a candidate like any other.
        m.save(1, [w_inc])
        self.assertEqual(m.alive([w_inc]), [True])
        self.assertEqual(m.pages(0, [n[2]]), [1])
        self.assertEqual(m.alive([w_inc]), [False])
        self.assert_rank(m, 1, 4, 4, 0, 0)

    def test_incomplete_keys_nobody_writes_are_evicted_when_nothing_else_can_go(self):
        # A save whose rank-1 write failed left keys confirmed on rank 0 only: no reader
        # can use them and no rank reserves them. When no complete key can serve an
        # allocation, they are evicted rather than answer -1 (those that hold a page on
        # the short rank, confirmed longest ago first).
        _, m = self.mirror(*self.LRU, threads=1)  # one directory slice: a defined order
        m.init(0, 4)
        m.init(1, 4)
        dead = keys(4, "dead")
        m.save(0, dead)
        self.assertEqual(m.confirm(1, [], m.pages(1, dead)), 204)   # rank 1's write failed
        self.assertEqual(m.pages(0, keys(2, "fresh")), [0, 1])
        self.assert_rank(m, 0, 4, 0, 2, 2, incomplete=2)
        st = m.stats()
        self.assertEqual((st["evicted_keys"], st["incomplete_keys"]), (2, 2))

    def test_batch_that_can_never_fit_answers_minus_one_without_evicting(self):
        _, m = self.mirror(*self.LRU)
        m.init(0, 8)
        self.assertEqual(m.pages(0, keys(2, "nf/reserved")), [0, 1])
        done = keys(6, "nf/complete")
        m.save(0, done)
        self.assertEqual(m.pages(0, keys(7, "nf/new")), [-1] * 7, NEVER_FITS)
        self.assertEqual(m.alive(done), [True] * 6)
        self.assertEqual(m.stats()["evicted_keys"], 0)
        # 6 new keys can fit: every complete key goes.
        self.assertEqual(m.pages(0, keys(6, "nf/new")), [2, 3, 4, 5, 6, 7])
        self.assertEqual(m.alive(done), [False] * 6)
        self.assert_rank(m, 0, 8, 0, 8, 0)
        self.assertEqual(m.stats()["evicted_keys"], 6)

    def test_back_to_back_uses_across_cores_keep_lru_order(self):
        # Sequential requests define a strict order of uses; the least recently used key
        # is the first one saved, whichever core its directory slice lives on, however
        # close together the requests came.
        server = self.start(None, 3, *self.LRU)
        c = Client(server.base_url)
        self.addCleanup(c.close)
        for trial in range(20):
            self.assertEqual(c.clear().status_code, 204)
            self.assertEqual(c.initialize(0, 6).status_code, 200)
            ks = keys(6, f"b2b/{trial}")
            for i, k in enumerate(ks):
                self.assertEqual(c.batch_allocate(0, [k]).json()["results"], [[k, i]])
                self.assertEqual(c.confirm_write(0, [(k, i)]).status_code, 204)
            new = key("b2b/new", str(trial))
            got = c.batch_allocate(0, [new]).json()["results"]
            alive = c.batch_exists(ks).json()["exists"]
            self.assertEqual((got, alive), ([[new, 0]], [False] + [True] * 5),
                             f"trial {trial}: 6 keys completed by 6 sequential confirm_writes "
                             f"(back to back, --threads 3); the allocation evicted the key(s) "
                             f"{[i for i, a in enumerate(alive) if not a]} instead of key 0, "
                             f"the least recently used")

    def test_lru_keys_that_live_on_other_ranks_do_not_make_the_allocation_fail(self):
        # Keys complete on rank 1 only (confirmed while rank 1 was the only worker) are
        # the least recently used; rank 0 is full of complete keys. The allocation on
        # rank 0 must succeed ("evicted until the allocation fits").
        _, m = self.mirror(*self.LRU)
        m.init(1, 100)
        old = keys(20, "elsewhere/rank1")
        m.save(1, old)
        gap()
        m.init(0, 4)
        mine = keys(4, "elsewhere/both")
        for k in mine:
            m.save_everywhere((0, 1), [k])
            gap()
        new = key("elsewhere/new")
        r = m.send("POST", "/keys/batch_allocate", {"rank": 0, "keys": [[new, ""]]})
        self.assertEqual(r.status_code, 200)
        alive_old = m.client.batch_exists(old).json()["exists"]
        alive_mine = m.client.batch_exists(mine).json()["exists"]
        evicted = m.client.request("GET", "/stats").json()["evicted_keys"]
        self.assertEqual(r.json()["results"], [[new, 0]],
                         f"batch_allocate of 1 new key on a full rank 0 whose 4 keys are all "
                         f"complete and unleased answered -1; it evicted {evicted} key(s) "
                         f"({alive_old.count(False)} of the 20 older keys that have no page on "
                         f"rank 0) and gave up")
        self.assertEqual(alive_mine, [False, True, True, True])
        self.assertIn(alive_old.count(False), (0, 20), "a part of the older keys was evicted")

    def test_unservable_batch_evicts_nothing(self):
        # Rank 0: 2 pages bound to keys only rank 0 confirmed (incomplete: being written),
        # 6 complete keys. 7 new keys cannot be served even by evicting every complete
        # key, so the answer is -1 and nothing is evicted (all-or-nothing; evicting 6 keys
        # for an allocation that fails anyway only destroys cached data).
        _, m = self.mirror(*self.LRU)
        m.init(0, 8)
        m.init(1, 8)
        m.save(0, keys(2, "unservable/incomplete"))
        m.pages(1, keys(2, "unservable/incomplete"))  # being written on rank 1: reserved
        done = keys(6, "unservable/complete")
        m.save_everywhere((0, 1), done)
        r = m.send("POST", "/keys/batch_allocate",
                   {"rank": 0, "keys": [[k, ""] for k in keys(7, "unservable/new")]})
        self.assertEqual([p for _, p in r.json()["results"]], [-1] * 7)
        alive = m.client.batch_exists(done).json()["exists"]
        self.assertEqual(alive, [True] * 6,
                         f"an allocation of 7 new keys on 8 pages, 2 of them held by keys being "
                         f"written, answered -1 after evicting {alive.count(False)} complete keys")


class NoEvictionTest(LifecycleCase):

    def test_full_rank_answers_minus_one_all_or_nothing(self):
        _, m = self.mirror("--read-lease-ms", "0")   # --eviction none is the default
        m.init(0, 4)
        m.init(1, 4)
        ks = keys(4, "none")
        for k in ks:
            m.save_everywhere((0, 1), [k])
        n = keys(2, "none/new")
        self.assertEqual(m.pages(0, [n[0]]), [-1])
        self.assertEqual(m.pages(0, [ks[0], n[0]]), [0, -1])
        self.assertEqual(m.pages(0, [ks[1], ks[0]]), [1, 0])
        self.assertEqual(m.alive(ks), [True] * 4)
        self.assertEqual(m.delete([ks[2]]), 1)
        self.assertEqual(m.pages(0, n), [-1, -1])
        self.assertEqual(m.pages(0, [n[1]]), [2])
        st = m.stats()
        self.assertEqual((st["evicted_keys"], st["deleted_keys"], st["keys"]), (0, 1, 3))


# --- 4. the vLLM flow ------------------------------------------------------------------

class VllmFlowTest(LifecycleCase):
    """One engine, TP 2: per prompt the scheduler's batch_exists, then loads
    (get_locations on every rank) of a hit, or a save (batch_allocate -> confirm_write on
    every rank) of a miss. 24 distinct 16-block segments against pools of 64 pages."""

    TP = (0, 1)
    PAGES = 64
    SEGMENTS = 24
    BLOCKS = 16
    STEPS = 80

    def run_flow(self, lru):
        args = ["--read-lease-ms", "0"] + (["--eviction", "lru"] if lru else [])
        _, m = self.mirror(*args)
        self.assertEqual(m.call("POST", "/rank/0/initialize", {"num_pages": 0, "role": "scheduler"})[0], 200)
        for r in self.TP:
            m.init(r, self.PAGES)
        rng = random.Random(1637)
        segs = [keys(self.BLOCKS, f"flow/{s}") for s in range(self.SEGMENTS)]
        recent = collections.deque(maxlen=6)
        saves = refused = loads = 0
        for step in range(self.STEPS):
            s = rng.choice(recent) if recent and rng.random() < 0.4 else rng.randrange(self.SEGMENTS)
            recent.append(s)
            ks = segs[s]
            found = m.alive(ks)
            self.assertIn(found, ([True] * self.BLOCKS, [False] * self.BLOCKS), f"step {step}")
            if found[0]:
                loads += 1
                for r in self.TP:
                    locs = m.locations(r, ks)["locations"]
                    self.assertNotIn(None, locs)
            else:
                pages = {r: m.pages(r, ks) for r in self.TP}
                if lru:
                    for r in self.TP:
                        self.assertNotIn(-1, pages[r], f"step {step} rank {r}")
                        self.assertEqual(m.confirm(r, list(zip(ks, pages[r]))), 204)
                    saves += 1
                    self.assertEqual(m.alive(ks), [True] * self.BLOCKS)
                elif -1 in pages[0]:
                    for r in self.TP:
                        self.assertEqual(pages[r], [-1] * self.BLOCKS, f"step {step} rank {r}")
                    refused += 1
                else:
                    for r in self.TP:
                        self.assertEqual(m.confirm(r, list(zip(ks, pages[r]))), 204)
                    saves += 1
            gap()
            if step % 8 == 7:
                self.check_pages(m, step)
        self.check_pages(m, "end")
        m.verify()
        return m, saves, refused, loads

    def check_pages(self, m, when):
        """Without touching recency: /rank and /stats (model-checked), every live key's
        page by a batch_allocate of hits, no page held by two keys, counts add up."""
        for r in self.TP:
            status, info = m.rank_info(r)
            self.assertEqual(info["free"] + info["reserved"] + info["bound"], self.PAGES)
            held = sorted(m.model.ranks[r].page_of)
            if held:
                pages = m.pages(r, held)
                self.assertEqual(len(set(pages)), len(pages), f"{when}: a page held by two keys")
                self.assertNotIn(-1, pages)
            self.assertEqual(m.rank_info(r), (status, info), "hits changed the counts")
        st = m.stats()
        self.assertEqual(st["keys"], sum(1 for k in m.model.directory if m.model.complete(k)),
                         f"{when}: incomplete keys left behind")

    def test_tp2_lru_saves_keep_succeeding_with_a_small_pool(self):
        m, saves, refused, loads = self.run_flow(lru=True)
        st = m.stats()
        live = self.PAGES // self.BLOCKS
        self.assertEqual(st["keys"], live * self.BLOCKS)
        self.assertEqual(st["evicted_keys"], (saves - live) * self.BLOCKS)
        self.assertGreater(saves, 2 * live, "the flow did not cycle the pool")
        self.assertGreater(loads, 0)
        for info in st["ranks"]:
            self.assertEqual((info["free"], info["reserved"], info["bound"]), (0, 0, self.PAGES))

    def test_tp2_without_eviction_allocations_fail_once_full(self):
        m, saves, refused, loads = self.run_flow(lru=False)
        st = m.stats()
        self.assertEqual(saves, self.PAGES // self.BLOCKS)
        self.assertGreater(refused, 10)
        self.assertGreater(loads, 0)
        self.assertEqual((st["keys"], st["evicted_keys"]), (self.PAGES, 0))


@transport_independent
class StaleKeyTest(LifecycleCase):
    """Keys confirmed on some ranks but never on all (a save whose write failed on one
    rank: vLLM releases that rank's pages, the others stay confirmed) are removed on every
    rank once --incomplete-grace-ms has passed since their last confirmation. Real time,
    so no model mirror: the answers are checked directly."""

    GRACE_MS = 800

    def client(self, *args):
        server = self.start(None, 2, "--incomplete-grace-ms", str(self.GRACE_MS), *args)
        c = Client(server.base_url)
        self.addCleanup(c.close)
        return server, c

    def save_on(self, c, rank, ks):
        r = c.batch_allocate(rank, ks)
        self.assertEqual(r.status_code, 200, r.content)
        pages = [p for _, p in r.json()["results"]]
        if -1 not in pages:
            self.assertEqual(c.confirm_write(rank, zip(ks, pages)).status_code, 204)
        return pages

    def half_save(self, c, ks):
        """Rank 0 writes and confirms; rank 1's write fails: it releases its pages."""
        self.assertNotIn(-1, self.save_on(c, 0, ks))
        r = c.batch_allocate(1, ks)
        pages = [p for _, p in r.json()["results"]]
        self.assertNotIn(-1, pages)
        self.assertEqual(c.confirm_write(1, [], pages).status_code, 204)

    def stats(self, c):
        r = c.request("GET", "/stats")
        self.assertEqual(r.status_code, 200)
        return r.json()

    def test_half_failed_saves_stop_blocking_the_rank_after_the_grace(self):
        for mode in ("lru", "none"):
            with self.subTest(eviction=mode):
                server, c = self.client("--eviction", mode)
                for r in (0, 1):
                    self.assertEqual(c.initialize(r, 256).status_code, 200)
                # The reproduction: two save tasks of 128 keys whose rank-1 write
                # failed fill rank 0 with keys that can never complete.
                self.half_save(c, keys(128, f"{mode}/a"))
                self.half_save(c, keys(128, f"{mode}/b"))
                st = self.stats(c)
                self.assertEqual((st["incomplete_keys"], st["incomplete_pages"]), (256, 256))
                fresh = keys(128, f"{mode}/c")
                if mode == "lru":
                    # Eviction takes 128 of them at once (no rank reserves them); the
                    # other 128 are reclaimed once their grace has passed.
                    self.assertNotIn(-1, self.save_on(c, 0, fresh))
                    self.assertNotIn(-1, self.save_on(c, 1, fresh))  # complete at once
                    self.assertEqual(self.stats(c)["evicted_keys"], 128)
                    deadline = time.monotonic() + self.GRACE_MS / 1000 + 5
                    while self.stats(c)["stale_keys"] < 128 and time.monotonic() < deadline:
                        time.sleep(0.1)
                    stale = 128
                else:
                    self.assertEqual(self.save_on(c, 0, fresh), [-1] * 128)
                    time.sleep(self.GRACE_MS / 1000 + 0.3)
                    self.assertNotIn(-1, self.save_on(c, 0, fresh))
                    self.assertNotIn(-1, self.save_on(c, 1, fresh))
                    stale = 256
                self.assertEqual(c.batch_exists(fresh).json()["exists"], [True] * 128)
                st = self.stats(c)
                self.assertEqual((st["stale_keys"], st["incomplete_keys"], st["keys"]),
                                 (stale, 0, 128))
                metrics = self.scrape(server)
                self.assertEqual(metrics.types.get("hf3fs_metad_stale_keys_total"), "counter")
                self.assertEqual(metrics.get("hf3fs_metad_stale_keys_total"), stale)
                self.assertEqual(metrics.get("hf3fs_metad_incomplete_keys"), 0)
                self.assertEqual(metrics.get("hf3fs_metad_incomplete_pages"), 0)

    def test_the_tick_reclaims_without_any_allocation(self):
        _, c = self.client()
        for r in (0, 1, 2):
            self.assertEqual(c.initialize(r, 8).status_code, 200)
        ks = keys(4, "tick")
        self.save_on(c, 0, ks)
        self.save_on(c, 2, ks)  # rank 1 never writes them: 2 of 3
        self.assertEqual(self.stats(c)["incomplete_pages"], 8)
        deadline = time.monotonic() + self.GRACE_MS / 1000 + 5
        while self.stats(c)["stale_keys"] < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        st = self.stats(c)
        self.assertEqual((st["stale_keys"], st["keys"], st["incomplete_pages"]), (4, 0, 0))
        for r in (0, 1, 2):
            self.assertEqual(c.rank_info(r).json(),
                             {"num_pages": 8, "free": 8, "reserved": 0, "bound": 0, "incomplete": 0})

    def test_a_lagging_writer_that_completes_within_the_grace_keeps_its_keys(self):
        _, c = self.client("--eviction", "lru")
        for r in (0, 1):
            self.assertEqual(c.initialize(r, 8).status_code, 200)
        ks = keys(4, "lag")
        self.save_on(c, 0, ks)
        slow = [p for _, p in c.batch_allocate(1, ks).json()["results"]]
        # Past the grace, but rank 1 holds reservations for them: a writer at work.
        time.sleep(self.GRACE_MS / 1000 + 0.6)
        self.assertEqual(self.stats(c)["stale_keys"], 0)
        self.assertEqual(c.confirm_write(1, zip(ks, slow)).status_code, 204)
        self.assertEqual(c.batch_exists(ks).json()["exists"], [True] * 4)
        time.sleep(self.GRACE_MS / 1000 + 0.6)
        st = self.stats(c)
        self.assertEqual((st["stale_keys"], st["keys"]), (0, 4))
        self.assertEqual(c.batch_exists(ks).json()["exists"], [True] * 4)


# --- 5. /stats and /metrics ------------------------------------------------------------

class StatsMetricsTest(LifecycleCase):

    def test_stats_shape_sorted_ranks_and_counters(self):
        server, m = self.mirror("--eviction", "lru", "--read-lease-ms", HUGE_LEASE_MS)
        c = m.client
        r = c.request("GET", "/stats")
        self.assertEqual((r.status_code, r.content),
                         (200, b'{"ranks":[],"ranks_total":0,"ranks_truncated":false,'
                               b'"pages_total":0,"pages_free":0,"pages_reserved":0,"pages_bound":0,'
                               b'"keys":0,"leased_keys":0,"evicted_keys":0,'
                               b'"expired_reservations":0,"deleted_keys":0,"refused_releases":0,'
                               b'"incomplete_keys":0,"incomplete_pages":0,"stale_keys":0}'))
        self.assertEqual(r.headers.get("Content-Type"), "application/json")
        big = 2**40
        ranks = (5, -3, big, 0)
        for rank, pages in zip(ranks, (6, 4, 4, 8)):
            m.init(rank, pages)
        self.assertEqual(m.call("POST", "/rank/9/initialize", {"num_pages": 0, "role": "scheduler"})[0], 200)
        a = keys(2, "stats/a")
        m.save_everywhere(ranks, a)
        gap()
        b = keys(2, "stats/b")
        for k in b:
            m.save_everywhere(ranks, [k])
            gap()
        self.assertEqual(m.pages(5, [key("stats/reserved")]), [4])
        hit = m.pages(5, [a[0]])
        self.assertEqual(hit, [0])
        self.assertEqual(m.confirm(5, [], hit), 204)                   # a refused release
        self.assertEqual(m.locations(0, [a[0]]), {"locations": [0]})   # a lease
        self.assertEqual(m.delete([a[1]]), 1)
        # Rank 2**40 (4 pages): a0 (leased), b0, b1 bound, one free page; 2 new keys
        # evict b0, the least recently used key without a lease.
        self.assertEqual(m.pages(big, keys(2, "stats/new")), [1, 2])
        self.assertEqual(m.alive(a + b), [True, False, False, True])
        r = c.request("GET", "/stats")
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.content, compact({
            "ranks": [
                {"rank": -3, "num_pages": 4, "free": 2, "reserved": 0, "bound": 2},
                {"rank": 0, "num_pages": 8, "free": 6, "reserved": 0, "bound": 2},
                {"rank": 5, "num_pages": 6, "free": 3, "reserved": 1, "bound": 2},
                {"rank": big, "num_pages": 4, "free": 0, "reserved": 2, "bound": 2}],
            "ranks_total": 4, "ranks_truncated": False, "pages_total": 22, "pages_free": 11,
            "pages_reserved": 3, "pages_bound": 8,
            "keys": 2, "leased_keys": 1, "evicted_keys": 1, "expired_reservations": 0,
            "deleted_keys": 1, "refused_releases": 1, "incomplete_keys": 0, "incomplete_pages": 0,
            "stale_keys": 0}))
        m.stats()  # and the model agrees
        for rank in ranks:
            info = m.rank_info(rank)[1]
            row = next(x for x in r.json()["ranks"] if x["rank"] == rank)
            info.pop("incomplete")  # GET /rank only
            self.assertEqual(row, {"rank": rank, **info})
        for method in ("POST", "PUT"):
            with self.subTest(method=method):
                resp = c.request(method, "/stats")
                self.assert_json_error(resp, 405, "Method Not Allowed")
                self.assertEqual(resp.headers.get("Allow"), "GET, HEAD")
        # /clear drops the ranks, the keys and their leases.
        self.assertEqual(c.clear().status_code, 204)
        st = c.request("GET", "/stats").json()
        self.assertEqual((st["ranks"], st["keys"], st["leased_keys"]), ([], 0, 0))

    def test_metrics_counters_and_endpoint_labels(self):
        server, m = self.mirror("--eviction", "lru", "--read-lease-ms", "0")
        before = self.scrape(server)
        families = ("hf3fs_metad_expired_reservations_total", "hf3fs_metad_evicted_keys_total",
                    "hf3fs_metad_deleted_keys_total")
        for family in families:
            with self.subTest(family=family):
                self.assertEqual(before.types.get(family), "counter")
                self.assertEqual(before.get(family), 0)
        m.init(0, 4)
        ks = keys(6, "metrics")
        for k in ks:
            if k == ks[4]:
                self.assertEqual(m.delete(ks[:1]), 1)
                self.assertEqual(m.delete(ks[1:3] + ["unknown"]), 2)
            m.save(0, [k])
            gap()
        # k3 (page 3), k4 (0), k5 (1) bound; 3 new keys evict k3 and k4.
        self.assertEqual(m.client.post("/keys/delete", {"keys": "x"}).status_code, 400)
        self.assertEqual(m.pages(0, keys(3, "metrics/new")), [0, 2, 3])
        self.assertEqual(m.alive(ks), [False] * 5 + [True])
        st = m.stats()
        m.stats()
        after = self.scrape(server)
        self.assertEqual(after.get("hf3fs_metad_deleted_keys_total"), 3)
        self.assertEqual(after.get("hf3fs_metad_evicted_keys_total"), st["evicted_keys"])
        self.assertEqual(st["evicted_keys"], 2)
        self.assertEqual(after.get("hf3fs_metad_expired_reservations_total"), 0)
        want = {("delete", "200"): 2, ("delete", "400"): 1, ("stats", "200"): 2}
        for (endpoint, status), n in want.items():
            with self.subTest(endpoint=endpoint, status=status):
                self.assertEqual(after.get("hf3fs_metad_requests_total", endpoint=endpoint, status=status) -
                                 before.get("hf3fs_metad_requests_total", endpoint=endpoint, status=status), n)
                self.assertEqual(after.get("hf3fs_metad_request_duration_seconds_count", endpoint=endpoint) -
                                 before.get("hf3fs_metad_request_duration_seconds_count", endpoint=endpoint),
                                 sum(v for (e, _), v in want.items() if e == endpoint))
        self.assertEqual(after.get("hf3fs_metad_keys"), 1)
        self.assertEqual(after.get("hf3fs_metad_pages", rank="0", state="reserved"), 3)


# --- 6. access control -----------------------------------------------------------------

class AdminTokenTest(LifecycleCase):

    TOKEN = "us3r-Token_0123456789"
    ADMIN = "adm1n-Token_9876543210"

    def token_file(self, text):
        path = os.path.join(self.tmpdir(), "token")
        with open(path, "w") as f:
            f.write(text)
        return path

    def check(self, server, user_headers):
        s = requests.Session()
        self.addCleanup(s.close)
        base = server.base_url
        admin = {"Authorization": f"Bearer {self.ADMIN}"}

        def post(path, obj, headers):
            return s.post(base + path, data=compact(obj),
                          headers={"Content-Type": "application/json", **headers},
                          timeout=SOCKET_TIMEOUT_S)

        self.assertEqual(post("/rank/0/initialize", {"num_pages": 4}, user_headers).status_code, 200)
        k = key("guarded")
        self.assertEqual(post("/keys/batch_allocate", {"rank": 0, "keys": [k]}, user_headers).status_code, 200)
        self.assertEqual(post("/keys/confirm_write", {"rank": 0, "confirmations": [[k, 0]]},
                              user_headers).status_code, 204)
        for name, headers in (("none", {}), ("user", {"Authorization": f"Bearer {self.TOKEN}"}),
                              ("wrong", {"Authorization": "Bearer nope"})):
            with self.subTest(delete_with=name):
                r = post("/keys/delete", {"keys": [k]}, headers)
                self.assertEqual((r.status_code, r.content),
                                 (401, b'{"detail":"Missing or invalid bearer token"}'))
                self.assertEqual(r.headers.get("WWW-Authenticate"), "Bearer")
                ex = post("/keys/batch_exists", {"keys": [k]}, user_headers)
                self.assertEqual((ex.status_code, ex.content), (200, b'{"exists":[true]}'))
        r = post("/keys/delete", {"keys": [k]}, admin)
        self.assertEqual((r.status_code, r.content), (200, b'{"deleted":1}'))
        ex = post("/keys/batch_exists", {"keys": [k]}, user_headers)
        self.assertEqual((ex.status_code, ex.content), (200, b'{"exists":[false]}'))

    def test_delete_needs_the_admin_token(self):
        server = self.start(None, 2, "--auth-token-file", self.token_file(self.TOKEN + "\n"),
                            "--admin-token-file", self.token_file(self.ADMIN))
        self.check(server, {"Authorization": f"Bearer {self.TOKEN}"})

    def test_delete_needs_the_admin_token_without_an_auth_token(self):
        server = self.start(None, 2, "--admin-token-file", self.token_file(self.ADMIN))
        self.check(server, {})


# --- 7. reservation expiry -------------------------------------------------------------

@transport_independent
class ReservationTtlTest(LifecycleCase):

    def test_reservations_expire_after_the_ttl_recovered_ones_too(self):
        data = self.tmpdir()
        first = self.start(data, 2, "--reservation-ttl", "600")
        c = Client(first.base_url)
        self.addCleanup(c.close)
        for r in (0, 1):
            self.assertEqual(c.initialize(r, 8).status_code, 200)
        reserved = keys(2, "ttl/recovered")
        done = key("ttl/complete")
        self.assertEqual(c.batch_allocate(0, reserved + [done]).json()["results"],
                         [[reserved[0], 0], [reserved[1], 1], [done, 2]])
        self.assertEqual(c.confirm_write(0, [(done, 2)]).status_code, 204)
        self.assertEqual(c.batch_allocate(1, [done]).json()["results"], [[done, 0]])
        self.assertEqual(c.confirm_write(1, [(done, 0)]).status_code, 204)
        self.crash(first)
        c.close()
        # Restarted with a 1 s TTL: the recovered reservations get one from now; and a
        # server with --reservation-ttl 0 alongside, over the same wait.
        second = self.start(data, 3, "--reservation-ttl", "1")
        never = self.start(None, 1, "--reservation-ttl", "0")
        c2, cn = Client(second.base_url), Client(never.base_url)
        self.addCleanup(c2.close)
        self.addCleanup(cn.close)
        fresh = key("ttl/fresh")
        sent = time.monotonic()
        self.assertEqual(c2.batch_allocate(1, [fresh]).json()["results"], [[fresh, 1]])
        self.assertEqual(cn.initialize(0, 4).status_code, 200)
        self.assertEqual(cn.batch_allocate(0, [fresh]).json()["results"], [[fresh, 0]])
        self.assertEqual(c2.rank_info(0).json(), {"num_pages": 8, "free": 5, "reserved": 2, "bound": 1, "incomplete": 0})
        self.assertEqual(c2.rank_info(1).json(), {"num_pages": 8, "free": 6, "reserved": 1, "bound": 1, "incomplete": 0})
        while True:
            infos = [c2.rank_info(r).json() for r in (0, 1)]
            elapsed = time.monotonic() - sent
            if infos[1]["reserved"] == 0:
                self.assertGreaterEqual(elapsed, 0.99, "a reservation expired before its TTL")
            if infos[0]["reserved"] == infos[1]["reserved"] == 0:
                break
            self.assertLess(elapsed, 4.0, f"reservations still there: {infos}")
            time.sleep(0.05)
        self.assertEqual(infos, [{"num_pages": 8, "free": 7, "reserved": 0, "bound": 1, "incomplete": 0},
                                 {"num_pages": 8, "free": 7, "reserved": 0, "bound": 1, "incomplete": 0}])
        st = c2.request("GET", "/stats").json()
        self.assertEqual(st["expired_reservations"], 3)
        self.assertEqual(self.scrape(second).get("hf3fs_metad_expired_reservations_total"), 3)
        # An expired page cannot be confirmed; the complete key is untouched.
        self.assertEqual(c2.confirm_write(0, [(reserved[0], 0)]).status_code, 400)
        self.assertEqual(c2.batch_exists([done] + reserved).json(), {"exists": [True, False, False]})
        self.assertEqual(c2.get_locations(0, [done]).json(), {"locations": [2]})
        self.assertEqual(c2.batch_allocate(0, [reserved[1]]).json()["results"], [[reserved[1], 0]])
        # --reservation-ttl 0: nothing expired over the same wait.
        self.assertEqual(cn.rank_info(0).json(), {"num_pages": 4, "free": 3, "reserved": 1, "bound": 0, "incomplete": 0})
        self.assertEqual(cn.request("GET", "/stats").json()["expired_reservations"], 0)
        # The expiry was logged: after kill -9 the pages are still free.
        self.crash(second)
        third = self.start(data, 1)
        c3 = Client(third.base_url)
        self.addCleanup(c3.close)
        self.assertEqual(c3.rank_info(0).json(), {"num_pages": 8, "free": 6, "reserved": 1, "bound": 1, "incomplete": 0})
        self.assertEqual(c3.rank_info(1).json(), {"num_pages": 8, "free": 7, "reserved": 0, "bound": 1, "incomplete": 0})
        self.assertEqual(c3.batch_allocate(0, [reserved[1]]).json()["results"], [[reserved[1], 0]])
        self.assertEqual(c3.get_locations(1, [done]).json(), {"locations": [0]})
        self.stop(third)


# --- 8. durability ---------------------------------------------------------------------

class LifecycleDurabilityTest(LifecycleCase):

    ARGS = ("--eviction", "lru", "--read-lease-ms", "0")
    RANKS = (0, 1, -4)

    def test_delete_and_eviction_survive_kill9_threads_1_then_3(self):
        data = self.tmpdir()
        server, m = self.mirror(*self.ARGS, threads=1, data_dir=data)
        for r in self.RANKS:
            m.init(r, 8)
        a = keys(6, "dur/a")
        for k in a:
            m.save_everywhere(self.RANKS, [k])
            gap()
        self.assertEqual(m.delete([a[1], a[4], key("dur/unknown")]), 2)
        rsv = keys(2, "dur/reserved")
        self.assertEqual(m.pages(0, rsv), [1, 4])
        inc = key("dur/incomplete")
        m.save(0, [inc])
        m.save(1, [inc])
        # Rank 0: 4 complete keys, 2 reservations, 1 incomplete key, 1 free page.
        n = keys(3, "dur/new")
        self.assertEqual(m.pages(0, n), [0, 2, 7])  # evicts a0 and a2, the oldest
        m.confirm(0, list(zip(n, [0, 2, 7])))     # incomplete: rank 0 only
        self.assertEqual(m.alive(a), [False, False, False, True, False, True])
        # Confirmed on rank -4, reserved on rank 1, deleted: the reservation stays.
        half = key("dur/half")
        self.assertEqual(m.save(-4, [half]), [0])
        self.assertEqual(m.pages(1, [half]), [0])
        self.assertEqual(m.delete([half]), 1)
        self.assert_rank(m, 1, 8, 4, 1, 3)
        self.assert_rank(m, -4, 8, 6, 0, 2)
        before = m.stats()
        self.assertEqual((before["evicted_keys"], before["deleted_keys"]), (2, 3))
        m.verify()
        self.crash(server)

        server = self.start(data, 3, *self.ARGS, "--snapshot-log-bytes", "4096")
        m.attach_restarted(server)
        m.verify()
        self.assertEqual(m.alive(a), [False, False, False, True, False, True])
        self.assertEqual(m.stats(), {**before, "evicted_keys": 0, "deleted_keys": 0})
        # The freed pages are free: lowest first on rank -4 (a0, a1, a2, a4 had 0, 1, 2, 4).
        after = keys(3, "dur/after")
        self.assertEqual(m.pages(-4, after), [0, 1, 2])
        # More of the same with 3 cores: a delete, then an eviction.
        self.assertEqual(m.delete([a[3], inc]), 2)
        m.confirm(-4, list(zip(after, [0, 1, 2])))
        self.assertEqual(m.save(1, after), [1, 2, 3])
        # Rank 0: 2 reservations, 3 keys of rank 0 only, a5, 2 free pages: a5 (the only
        # complete key) is evicted for the third page.
        self.assertEqual(m.save(0, after), [3, 5, 6])
        self.assertEqual(m.alive(after + [a[5]]), [True, True, True, False])
        self.assert_rank(m, -4, 8, 5, 0, 3)
        self.assert_rank(m, 1, 8, 4, 1, 3)
        st = m.stats()
        self.assertEqual((st["evicted_keys"], st["deleted_keys"], st["keys"]), (1, 2, 6))
        m.verify()
        self.crash(server)

        server = self.start(data, 1, *self.ARGS)
        m.attach_restarted(server)
        m.verify()
        self.assertEqual(m.alive(a + [inc, half] + after), [False] * 8 + [True] * 3)
        self.assertEqual(m.pages(1, [half]), [0])
        self.assertEqual(m.stats()["keys"], 6)
        self.stop(server)

    def test_nothing_is_removed_for_read_lease_ms_after_recovery(self):
        data = self.tmpdir()
        server = self.start(data, 2, "--eviction", "lru", "--read-lease-ms", "0")
        c = Client(server.base_url)
        self.addCleanup(c.close)
        self.assertEqual(c.initialize(0, 4).status_code, 200)
        ks = keys(4, "floor")
        self.assertEqual(c.batch_allocate(0, ks).json()["results"], [[k, i] for i, k in enumerate(ks)])
        self.assertEqual(c.confirm_write(0, [(k, i) for i, k in enumerate(ks)]).status_code, 204)
        self.crash(server)
        c.close()
        server = self.start(data, 3, "--eviction", "lru", "--read-lease-ms", HUGE_LEASE_MS)
        c = Client(server.base_url)
        self.addCleanup(c.close)
        new = keys(2, "floor/new")
        r = c.post("/keys/delete", {"keys": ks[:1]})
        self.assertEqual((r.status_code, r.json()),
                         (503, {"detail": "Deletes are refused for --read-lease-ms after a "
                                          "restart: readers' leases were not kept"}))
        self.assertEqual(c.batch_allocate(0, new[:1]).json()["results"], [[new[0], -1]])
        self.assertEqual(c.batch_exists(ks).json(), {"exists": [True] * 4})
        st = c.request("GET", "/stats").json()
        self.assertEqual((st["evicted_keys"], st["deleted_keys"], st["keys"]), (0, 0, 4))
        self.crash(server)
        c.close()
        server = self.start(data, 1, "--eviction", "lru", "--read-lease-ms", "0")
        c = Client(server.base_url)
        self.addCleanup(c.close)
        self.assertEqual(c.post("/keys/delete", {"keys": ks[:1]}).content, b'{"deleted":1}')
        got = [p for _, p in c.batch_allocate(0, new).json()["results"]]
        alive = c.batch_exists(ks[1:]).json()["exists"]
        self.assertEqual(alive.count(False), 1, alive)
        self.assertEqual(got, [0, 1 + alive.index(False)])
        self.stop(server)


if __name__ == "__main__":
    unittest.main()
