# ctest: etcd
"""Replayed requests after failover (docs/replication.md, "Replayed requests after a
failover"; test plan T8), on a real etcd tuned as deploy/etcd (1 s lease). Two
replicated nodes: a leads, b is its sync standby; both run with the server's default
--release-quarantine-ms (5000; the other suites turn it off) and --read-lease-ms 1000
(so that deletes refused after a promotion resume quickly).

A client (vLLM's client retrying a POST at 0, 0.01, 0.61, 1.81 s, or a proxy that
redispatches) replays a request whose answer it lost, and after a failover the new
leader receives requests the old one already applied. The "dropped response" below: the
request is sent to a and applied (its answer is read and recorded, then treated as
lost), a is killed -9, b takes over, and the IDENTICAL body goes to b.

Checks:
  a. Every mutating endpoint, with one failover for all of them (first attempts on a,
     one kill, every replay on b). vLLM (rank 0):
     - initialize: the same num_pages replayed answers the same 200; GET /rank/0 is
       the same before and after.
     - batch_allocate of two bound (complete) keys and three new ones: the replay's
       answer is byte for byte the first one (the reservations reached b, so the same
       pages come back; the bound keys keep theirs), and confirming those pages works.
     - confirm_write confirmations: the replay answers 204 and every binding stays.
     - confirm_write pages_to_release, the hazard: pages P1 released on a (answer
       lost); on b another engine's writer allocates first and gets none of P1 (the
       quarantine restarted on promotion, and P1 are the lowest free pages, so without
       it they would be handed out); then the release is replayed and that writer's
       confirm still succeeds (204, its key at its page). Variant: pages P2 released on
       a, and another writer allocates on a BEFORE the kill (it gets none of P2); the
       release replayed on b leaves its reservation intact (its confirm on b succeeds).
     - /keys/delete: keys deleted on a (answer lost); on b another engine reserves one
       of those keys again, then the delete is replayed (503 while deletes are refused
       after the promotion, changing nothing; then 200 {"deleted":0}): the reservation
       is kept, and its confirm binds the key.
     - at the end: every binding at its page, no page bound to two keys, nothing
       reserved, and allocating as many keys as GET /rank/0 counts free gets exactly
       the pages nobody holds (no page leaked, none held twice).
     SGLang (docs/sglang-api.md, default tenant):
     - /{r}/initialize: the replay answers 204 and the pool's /stats row is unchanged.
     - /{r}/confirm_write confirmations: 204, bindings and the pool row unchanged.
     - /{r}/delete_keys: replayed after another writer reserved (and got) the deleted
       key's page: that writer's confirm binds its key at its page.
     - /{r}/reserve_and_allocate_page_indices: a bound key answers [true, its page]
       again; keys reserved by the first attempt get pages that no other key holds
       (the contract: an in-flight key is not a hit, so these may be new pages; the
       first ones then stay in flight until --reservation-ttl), and their confirm binds.
     - /{r}/clear of another pool: a writer that reserved between the clear and its
       replay is not given its page to anyone else while it writes; its confirm binds
       it at that page or not at all (the replay is a clear after its reserve), and
       the cleared key stays gone.
  b. Requests in flight at the kill, retried like vLLM's client: two writers (vLLM's
     retry schedule, every third task releasing its pages) run on a; an allocate, a
     release of an acknowledged reservation and a confirm of another are sent to a and
     a is killed before their answers are read; each is retried on b at +0.01, +0.6,
     +1.2 s, and the writers follow (their URL switches to b, as a forwarder's would).
     Whatever was applied: no writer got a 4xx or -1 for an acknowledged reservation,
     every acknowledged binding is on b at its page, no page is bound to two keys, no
     acknowledged binding uses a page released in flight (quarantine), acknowledged
     reservations are still confirmable, a fresh allocation avoids every acknowledged
     page, and when every call was answered, nothing is left reserved (a replayed
     allocate reserved no second set of pages).
  c. vLLM's /clear replayed: 204 again, still no rank; SGLang's pools are untouched (a
     bound key stays, an in-flight reservation still confirms); a rank initialised
     afterwards works.
  d. SGLang's pages_to_release replayed after another writer reserved the released page
     (on b after the kill, and on a before it): no page may go to two writers (SGLang's
     pools have the release quarantine too, replicated, and restarted on promotion).

Skipped where etcd is absent or where `hf3fs-metad --help` does not mention
--repl-listen. Run by scripts/test.sh's release stage (ctest e2e_python_replay_failover,
label etcd).
"""

import json
import sys
import threading
import time
import unittest

import requests

from failover_harness import (NUM_PAGES, REPL, RETRY_STATUSES, TAKEOVER_TIMEOUT_S,
                              VLLM_RETRY_SLEEPS, WHY, FailoverCase, Ledger, Writer,
                              check_ledger, ready, wait_until)
from metad_harness import RawConnection, compact, keys, raw_request

QUARANTINE_MS = 5000  # the server's default; metad_harness.server_args turns it off
READ_LEASE_MS = 1000  # deletes are refused this long after a promotion
RANK = 0              # vLLM's rank (the only worker rank: every key is complete at once)
VLLM_PAGES = 256
SG_PAGES = 16
HTTP_TIMEOUT_S = 5.0


class Sent:
    """A request as bytes, sent once, with the answer its sender then "lost"."""

    def __init__(self, path, obj):
        self.path = path
        self.body = compact(obj)
        self.status = None
        self.content = None


@unittest.skipUnless(REPL, WHY)
class ReplayAfterFailoverTest(FailoverCase):
    """Cases a-d of the docstring above."""

    def node(self, node_id):
        # FailoverCase's node with the release quarantine and a short read lease; a
        # later flag wins over metad_harness.server_args' --release-quarantine-ms 0.
        n = super().node(node_id)
        n.args += ["--release-quarantine-ms", str(QUARANTINE_MS),
                   "--read-lease-ms", str(READ_LEASE_MS)]
        return n

    def setUp(self):
        super().setUp()
        self.http = requests.Session()
        self.addCleanup(self.http.close)

    # --- wire helpers ------------------------------------------------------------------

    def post(self, url, path, obj):
        return self.http.post(url + path, data=compact(obj),
                              headers={"Content-Type": "application/json"},
                              timeout=HTTP_TIMEOUT_S)

    def first(self, url, path, obj, status):
        """The first attempt: sent to `url`, applied, answered `status`; the answer is
        kept for the comparison with the replay and otherwise treated as lost."""
        sent = Sent(path, obj)
        r = self.http.post(url + path, data=sent.body,
                           headers={"Content-Type": "application/json"}, timeout=HTTP_TIMEOUT_S)
        self.assertEqual(r.status_code, status, f"{path} {obj}: {r.text}")
        sent.status, sent.content = r.status_code, r.content
        return sent

    def replay(self, url, sent):
        """The same bytes again, to `url`."""
        return self.http.post(url + sent.path, data=sent.body,
                              headers={"Content-Type": "application/json"},
                              timeout=HTTP_TIMEOUT_S)

    def assert_same_answer(self, sent, r):
        self.assertEqual((r.status_code, r.content), (sent.status, sent.content),
                         f"replay of {sent.path} {sent.body[:200]!r}")

    def ok(self, r, status=200):
        self.assertEqual(r.status_code, status, f"{r.request.url}: {r.text}")
        return None if status == 204 else r.json()

    def fail_over(self, a, b):
        """kill -9 a, which leads with b in /sync; returns once b serves (/ready 200)."""
        self.assertTrue(self.cluster_keys.in_sync(b.id, a.id),
                        f"{b.id} is not in /sync before the kill: {self.cluster_keys.sync()}")
        t0 = time.monotonic()
        a.kill()
        self.assertTrue(wait_until(lambda: ready(b.base_url, 0.5), TAKEOVER_TIMEOUT_S, 0.005),
                        f"{b.id} did not serve within {TAKEOVER_TIMEOUT_S} s of the kill:\n"
                        f"{b.log(40)}")
        sys.stderr.write(f"  kill -9 {a.id}: {b.id} /ready 200 after "
                         f"{(time.monotonic() - t0) * 1000:.0f} ms\n")

    # vLLM
    def rank_info(self, url):
        return self.ok(self.http.get(url + f"/rank/{RANK}", timeout=HTTP_TIMEOUT_S))

    def allocate(self, url, ks):
        """batch_allocate of fresh or held keys: {key: page}, every page >= 0."""
        body = self.ok(self.post(url, "/keys/batch_allocate",
                                 {"rank": RANK, "keys": [[k, ""] for k in ks]}))
        pages = dict(body["results"])
        self.assertEqual(list(pages), list(dict.fromkeys(ks)))
        self.assertNotIn(-1, pages.values(), body)
        return pages

    def confirm(self, url, pairs):
        self.ok(self.post(url, "/keys/confirm_write",
                          {"rank": RANK, "confirmations": [[k, p] for k, p in pairs.items()],
                           "pages_to_release": []}), 204)

    def locations(self, url, ks):
        return self.ok(self.post(url, "/keys/get_locations",
                                 {"rank": RANK, "keys": list(ks)}))["locations"]

    def exists(self, url, ks):
        return self.ok(self.post(url, "/keys/batch_exists", {"keys": list(ks)}))["exists"]

    # SGLang
    def sg(self, url, rank, op, obj, status=200):
        return self.ok(self.post(url, f"/{rank}/{op}", dict(obj, namespace="kv")), status)

    def sg_reserve(self, url, rank, ks):
        """reserve_and_allocate_page_indices: [[already_exists, page], ...]."""
        answer = self.sg(url, rank, "reserve_and_allocate_page_indices",
                         {"keys": [[k, ""] for k in ks]})["indices"]
        self.assertEqual(len(answer), len(ks))
        return answer

    def sg_confirm(self, url, rank, pairs, release=()):
        self.sg(url, rank, "confirm_write",
                {"written_keys_to_confirm": [[k, p] for k, p in pairs.items()],
                 "pages_to_release": list(release)}, 204)

    def sg_exists(self, url, rank, ks):
        return self.sg(url, rank, "exists", {"keys": list(ks)})["exists"]

    def sg_pages(self, url, rank, ks):
        return self.sg(url, rank, "get_page_indices", {"keys": list(ks)})["indices"]

    def sg_pool(self, url, rank):
        """The pool's row of /stats (tenant "", namespace kv)."""
        stats = self.ok(self.http.get(url + "/stats", timeout=HTTP_TIMEOUT_S))
        rows = [p for p in stats.get("sglang", {}).get("pools", [])
                if (p["tenant"], p["rank"], p["namespace"]) == ("", rank, "kv")]
        self.assertEqual(len(rows), 1, stats)
        return rows[0]

    # --- a ----------------------------------------------------------------------------

    def test_a_every_mutating_request_replayed_after_failover(self):
        """Case a: first attempts of every mutating endpoint on a, one kill, replays on b."""
        a, b = self.pair()
        vllm = self.vllm_first_attempts(a.base_url)
        sglang = self.sglang_first_attempts(a.base_url)
        self.fail_over(a, b)
        held = self.vllm_replays(b.base_url, vllm)
        self.sglang_replays(b.base_url, sglang)
        self.vllm_delete_replayed(b.base_url, vllm, held)
        self.vllm_final_state(b.base_url, vllm, held)

    def vllm_first_attempts(self, url):
        """On the leader: one first attempt per vLLM endpoint, each applied and answered
        (answer recorded, then treated as lost), plus the answered calls they follow."""
        s = {}
        s["init"] = self.first(url, f"/rank/{RANK}/initialize",
                               {"num_pages": VLLM_PAGES, "role": "worker"}, 200)
        # C: one engine's save task; the answer of its confirm is lost.
        s["C"] = self.allocate(url, keys(4, "vllm-c"))
        s["confirm"] = self.first(url, "/keys/confirm_write", {
            "rank": RANK, "confirmations": [[k, p] for k, p in s["C"].items()],
            "pages_to_release": []}, 204)
        # A batch of two keys bound above and three new ones; its answer is lost.
        bound, new = list(s["C"])[:2], keys(3, "vllm-r")
        s["allocate"] = self.first(url, "/keys/batch_allocate",
                                   {"rank": RANK, "keys": [[k, ""] for k in bound + new]}, 200)
        results = dict(json.loads(s["allocate"].content)["results"])
        self.assertEqual({k: results[k] for k in bound}, {k: s["C"][k] for k in bound})
        s["R"] = {k: results[k] for k in new}
        self.assertNotIn(-1, s["R"].values())
        self.assertEqual(len(set(s["R"].values()) | set(s["C"].values())), 7, results)
        # H1: a write that failed; the answer of its release is lost (replayed on b after
        # another writer allocated there).
        s["P1"] = list(self.allocate(url, keys(2, "vllm-h1")).values())
        s["release1"] = self.first(url, "/keys/confirm_write", {
            "rank": RANK, "confirmations": [], "pages_to_release": s["P1"]}, 204)
        # H2: the same, and another engine's writer allocates on a right after it.
        s["P2"] = list(self.allocate(url, keys(2, "vllm-h2")).values())
        s["release2"] = self.first(url, "/keys/confirm_write", {
            "rank": RANK, "confirmations": [], "pages_to_release": s["P2"]}, 204)
        s["O2"] = self.allocate(url, keys(2, "vllm-o2"))
        self.assertFalse(set(s["O2"].values()) & set(s["P1"] + s["P2"]),
                         f"a page released on a went to another writer at once: {s}")
        # D: saved, then deleted; the answer of the delete is lost.
        s["D"] = self.allocate(url, keys(2, "vllm-d"))
        self.confirm(url, s["D"])
        s["delete"] = self.first(url, "/keys/delete", {"keys": list(s["D"])}, 200)
        self.assertEqual(json.loads(s["delete"].content), {"deleted": 2})
        s["rank"] = self.rank_info(url)
        self.assertEqual((s["rank"]["reserved"], s["rank"]["bound"]), (5, 4), s["rank"])
        return s

    def vllm_replays(self, url, s):
        """On the new leader: initialize, the releases (after another writer allocated),
        batch_allocate and confirm_write replayed. Returns {key: page} of every key bound
        afterwards."""
        self.assertEqual(self.rank_info(url), s["rank"], "b does not hold what a acknowledged")

        # initialize: the same answer, nothing changes.
        self.assert_same_answer(s["init"], self.replay(url, s["init"]))
        self.assertEqual(self.rank_info(url), s["rank"])

        # Another engine's writer allocates before the releases are replayed. Its pages
        # must not be released ones: the quarantine restarted on promotion. P1 + P2 are
        # the lowest free pages, so lowest-free-first would hand them out without it.
        released = set(s["P1"] + s["P2"])
        held = set(s["C"].values()) | set(s["R"].values()) | set(s["O2"].values())
        self.assertLess(min(released), min(set(range(VLLM_PAGES)) - released - held))
        o1 = self.allocate(url, keys(2, "vllm-o1"))
        self.assertFalse(set(o1.values()) & released,
                         f"b handed out pages released on a before the kill: {o1}, "
                         f"released {sorted(released)}")
        self.assertFalse(set(o1.values()) & held, o1)

        # The releases replayed: 204, and the other writers' reservations are intact.
        self.assert_same_answer(s["release1"], self.replay(url, s["release1"]))
        self.assert_same_answer(s["release2"], self.replay(url, s["release2"]))
        self.confirm(url, o1)         # would be a 400 had the replay freed its pages
        self.confirm(url, s["O2"])    # reserved on a before the kill
        self.assertEqual(self.locations(url, list(o1) + list(s["O2"])),
                         list(o1.values()) + list(s["O2"].values()))

        # batch_allocate replayed: the same pages for the reserved keys, the bound keys
        # keep theirs: byte for byte the first answer. Then its writer confirms.
        self.assert_same_answer(s["allocate"], self.replay(url, s["allocate"]))
        self.confirm(url, s["R"])

        # confirm_write replayed: a no-op 204, C's keys at their pages.
        self.assert_same_answer(s["confirm"], self.replay(url, s["confirm"]))
        self.assertEqual(self.locations(url, s["C"]), list(s["C"].values()))
        return {**s["C"], **s["R"], **o1, **s["O2"]}

    def vllm_delete_replayed(self, url, s, bound):
        """/keys/delete replayed after another engine reserved one of its keys again:
        the reservation survives (deletes skip reserved keys) and its confirm binds."""
        d0, d1 = list(s["D"])
        e0 = self.allocate(url, [d0])
        self.assertFalse(set(e0.values()) & set(bound.values()), e0)
        deadline = time.monotonic() + READ_LEASE_MS / 1000 + 5
        while True:
            r = self.replay(url, s["delete"])
            # Refused (503) for --read-lease-ms after the promotion: nothing changes.
            if r.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual((r.status_code, r.json()), (200, {"deleted": 0}), r.text)
        self.confirm(url, e0)
        self.assertEqual(self.exists(url, [d0, d1]), [True, False])
        bound.update(e0)

    def vllm_final_state(self, url, s, bound):
        """Every binding at its page, none shared, nothing reserved, and every other page
        free: allocating as many keys as are counted free gets exactly those pages."""
        result = check_ledger(url, {RANK: bound})
        self.assertEqual((result["checked"], result["lost"], result["moved"],
                          result["duplicate_pages"], result["errors"]),
                         (len(bound), 0, 0, 0, 0), result["details"])
        info = self.rank_info(url)
        self.assertEqual((info["num_pages"], info["bound"], info["reserved"]),
                         (VLLM_PAGES, len(bound), 0), info)
        fill = self.allocate(url, keys(info["free"], "vllm-fill"))
        self.assertEqual(sorted(fill.values()),
                         sorted(set(range(VLLM_PAGES)) - set(bound.values())))

    def sglang_first_attempts(self, url):
        """On the leader: one first attempt per SGLang endpoint (pool 0; clear on pool 1),
        each applied and answered, the answer then treated as lost."""
        s = {}
        s["init"] = self.first(url, "/0/initialize",
                               {"num_pages": SG_PAGES, "namespace": "kv"}, 204)
        # C: saved; the answer of its confirm is lost.
        c = keys(2, "sg-c")
        answer = self.sg_reserve(url, 0, c)
        self.assertEqual([e for e, _ in answer], [False, False])
        s["C"] = {k: p for k, (_, p) in zip(c, answer)}
        s["confirm"] = self.first(url, "/0/confirm_write", {
            "written_keys_to_confirm": [[k, p] for k, p in s["C"].items()],
            "pages_to_release": [], "namespace": "kv"}, 204)
        # A reserve of a bound key and two new ones; its answer is lost.
        s["hit"], s["R"] = c[0], keys(2, "sg-r")
        s["reserve"] = self.first(url, "/0/reserve_and_allocate_page_indices", {
            "keys": [[k, ""] for k in [s["hit"]] + s["R"]], "namespace": "kv"}, 200)
        first = json.loads(s["reserve"].content)["indices"]
        self.assertEqual(first[0], [True, s["C"][s["hit"]]])
        s["R_first"] = [p for _, p in first[1:]]
        # D: saved, then deleted; the answer of the delete is lost.
        d = keys(1, "sg-d")
        (_, page), = self.sg_reserve(url, 0, d)
        self.sg_confirm(url, 0, {d[0]: page})
        s["D"] = d
        s["delete"] = self.first(url, "/0/delete_keys", {"keys": d, "namespace": "kv"}, 204)
        # Pool 1: a key saved, then the pool cleared; the answer of the clear is lost.
        self.sg(url, 1, "initialize", {"num_pages": SG_PAGES}, 204)
        s["S1"] = keys(1, "sg-s1")
        (_, page), = self.sg_reserve(url, 1, s["S1"])
        self.sg_confirm(url, 1, {s["S1"][0]: page})
        s["clear"] = self.first(url, "/1/clear", {"namespace": "kv"}, 204)
        s["pool0"], s["pool1"] = self.sg_pool(url, 0), self.sg_pool(url, 1)
        return s

    def sglang_replays(self, url, s):
        """On the new leader: each SGLang first attempt replayed (see the docstring)."""
        self.assertEqual((self.sg_pool(url, 0), self.sg_pool(url, 1)), (s["pool0"], s["pool1"]),
                         "b does not hold what a acknowledged")

        # initialize: 204 again, the pool unchanged.
        self.assert_same_answer(s["init"], self.replay(url, s["init"]))
        self.assertEqual(self.sg_pool(url, 0), s["pool0"])

        # confirm_write: 204 again, the bindings and the pool unchanged.
        self.assert_same_answer(s["confirm"], self.replay(url, s["confirm"]))
        self.assertEqual(self.sg_pages(url, 0, s["C"]), list(s["C"].values()))
        self.assertEqual(self.sg_pool(url, 0), s["pool0"])

        # delete_keys replayed after another writer reserved: that writer's page stays its.
        x = keys(1, "sg-x")
        (exists, px), = self.sg_reserve(url, 0, x)
        self.assertEqual(exists, False)
        self.assertGreaterEqual(px, 0)
        self.assert_same_answer(s["delete"], self.replay(url, s["delete"]))
        self.sg_confirm(url, 0, {x[0]: px})
        self.assertEqual(self.sg_exists(url, 0, x + s["D"]), [True, False])
        self.assertEqual(self.sg_pages(url, 0, x), [px])

        # reserve replayed: the bound key answers [true, its page] again; the keys the
        # first attempt reserved get pages no other key holds.
        r = self.replay(url, s["reserve"])
        answer = self.ok(r)["indices"]
        self.assertEqual(answer[0], [True, s["C"][s["hit"]]])
        self.assertEqual([e for e, _ in answer[1:]], [False, False], answer)
        replayed = {k: p for k, (_, p) in zip(s["R"], answer[1:])}
        others = set(s["C"].values()) | {px}
        self.assertTrue(all(p >= 0 for p in replayed.values()), answer)
        self.assertEqual(len(set(replayed.values())), 2, answer)
        self.assertFalse(set(replayed.values()) & others,
                         f"a replayed reserve handed out a page another key holds: {answer}")
        self.sg_confirm(url, 0, replayed)
        self.assertEqual(self.sg_pages(url, 0, s["R"]), list(replayed.values()))

        # The pool: five keys bound at five distinct pages, every page accounted for.
        bound = {**s["C"], x[0]: px, **replayed}
        pages = self.sg_pages(url, 0, list(bound))
        self.assertEqual(pages, list(bound.values()))
        self.assertEqual(len(set(pages)), len(pages))
        pool = self.sg_pool(url, 0)
        self.assertEqual(pool["bound"], len(bound), pool)
        self.assertEqual(pool["free"] + pool["in_flight"] + pool["bound"], SG_PAGES, pool)
        sys.stderr.write(f"  SGLang reserve replayed: first answer pages {s['R_first']}, "
                         f"replay {list(replayed.values())}; pool 0 then {pool}\n")

        # clear replayed (pool 1) after another writer reserved: its page goes to nobody
        # else while it writes; its confirm binds it there or, the replay being a clear
        # after its reserve, not at all; the key cleared before stays gone.
        s2 = keys(1, "sg-s2")
        (_, p2), = self.sg_reserve(url, 1, s2)
        self.assertGreaterEqual(p2, 0)
        self.assert_same_answer(s["clear"], self.replay(url, s["clear"]))
        s3 = keys(1, "sg-s3")
        (_, p3), = self.sg_reserve(url, 1, s3)
        self.assertGreaterEqual(p3, 0)
        self.assertNotEqual(p3, p2, "a replayed clear freed another writer's in-flight page")
        self.sg_confirm(url, 1, {s2[0]: p2})
        self.sg_confirm(url, 1, {s3[0]: p3})
        self.assertEqual(self.sg_exists(url, 1, s["S1"] + s3), [False, True])
        self.assertIn(self.sg_pages(url, 1, s2 + s3), ([p2, p3], [None, p3]))

    # --- b ----------------------------------------------------------------------------

    def test_b_requests_in_flight_at_the_kill_retried_on_the_new_leader(self):
        """Case b: calls in flight at the kill, retried on b on vLLM's schedule."""
        a, b = self.pair()
        self.ok(self.post(a.base_url, f"/rank/{RANK}/initialize",
                          {"num_pages": NUM_PAGES, "role": "worker"}))
        ledger = Ledger()
        writers = [Writer(a.base_url, RANK, ledger, f"inflight-{i}", retry=True,
                          release_every=3) for i in range(2)]
        for w in writers:
            w.start()
            self.addCleanup(w.join, 10)
            self.addCleanup(w.stop)
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= 200, 30),
                        f"the writers made no progress: {[w.failures for w in writers]}")

        # Acknowledged reservations whose release / confirm will be in flight.
        rel = self.allocate(a.base_url, keys(8, "inflight-release"))
        con = self.allocate(a.base_url, keys(8, "inflight-confirm"))
        for pages in (rel, con):
            ledger.on_allocate(RANK, pages.items())
        calls = {
            "allocate": Sent("/keys/batch_allocate", {
                "rank": RANK, "keys": [[k, ""] for k in keys(8, "inflight-allocate")]}),
            "release": Sent("/keys/confirm_write", {
                "rank": RANK, "confirmations": [], "pages_to_release": list(rel.values())}),
            "confirm": Sent("/keys/confirm_write", {
                "rank": RANK, "confirmations": [[k, p] for k, p in con.items()],
                "pages_to_release": []}),
        }
        self.assertTrue(self.cluster_keys.in_sync(b.id, a.id), self.cluster_keys.sync())
        conns = {}
        for name, sent in calls.items():
            conns[name] = RawConnection(a.port)
            self.addCleanup(conns[name].close)
            conns[name].send(raw_request("POST", sent.path, sent.body))
        t0 = time.monotonic()
        a.kill()
        for w in writers:
            w.url = b.base_url  # a forwarder now routes to b

        outcomes = {}
        threads = [threading.Thread(target=self.vllm_client_call,
                                    args=(conns[name], b.base_url, sent, outcomes, name))
                   for name, sent in calls.items()]
        for t in threads:
            t.start()
        self.assertTrue(wait_until(lambda: ready(b.base_url, 0.5), TAKEOVER_TIMEOUT_S, 0.005),
                        f"{b.id} did not serve within {TAKEOVER_TIMEOUT_S} s of the kill:\n"
                        f"{b.log(40)}")
        ready_ms = (time.monotonic() - t0) * 1000
        for t in threads:
            t.join(15)
            self.assertFalse(t.is_alive())

        # What the client saw goes into the ledger.
        status, answer = outcomes["allocate"][:2]
        if status == 200:
            got = dict(json.loads(answer)["results"])
            self.assertNotIn(-1, got.values(), answer)
            ledger.on_allocate(RANK, got.items())
            self.confirm(b.base_url, got)
            ledger.on_confirm(RANK, got.items())
        elif status is not None:
            ledger.problem(f"in-flight allocate answered {status}: {answer[:200]!r}")
        status, answer = outcomes["release"][:2]
        if status == 204:
            ledger.on_confirm(RANK, [], list(rel))
        elif status is None:
            ledger.on_unknown_release(RANK, list(rel))
        else:
            ledger.problem(f"in-flight release answered {status}: {answer[:200]!r}")
        status, answer = outcomes["confirm"][:2]
        if status is None:
            # The client gave up; its reservation is still acknowledged: a later confirm
            # (applied before or not) must succeed.
            status = self.post(b.base_url, "/keys/confirm_write", json.loads(
                calls["confirm"].body)).status_code
        if status == 204:
            ledger.on_confirm(RANK, con.items())
        else:
            ledger.problem(f"in-flight confirm answered {status}: {answer[:200]!r}")

        # The writers go on against b for a while, then stop.
        before = ledger.bound_count()
        self.assertTrue(wait_until(lambda: ledger.bound_count() >= before + 200, 15),
                        f"the writers made no progress on b: {[w.failures for w in writers]}")
        for w in writers:
            w.stop()
        for w in writers:
            w.join(10)
            self.assertFalse(w.is_alive())
        failures = [f for w in writers for f in w.failures]
        # Writers' calls with a lost connection among their attempts (informational).
        across = [(path, attempts) for w in writers
                  for _, _, path, attempts in list(w.slow_calls)
                  if any(not isinstance(o, int) for _, _, o in attempts)]
        sys.stderr.write(
            "  in flight at the kill: " + ", ".join(
                f"{name} {o[0]} after {len(o[2])} attempt(s) {o[2]}"
                for name, o in outcomes.items()) +
            f"; b ready {ready_ms:.0f} ms after the kill; writers: "
            f"{sum(w.tasks for w in writers)} tasks, {len(across)} calls retried after a "
            f"lost connection, {len(failures)} gave up; {ledger.bound_count()} keys acked\n")

        self.assertEqual(ledger.problems, [])
        # No acknowledged binding uses a page whose release was in flight: whether the
        # release was applied on a, on b, or both, those pages were quarantined.
        bound, _ = ledger.snapshot()
        self.assertFalse(set(bound[RANK].values()) & set(rel.values()),
                         "a page released in flight went to another key")
        self.assert_ledger(b, ledger)
        # Every call answered: no reservation may be left over (a replayed allocate
        # whose first attempt was applied must have answered the same pages).
        if not failures and all(o[0] is not None for o in outcomes.values()):
            info = self.rank_info(b.base_url)
            self.assertEqual(info["reserved"], 0, info)

    def vllm_client_call(self, conn, retry_url, sent, outcomes, name):
        """One call of vLLM's client whose first attempt is on `conn` (already sent):
        its answer if one comes, else retries of the same bytes at retry_url after 0.01,
        0.6 and 1.2 s while they fail or answer 5xx. outcomes[name] = (status or None,
        body, attempts)."""
        attempts = []
        try:
            status, _, body = conn.read_response()
            attempts.append(f"a:{status}")
            if status not in RETRY_STATUSES:
                outcomes[name] = (status, body, attempts)
                return
        except (ConnectionError, OSError) as e:
            attempts.append(f"a:{type(e).__name__}")
        session = requests.Session()
        try:
            for pause in VLLM_RETRY_SLEEPS:
                time.sleep(pause)
                try:
                    r = session.post(retry_url + sent.path, data=sent.body,
                                     headers={"Content-Type": "application/json"},
                                     timeout=HTTP_TIMEOUT_S)
                except requests.RequestException as e:
                    attempts.append(f"b:{type(e).__name__}")
                    continue
                attempts.append(f"b:{r.status_code}")
                if r.status_code not in RETRY_STATUSES:
                    outcomes[name] = (r.status_code, r.content, attempts)
                    return
        finally:
            session.close()
        outcomes[name] = (None, b"", attempts)

    # --- c ----------------------------------------------------------------------------

    def test_c_a_replayed_clear_drops_nothing_more(self):
        """Case c: vLLM's /clear applied on a, replayed on b."""
        a, b = self.pair()
        url = a.base_url
        self.ok(self.post(url, f"/rank/{RANK}/initialize", {"num_pages": 16, "role": "worker"}))
        self.confirm(url, self.allocate(url, keys(2, "clear-k")))
        self.sg(url, 0, "initialize", {"num_pages": SG_PAGES}, 204)
        s0, s1 = keys(2, "clear-s")
        (_, p0), (_, p1) = self.sg_reserve(url, 0, [s0, s1])
        self.sg_confirm(url, 0, {s0: p0})  # s1 stays in flight
        clear = self.first(url, "/clear", {}, 204)
        self.assertEqual(self.http.get(url + f"/rank/{RANK}").status_code, 404)
        pool = self.sg_pool(url, 0)

        self.fail_over(a, b)
        url = b.base_url
        self.assertEqual(self.http.get(url + f"/rank/{RANK}").status_code, 404)
        self.assert_same_answer(clear, self.replay(url, clear))
        stats = self.ok(self.http.get(url + "/stats"))
        self.assertEqual((stats["ranks"], stats["keys"], stats["pages_total"]), ([], 0, 0), stats)
        # vLLM's /clear leaves SGLang's pools: the bound key stays, the in-flight one binds.
        self.assertEqual(self.sg_pool(url, 0), pool)
        self.sg_confirm(url, 0, {s1: p1})
        self.assertEqual(self.sg_pages(url, 0, [s0, s1]), [p0, p1])
        # A worker that initialises afterwards saves normally.
        self.ok(self.post(url, f"/rank/{RANK}/initialize", {"num_pages": 16, "role": "worker"}))
        saved = self.allocate(url, keys(2, "clear-after"))
        self.confirm(url, saved)
        self.assertEqual(self.locations(url, saved), list(saved.values()))

    # --- d ----------------------------------------------------------------------------

    def test_d_sglang_replayed_release_frees_no_other_writers_page(self):
        """Case d: SGLang's pages_to_release replayed after another writer reserved."""
        a, b = self.pair()
        url = a.base_url
        # Pool 0: released on a, the other writer reserves on b after the kill.
        # Pool 2: released on a, the other writer reserves on a before the kill.
        for rank in (0, 2):
            self.sg(url, rank, "initialize", {"num_pages": SG_PAGES}, 204)
        released, releases = {}, {}
        for rank in (0, 2):
            (_, page), = self.sg_reserve(url, rank, keys(1, f"sg-h{rank}"))
            released[rank] = page
            releases[rank] = self.first(url, f"/{rank}/confirm_write", {
                "written_keys_to_confirm": [], "pages_to_release": [page],
                "namespace": "kv"}, 204)
        writer = {2: {k: p for k, (_, p) in zip(keys(1, "sg-o2"),
                                                  self.sg_reserve(url, 2, keys(1, "sg-o2")))}}
        self.fail_over(a, b)
        url = b.base_url
        writer[0] = {k: p for k, (_, p) in zip(keys(1, "sg-o0"),
                                                 self.sg_reserve(url, 0, keys(1, "sg-o0")))}
        for rank in (0, 2):
            self.assert_same_answer(releases[rank], self.replay(url, releases[rank]))
            third = keys(1, f"sg-t{rank}")
            (_, t), = self.sg_reserve(url, rank, third)
            self.assertNotIn(t, writer[rank].values(),
                             f"pool {rank}: page {t} reserved for two writers at once "
                             f"(released {released[rank]}, other writer {writer[rank]})")
            self.sg_confirm(url, rank, writer[rank])
            self.sg_confirm(url, rank, {third[0]: t})
            self.assertEqual(self.sg_pages(url, rank, list(writer[rank]) + third),
                             list(writer[rank].values()) + [t])


if __name__ == "__main__":
    unittest.main()
