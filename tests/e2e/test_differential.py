# ctest: once
"""Randomized differential test: the real server against reference_model.py.

Long random sequences of requests — every endpoint, valid and invalid bodies, many ranks
(negative and int64 extremes included), small pools so that exhaustion is common, keys
from a small space so that hits and duplicates are common, /clear now and then — go to
the server over one keep-alive socket (sometimes pipelined, sometimes chunked); every
answer's status and parsed JSON body must equal the model's exactly (204: no body).

A concurrent variant runs several threads on disjoint ranks and keys, each against its
own model (disjoint means each thread's answers are still deterministic), and ends by
checking every rank's page counts (free + reserved + bound == num_pages) and locations.

Seeds are printed; replay one with
    DIFF_SEED=<seed> DIFF_OPS=<ops> METAD_BIN=build/hf3fs-metad \\
        /usr/bin/python3 -m unittest test_differential        (from tests/e2e)
Environment: DIFF_SEED (one seed instead of the default set), DIFF_OPS (operations per
seed), DIFF_SEEDS (how many fresh random seeds to add to the fixed ones, default 2),
DIFF_THREADS (threads of the concurrent variant). Standard library + requests only.
"""

import json
import os
import random
import sys
import threading
import unittest

from metad_harness import MetadTestCase, RawConnection
from reference_model import INT64_MAX, INT64_MIN, Model

PAGES_MAX = 64  # --pages-per-rank-max: the ceiling is cheap to test
FIXED_SEEDS = (1, 2, 3)
DEFAULT_OPS = 6000
CONCURRENT_OPS = 3000
HISTORY = 12  # requests shown before a mismatch

HEX_KEYS = [f"{i:032x}" for i in range(0x3a7, 0x3a7 + 10)] + [f"{i:064x}" for i in range(2)]
ODD_KEYS = ["", "\u00e9t\u00e9", 'q"uote', "back\\slash", "tab\tnl\n", "nul\u0000", "\U0001f600", "k" * 70]
COLD_KEYS = [f"{i:032x}" for i in range(0xc01d000, 0xc01d000 + 300)]  # rarely repeated
RANKS = [0, 1, 2, 3, 5, -1, -7, 1000003]
RARE_RANKS = [INT64_MAX, INT64_MIN, 12345678901]
BAD_RANK_TEXTS = ["abc", "1.5", "9223372036854775808", "-9223372036854775809", "+", "-", "%31", "1e3", "0x10"]
BAD_JSON = [b"", b"  ", b"{", b"}", b"{\"rank\":1,}", b"{\"keys\":[NaN]}", b"{} {}", b"{\"a\":Infinity}",
            b"\xff", b"{\"keys\":[\"\xc3\"]}", b"nul", b"{\"keys\":[1,]}", b"{'keys':[]}", b"{\"keys\":[\"a\tb\"]}",
            b"{\"a\":01}", b"{\"a\":-}", b"{\"a\":.5}", b"{\"a\":[}", b"{\"a\" 1}", b"\"\\x\""]
NOT_OBJECT = [b"[]", b"\"x\"", b"1", b"null", b"true", b"[{\"rank\":1}]"]


def env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value else default


class Request:
    __slots__ = ("method", "path", "body", "chunked")

    def __init__(self, method, path, body=b"", chunked=False):
        self.method, self.path, self.body, self.chunked = method, path, body, chunked

    def wire(self, rng):
        head = f"{self.method} {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if self.chunked:
            head += "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            out = head.encode()
            at = 0
            while at < len(self.body):
                n = rng.randint(1, max(1, len(self.body) // 2))
                part = self.body[at:at + n]
                out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
                at += n
            return out + b"0\r\n\r\n"
        if self.body or self.method == "POST":
            head += f"Content-Type: application/json\r\nContent-Length: {len(self.body)}\r\n"
        return head.encode() + b"\r\n" + self.body

    def __repr__(self):
        body = self.body if len(self.body) <= 300 else self.body[:300] + b"..."
        return f"{self.method} {self.path} {body!r}{' (chunked)' if self.chunked else ''}"


class Generator:
    """Random requests, steered by the model's state so that most of them do something."""

    def __init__(self, rng, model, ranks, keys, absent_ranks=(), may_create=True, may_clear=True, cold_keys=()):
        self.rng = rng
        self.model = model
        self.ranks = list(ranks)
        self.keys = list(keys)
        self.cold_keys = list(cold_keys)
        self.absent_ranks = list(absent_ranks)  # never initialised (404 answers)
        self.may_create = may_create  # may initialise ranks not yet there
        self.may_clear = may_clear
        self.pending = []  # requests of a multi-step operation, built when their turn comes
        ops = [(self.tp_save, 4), (self.init_worker, 10), (self.init_other, 4), (self.allocate, 26), (self.confirm, 26),
               (self.exists, 9), (self.locations, 9), (self.rank_info, 6), (self.bad_json, 3),
               (self.bad_route, 2)]
        if may_clear:
            ops.append((self.clear, 0.4))
        self.ops = [op for op, _ in ops]
        self.weights = [w for _, w in ops]

    def busy(self):
        """A multi-step operation is under way: its next request depends on the answers so
        far, so it must be sent alone (not pipelined behind requests not yet answered)."""
        return bool(self.pending)

    def next(self):
        if self.pending:
            return self.pending.pop(0)()
        req = self.rng.choices(self.ops, self.weights)[0]()
        if req.body and req.method == "POST" and self.rng.random() < 0.08:
            req.chunked = True
        return req

    # --- pieces ----------------------------------------------------------------------

    def dumps(self, obj):
        r = self.rng.random()
        if r < 0.7:
            text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        elif r < 0.9:
            text = json.dumps(obj, ensure_ascii=True)
        else:
            text = json.dumps(obj, indent=1, ensure_ascii=False)
        body = text.encode("utf-8", errors="surrogatepass")
        if self.rng.random() < 0.02:
            body = b"\xef\xbb\xbf" + body
        return body

    def with_noise(self, obj):
        """Unknown fields are ignored (but must still be valid JSON)."""
        if self.rng.random() < 0.08:
            obj = dict(obj)
            obj[self.rng.choice(["extra", "prefix_key", "x"])] = self.rng.choice(
                [None, [1, 2.5, {"y": "z"}], "s", 1e300, -0.0, True, 2**64 - 1, -(2**63)])
        return obj

    def rank(self, existing_bias=0.85):
        initialised = [r for r in self.ranks if r in self.model.ranks]
        if initialised and self.rng.random() < existing_bias:
            return self.rng.choice(initialised)
        pool = self.ranks + self.absent_ranks
        if self.may_create and self.rng.random() < 0.05:
            pool = pool + RARE_RANKS
        return self.rng.choice(pool)

    def key_sample(self, lo=1, hi=6):
        n = self.rng.randint(lo, hi)
        ks = [self.rng.choice(self.cold_keys if self.cold_keys and self.rng.random() < 0.15 else self.keys)
              for _ in range(n)]
        if ks and self.rng.random() < 0.2:
            ks.append(self.rng.choice(ks))  # a duplicate
        return ks

    def bad_rank_value(self):
        return self.rng.choice([None, "1", 1.5, True, False, 2**63, 2**64 - 1, 1e300, [1], {"r": 1}])

    def post(self, path, obj):
        return Request("POST", path, self.dumps(self.with_noise(obj)))

    # --- operations ------------------------------------------------------------------

    def tp_save(self):
        """The connector's save of one block range on every TP rank: allocate on each rank,
        then confirm each rank's pages (or, sometimes, release them as a failed write)."""
        keys = list(dict.fromkeys(self.key_sample(1, 4)))
        ranks = [r for r in self.ranks if r in self.model.ranks]
        if not ranks:
            return self.init_worker()

        def allocate(rank):
            return self.post("/keys/batch_allocate", {"rank": rank, "keys": [[k, ""] for k in keys]})

        def finish(rank):
            state = self.model.ranks.get(rank)
            held = [[k, state.page_of[k]] for k in keys if state is not None and k in state.page_of]
            if self.rng.random() < 0.9:
                return self.post("/keys/confirm_write", {"rank": rank, "confirmations": held, "pages_to_release": []})
            return self.post("/keys/confirm_write", {"rank": rank, "confirmations": [],
                                                     "pages_to_release": [p for _, p in held]})

        self.pending = [lambda r=r: allocate(r) for r in ranks[1:]] + [lambda r=r: finish(r) for r in ranks]
        return allocate(ranks[0])

    def init_worker(self):
        rank = self.rank(existing_bias=0.5)
        state = self.model.ranks.get(rank)
        if state is None and not self.may_create:
            rank = self.rng.choice([r for r in self.ranks if r in self.model.ranks] or self.ranks)
            state = self.model.ranks.get(rank)
        if state is not None and self.rng.random() < 0.7:
            pages = max(1, state.num_pages + self.rng.choice([-2, -1, 0, 0, 1, 3]))
        else:  # mostly tiny pools (exhaustion is common), sometimes roomy ones
            pages = self.rng.randint(1, 6) if self.rng.random() < 0.6 else self.rng.randint(8, PAGES_MAX)
        body = {"num_pages": pages} if self.rng.random() < 0.3 else {"num_pages": pages, "role": "worker"}
        text = str(rank) if self.rng.random() < 0.95 else ("+" + str(rank) if rank >= 0 else str(rank))
        return self.post(f"/rank/{text}/initialize", body)

    def init_other(self):
        r = self.rng.random()
        rank = self.rank(existing_bias=0.5)
        if r < 0.25:
            body = {"num_pages": self.rng.choice([0, 5, -1]), "role": "scheduler"}
            return self.post(f"/rank/{rank}/initialize", body)
        if r < 0.4:
            return self.post(f"/rank/{self.rng.choice(BAD_RANK_TEXTS)}/initialize", {"num_pages": 2})
        if r < 0.5:
            return self.post(f"/rank/{rank}/initialize", {"num_pages": self.rng.choice([PAGES_MAX + 1, 2**40])})
        bodies = [{"role": "Worker", "num_pages": 2}, {"role": "", "num_pages": 2}, {"role": 1, "num_pages": 2},
                  {"role": None, "num_pages": 2}, {"num_pages": 0}, {"num_pages": -3}, {"num_pages": "3"},
                  {"num_pages": 1.5}, {"num_pages": 2.0}, {"num_pages": True}, {"num_pages": None}, {},
                  {"role": "worker"}, {"num_pages": 2**63}, {"num_pages": [2]}]
        return self.post(f"/rank/{rank}/initialize", self.rng.choice(bodies))

    def key_item(self, key):
        r = self.rng.random()
        if r < 0.7:
            return [key, ""]
        if r < 0.9:
            return key
        return [key, self.rng.choice(["p", "\u00e9", "0" * 32])]

    def allocate(self):
        r = self.rng.random()
        rank = self.rank()
        items = [self.key_item(k) for k in self.key_sample()]
        if r < 0.05:
            items.insert(self.rng.randint(0, len(items)), self.rng.choice(
                [1, None, [self.keys[0]], [self.keys[0], 1], [1, ""], ["a", "", ""], {}, [], True]))
        elif r < 0.08:
            return self.post("/keys/batch_allocate", {"rank": self.bad_rank_value(), "keys": items})
        elif r < 0.10:
            return self.post("/keys/batch_allocate", {"rank": rank, "keys": self.rng.choice(["k", {}, 1, None])})
        elif r < 0.12:
            return self.post("/keys/batch_allocate", self.rng.choice([{"keys": items}, {"rank": rank}]))
        return self.post("/keys/batch_allocate", {"rank": rank, "keys": items})

    def confirm(self):
        rank = self.rank()
        state = self.model.ranks.get(rank)
        confirmations, releases = [], []
        if state is not None:
            reserved = [(k, p) for k, p in state.page_of.items() if k not in state.confirmed]
            bound = [(k, p) for k, p in state.page_of.items() if k in state.confirmed]
            self.rng.shuffle(reserved)
            task = reserved[:self.rng.randint(0, len(reserved))]
            if self.rng.random() < 0.75:  # the write succeeded: confirm the task
                confirmations = [list(c) for c in task]
                if bound and self.rng.random() < 0.3:
                    confirmations.append(list(self.rng.choice(bound)))  # a no-op re-confirm
            else:  # the write failed: release the task's pages (cache hits included)
                releases = [p for _, p in task]
                if bound and self.rng.random() < 0.5:
                    releases.append(self.rng.choice(bound)[1])
            if self.rng.random() < 0.15:  # something wrong: an unreserved key or page
                wrong = [self.rng.choice(self.keys), self.rng.randint(0, state.num_pages + 1)]
                confirmations.insert(self.rng.randint(0, len(confirmations)), wrong)
            if self.rng.random() < 0.15:
                releases.append(self.rng.randint(0, state.num_pages + 1))
            if confirmations and self.rng.random() < 0.05:  # one page for two keys
                confirmations.append([self.rng.choice(self.keys), confirmations[0][1]])
        else:
            confirmations = [[k, self.rng.randint(0, 3)] for k in self.key_sample(0, 2)]
        r = self.rng.random()
        if r < 0.03:
            confirmations.append(self.rng.choice([["k", -1], ["k"], ["k", 1.0], [1, 1], "k", ["k", "1"], None]))
        elif r < 0.05:
            releases.append(self.rng.choice([-1, 1.5, "2", None, [1]]))
        elif r < 0.07:
            return self.post("/keys/confirm_write", {"rank": self.bad_rank_value(), "confirmations": confirmations})
        elif r < 0.08:
            return self.post("/keys/confirm_write", {"rank": rank, "confirmations": {}, "pages_to_release": []})
        elif r < 0.09:
            return self.post("/keys/confirm_write", {"rank": rank, "confirmations": [], "pages_to_release": 3})
        body = {"rank": rank, "confirmations": confirmations}
        if releases or self.rng.random() < 0.7:
            body["pages_to_release"] = releases
        return self.post("/keys/confirm_write", body)

    def exists(self):
        r = self.rng.random()
        keys = self.key_sample(0, 8)
        if r < 0.04:
            keys.append(self.rng.choice([1, None, ["a"], True]))
        elif r < 0.06:
            return self.post("/keys/batch_exists", {"keys": self.rng.choice(["k", 1, {}, None])})
        elif r < 0.08:
            return self.post("/keys/batch_exists", {})
        return self.post("/keys/batch_exists", {"keys": keys})

    def locations(self):
        r = self.rng.random()
        keys = self.key_sample(0, 8)
        rank = self.rank()
        if r < 0.04:
            keys.append(self.rng.choice([1, None, ["a", ""], True]))
        elif r < 0.06:
            return self.post("/keys/get_locations", {"rank": self.bad_rank_value(), "keys": keys})
        elif r < 0.08:
            return self.post("/keys/get_locations", {"rank": rank})
        return self.post("/keys/get_locations", {"rank": rank, "keys": keys})

    def rank_info(self):
        if self.rng.random() < 0.1:
            return Request("GET", f"/rank/{self.rng.choice(BAD_RANK_TEXTS)}")
        return Request("GET", f"/rank/{self.rank(existing_bias=0.8)}")

    def bad_json(self):
        path = self.rng.choice(["/keys/batch_allocate", "/keys/confirm_write", "/keys/batch_exists",
                                "/keys/get_locations", f"/rank/{self.rank()}/initialize"])
        body = self.rng.choice(BAD_JSON + NOT_OBJECT)
        return Request("POST", path, body)

    def bad_route(self):
        return self.rng.choice([
            Request("GET", "/keys/batch_exists"), Request("PUT", "/keys/batch_allocate", b"{}"),
            Request("DELETE", "/keys/confirm_write"), Request("GET", "/clear"),
            Request("POST", f"/rank/{self.rank()}", b"{}"), Request("GET", f"/rank/{self.rank()}/initialize"),
            Request("POST", "/nope", b"{}"), Request("POST", "/keys/", b"{}"), Request("POST", "/keys/batch_exist", b"{}"),
            Request("POST", "/rank//initialize", b"{}"), Request("POST", f"/rank/{self.rank()}/initialize/x", b"{}"),
            Request("POST", "/keys/batch_exists?verbose=1", b"{\"keys\":[]}"), Request("GET", "/nope"),
            Request("POST", "/clear/", b""), Request("GET", f"/rank/{self.rank()}?x=1"),
        ])

    def clear(self):
        return Request("POST", "/clear", self.rng.choice([b"", b"{}", b"not json"]))


class Mismatch(AssertionError):
    pass


class Session:
    """One connection to the server and one model; runs requests and compares answers."""

    def __init__(self, port, model, rng, label):
        self.conn = RawConnection(port)
        self.model = model
        self.rng = rng
        self.label = label
        self.history = []
        self.count = 0
        self.seen = {}  # what the answers covered: (endpoint, status, detail) → count

    def close(self):
        self.conn.close()

    def run(self, requests):
        """Sends the requests (pipelined when more than one) and checks every answer."""
        self.conn.send(b"".join(req.wire(self.rng) for req in requests))
        for req in requests:
            status, headers, body = self.conn.read_final_response()
            expected = self.model.handle(req.method, req.path, req.body)
            self.count += 1
            self.history.append(req)
            del self.history[:-HISTORY]
            self.compare(req, expected, status, headers, body)

    def compare(self, req, expected, status, headers, body):
        parsed = None
        problem = ""
        if status == 204:
            if body:
                problem = "204 with a body"
        else:
            if headers.get("content-type", "").split(";")[0].strip() != "application/json":
                problem = f"content-type {headers.get('content-type')!r}"
            try:
                parsed = json.loads(body)
            except ValueError:
                problem = "body is not JSON"
        if not problem and not expected.matches(status, parsed):
            problem = "answer differs from the model"
        if not problem:
            self.note(req, status, parsed)
        if problem:
            shown = "\n  ".join(repr(r) for r in self.history)
            raise Mismatch(f"{self.label}, request #{self.count}: {problem}\n  request: {req!r}\n"
                           f"  expected: {expected!r}\n  actual: {status} {body[:600]!r}\n"
                           f"  last requests:\n  {shown}")

    def note(self, req, status, parsed):
        what = req.path.split("?")[0]
        if what.startswith("/rank/"):
            what = "/rank/{r}/initialize" if what.endswith("/initialize") else "/rank/{r}"
        tags = [f"{req.method} {what} {status}"]
        if isinstance(parsed, dict):
            if "results" in parsed:
                pages = [p for _, p in parsed["results"]]
                tags.append("allocate: exhausted" if -1 in pages else "allocate: served")
            if True in parsed.get("exists", []):
                tags.append("exists: a complete key")
            if any(p is not None for p in parsed.get("locations", [])):
                tags.append("locations: a page")
        for tag in tags:
            self.seen[tag] = self.seen.get(tag, 0) + 1

    def coverage(self):
        return ", ".join(f"{k}: {v}" for k, v in sorted(self.seen.items()))

    def check_everything(self, ranks, keys):
        """Every rank's counts and every key's locations and existence against the model."""
        for rank in ranks:
            self.run([Request("GET", f"/rank/{rank}")])
            self.run([Request("POST", "/keys/get_locations", json.dumps({"rank": rank, "keys": keys}).encode())])
        self.run([Request("POST", "/keys/batch_exists", json.dumps({"keys": keys}).encode())])
        problem = self.model.check()
        if problem:
            raise Mismatch(f"{self.label}: the model itself is inconsistent: {problem}")


def seeds_to_run():
    if os.environ.get("DIFF_SEED"):
        return [int(os.environ["DIFF_SEED"])]
    fresh = [random.SystemRandom().randrange(1, 2**31) for _ in range(env_int("DIFF_SEEDS", 2))]
    return list(FIXED_SEEDS) + fresh


class DifferentialTest(MetadTestCase):
    # Released pages stay quarantined longer than any run: the model keeps them in order.
    extra_args = ("--pages-per-rank-max", str(PAGES_MAX), "--release-quarantine-ms", "86400000")

    def run_sequence(self, seed, ops):
        rng = random.Random(seed)
        model = Model(pages_max=PAGES_MAX, quarantine=True)
        gen = Generator(rng, model, RANKS, HEX_KEYS + ODD_KEYS, absent_ranks=[4, -2], cold_keys=COLD_KEYS)
        session = Session(self.port, model, rng, f"seed {seed} (replay: DIFF_SEED={seed} DIFF_OPS={ops})")
        try:
            session.run([Request("POST", "/clear")])
            done = 0
            while done < ops:
                n = 1 if gen.busy() or rng.random() < 0.8 else rng.randint(2, 6)
                n = min(n, ops - done)
                session.run([gen.next() for _ in range(n)])
                done += n
            session.check_everything(RANKS + RARE_RANKS, HEX_KEYS + ODD_KEYS + COLD_KEYS)
        finally:
            session.close()
        if os.environ.get("DIFF_VERBOSE"):
            print(f"differential: seed {seed} covered {session.coverage()}", file=sys.stderr)
        return session.count

    def test_random_sequences_match_the_model(self):
        ops = env_int("DIFF_OPS", DEFAULT_OPS)
        for seed in seeds_to_run():
            print(f"\ndifferential: seed {seed}, {ops} operations", file=sys.stderr, flush=True)
            with self.subTest(seed=seed):
                count = self.run_sequence(seed, ops)
                print(f"differential: seed {seed}: {count} answers match the model", file=sys.stderr, flush=True)

    def test_numbers_beyond_64_bits_are_valid_json(self):
        """JSON numbers outside int64/uint64/double range are valid JSON (the reference's
        json.loads accepts them): accepted in fields nobody reads; where a rank, page or
        num_pages is read, they are a 400 like any other non-int64."""
        model = Model(pages_max=PAGES_MAX)
        session = Session(self.port, model, random.Random(0), "numbers beyond 64 bits")
        try:
            session.run([Request("POST", "/rank/1/initialize", b'{"num_pages":4}')])
            for body in [b'{"keys":[],"unread":123456789012345678901234567890}',
                         b'{"keys":[],"unread":-9223372036854775809}',
                         b'{"keys":[],"unread":1e999}',
                         b'{"keys":["a"],"unread":[18446744073709551616]}']:
                session.run([Request("POST", "/keys/batch_exists", body)])
            session.run([Request("POST", "/keys/batch_allocate", b'{"rank":-9223372036854775809,"keys":[]}')])
            session.run([Request("POST", "/rank/1/initialize", b'{"num_pages":18446744073709551616}')])
        finally:
            session.close()

    def test_concurrent_disjoint_clients_match_their_models(self):
        threads = env_int("DIFF_THREADS", 4)
        ops = env_int("DIFF_OPS", CONCURRENT_OPS)
        seed = int(os.environ["DIFF_SEED"]) if os.environ.get("DIFF_SEED") else random.SystemRandom().randrange(1, 2**31)
        print(f"\ndifferential (concurrent): seed {seed}, {threads} threads x {ops} operations",
              file=sys.stderr, flush=True)
        # Thread t owns three ranks (spread over the cores, negative for odd t) and its own
        # keys. All ranks are initialised up front and none is created later, so every
        # key's tp_world_size is the same known number whatever the interleaving.
        owned = [[(1 if t % 2 == 0 else -1) * (100 * (t + 1) + i) for i in range(3)] for t in range(threads)]
        total = sum(len(r) for r in owned)
        models, sessions, errors = [], [], []
        for t in range(threads):
            model = Model(pages_max=PAGES_MAX, quarantine=True)
            model.external_workers = total - len(owned[t])
            rng = random.Random(seed * 1000 + t)
            session = Session(self.port, model, rng, f"thread {t} of concurrent seed {seed} "
                                                     f"(replay: DIFF_SEED={seed} DIFF_OPS={ops} DIFF_THREADS={threads})")
            session.run([Request("POST", f"/rank/{r}/initialize", json.dumps({"num_pages": rng.randint(2, 8)}).encode())
                         for r in owned[t]])
            models.append(model)
            sessions.append(session)
        keys = [[f"t{t}-{k}" for k in HEX_KEYS[:8]] + [f"t{t}-\u00e9"] for t in range(threads)]

        def work(t):
            try:
                rng = sessions[t].rng
                gen = Generator(rng, models[t], owned[t], keys[t], absent_ranks=[-(100 * (t + 1) + 50)],
                                may_create=False, may_clear=False)
                done = 0
                while done < ops:
                    n = 1 if gen.busy() or rng.random() < 0.8 else rng.randint(2, 5)
                    sessions[t].run([gen.next() for _ in range(n)])
                    done += n
                sessions[t].check_everything(owned[t], keys[t])
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for s in sessions:
            s.close()
        if errors:
            raise errors[0]
        # The page invariant, through the API, on every rank.
        for t in range(threads):
            for r in owned[t]:
                info = self.rank_info(r)
                self.assertEqual(info["free"] + info["reserved"] + info["bound"], info["num_pages"], info)
                model = models[t]
                incomplete = sum(1 for k in model.ranks[r].confirmed if not model.complete(k))
                self.assertEqual(info, {**model.ranks[r].stats(), "incomplete": incomplete})
        print(f"differential (concurrent): seed {seed}: {sum(s.count for s in sessions)} answers match",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    unittest.main()
