"""End-to-end: the call sequences of vLLM's HF3FS KV connector against hf3fs-metad.

Run: cd tests/e2e && METAD_BIN=... METAD_IO=uring|epoll /usr/bin/python3 -m unittest -v
"""

import hashlib
import http.client
import json
import threading
import time
import unittest

from metad_harness import (INT64_MAX, INT64_MIN, Client, MetadServer, MetadTestCase,
                           RawConnection, compact, key, keys, raw_request, transport_independent)

SCHEDULER_OK = {"message": "Scheduler role does not require initialization"}


class InitializeTest(MetadTestCase):

    def test_scheduler_init_is_exact_and_changes_nothing(self):
        r = self.client.initialize(0, 0, role="scheduler")
        self.assert_body(r, 200, SCHEDULER_OK)
        self.assertEqual(r.content,
                         b'{"message":"Scheduler role does not require initialization"}')
        self.assert_error(self.client.rank_info(0), 404, "Rank 0 not initialized")
        # The scheduler does not count as a worker rank for tp_world_size.
        self.init_worker(0, 4)
        self.save(0, [key(1)])
        self.assertEqual(self.exists([key(1)]), [True])

    def test_tensor_parallel_worker_inits(self):
        for tp, num_pages in ((2, 1000), (8, 123456)):
            with self.subTest(tp=tp):
                self.reset()
                self.assert_body(self.client.initialize(0, 0, role="scheduler"), 200,
                                 SCHEDULER_OK)
                for r in range(tp):
                    self.init_worker(r, num_pages)
                for r in range(tp):
                    self.assert_rank(r, num_pages, num_pages, 0, 0)
                self.assert_error(self.client.rank_info(tp), 404,
                                  f"Rank {tp} not initialized")

    def test_reinitialize_same_size_is_a_no_op(self):
        self.init_worker(1, 16)
        self.save(1, keys(3))
        self.init_worker(1, 16)
        self.assert_rank(1, 16, 13, 0, 3)
        self.assertEqual(self.locations(1, keys(3)), [0, 1, 2])

    def test_reinitialize_larger_grows_the_pool(self):
        self.init_worker(1, 4)
        self.save(1, keys(3))
        self.init_worker(1, 10)
        self.assert_rank(1, 10, 7, 0, 3)
        self.assertEqual(self.locations(1, keys(3)), [0, 1, 2])
        # 8 new keys, 7 free pages: all or nothing.
        self.assertEqual(self.allocate(1, keys(8, "new")), [-1] * 8)
        self.assert_rank(1, 10, 7, 0, 3)

    def test_reinitialize_larger_then_allocate_lowest_first(self):
        self.init_worker(1, 4)
        self.save(1, keys(3))
        self.init_worker(1, 10)
        self.assertEqual(self.allocate(1, keys(7, "new")), [3, 4, 5, 6, 7, 8, 9])
        self.assert_rank(1, 10, 0, 7, 3)

    def test_reinitialize_smaller_shrinks_the_pool(self):
        # An unmodified vLLM worker raises on anything but 200: a lowered
        # hf3fs_file_size must not stop it from starting. Its file is authoritative:
        # keys bound past the new end lose their page on this rank.
        self.init_worker(1, 8)
        self.init_worker(2, 8)  # tp_world_size 2: a key is complete on both ranks
        ks = keys(6)
        self.save(1, ks)
        self.save(2, ks)
        self.assertEqual(self.allocate(1, [key("open")]), [6])  # a reservation past the end too
        r = self.client.initialize(1, 4)
        self.assert_body(r, 200, {"message": "Rank 1 initialized with 4 pages"})
        self.assert_rank(1, 4, 0, 0, 4, 0)
        self.assertEqual(self.exists(ks), [True] * 4 + [False] * 2)
        self.assertEqual(self.locations(2, ks), [0, 1, 2, 3, None, None])
        self.assert_rank(2, 8, 2, 0, 6, 2)  # the lost keys are incomplete on rank 2
        self.init_worker(1, 8)  # grown back: the pages are new and free
        self.assertEqual(self.allocate(1, ks[4:] + [key("open")]), [4, 5, 6])

    def test_role_defaults_to_worker(self):
        r = self.client.post("/rank/5/initialize", {"num_pages": 3})
        self.assert_body(r, 200, {"message": "Rank 5 initialized with 3 pages"})
        self.assert_rank(5, 3, 3, 0, 0)


class SaveLoadFlowTest(MetadTestCase):
    """batch_allocate → confirm_write → batch_exists / get_locations, per TP rank."""

    def run_tp_flow(self, tp, num_pages, batch):
        for r in range(tp):
            self.init_worker(r, num_pages)
        ks = keys(batch, f"tp{tp}")
        unknown = key("never-saved")
        for r in range(tp):
            pages = self.allocate(r, ks)
            self.assertEqual(pages, list(range(batch)), f"rank {r}")
            self.assert_rank(r, num_pages, num_pages - batch, batch, 0)
            # Reserved but unconfirmed: not visible anywhere.
            self.assertEqual(self.exists(ks), [False] * batch)
            self.assertEqual(self.locations(r, ks), [None] * batch)
            self.confirm(r, list(zip(ks, pages)))
            self.assert_rank(r, num_pages, num_pages - batch, 0, batch)
            complete = r == tp - 1
            self.assertEqual(self.exists(ks + [unknown]), [complete] * batch + [False])
            want = list(range(batch)) if complete else [None] * batch
            for q in range(tp):
                self.assertEqual(self.locations(q, ks + [unknown]), want + [None],
                                 f"after rank {r} confirmed, locations on rank {q}")

    def test_tp1_flow(self):
        self.run_tp_flow(1, 64, 16)

    def test_tp2_flow(self):
        self.run_tp_flow(2, 256, 128)

    def test_tp8_flow(self):
        self.run_tp_flow(8, 1024, 32)

    def test_incomplete_key_is_invisible_until_all_ranks_confirm(self):
        for r in range(2):
            self.init_worker(r, 8)
        k = key(1)
        self.assertEqual(self.allocate(0, [k]), [0])
        self.confirm(0, [(k, 0)])
        self.assertEqual(self.exists([k]), [False])
        self.assertEqual(self.locations(0, [k]), [None])
        self.assertEqual(self.locations(1, [k]), [None])
        # Confirmed but incomplete: the rank keeps the same page for the key.
        self.assertEqual(self.allocate(0, [k]), [0])
        self.assert_rank(0, 8, 7, 0, 1, incomplete=1)  # its page holds an incomplete key
        self.assertEqual(self.allocate(1, [k]), [0])
        self.confirm(1, [(k, 0)])
        self.assertEqual(self.exists([k, k]), [True, True])
        self.assertEqual(self.locations(0, [k]), [0])
        self.assertEqual(self.locations(1, [k]), [0])
        self.assert_rank(0, 8, 7, 0, 1, incomplete=0)
        self.assert_rank(1, 8, 7, 0, 1, incomplete=0)

    def test_tp_world_size_is_fixed_at_first_confirmation(self):
        self.init_worker(0, 8)
        self.init_worker(1, 8)
        early = key("early")
        self.save(0, [early])
        self.save(1, [early])
        self.assertEqual(self.exists([early]), [True])
        # A third rank joins: the early key stays complete, a new key needs 3 ranks.
        self.init_worker(2, 8)
        self.assertEqual(self.exists([early]), [True])
        late = key("late")
        self.save(0, [late])
        self.save(1, [late])
        self.assertEqual(self.exists([early, late]), [True, False])
        self.save(2, [late])
        self.assertEqual(self.exists([early, late]), [True, True])

    def test_key_confirmed_by_more_ranks_than_expected_stays_complete(self):
        # Fix: completeness is confirmations >= tp_world_size (the reference uses ==).
        self.init_worker(0, 4)
        k = key(7)
        self.save(0, [k])  # tp_world_size 1
        self.assertEqual(self.exists([k]), [True])
        self.init_worker(1, 4)
        self.save(1, [k])
        self.assertEqual(self.exists([k]), [True])
        self.assertEqual(self.locations(0, [k]), [0])
        self.assertEqual(self.locations(1, [k]), [0])

    def test_locations_are_per_rank_pages(self):
        self.init_worker(0, 8)
        self.init_worker(1, 8)
        # Rank 1 already holds pages 0..2 for other keys, so the shared key lands on a
        # different page per rank.
        self.assertEqual(self.allocate(1, keys(3, "filler")), [0, 1, 2])
        k = key("shared")
        self.assertEqual(self.save(0, [k]), [0])
        self.assertEqual(self.save(1, [k]), [3])
        self.assertEqual(self.locations(0, [k]), [0])
        self.assertEqual(self.locations(1, [k]), [3])

    def test_duplicate_confirmation_in_one_request_counts_once(self):
        for r in range(2):
            self.init_worker(r, 8)
        k = key("dup")
        self.assertEqual(self.allocate(0, [k]), [0])
        self.confirm(0, [(k, 0), (k, 0)])
        self.assert_rank(0, 8, 7, 0, 1)
        self.assertEqual(self.exists([k]), [False], "one rank confirmed, tp_world_size 2")
        self.save(1, [k])
        self.assertEqual(self.exists([k]), [True])

    def test_repeated_confirm_counts_once(self):
        for r in range(2):
            self.init_worker(r, 8)
        k = key("again")
        self.assertEqual(self.allocate(0, [k]), [0])
        for _ in range(3):
            self.confirm(0, [(k, 0)])
        self.assertEqual(self.exists([k]), [False], "one rank confirmed, tp_world_size 2")
        self.assertEqual(self.locations(0, [k]), [None])
        self.save(1, [k])
        self.assertEqual(self.exists([k]), [True])

    def test_complete_key_has_no_location_on_a_rank_that_did_not_confirm_it(self):
        self.init_worker(0, 8)
        k = key("solo")
        self.save(0, [k])  # tp_world_size 1: complete
        self.init_worker(1, 8)
        self.assertEqual(self.exists([k]), [True])
        self.assertEqual(self.locations(1, [k]), [None])
        # Not a hit on rank 1: a new page is reserved there.
        self.assertEqual(self.allocate(1, [key("other"), k]), [0, 1])
        self.assert_rank(1, 8, 6, 2, 0)

    def test_bare_string_keys_are_accepted(self):
        self.init_worker(0, 8)
        ks = keys(3)
        r = self.client.post("/keys/batch_allocate", {"rank": 0, "keys": ks})
        self.assert_body(r, 200, {"rank": 0, "results": [[k, i] for i, k in enumerate(ks)]})
        r = self.client.post("/keys/batch_allocate",
                             {"rank": 0, "keys": [ks[0], [ks[1], ""], ks[2]]})
        self.assert_body(r, 200, {"rank": 0, "results": [[k, i] for i, k in enumerate(ks)]})

    def test_sha256_keys(self):
        self.init_worker(0, 8)
        ks = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(4)]
        self.assertEqual(self.save(0, ks), [0, 1, 2, 3])
        self.assertEqual(self.exists(ks), [True] * 4)
        self.assertEqual(self.locations(0, ks), [0, 1, 2, 3])

    def test_response_bodies_are_byte_exact(self):
        self.init_worker(3, 4)
        k0, k1 = key(0), key(1)
        r = self.client.batch_allocate(3, [k0, k1])
        self.assertEqual(r.content, f'{{"rank":3,"results":[["{k0}",0],["{k1}",1]]}}'.encode())
        r = self.client.confirm_write(3, [(k0, 0)], [1])
        self.assert_ok(r, 204)
        r = self.client.batch_exists([k0, k1])
        self.assertEqual(r.content, b'{"exists":[true,false]}')
        r = self.client.get_locations(3, [k0, k1])
        self.assertEqual(r.content, b'{"locations":[0,null]}')
        r = self.client.rank_info(3)
        self.assertEqual(r.content, b'{"num_pages":4,"free":3,"reserved":0,"bound":1,"incomplete":0}')

    def test_batch_exists_needs_no_rank(self):
        self.assertEqual(self.exists(keys(5)), [False] * 5)
        self.assertEqual(self.exists([]), [])

    def test_clear_drops_everything(self):
        self.init_worker(0, 4)
        self.save(0, keys(2))
        self.reset()
        self.assert_error(self.client.rank_info(0), 404, "Rank 0 not initialized")
        self.assertEqual(self.exists(keys(2)), [False, False])
        self.init_worker(0, 4)
        self.assertEqual(self.allocate(0, keys(2)), [0, 1])
        self.assertEqual(self.locations(0, keys(2)), [None, None])


class WriteFailureTest(MetadTestCase):
    """The connector's failure path: no confirmations, all the task's pages released."""

    def test_release_frees_reserved_pages(self):
        self.init_worker(0, 8)
        ks = keys(4)
        self.assertEqual(self.allocate(0, ks), [0, 1, 2, 3])
        self.confirm(0, [], pages_to_release=[0, 1, 2, 3])
        self.assert_rank(0, 8, 8, 0, 0)
        self.assertEqual(self.exists(ks), [False] * 4)
        self.assertEqual(self.locations(0, ks), [None] * 4)
        # The reservations are gone: other keys get the lowest pages again.
        self.assertEqual(self.allocate(0, keys(2, "other")), [0, 1])

    def test_release_of_cache_hits_does_not_free_them(self):
        self.init_worker(0, 8)
        hits, new = keys(2, "hit"), keys(2, "new")
        self.assertEqual(self.save(0, hits), [0, 1])
        self.assertEqual(self.allocate(0, hits + new), [0, 1, 2, 3])
        self.assert_rank(0, 8, 4, 2, 2)
        self.confirm(0, [], pages_to_release=[0, 1, 2, 3])
        self.assert_rank(0, 8, 6, 0, 2)
        self.assertEqual(self.exists(hits + new), [True, True, False, False])
        self.assertEqual(self.locations(0, hits + new), [0, 1, None, None])
        # Pages 0 and 1 still hold live data: a new key must not get them.
        self.assertEqual(self.allocate(0, [key("later")]), [2])

    def test_confirm_and_release_of_the_same_page_keeps_it_bound(self):
        # Confirmations are applied before releases; a bound page is never freed.
        self.init_worker(0, 4)
        k = key(0)
        self.assertEqual(self.allocate(0, [k]), [0])
        self.confirm(0, [(k, 0)], pages_to_release=[0])
        self.assert_rank(0, 4, 3, 0, 1)
        self.assertEqual(self.locations(0, [k]), [0])
        self.assertEqual(self.allocate(0, [key(1)]), [1])

    def test_confirm_after_release_is_rejected(self):
        self.init_worker(0, 4)
        k = key(0)
        self.assertEqual(self.allocate(0, [k]), [0])
        self.confirm(0, [], pages_to_release=[0])
        self.assert_error(self.client.confirm_write(0, [(k, 0)]), 400)
        self.assert_rank(0, 4, 4, 0, 0)
        self.assertEqual(self.exists([k]), [False])

    def test_release_of_free_page_is_a_no_op(self):
        self.init_worker(0, 4)
        self.confirm(0, [], pages_to_release=[0, 3, 3])
        self.assert_rank(0, 4, 4, 0, 0)
        self.assertEqual(self.allocate(0, [key(0)]), [0])

    def test_confirm_and_release_in_one_request(self):
        self.init_worker(0, 8)
        ks = keys(4)
        self.assertEqual(self.allocate(0, ks), [0, 1, 2, 3])
        self.confirm(0, [(ks[0], 0), (ks[2], 2)], pages_to_release=[1, 3])
        self.assert_rank(0, 8, 6, 0, 2)
        self.assertEqual(self.exists(ks), [True, False, True, False])
        self.assertEqual(self.locations(0, ks), [0, None, 2, None])

    def test_confirm_twice_with_same_page_is_a_no_op(self):
        self.init_worker(0, 4)
        k = key(0)
        self.save(0, [k])
        self.confirm(0, [(k, 0)])
        self.assert_rank(0, 4, 3, 0, 1)
        self.assertEqual(self.locations(0, [k]), [0])

    def test_missing_confirmations_and_releases_are_empty(self):
        self.init_worker(0, 4)
        self.assertEqual(self.allocate(0, [key(0)]), [0])
        self.assert_ok(self.client.post("/keys/confirm_write", {"rank": 0}), 204)
        self.assert_rank(0, 4, 3, 1, 0)


@transport_independent
class QuarantineTest(MetadTestCase):
    """A replayed release (vLLM's client retries a POST after a 5xx or a lost connection)
    must not free a page another writer was given meanwhile: released pages sit out
    --release-quarantine-ms before they go to another key, unless nothing else is free."""

    QUARANTINE_S = 1.0
    extra_args = ("--release-quarantine-ms", str(int(QUARANTINE_S * 1000)))

    def test_a_replayed_release_does_not_free_another_writers_page(self):
        self.init_worker(0, 4)
        a, b, c = key("A"), key("B"), key("C")
        self.assertEqual(self.allocate(0, [a]), [0])
        self.confirm(0, [], pages_to_release=[0])
        self.assertEqual(self.allocate(0, [b]), [1], "the released page waits")
        self.confirm(0, [], pages_to_release=[0])  # the replay: page 0 is quarantined already
        self.assertEqual(self.allocate(0, [c]), [2])
        self.confirm(0, [(b, 1)])
        self.assert_rank(0, 4, 2, 1, 1)  # the quarantined page counts as free
        self.assertEqual(self.locations(0, [b]), [1])
        # A full pool still serves, with the quarantined page last.
        self.assertEqual(self.allocate(0, [key("D"), key("E")]), [3, 0])

    def test_after_the_quarantine_a_released_page_is_lowest_first_again(self):
        self.init_worker(0, 4)
        self.assertEqual(self.allocate(0, keys(2)), [0, 1])
        self.confirm(0, [], pages_to_release=[0, 1])
        self.assertEqual(self.allocate(0, [key("next")]), [2])
        time.sleep(self.QUARANTINE_S + 0.3)  # ended on a core's tick
        self.assertEqual(self.allocate(0, keys(2, "later")), [0, 1])


class AllocationTest(MetadTestCase):

    def test_duplicate_keys_get_one_page_each(self):
        self.init_worker(0, 8)
        a, b, c = key("a"), key("b"), key("c")
        r = self.client.batch_allocate(0, [a, b, a, c, b, a])
        self.assert_body(r, 200, {"rank": 0, "results": [[a, 0], [b, 1], [c, 2]]})
        self.assert_rank(0, 8, 5, 3, 0)

    def test_duplicates_do_not_count_against_the_pool(self):
        self.init_worker(0, 2)
        a, b = key("a"), key("b")
        self.assertEqual(self.allocate(0, [a, a, b, b, a]), [0, 1])
        self.assert_rank(0, 2, 0, 2, 0)

    def test_cache_hit_returns_the_confirmed_page_without_taking_one(self):
        self.init_worker(0, 8)
        ks = keys(3)
        self.assertEqual(self.save(0, ks), [0, 1, 2])
        before = self.free_pages(0)
        self.assertEqual(self.allocate(0, ks), [0, 1, 2])
        self.assertEqual(self.free_pages(0), before)
        self.assert_rank(0, 8, 5, 0, 3)
        # Mixed with new keys: hits keep their pages, new keys get the lowest free.
        self.assertEqual(self.allocate(0, [key("n"), ks[1]]), [3, 1])

    def test_reallocating_a_reserved_key_returns_the_same_page(self):
        self.init_worker(0, 8)
        ks = keys(3)
        self.assertEqual(self.allocate(0, ks), [0, 1, 2])
        self.assertEqual(self.allocate(0, [ks[2], ks[0], key("x")]), [2, 0, 3])
        self.assert_rank(0, 8, 4, 4, 0)

    def test_pool_exhaustion_is_all_or_nothing(self):
        self.init_worker(0, 4)
        hit = key("hit")
        self.assertEqual(self.save(0, [hit]), [0])
        new = keys(4, "new")
        # 4 new keys, 3 free pages: every new key gets -1, the hit keeps its page.
        self.assertEqual(self.allocate(0, [new[0], hit, new[1], new[2], new[3]]),
                         [-1, 0, -1, -1, -1])
        self.assert_rank(0, 4, 3, 0, 1)
        # Exactly enough: all served.
        self.assertEqual(self.allocate(0, [hit] + new[:3]), [0, 1, 2, 3])
        self.assert_rank(0, 4, 0, 3, 1)
        # Pool empty: new keys -1, hits and reserved keys still answered.
        self.assertEqual(self.allocate(0, [new[3], new[0], hit]), [-1, 1, 0])
        self.assert_rank(0, 4, 0, 3, 1)

    def test_pages_are_lowest_free_first_after_releases(self):
        self.init_worker(0, 8)
        ks = keys(6)
        self.assertEqual(self.allocate(0, ks), [0, 1, 2, 3, 4, 5])
        self.confirm(0, [], pages_to_release=[4, 1, 3])
        self.assertEqual(self.allocate(0, keys(4, "b")), [1, 3, 4, 6])

    def test_large_pool(self):
        self.init_worker(0, 1_000_000)
        self.assertEqual(self.allocate(0, keys(128)), list(range(128)))
        self.assert_rank(0, 1_000_000, 1_000_000 - 128, 128, 0)


class RankIdTest(MetadTestCase):

    def test_rank_ids(self):
        for rank in (0, 1, -1, -7, 123456789, INT64_MAX, INT64_MIN):
            with self.subTest(rank=rank):
                self.reset()
                self.init_worker(rank, 5)
                ks = keys(3, str(rank))
                pages = self.allocate(rank, ks)
                self.assertEqual(pages, [0, 1, 2])
                r = self.client.batch_allocate(rank, [ks[0]])
                self.assertEqual(r.json()["rank"], rank)
                self.confirm(rank, list(zip(ks, pages)))
                self.assertEqual(self.exists(ks), [True] * 3)
                self.assertEqual(self.locations(rank, ks), [0, 1, 2])
                self.assert_rank(rank, 5, 2, 0, 3)
                self.assert_body(self.client.initialize(rank, 2), 200,
                                 {"message": f"Rank {rank} initialized with 2 pages"})
                self.assert_rank(rank, 2, 0, 0, 2)  # the key on page 2 lost its page
                self.assertEqual(self.exists(ks), [True, True, False])

    def test_ranks_are_independent(self):
        for rank in (-1, 0, 1, 2, 3):
            self.init_worker(rank, 4)
        for rank in (-1, 0, 1, 2, 3):
            self.assertEqual(self.allocate(rank, [key(rank)]), [0])
        for rank in (-1, 0, 1, 2, 3):
            self.assert_rank(rank, 4, 3, 1, 0)


class WireTest(MetadTestCase):
    """HTTP features vLLM's client, curl and proxies rely on."""

    def test_large_batch_exists(self):
        self.init_worker(0, 4096)
        ks = keys(1250)
        saved = ks[:600:3]
        self.save(0, saved)
        body = compact({"keys": ks})
        self.assertGreater(len(body), 40_000)
        want = [k in set(saved) for k in ks]
        self.assertEqual(self.exists(ks), want)
        # The whole prompt again, as one scheduler call per request.
        for _ in range(3):
            self.assertEqual(self.exists(ks), want)

    def test_large_allocate_and_locations(self):
        self.init_worker(0, 4096)
        ks = keys(1250)
        self.assertEqual(self.save(0, ks), list(range(1250)))
        self.assertEqual(self.locations(0, ks), list(range(1250)))

    def test_any_content_type(self):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            with self.subTest(content_type=ctype):
                r = self.client.post_raw("/keys/batch_exists", b'{"keys":["a"]}',
                                         headers={"Content-Type": ctype})
                self.assert_body(r, 200, {"exists": [False]})

    def test_query_string_is_ignored(self):
        r = self.client.post_raw("/keys/batch_exists?x=1&y", b'{"keys":[]}')
        self.assert_body(r, 200, {"exists": []})

    def test_whitespace_around_json(self):
        r = self.client.post_raw("/keys/batch_exists", b' \r\n\t{ "keys" : [ "a" ] }\n ')
        self.assert_body(r, 200, {"exists": [False]})

    def test_chunked_request_body(self):
        self.init_worker(0, 8)
        ks = keys(3)
        body = compact({"rank": 0, "keys": [[k, ""] for k in ks]})

        def pieces():
            for i in range(0, len(body), 7):
                yield body[i:i + 7]

        r = self.client.post_raw("/keys/batch_allocate", pieces())
        self.assertEqual(r.request.headers.get("Transfer-Encoding"), "chunked")
        self.assert_body(r, 200, {"rank": 0, "results": [[k, i] for i, k in enumerate(ks)]})
        # The keep-alive connection is still good afterwards.
        self.assertEqual(self.locations(0, ks), [None] * 3)

    def test_chunked_raw_with_extensions_and_trailers(self):
        body = b'{"keys":["a","b"]}'
        chunks = (b"5;name=value\r\n" + body[:5] + b"\r\n"
                  + b"%x\r\n" % (len(body) - 5) + body[5:] + b"\r\n"
                  + b"0\r\nX-Trailer: 1\r\n\r\n")
        req = raw_request("POST", "/keys/batch_exists", headers={
            "Content-Length": None, "Transfer-Encoding": "chunked"}) + chunks
        with self.raw() as conn:
            conn.send(req)
            status, headers, got = conn.read_response()
        self.assertEqual((status, got), (200, b'{"exists":[false,false]}'))

    def test_expect_100_continue_raw(self):
        body = compact({"keys": keys(40)})  # over 1 KiB, like curl
        self.assertGreater(len(body), 1024)
        req = raw_request("POST", "/keys/batch_exists", body=b"",
                          headers={"Content-Length": str(len(body)),
                                   "Expect": "100-continue"})
        with self.raw() as conn:
            conn.send(req)
            status, _, interim = conn.read_response()
            self.assertEqual((status, interim), (100, b""))
            conn.send(body)
            status, headers, got = conn.read_response()
            self.assertEqual(status, 200)
            self.assertEqual(got, compact({"exists": [False] * 40}))
            # Keep-alive: a second request on the same connection.
            conn.send(raw_request("POST", "/keys/batch_exists", compact({"keys": ["x"]})))
            self.assertEqual(conn.read_response()[2], b'{"exists":[false]}')

    def test_expect_100_continue_http_client(self):
        # http.client sends the body right after the headers without waiting.
        self.init_worker(0, 4)
        body = compact({"rank": 0, "keys": [[k, ""] for k in keys(40)]})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", "/keys/batch_allocate", body=body,
                         headers={"Content-Type": "application/json",
                                  "Expect": "100-continue"})
            resp = conn.getresponse()
            got = resp.read()
            self.assertEqual(resp.status, 200)
            results = [p for _, p in json.loads(got)["results"]]
            self.assertEqual(results, [-1] * 40)  # 40 keys, 4 pages: all or nothing
            conn.request("POST", "/keys/batch_exists", body=b'{"keys":[]}')
            resp = conn.getresponse()
            self.assertEqual((resp.status, resp.read()), (200, b'{"exists":[]}'))
        finally:
            conn.close()

    def test_http_1_0_is_answered_then_closed(self):
        with self.raw() as conn:
            conn.send(raw_request("POST", "/keys/batch_exists", compact({"keys": ["a"]}),
                                  version="HTTP/1.0"))
            status, headers, body = conn.read_response()
            self.assertEqual((status, body), (200, b'{"exists":[false]}'))
            self.assertTrue(conn.closed_by_peer(), "HTTP/1.0 connection left open")

    def test_connection_close_is_honoured(self):
        with self.raw() as conn:
            conn.send(raw_request("POST", "/keys/batch_exists", compact({"keys": []}),
                                  headers={"Connection": "close"}))
            status, headers, body = conn.read_response()
            self.assertEqual((status, body), (200, b'{"exists":[]}'))
            self.assertTrue(conn.closed_by_peer(), "Connection: close not honoured")

    def test_keep_alive_serves_many_requests(self):
        with self.raw() as conn:
            for i in range(50):
                conn.send(raw_request("POST", "/keys/batch_exists",
                                      compact({"keys": ["a"] * (i % 3)})))
                status, _, body = conn.read_response()
                self.assertEqual((status, body), (200, compact({"exists": [False] * (i % 3)})))

    def test_pipelining_answers_in_order(self):
        k = key("pipe")
        reqs = [
            raw_request("POST", "/rank/7/initialize",
                        compact({"num_pages": 4, "role": "worker"})),
            raw_request("POST", "/keys/batch_allocate", compact({"rank": 7, "keys": [[k, ""]]})),
            raw_request("POST", "/keys/confirm_write",
                        compact({"rank": 7, "confirmations": [[k, 0]], "pages_to_release": []})),
            raw_request("POST", "/keys/batch_exists", compact({"keys": [k, "zz"]})),
            raw_request("GET", "/rank/7"),
        ]
        want = [
            (200, b'{"message":"Rank 7 initialized with 4 pages"}'),
            (200, compact({"rank": 7, "results": [[k, 0]]})),
            (204, b""),
            (200, b'{"exists":[true,false]}'),
            (200, b'{"num_pages":4,"free":3,"reserved":0,"bound":1,"incomplete":0}'),
        ]
        with self.raw() as conn:
            conn.send(b"".join(reqs))
            got = [conn.read_response() for _ in reqs]
        self.assertEqual([(s, b) for s, _, b in got], want)

    def test_pipelining_three_requests_one_write(self):
        reqs = b"".join(raw_request("POST", "/keys/batch_exists",
                                    compact({"keys": ["a"] * n})) for n in (1, 2, 3))
        with self.raw() as conn:
            conn.send(reqs)
            bodies = [conn.read_response()[2] for _ in range(3)]
        self.assertEqual(bodies, [compact({"exists": [False] * n}) for n in (1, 2, 3)])

    def test_pipelined_request_split_across_writes(self):
        req = raw_request("POST", "/keys/batch_exists", compact({"keys": ["a", "b"]})) * 2
        with self.raw() as conn:
            for i in range(0, len(req), 11):
                conn.send(req[i:i + 11])
            bodies = [conn.read_response()[2] for _ in range(2)]
        self.assertEqual(bodies, [b'{"exists":[false,false]}'] * 2)

    def test_prompt_of_a_million_tokens(self):
        # 1M tokens / 16 per block = 62,500 keys, ~2.3 MB of JSON in one batch_exists.
        ks = keys(62_500)
        self.assertEqual(self.exists(ks), [False] * len(ks))

    def test_header_names_and_chunked_are_case_insensitive(self):
        body = b'{"keys":["a"]}'
        for te in ("CHUNKED", "Chunked"):
            with self.subTest(transfer_encoding=te):
                req = (b"POST /keys/batch_exists HTTP/1.1\r\nhOsT: x\r\n"
                       b"TRANSFER-ENCODING: " + te.encode() + b"\r\n\r\n"
                       + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
                with self.raw() as conn:
                    conn.send(req)
                    self.assertEqual(conn.read_response()[::2], (200, b'{"exists":[false]}'))
        req = (b"POST /keys/batch_exists HTTP/1.1\r\ncontent-LENGTH: %d\r\n"
               b"connection: CLOSE\r\n\r\n" % len(body) + body)
        with self.raw() as conn:
            conn.send(req)
            self.assertEqual(conn.read_response()[::2], (200, b'{"exists":[false]}'))
            self.assertTrue(conn.closed_by_peer(), "Connection: CLOSE not honoured")

    def test_many_pipelined_requests_across_ranks(self):
        # Ranks 0 and 1 live on different cores; answers must still come back in
        # request order.
        for r in (0, 1):
            self.init_worker(r, 512)
        reqs, want = [], []
        for i in range(200):
            r = i % 2
            k = key(i, "pipe")
            reqs.append(raw_request("POST", "/keys/batch_allocate",
                                    compact({"rank": r, "keys": [[k, ""]]})))
            want.append(compact({"rank": r, "results": [[k, i // 2]]}))
        with self.raw() as conn:
            conn.send(b"".join(reqs))
            got = [conn.read_response() for _ in reqs]
        self.assertEqual([s for s, _, _ in got], [200] * len(reqs))
        self.assertEqual([b for _, _, b in got], want)

    def test_many_connections(self):
        conns = [self.raw() for _ in range(200)]
        try:
            for i, conn in enumerate(conns):
                conn.send(raw_request("POST", "/keys/batch_exists",
                                      compact({"keys": ["a"] * (i % 4)})))
            for i, conn in enumerate(conns):
                self.assertEqual(conn.read_response()[::2],
                                 (200, compact({"exists": [False] * (i % 4)})))
        finally:
            for conn in conns:
                conn.close()

    def test_keys_with_escapes_and_unicode(self):
        self.init_worker(0, 8)
        odd = ['quo"te', "back\\slash", "new\nline\ttab", "\u043a\u043b\u044e\u0447",
               "\U0001f600", "", "x" * 4096]
        r = self.client.batch_allocate(0, odd)
        self.assert_status(r, 200)
        self.assertEqual(r.json(), {"rank": 0, "results": [[k, i] for i, k in enumerate(odd)]})
        self.confirm(0, [(k, i) for i, k in enumerate(odd)])
        self.assertEqual(self.exists(odd), [True] * len(odd))
        self.assertEqual(self.locations(0, odd), list(range(len(odd))))

    def test_escaped_key_is_the_same_key(self):
        # JSON escapes are decoded: "\u0041" and "A" name one key, as in the reference.
        self.init_worker(0, 8)
        self.save(0, ["A/B"])
        r = self.client.post_raw("/keys/batch_exists", b'{"keys":["\\u0041\\/B","A/B"]}')
        self.assert_body(r, 200, {"exists": [True, True]})
        r = self.client.post_raw("/keys/batch_allocate",
                                 b'{"rank":0,"keys":[["\\u0041\\/B",""]]}')
        self.assert_status(r, 200)
        self.assertEqual(r.json(), {"rank": 0, "results": [["A/B", 0]]})
        self.assert_rank(0, 8, 7, 0, 1)

    def test_connection_close_ends_the_pipeline(self):
        one = raw_request("POST", "/keys/batch_exists", b'{"keys":[]}')
        closing = raw_request("POST", "/keys/batch_exists", b'{"keys":["a"]}',
                              headers={"Connection": "close"})
        for version in ("HTTP/1.1", "HTTP/1.0"):
            with self.subTest(version=version):
                first = closing if version == "HTTP/1.1" else raw_request(
                    "POST", "/keys/batch_exists", b'{"keys":["a"]}', version="HTTP/1.0")
                with self.raw() as conn:
                    conn.send(first + one)
                    self.assertEqual(conn.read_response()[::2], (200, b'{"exists":[false]}'))
                    self.assertTrue(conn.closed_by_peer(),
                                    "a request after the closing one was answered")

    def test_404_and_405_keep_the_connection(self):
        with self.raw() as conn:
            conn.send(raw_request("GET", "/keys/batch_allocate"))
            status, headers, body = conn.read_response()
            self.assertEqual((status, headers.get("allow"), body),
                             (405, "POST", b'{"detail":"Method Not Allowed"}'))
            conn.send(raw_request("POST", "/nope", b"{}"))
            self.assertEqual(conn.read_response()[::2], (404, b'{"detail":"Not Found"}'))
            conn.send(raw_request("POST", "/keys/batch_exists", b'{"keys":[]}'))
            self.assertEqual(conn.read_response()[::2], (200, b'{"exists":[]}'))

    def test_get_rank_info_unknown(self):
        self.assert_error(self.client.rank_info(42), 404, "Rank 42 not initialized")


class ConcurrencyTest(MetadTestCase):
    """Several TP workers and a scheduler at once, on separate keep-alive connections
    (spread over the server's cores)."""

    def test_read_your_writes_across_connections(self):
        clients = [Client(self.server.base_url) for _ in range(8)]
        try:
            for r in (0, 1):
                self.init_worker(r, 256)
            for i in range(40):
                k = key(i, "ryw")
                for r in (0, 1):
                    c = clients[r]
                    body = c.batch_allocate(r, [k]).json()
                    page = body["results"][0][1]
                    self.assert_status(c.confirm_write(r, [(k, page)]), 204)
                # The confirm that completed the key has been answered: every other
                # connection sees it at once.
                for c in clients[2:]:
                    self.assertEqual(c.batch_exists([k]).json(), {"exists": [True]}, i)
                    self.assertEqual(c.get_locations(1, [k]).json(), {"locations": [i]})
        finally:
            for c in clients:
                c.close()

    def test_parallel_tp_workers_and_scheduler(self):
        tp, num_pages, tasks, batch = 4, 4096, 24, 64
        for r in range(tp):
            self.init_worker(r, num_pages)
        task_keys = [keys(batch, f"task{t}") for t in range(tasks)]
        failed = {t for t in range(tasks) if t % 5 == 4}
        pages_by_rank = {}
        errors = []
        stop = threading.Event()

        def worker(rank):
            c = Client(self.server.base_url)
            mine = {}
            try:
                for t in range(tasks):
                    body = c.batch_allocate(rank, task_keys[t]).json()
                    pages = [p for _, p in body["results"]]
                    if -1 in pages:
                        raise AssertionError(f"rank {rank} task {t}: pool exhausted")
                    if t in failed:
                        r = c.confirm_write(rank, [], pages)
                    else:
                        r = c.confirm_write(rank, list(zip(task_keys[t], pages)))
                        mine.update(zip(task_keys[t], pages))
                    if r.status_code != 204:
                        raise AssertionError(f"rank {rank} task {t}: {r.status_code} {r.text}")
                pages_by_rank[rank] = mine
            except Exception as e:  # reported by the main thread
                errors.append(f"rank {rank}: {e!r}")
            finally:
                c.close()

        def scheduler():
            c = Client(self.server.base_url)
            seen = set()
            all_keys = [k for ks in task_keys for k in ks]
            try:
                while not stop.is_set():
                    exists = c.batch_exists(all_keys).json()["exists"]
                    now = {k for k, e in zip(all_keys, exists) if e}
                    if not seen <= now:
                        raise AssertionError(f"{len(seen - now)} complete keys vanished")
                    seen = now
            except Exception as e:
                errors.append(f"scheduler: {e!r}")
            finally:
                c.close()

        threads = [threading.Thread(target=worker, args=(r,)) for r in range(tp)]
        sched = threading.Thread(target=scheduler)
        sched.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        stop.set()
        sched.join(60)
        self.assertEqual(errors, [])

        saved = (tasks - len(failed)) * batch
        for t in range(tasks):
            self.assertEqual(self.exists(task_keys[t]), [t not in failed] * batch, t)
        for r in range(tp):
            mine = pages_by_rank[r]
            self.assertEqual(len(mine), saved)
            self.assertEqual(len(set(mine.values())), saved, "a page bound to two keys")
            self.assert_rank(r, num_pages, num_pages - saved, 0, saved)
            ks = list(mine)
            self.assertEqual(self.locations(r, ks), [mine[k] for k in ks])


class ShutdownTest(unittest.TestCase):
    """SIGTERM with clients still connected: the server exits 0 within the drain time."""

    def test_sigterm_with_idle_and_half_sent_connections(self):
        server = MetadServer()
        try:
            idle = RawConnection(server.port)
            idle.send(raw_request("POST", "/keys/batch_exists", b'{"keys":[]}'))
            self.assertEqual(idle.read_response()[0], 200)
            partial = RawConnection(server.port)
            partial.send(b"POST /keys/batch_exists HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
            time.sleep(0.2)
        finally:
            code = server.stop()
        self.assertEqual(code, 0, server.log()[-4000:])
        idle.close()
        partial.close()


if __name__ == "__main__":
    unittest.main()
