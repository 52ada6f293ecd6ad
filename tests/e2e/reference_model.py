"""A deliberately simple reference implementation of docs/api.md (the HTTP contract).

Single-threaded, dicts and sets, no performance: it exists to be obviously right, so that
test_differential.py can compare every answer of the real server with it. It models the
request/response level only (method, path, body → status and JSON body); HTTP framing
is covered by the fuzzers and test_bad_input.py.

Every **Fix** of the spec is here: `>=` completeness, hits and duplicates not counted
against the pool, a key keeps its page, all-or-nothing allocation over the misses,
lowest-free-first pages, whole-request validation of confirm_write, releases that never
free a bound page, grow/shrink of a re-initialised rank, 404 for an unknown rank, 400 for
bad JSON and bad shapes.

Where the spec asks only for "a clear detail", the texts below are the server's (so that
bodies compare exactly); they are marked `# server wording`.

Standard library only.
"""

import collections
import heapq
import json

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
DEFAULT_PAGES_MAX = 2**28

NEED_RANK_KEYS = "Invalid request format: need 'rank' and 'keys'"
NEED_RANK_CONFIRMATIONS = "Invalid request format: need 'rank' and 'confirmations'"
RELEASES_NOT_LIST = "Invalid request format: 'pages_to_release' must be a list of page numbers"  # server wording
INVALID_KEYS_FORMAT = "Invalid keys format"
INVALID_INIT = "Invalid initialization parameters"
INVALID_RANK_IN_PATH = "Invalid rank in path"
SCHEDULER_MESSAGE = "Scheduler role does not require initialization"
INVALID_JSON_PREFIX = "Invalid JSON body: "


class Answer:
    """An expected answer: status and JSON body (None for 204).

    detail_prefix: the body is {"detail": text} where only this prefix is specified
    (invalid JSON: the reason after it is the parser's own words).
    """

    __slots__ = ("status", "body", "detail_prefix")

    def __init__(self, status, body=None, detail_prefix=None):
        self.status = status
        self.body = body
        self.detail_prefix = detail_prefix

    def matches(self, status, body):
        """body: the parsed JSON of the actual answer (None when it had no body)."""
        if status != self.status:
            return False
        if self.detail_prefix is not None:
            return (isinstance(body, dict) and list(body) == ["detail"] and isinstance(body["detail"], str)
                    and body["detail"].startswith(self.detail_prefix)
                    and len(body["detail"]) > len(self.detail_prefix))
        return _same_json(body, self.body)

    def __repr__(self):
        if self.detail_prefix is not None:
            return f"Answer({self.status}, detail starting {self.detail_prefix!r})"
        return f"Answer({self.status}, {self.body!r})"


def _same_json(a, b):
    """Equality that also tells bool from int (True == 1 in Python)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _error(status, detail):
    return Answer(status, {"detail": detail})


class _BadJson(Exception):
    pass


def _reject_constant(name):
    raise _BadJson(name)


def parse_body(raw):
    """The request body as a JSON object (dict), or an Answer for a 400."""
    if raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark is accepted
        raw = raw[3:]
    try:
        text = raw.decode("utf-8", errors="strict")
        value = json.loads(text, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, _BadJson, RecursionError):
        return Answer(400, detail_prefix=INVALID_JSON_PREFIX)
    if not isinstance(value, dict):
        return _error(400, "Invalid JSON body: expected an object")
    return value


def is_int64(value):
    """A JSON integer token within int64 (json.loads makes 1.0 and 1e2 floats)."""
    return type(value) is int and INT64_MIN <= value <= INT64_MAX


def parse_rank(text):
    """The {rank} path segment: optional sign, then decimal digits, within int64."""
    digits = text[1:] if text[:1] in ("-", "+") else text
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    value = int(digits)
    if text[:1] == "-":
        value = -value
    return value if INT64_MIN <= value <= INT64_MAX else None


class Rank:
    """One worker rank: its page pool and its key → page map."""

    def __init__(self, num_pages, quarantine=False):
        self.num_pages = 0
        self.free = set()
        # Pages confirm_write released, oldest first, with the server's quarantine on
        # (--release-quarantine-ms longer than the run): taken only when nothing is free.
        self.quarantine_on = quarantine
        self.quarantine = collections.deque()
        self._heap = []  # candidate free pages; stale entries are skipped
        self.page_of = {}  # key → page (reserved or confirmed)
        self.confirmed = set()  # keys whose page is bound on this rank
        self.key_of = {}  # page → key, for every reserved or bound page
        self.grow(num_pages)

    def grow(self, num_pages):
        for page in range(self.num_pages, num_pages):
            self.free.add(page)
            heapq.heappush(self._heap, page)
        self.num_pages = num_pages

    def shrink(self, num_pages):
        """Pages from num_pages on no longer exist: their keys lose them. Returns the keys
        that were bound there."""
        unbound = []
        for page in [p for p in self.key_of if p >= num_pages]:
            key = self.key_of.pop(page)
            del self.page_of[key]
            if key in self.confirmed:
                self.confirmed.remove(key)
                unbound.append(key)
        self.quarantine = collections.deque(p for p in self.quarantine if p < num_pages)
        self.free = {p for p in self.free if p < num_pages}
        self.num_pages = num_pages
        return unbound

    def free_count(self):
        return len(self.free) + len(self.quarantine)

    def take_lowest(self):
        if not self.free:
            return self.quarantine.popleft()
        while True:
            page = heapq.heappop(self._heap)
            if page in self.free:
                self.free.remove(page)
                return page

    def give_back(self, page):
        self.free.add(page)
        heapq.heappush(self._heap, page)

    def release(self, page):
        """A page confirm_write's pages_to_release freed."""
        if self.quarantine_on:
            self.quarantine.append(page)
        else:
            self.give_back(page)

    def stats(self):
        bound = len(self.confirmed)
        reserved = len(self.page_of) - bound
        return {"num_pages": self.num_pages, "free": self.free_count(), "reserved": reserved,
                "bound": bound}

    def check(self):
        """The page invariant; returns a description of the first violation or ''."""
        if self.free_count() + len(self.page_of) != self.num_pages:
            return f"free {self.free_count()} + held {len(self.page_of)} != num_pages {self.num_pages}"
        for key, page in self.page_of.items():
            if self.key_of.get(page) != key or page in self.free or not 0 <= page < self.num_pages:
                return f"key {key!r} page {page} inconsistent"
        if len(self.key_of) != len(self.page_of):
            return "a page belongs to two keys"
        return ""


class Model:
    """The whole server state and its request handling."""

    def __init__(self, pages_max=DEFAULT_PAGES_MAX, quarantine=False):
        self.pages_max = pages_max
        self.quarantine = quarantine  # see Rank
        self.ranks = {}
        # key → [tp_world_size, set of ranks that confirmed it]
        self.directory = {}
        # Worker ranks initialised elsewhere (other threads' disjoint ranks): they count
        # toward a key's tp_world_size.
        self.external_workers = 0
        self.refused_releases = 0

    # --- routing -------------------------------------------------------------------

    def handle(self, method, path, body=b""):
        """The answer to one request. `path` may carry a query string."""
        path = path.split("?", 1)[0]
        if path.startswith("/keys/"):
            name = path[len("/keys/"):]
            handlers = {
                "batch_allocate": self.batch_allocate,
                "confirm_write": self.confirm_write,
                "batch_exists": self.batch_exists,
                "get_locations": self.get_locations,
            }
            if name not in handlers:
                return _error(404, "Not Found")
            if method != "POST":
                return _error(405, "Method Not Allowed")
            return handlers[name](body)
        if path.startswith("/rank/"):
            rest = path[len("/rank/"):]
            rank_text, slash, tail = rest.partition("/")
            if not rank_text:
                return _error(404, "Not Found")
            if not slash:
                if method != "GET":
                    return _error(405, "Method Not Allowed")
                return self.rank_info(rank_text)
            if "/" + tail != "/initialize":
                return _error(404, "Not Found")
            if method != "POST":
                return _error(405, "Method Not Allowed")
            return self.initialize(rank_text, body)
        if path == "/clear":
            if method != "POST":
                return _error(405, "Method Not Allowed")
            return self.clear()
        return _error(404, "Not Found")

    # --- endpoints -----------------------------------------------------------------

    def worker_count(self):
        return len(self.ranks) + self.external_workers

    def complete(self, key):
        entry = self.directory.get(key)
        return entry is not None and len(entry[1]) >= entry[0]

    def initialize(self, rank_text, body):
        rank = parse_rank(rank_text)
        if rank is None:
            return _error(400, INVALID_RANK_IN_PATH)
        obj = parse_body(body)
        if isinstance(obj, Answer):
            return obj
        role = obj.get("role", "worker")
        if not isinstance(role, str):
            return _error(400, INVALID_INIT)
        if role == "scheduler":
            return Answer(200, {"message": SCHEDULER_MESSAGE})
        num_pages = obj.get("num_pages")
        if role != "worker" or not is_int64(num_pages) or num_pages <= 0:
            return _error(400, INVALID_INIT)
        if num_pages > self.pages_max:
            return _error(400, f"num_pages exceeds the limit of {self.pages_max}")
        state = self.ranks.get(rank)
        if state is None:
            self.ranks[rank] = Rank(num_pages, self.quarantine)
        elif num_pages < state.num_pages:
            for key in state.shrink(num_pages):  # bindings lost: one confirmation less
                entry = self.directory[key]
                entry[1].discard(rank)
                if not entry[1]:
                    del self.directory[key]
        else:
            state.grow(num_pages)
        return Answer(200, {"message": f"Rank {rank} initialized with {num_pages} pages"})

    @staticmethod
    def _rank_and_list(obj, list_name, shape_detail):
        """(rank, list) or an Answer; a missing list is empty."""
        rank = obj.get("rank")
        if not is_int64(rank):
            return _error(400, shape_detail)
        items = obj.get(list_name, [])
        if not isinstance(items, list):
            return _error(400, shape_detail)
        return rank, items

    @staticmethod
    def _string_keys(items):
        for i, item in enumerate(items):
            if not isinstance(item, str):
                return _error(400, f"Invalid key at index {i}: expected a string")
        return None

    def batch_allocate(self, body):
        obj = parse_body(body)
        if isinstance(obj, Answer):
            return obj
        got = self._rank_and_list(obj, "keys", NEED_RANK_KEYS)
        if isinstance(got, Answer):
            return got
        rank, items = got
        keys = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                keys.append(item)
            elif (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                  and isinstance(item[1], str)):
                keys.append(item[0])
            else:
                return _error(400, f"Invalid key at index {i}: expected a string or a "
                                   f"[key, prefix_key] pair of strings")
        state = self.ranks.get(rank)
        if state is None:
            return _error(404, f"Allocation failed: Rank {rank} not initialized")
        distinct = list(dict.fromkeys(keys))
        misses = [k for k in distinct if k not in state.page_of]
        pages = {}
        if len(misses) <= state.free_count():  # all or nothing over the keys needing a page
            for k in misses:
                page = state.take_lowest()
                state.page_of[k] = page
                state.key_of[page] = k
                pages[k] = page
        results = [[k, state.page_of.get(k, pages.get(k, -1))] for k in distinct]
        return Answer(200, {"rank": rank, "results": results})

    def confirm_write(self, body):
        obj = parse_body(body)
        if isinstance(obj, Answer):
            return obj
        got = self._rank_and_list(obj, "confirmations", NEED_RANK_CONFIRMATIONS)
        if isinstance(got, Answer):
            return got
        rank, items = got
        releases = obj.get("pages_to_release", [])
        if not isinstance(releases, list):
            return _error(400, RELEASES_NOT_LIST)
        confirmations = []
        for i, item in enumerate(items):
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                    and is_int64(item[1]) and item[1] >= 0):
                return _error(400, f"Invalid confirmation at index {i}: expected [key, page] with "
                                   f"a string key and a non-negative integer page")  # server wording
            confirmations.append((item[0], item[1]))
        for i, page in enumerate(releases):
            if not is_int64(page) or page < 0:
                return _error(400, f"Invalid page in pages_to_release at index {i}")  # server wording
        state = self.ranks.get(rank)
        if state is None:
            return _error(404, f"Confirm failed: Rank {rank} not initialized")  # server wording
        # Validate the whole request before applying any of it (server wording below).
        for i, (key, page) in enumerate(confirmations):
            if page >= state.num_pages:
                return _error(400, f"Page {page} out of range for rank {rank} (num_pages {state.num_pages})")
            if state.page_of.get(key) == page:
                continue  # reserved for this key, or bound to it already
            if any(p == page and k != key for k, p in confirmations[:i]):
                return _error(400, f"Page {page} confirmed for two different keys")
            return _error(400, f"Page {page} is not reserved for key {key} on rank {rank}")
        for page in releases:
            if page >= state.num_pages:
                return _error(400, f"Page {page} in pages_to_release out of range for rank {rank} "
                                   f"(num_pages {state.num_pages})")
        tp_world_size = self.worker_count()
        for key, _page in confirmations:
            if key in state.confirmed:
                continue
            state.confirmed.add(key)
            entry = self.directory.setdefault(key, [tp_world_size, set()])
            entry[1].add(rank)
        for page in releases:
            key = state.key_of.get(page)
            if key is None:
                continue  # free already: a no-op
            if key in state.confirmed:
                self.refused_releases += 1  # a live cache hit is never freed
                continue
            del state.key_of[page]
            del state.page_of[key]
            state.release(page)
        return Answer(204)

    def batch_exists(self, body):
        obj = parse_body(body)
        if isinstance(obj, Answer):
            return obj
        keys = obj.get("keys", [])
        if not isinstance(keys, list):
            return _error(400, INVALID_KEYS_FORMAT)
        bad = self._string_keys(keys)
        if bad:
            return bad
        return Answer(200, {"exists": [self.complete(k) for k in keys]})

    def get_locations(self, body):
        obj = parse_body(body)
        if isinstance(obj, Answer):
            return obj
        got = self._rank_and_list(obj, "keys", NEED_RANK_KEYS)
        if isinstance(got, Answer):
            return got
        rank, keys = got
        bad = self._string_keys(keys)
        if bad:
            return bad
        state = self.ranks.get(rank)
        if state is None:
            return _error(404, f"Failed to get key locations: Rank {rank} not initialized")
        return Answer(200, {"locations": [
            state.page_of[k] if k in state.confirmed and self.complete(k) else None for k in keys]})

    def clear(self):
        self.ranks.clear()
        self.directory.clear()
        return Answer(204)

    def rank_info(self, rank_text):
        rank = parse_rank(rank_text)
        if rank is None:
            return _error(400, INVALID_RANK_IN_PATH)
        state = self.ranks.get(rank)
        if state is None:
            return _error(404, f"Rank {rank} not initialized")  # server wording
        incomplete = sum(1 for k in state.confirmed if not self.complete(k))
        return Answer(200, {**state.stats(), "incomplete": incomplete})

    # --- whole-state check -----------------------------------------------------------

    def check(self):
        for rank, state in self.ranks.items():
            problem = state.check()
            if problem:
                return f"model rank {rank}: {problem}"
        return ""
