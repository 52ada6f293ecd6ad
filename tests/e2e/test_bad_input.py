"""End-to-end: every malformed request of docs/api.md gets the specified 4xx/5xx answer
and leaves the server's state exactly as it was.

Each table case starts from the same known state (rank 3 with 8 pages: key A confirmed
on page 0 and complete, key B reserved on page 1), sends one bad request, checks the
answer, then proves nothing changed: rank counters, batch_exists, get_locations, the
next allocation still gets page 2, and no rank named by the request was created.

Run: cd tests/e2e && METAD_BIN=... METAD_IO=uring|epoll /usr/bin/python3 -m unittest -v
"""

import collections
import json
import select
import socket
import time
import unittest

from metad_harness import MetadTestCase, compact, key, raw_request

RANK = 3
PAGES = 8
PAGES_MAX = 1000
BODY_MAX = 4096
HEADER_MAX = 2048

A, B, C = key("A"), key("B"), key("C")  # A: complete on page 0; B: reserved page 1
FRESH = key("fresh")  # never allocated before a case
PROBE = key("probe")  # allocated after a case: must get page 2

INVALID_INIT = "Invalid initialization parameters"
INVALID_RANK_PATH = "Invalid rank in path"
ALLOC_FORMAT = "Invalid request format: need 'rank' and 'keys'"
CONFIRM_FORMAT = "Invalid request format: need 'rank' and 'confirmations'"
KEYS_FORMAT = "Invalid keys format"
JSON_PREFIX = "Invalid JSON body: "
LIMIT = f"num_pages exceeds the limit of {PAGES_MAX}"

BEYOND_INT64 = "9223372036854775808"
BELOW_INT64 = "-9223372036854775809"

# One bad request and what must come back. body: dict (sent as compact JSON), str or
# bytes (sent as is). detail/prefix/one_of as in MetadTestCase.assert_error. absent:
# ranks that must still not exist afterwards.
Case = collections.namedtuple(
    "Case", "name path body status detail prefix one_of absent method",
    defaults=(None, None, None, (), "POST"))

ENDPOINTS = {
    "initialize": "/rank/5/initialize",
    "batch_allocate": "/keys/batch_allocate",
    "confirm_write": "/keys/confirm_write",
    "batch_exists": "/keys/batch_exists",
    "get_locations": "/keys/get_locations",
    "inspect": "/keys/inspect",
}

# A valid body per endpoint, each of which would change state or answer 200 if the
# server ignored the corruption applied to it.
VALID_BODIES = {
    "initialize": '{"num_pages":4,"role":"worker"}',
    "batch_allocate": f'{{"rank":{RANK},"keys":[["{FRESH}",""]]}}',
    "confirm_write": f'{{"rank":{RANK},"confirmations":[["{B}",1]],"pages_to_release":[]}}',
    "batch_exists": f'{{"keys":["{A}"]}}',
    "get_locations": f'{{"rank":{RANK},"keys":["{A}"]}}',
    "inspect": f'{{"keys":["{A}"]}}',
}


def _extend(body, extra):
    """Adds `extra` (raw text) as a last member of the object text `body`."""
    return body[:-1] + "," + extra + "}"


# Corruptions of a valid object text that make the body invalid JSON or not an object.
JSON_CORRUPTIONS = [
    ("syntax_error_in_unread_field", lambda b: _extend(b, '"junk":[1,2,]')),
    ("bad_literal_in_unread_field", lambda b: _extend(b, '"junk":{"a":tru}')),
    ("trailing_bytes", lambda b: b + "x"),
    ("two_objects", lambda b: b + " {}"),
    ("nan", lambda b: _extend(b, '"x":NaN')),
    ("infinity", lambda b: _extend(b, '"x":Infinity')),
    ("minus_infinity", lambda b: _extend(b, '"x":-Infinity')),
    ("truncated", lambda b: b[:-1]),
    ("trailing_comma", lambda b: b[:-1] + ",}"),
    ("single_quotes", lambda b: b.replace('"', "'")),
    ("leading_zero", lambda b: _extend(b, '"x":01')),
    ("bad_escape", lambda b: _extend(b, '"x":"\\q"')),
    ("raw_control_char", lambda b: _extend(b, '"x":"a\x01b"')),
    ("invalid_utf8", lambda b: _extend(b, '"x":"').encode() + b'\xff\xfe"}'),
    ("unquoted_name", lambda b: _extend(b, 'x:1')),
    ("array", lambda b: "[" + b + "]"),
    ("empty_array", lambda b: "[]"),
    ("string", lambda b: '""'),
    ("number", lambda b: "1"),
    ("null", lambda b: "null"),
    ("true", lambda b: "true"),
    ("empty_body", lambda b: ""),
    ("whitespace_only", lambda b: " \r\n "),
]


def json_cases():
    cases = []
    for endpoint, path in ENDPOINTS.items():
        for name, corrupt in JSON_CORRUPTIONS:
            absent = (5,) if endpoint == "initialize" else ()
            cases.append(Case(f"{endpoint}/{name}", path, corrupt(VALID_BODIES[endpoint]),
                              400, prefix=JSON_PREFIX, absent=absent))
    return cases


def initialize_cases():
    def init(name, body, status=400, detail=INVALID_INIT, path="/rank/5/initialize"):
        return Case(f"initialize/{name}", path, body, status, detail=detail, absent=(5,))

    cases = [
        init("role_capitalised", {"role": "Worker", "num_pages": 4}),
        init("role_upper", {"role": "WORKER", "num_pages": 4}),
        init("role_scheduler_capitalised", {"role": "Scheduler", "num_pages": 0}),
        init("role_empty", {"role": "", "num_pages": 4}),
        init("role_misspelled", {"role": "workers", "num_pages": 4}),
        init("role_null", {"role": None, "num_pages": 4}),
        init("role_number", {"role": 1, "num_pages": 4}),
        init("role_list", {"role": ["worker"], "num_pages": 4}),
        init("num_pages_missing", {"role": "worker"}),
        init("empty_object", {}),
        init("num_pages_zero", {"role": "worker", "num_pages": 0}),
        init("num_pages_minus_zero", '{"role":"worker","num_pages":-0}'),
        init("num_pages_negative", {"role": "worker", "num_pages": -1}),
        init("num_pages_string", {"role": "worker", "num_pages": "5"}),
        init("num_pages_float", '{"role":"worker","num_pages":5.0}'),
        init("num_pages_exponent", '{"role":"worker","num_pages":1e2}'),
        init("num_pages_exponent_int", '{"role":"worker","num_pages":5E0}'),
        init("num_pages_null", {"role": "worker", "num_pages": None}),
        init("num_pages_true", {"role": "worker", "num_pages": True}),
        init("num_pages_false", {"role": "worker", "num_pages": False}),
        init("num_pages_list", {"role": "worker", "num_pages": [5]}),
        init("num_pages_object", {"role": "worker", "num_pages": {"n": 5}}),
        init("num_pages_default_role_zero", {"num_pages": 0}),
        init("num_pages_over_limit", {"role": "worker", "num_pages": PAGES_MAX + 1},
             detail=LIMIT),
        init("num_pages_int64_max", {"role": "worker", "num_pages": 2**63 - 1},
             detail=LIMIT),
        # Beyond int64: the spec requires a 400 but pins no detail (RFC 8259 lets a
        # parser limit the range of numbers, so "Invalid JSON body: ..." is allowed).
        init("num_pages_beyond_int64",
             '{"role":"worker","num_pages":%s}' % BEYOND_INT64, detail=None),
        init("num_pages_below_int64",
             '{"role":"worker","num_pages":%s}' % BELOW_INT64, detail=None),
        # The existing rank: invalid or over-limit re-initialisation (a smaller one is
        # valid: it shrinks the pool, test_vllm_client.InitializeTest).
        init("existing_rank_zero", {"role": "worker", "num_pages": 0},
             path=f"/rank/{RANK}/initialize"),
        init("existing_rank_over_limit", {"role": "worker", "num_pages": PAGES_MAX + 1},
             detail=LIMIT, path=f"/rank/{RANK}/initialize"),
    ]
    for text in ("abc", "1.5", "99999999999999999999", BEYOND_INT64, BELOW_INT64, "1a",
                 "0x1", "--1", "-", "1e3"):
        for role in ("worker", "scheduler"):
            cases.append(init(f"path_rank_{text}_{role}", {"role": role, "num_pages": 4},
                              detail=INVALID_RANK_PATH, path=f"/rank/{text}/initialize"))
    return cases


def allocate_cases():
    path = "/keys/batch_allocate"

    def alloc(name, body, status=400, detail=None, prefix=None, absent=()):
        if isinstance(body, dict) and "keys" not in body:
            body = dict(body, keys=[[FRESH, ""]])
        return Case(f"batch_allocate/{name}", path, body, status, detail=detail,
                    prefix=prefix, absent=absent)

    def bad_key(name, ks, index):
        return alloc(name, {"rank": RANK, "keys": ks},
                     prefix=f"Invalid key at index {index}: ")

    return [
        alloc("rank_missing", {}, detail=ALLOC_FORMAT),
        alloc("rank_null", {"rank": None}, detail=ALLOC_FORMAT),
        alloc("rank_string", {"rank": str(RANK)}),
        alloc("rank_float", f'{{"rank":{RANK}.0,"keys":[["{FRESH}",""]]}}'),
        alloc("rank_exponent", f'{{"rank":{RANK}e0,"keys":[["{FRESH}",""]]}}'),
        alloc("rank_true", {"rank": True}),
        alloc("rank_list", {"rank": [RANK]}),
        alloc("rank_beyond_int64", f'{{"rank":{BEYOND_INT64},"keys":[["{FRESH}",""]]}}'),
        alloc("rank_below_int64", f'{{"rank":{BELOW_INT64},"keys":[["{FRESH}",""]]}}'),
        alloc("keys_string", {"rank": RANK, "keys": "abc"}, detail=ALLOC_FORMAT),
        alloc("keys_object", {"rank": RANK, "keys": {}}, detail=ALLOC_FORMAT),
        alloc("keys_number", {"rank": RANK, "keys": 5}, detail=ALLOC_FORMAT),
        alloc("keys_null", {"rank": RANK, "keys": None}, detail=ALLOC_FORMAT),
        bad_key("element_number", [1], 0),
        bad_key("element_one_string", [["a"]], 0),
        bad_key("element_three_strings", [["a", "b", "c"]], 0),
        bad_key("element_empty_list", [[]], 0),
        bad_key("element_key_number", [[1, ""]], 0),
        bad_key("element_key_null", [[None, ""]], 0),
        bad_key("element_key_list", [[["a"], ""]], 0),
        bad_key("element_prefix_number", [["a", 1]], 0),
        bad_key("element_prefix_null", [["a", None]], 0),
        bad_key("element_object", [{}], 0),
        bad_key("element_null", [None], 0),
        bad_key("element_true", [True], 0),
        bad_key("bad_after_good", [[FRESH, ""], "ok2", [1, ""]], 2),
        bad_key("bad_after_duplicates", [[FRESH, ""], [FRESH, ""], {}], 2),
        bad_key("bad_after_hit_and_reserved", [[A, ""], [B, ""], FRESH, 7], 3),
        bad_key("bare_then_number", ["x", 5], 1),
        alloc("unknown_rank", {"rank": 99}, status=404,
              detail="Allocation failed: Rank 99 not initialized", absent=(99,)),
        alloc("unknown_negative_rank", {"rank": -5}, status=404,
              detail="Allocation failed: Rank -5 not initialized", absent=(-5,)),
    ]


def confirm_cases():
    path = "/keys/confirm_write"

    def conf(name, confirmations=((B, 1),), releases=(), rank=RANK, status=400,
             detail=None, absent=()):
        # json.dumps writes tuples as arrays; rank=... leaves "rank" out.
        body = {"rank": rank, "confirmations": confirmations, "pages_to_release": releases}
        if rank is ...:
            del body["rank"]
        return Case(f"confirm_write/{name}", path, body, status, detail=detail,
                    absent=absent)

    def conf_raw(name, confirmations_text, releases_text="[]"):
        body = '{"rank":%d,"confirmations":%s,"pages_to_release":%s}' % (
            RANK, confirmations_text, releases_text)
        return Case(f"confirm_write/{name}", path, body, 400)

    return [
        conf("rank_missing", rank=..., detail=CONFIRM_FORMAT),
        conf("rank_null", rank=None, detail=CONFIRM_FORMAT),
        conf("rank_string", rank=str(RANK)),
        Case("confirm_write/rank_float", path,
             f'{{"rank":{RANK}.0,"confirmations":[["{B}",1]],"pages_to_release":[]}}', 400),
        Case("confirm_write/rank_beyond_int64", path,
             f'{{"rank":{BEYOND_INT64},"confirmations":[["{B}",1]],"pages_to_release":[]}}',
             400),
        conf("confirmations_string", confirmations="x", detail=CONFIRM_FORMAT),
        conf("confirmations_object", confirmations={}, detail=CONFIRM_FORMAT),
        conf("confirmations_number", confirmations=5, detail=CONFIRM_FORMAT),
        conf("confirmations_null", confirmations=None, detail=CONFIRM_FORMAT),
        conf("page_out_of_range", [(B, PAGES)]),
        conf("page_int64_max", [(B, 2**63 - 1)]),
        conf_raw("page_beyond_int64", f'[["{B}",{BEYOND_INT64}]]'),
        conf("free_page_not_reserved", [(C, 2)]),
        conf("page_reserved_for_another_key", [(C, 1)]),
        conf("bound_key_to_page_reserved_for_another", [(A, 1)]),
        conf("page_bound_to_another_key", [(C, 0)]),
        conf("reserved_key_to_page_bound_to_another", [(B, 0)]),
        conf("same_page_two_keys", [(B, 1), (C, 1)]),
        conf("good_then_bad", [(B, 1), (C, 5)]),
        conf("negative_page", [(B, -1)]),
        conf_raw("page_float", f'[["{B}",1.0]]'),
        conf_raw("page_exponent", f'[["{B}",1e0]]'),
        conf("page_string", [(B, "1")]),
        conf("page_null", [(B, None)]),
        conf("page_true", [(B, True)]),
        conf("element_one_item", [[B]]),
        conf("element_three_items", [[B, 1, 2]]),
        conf("element_key_number", [[1, 1]]),
        conf("element_bare_string", [B]),
        conf("element_null", [None]),
        conf("element_object", [{"key": B, "page": 1}]),
        conf("release_out_of_range", [], [PAGES]),
        conf("release_negative", [], [-1]),
        conf("release_string", [], ["1"]),
        conf("release_null_element", [], [None]),
        conf_raw("release_float", "[]", "[1.0]"),
        conf_raw("release_beyond_int64", "[]", f"[{BEYOND_INT64}]"),
        conf("releases_string", [], "x"),
        conf("releases_object", [], {}),
        conf("good_confirmation_bad_release", [(B, 1)], [PAGES]),
        conf("good_release_bad_confirmation", [(C, 2)], [1]),
        conf("good_release_then_bad_release", [], [1, PAGES + 3]),
        conf("unknown_rank", [(B, 1)], rank=99, status=404, absent=(99,)),
        conf("unknown_rank_release", [], [0], rank=99, status=404, absent=(99,)),
    ]


def exists_cases(endpoint="batch_exists"):
    path = f"/keys/{endpoint}"

    def ex(name, ks, detail=None):
        return Case(f"{endpoint}/{name}", path, {"keys": ks}, 400, detail=detail)

    return [
        ex("keys_string", "x", KEYS_FORMAT),
        ex("keys_object", {}, KEYS_FORMAT),
        ex("keys_number", 5, KEYS_FORMAT),
        ex("keys_null", None, KEYS_FORMAT),
        ex("element_number", [1]),
        ex("element_null", [None]),
        ex("element_pair", [[A, ""]]),
        ex("element_true", [True]),
        ex("good_then_number", [A, 2]),
    ]


def locations_cases():
    path = "/keys/get_locations"

    def loc(name, body, status=400, detail=None, absent=()):
        return Case(f"get_locations/{name}", path, body, status, detail=detail,
                    absent=absent)

    return [
        loc("unknown_rank", {"rank": 99, "keys": [A]}, 404,
            "Failed to get key locations: Rank 99 not initialized", absent=(99,)),
        loc("unknown_negative_rank", {"rank": -2, "keys": [A]}, 404,
            "Failed to get key locations: Rank -2 not initialized", absent=(-2,)),
        loc("rank_missing", {"keys": [A]}, detail=ALLOC_FORMAT),
        loc("rank_null", {"rank": None, "keys": [A]}, detail=ALLOC_FORMAT),
        loc("rank_string", {"rank": str(RANK), "keys": [A]}),
        loc("rank_float", f'{{"rank":{RANK}.0,"keys":["{A}"]}}'),
        loc("rank_beyond_int64", f'{{"rank":{BEYOND_INT64},"keys":["{A}"]}}'),
        loc("keys_string", {"rank": RANK, "keys": "x"}, detail=ALLOC_FORMAT),
        loc("keys_object", {"rank": RANK, "keys": {}}, detail=ALLOC_FORMAT),
        loc("keys_null", {"rank": RANK, "keys": None}, detail=ALLOC_FORMAT),
        loc("element_number", {"rank": RANK, "keys": [1]}),
        loc("element_pair", {"rank": RANK, "keys": [[A, ""]]}),
        loc("element_null", {"rank": RANK, "keys": [None]}),
        loc("good_then_number", {"rank": RANK, "keys": [A, 5]}),
    ]


def routing_cases():
    cases = []
    for path in ("/nope", "//", "/keys", "/keys/", "/keys/batch_allocatex",
                 "/Keys/batch_allocate", "/rank/3/initialize/x", "/rank/3/init",
                 "/rank/3/initialize/", "/clear/x"):
        for method in ("POST", "GET"):
            cases.append(Case(f"not_found/{method}{path}", path, {}, 404,
                              detail="Not Found", method=method))
    for path in ("/keys/batch_allocate", "/keys/confirm_write", "/keys/batch_exists",
                 "/keys/get_locations", "/clear", "/rank/3/initialize"):
        for method in ("GET", "PUT", "DELETE", "PATCH"):
            cases.append(Case(f"method_not_allowed/{method}{path}", path, {}, 405,
                              detail="Method Not Allowed", method=method))
    return cases


# Raw-socket requests that must fail at the HTTP layer. expect_close: the spec requires
# the connection to be closed after the answer.
RawCase = collections.namedtuple("RawCase", "name request status expect_close")


def _head(lines):
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def raw_cases():
    post = "POST /keys/batch_exists HTTP/1.1"
    fill = "a" * (HEADER_MAX + 1000)
    chunked_big = b"%x\r\n" % (BODY_MAX + 100) + b" " * (BODY_MAX + 100) + b"\r\n0\r\n\r\n"
    return [
        RawCase("header_too_large", _head([post, "Host: x", f"X-Fill: {fill}",
                                           "Content-Length: 2"]) + b"{}", 431, True),
        RawCase("many_headers_too_large",
                _head([post, "Host: x"] + [f"X-H{i}: {'b' * 40}" for i in range(80)]
                      + ["Content-Length: 2"]) + b"{}", 431, True),
        RawCase("header_too_large_unterminated",
                f"{post}\r\nHost: x\r\nX-Fill: {fill}".encode(), 431, True),
        RawCase("body_too_large_content_length",
                _head([post, "Host: x", f"Content-Length: {BODY_MAX + 1}"]), 413, True),
        RawCase("body_too_large_huge_content_length",
                _head([post, "Host: x", "Content-Length: 99999999999999"]), 413, True),
        RawCase("body_too_large_chunked",
                _head([post, "Host: x", "Transfer-Encoding: chunked"]) + chunked_big,
                413, True),
        RawCase("body_too_large_expect_continue",
                _head([post, "Host: x", f"Content-Length: {BODY_MAX + 1}",
                       "Expect: 100-continue"]), 413, True),
        RawCase("content_length_and_chunked",
                _head([post, "Host: x", "Content-Length: 2", "Transfer-Encoding: chunked"])
                + b"2\r\n{}\r\n0\r\n\r\n", 400, True),
        RawCase("chunked_and_content_length",
                _head([post, "Host: x", "Transfer-Encoding: chunked", "Content-Length: 2"])
                + b"2\r\n{}\r\n0\r\n\r\n", 400, True),
        RawCase("transfer_encoding_gzip",
                _head([post, "Host: x", "Transfer-Encoding: gzip"]), 501, False),
        RawCase("request_line_garbage", b"GARBAGE\r\n\r\n", 400, True),
        RawCase("request_line_no_version", b"POST /keys/batch_exists\r\n\r\n", 400, True),
        RawCase("request_line_binary", b"\x00\x01\x02\x03\r\n\r\n", 400, True),
        RawCase("header_without_colon",
                _head([post, "Host: x", "NoColonHere", "Content-Length: 2"]) + b"{}",
                400, True),
        RawCase("content_length_abc",
                _head([post, "Host: x", "Content-Length: abc"]) + b"{}", 400, True),
        RawCase("content_length_negative",
                _head([post, "Host: x", "Content-Length: -1"]) + b"{}", 400, True),
        RawCase("content_length_fraction",
                _head([post, "Host: x", "Content-Length: 1.5"]) + b"{}", 400, True),
        RawCase("content_length_conflicting",
                _head([post, "Host: x", "Content-Length: 2", "Content-Length: 3"]) + b"{} ",
                400, True),
        RawCase("chunk_size_not_hex",
                _head([post, "Host: x", "Transfer-Encoding: chunked"]) + b"zz\r\n{}\r\n0\r\n\r\n",
                400, True),
        RawCase("chunk_without_crlf",
                _head([post, "Host: x", "Transfer-Encoding: chunked"]) + b"2\r\n{}XX0\r\n\r\n",
                400, True),
    ]


class BadInputTest(MetadTestCase):
    extra_args = ("--pages-per-rank-max", str(PAGES_MAX), "--body-bytes-max", str(BODY_MAX),
                  "--header-bytes-max", str(HEADER_MAX))

    # --- the known state and the proof that it did not change -----------------------

    def build_state(self):
        self.reset()
        self.init_worker(RANK, PAGES)
        self.assertEqual(self.allocate(RANK, [A, B]), [0, 1])
        self.confirm(RANK, [(A, 0)])
        self.assert_unchanged_snapshot()

    def assert_unchanged_snapshot(self, absent=()):
        self.assert_rank(RANK, PAGES, PAGES - 2, 1, 1)
        self.assertEqual(self.exists([A, B, C, FRESH]), [True, False, False, False])
        self.assertEqual(self.locations(RANK, [A, B, C, FRESH]), [0, None, None, None])
        for rank in absent:
            self.assert_error(self.client.rank_info(rank), 404,
                              f"Rank {rank} not initialized")

    def assert_unchanged(self, absent=()):
        self.assert_unchanged_snapshot(absent)
        # B is still reserved on page 1 and A still bound on page 0; the next new key
        # gets the lowest free page, 2.
        self.assertEqual(self.allocate(RANK, [A, B, PROBE]), [0, 1, 2])
        self.assert_rank(RANK, PAGES, PAGES - 3, 2, 1)

    # --- table runner ---------------------------------------------------------------

    def send(self, case):
        body = case.body
        if isinstance(body, dict):
            body = compact(body)
        elif isinstance(body, str):
            body = body.encode()
        return self.client.request(case.method, case.path, data=body,
                                   headers={"Content-Type": "application/json"})

    def run_cases(self, cases):
        self.assertTrue(cases)
        names = [c.name for c in cases]
        self.assertEqual(len(names), len(set(names)), "duplicate case names")
        for case in cases:
            with self.subTest(case=case.name):
                self.build_state()
                r = self.send(case)
                self.assert_error(r, case.status, detail=case.detail, prefix=case.prefix,
                                  one_of=case.one_of)
                if case.status == 405:
                    self.assertEqual(r.headers.get("Allow"), "POST")
                self.assert_unchanged(case.absent)

    def test_invalid_json(self):
        self.run_cases(json_cases())

    def test_initialize(self):
        self.run_cases(initialize_cases())

    def test_batch_allocate(self):
        self.run_cases(allocate_cases())

    def test_confirm_write(self):
        self.run_cases(confirm_cases())

    def test_batch_exists(self):
        self.run_cases(exists_cases())

    def test_get_locations(self):
        self.run_cases(locations_cases())

    def test_inspect(self):
        # batch_exists' body rules, and at most 256 keys.
        too_many = [f"k{i}" for i in range(257)]
        self.run_cases(exists_cases("inspect") + [
            Case("inspect/too_many_keys", "/keys/inspect", {"keys": too_many}, 400,
                 detail="Too many keys: 257; an inspection takes at most 256")])

    def test_routing(self):
        self.run_cases(routing_cases())

    def test_status_page_wrong_method(self):
        # GET / is the status page, GET /status.json its summary: nothing else.
        for path in ("/", "/status.json"):
            for method in ("POST", "PUT", "DELETE"):
                with self.subTest(path=path, method=method):
                    self.build_state()
                    r = self.client.request(method, path, data=b"{}")
                    self.assert_error(r, 405, "Method Not Allowed")
                    self.assertEqual(r.headers.get("Allow"), "GET, HEAD")
                    self.assert_unchanged()

    def test_rank_info_wrong_method(self):
        # GET /rank/{rank} is the only method there: a 405 must not advertise POST.
        for method in ("POST", "PUT", "DELETE"):
            with self.subTest(method=method):
                self.build_state()
                r = self.client.request(method, f"/rank/{RANK}", data=b"{}")
                self.assert_error(r, 405, "Method Not Allowed")
                allow = [m.strip() for m in r.headers.get("Allow", "").split(",")]
                self.assertIn("GET", allow)
                self.assertNotIn("POST", allow)
                self.assert_unchanged()

    # --- controls: the valid requests the tables corrupt do work --------------------

    def test_valid_bodies_work(self):
        expected = {
            "initialize": (200, b'{"message":"Rank 5 initialized with 4 pages"}'),
            "batch_allocate": (200, compact({"rank": RANK, "results": [[FRESH, 2]]})),
            "confirm_write": (204, b""),
            "batch_exists": (200, b'{"exists":[true]}'),
            "get_locations": (200, b'{"locations":[0]}'),
        }
        for endpoint, path in ENDPOINTS.items():
            with self.subTest(endpoint=endpoint):
                self.build_state()
                r = self.client.post_raw(path, VALID_BODIES[endpoint].encode())
                if endpoint == "inspect":  # its answer carries times
                    self.assertEqual(r.status_code, 200, r.content)
                    self.assertEqual([(k["key"], k["state"]) for k in r.json()["keys"]],
                                     [(A, "complete")])
                    continue
                self.assertEqual((r.status_code, r.content), expected[endpoint])

    def test_limits_boundaries_are_accepted(self):
        self.build_state()
        self.assert_body(self.client.initialize(5, PAGES_MAX), 200,
                         {"message": f"Rank 5 initialized with {PAGES_MAX} pages"})
        self.assert_body(self.client.initialize(RANK, PAGES_MAX), 200,
                         {"message": f"Rank {RANK} initialized with {PAGES_MAX} pages"})
        self.assert_rank(RANK, PAGES_MAX, PAGES_MAX - 2, 1, 1)

    def test_missing_keys_are_empty_lists(self):
        self.build_state()
        self.assert_body(self.client.post("/keys/batch_allocate", {"rank": RANK}), 200,
                         {"rank": RANK, "results": []})
        self.assert_body(self.client.post("/keys/batch_exists", {}), 200, {"exists": []})
        self.assert_body(self.client.post("/keys/get_locations", {"rank": RANK}), 200,
                         {"locations": []})
        self.assert_ok(self.client.post("/keys/confirm_write", {"rank": RANK}), 204)
        self.assert_unchanged()

    def test_unknown_fields_are_ignored(self):
        self.build_state()
        r = self.client.post("/keys/batch_exists",
                             {"keys": [A], "extra": {"nested": [1, 2.5, None, True, "s"]}})
        self.assert_body(r, 200, {"exists": [True]})

    def test_deep_nesting_does_not_crash(self):
        self.build_state()
        for depth in (100, 2000):
            with self.subTest(depth=depth):
                body = '{"keys":[],"x":' + "[" * depth + "]" * depth + "}"
                r = self.client.post_raw("/keys/batch_exists", body.encode())
                self.assertIn(r.status_code, (200, 400), r.content)
                self.assert_json_type(r.headers)
        self.assert_unchanged()

    # --- raw-socket protocol errors -------------------------------------------------

    def test_raw_protocol_errors(self):
        for case in raw_cases():
            with self.subTest(case=case.name):
                self.build_state()
                with self.raw() as conn:
                    conn.send(case.request)
                    status, headers, body = conn.read_final_response()
                    self.assertEqual(status, case.status, body)
                    self.assert_json_type(headers)
                    self.assertEqual(headers.get("content-length"), str(len(body)))
                    detail = json.loads(body)["detail"]
                    self.assertIsInstance(detail, str)
                    self.assertTrue(detail)
                    if case.expect_close:
                        self.assertTrue(conn.closed_by_peer(),
                                        "connection left open after the error")
                self.assert_served()
                self.assert_unchanged()

    def test_error_after_good_pipelined_request(self):
        # A good request then a malformed one in one write: the first is answered
        # normally, then the error, then the close.
        self.build_state()
        good = raw_request("POST", "/keys/batch_exists", compact({"keys": [A]}))
        with self.raw() as conn:
            conn.send(good + b"GARBAGE\r\n\r\n")
            status, _, body = conn.read_response()
            self.assertEqual((status, body), (200, b'{"exists":[true]}'))
            status, headers, body = conn.read_response()
            self.assertEqual(status, 400, body)
            self.assert_json_type(headers)
            self.assertTrue(conn.closed_by_peer(), "connection left open after the error")
        self.assert_served()
        self.assert_unchanged()

    def test_body_limit_boundary(self):
        self.build_state()
        base = compact({"keys": [A]})
        exact = base + b" " * (BODY_MAX - len(base))
        self.assertEqual(len(exact), BODY_MAX)
        self.assert_body(self.client.post_raw("/keys/batch_exists", exact), 200,
                         {"exists": [True]})
        r = self.client.post_raw("/keys/batch_exists", exact + b" ")
        self.assert_error(r, 413)
        self.assert_served()
        self.assert_unchanged()


class SlowClientTest(MetadTestCase):
    """Idle and slow clients time out; busy keep-alive clients do not."""

    extra_args = ("--idle-timeout-ms", "1000", "--header-timeout-ms", "1000")
    # The harness's own requests must not reuse a connection the idle timeout may be
    # closing at that very moment (the cause of a rare RemoteDisconnected in setUp).
    fresh_connections = True

    def test_idle_keep_alive_connection_is_closed(self):
        with self.raw() as conn:
            conn.send(raw_request("POST", "/keys/batch_exists", b'{"keys":[]}'))
            self.assertEqual(conn.read_response()[0], 200)
            self.assertTrue(conn.closed_by_peer(timeout=6), "idle connection kept open")

    def test_connection_that_never_sends_is_closed(self):
        with self.raw() as conn:
            self.assertTrue(conn.closed_by_peer(timeout=6), "silent connection kept open")

    def test_incomplete_request_is_closed(self):
        for name, partial in (
                ("headers", b"POST /keys/batch_exists HTTP/1.1\r\nHost: x\r\n"),
                ("body", b"POST /keys/batch_exists HTTP/1.1\r\nContent-Length: 50\r\n\r\n{")):
            with self.subTest(part=name):
                with self.raw() as conn:
                    conn.send(partial)
                    self.assert_ends_without_success(conn)
        self.assert_served()

    def test_trickled_headers_are_cut_off(self):
        # One byte every 100 ms: the header timeout covers the whole request, it is
        # not restarted by each byte.
        request = raw_request("POST", "/keys/batch_exists", b'{"keys":[]}',
                              headers={"X-Pad": "p" * 100})
        with self.raw() as conn:
            cut = False
            for i in range(len(request)):
                try:
                    conn.send(request[i:i + 1])
                except OSError:
                    cut = True
                    break
                time.sleep(0.1)
                if i % 10 == 0 and self.readable(conn):
                    cut = True
                    break
            self.assertTrue(cut, f"{len(request)} bytes trickled over "
                                 f"{len(request) / 10:.0f} s were all accepted")
            self.assert_ends_without_success(conn)
        self.assert_served()

    def test_busy_keep_alive_connection_stays_open(self):
        with self.raw() as conn:
            for _ in range(8):
                conn.send(raw_request("POST", "/keys/batch_exists", b'{"keys":[]}'))
                self.assertEqual(conn.read_response()[::2], (200, b'{"exists":[]}'))
                time.sleep(0.4)

    @staticmethod
    def readable(conn):
        return bool(select.select([conn.sock], [], [], 0)[0])

    def assert_ends_without_success(self, conn):
        """The server ends the connection; it may first answer with an error (4xx)."""
        conn.sock.settimeout(6)
        try:
            while True:
                if not conn._fill():
                    break
        except socket.timeout:
            self.fail("slow connection kept open")
        if conn.buf:
            status = int(conn.buf.split(b" ", 2)[1])
            self.assertGreaterEqual(status, 400, conn.buf)


if __name__ == "__main__":
    unittest.main()
