#!/usr/bin/python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<harness>/).

Seeds are realistic vLLM connector traffic (the request shapes of vLLM's Python client:
python-requests headers, compact JSON, 32/64-hex block keys), pipelined and chunked
streams, and malformed inputs. Each harness reads a few header bytes before its payload
(see the harness sources); this script adds them. Rerun after changing the seeds:
    /usr/bin/python3 tests/fuzz/make_seeds.py
data_dir_fuzz's seeds are data directories a node wrote, so a C++ program makes them
(data_dir_seeds.cpp); this script leaves corpus/data_dir_fuzz/ alone.
"""
import hashlib
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def key(i, width=32):
    return hashlib.sha256(str(i).encode()).hexdigest()[:width]


def body(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def post(path, payload, extra=b"", version=b"HTTP/1.1"):
    return (b"POST " + path.encode() + b" " + version + b"\r\nHost: 127.0.0.1:18000\r\n"
            b"User-Agent: python-requests/2.28.1\r\nAccept-Encoding: gzip, deflate\r\n"
            b"Accept: */*\r\nConnection: keep-alive\r\nContent-Length: " + str(len(payload)).encode() +
            b"\r\nContent-Type: application/json\r\n" + extra + b"\r\n" + payload)


def chunked(path, payload, pieces=3, trailer=b""):
    step = max(1, len(payload) // pieces)
    out = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    for i in range(0, len(payload), step):
        part = payload[i:i + step]
        out += format(len(part), "x").encode() + b"\r\n" + part + b"\r\n"
    return out + b"0\r\n" + trailer + b"\r\n"


def vllm_bodies():
    keys = [key(i) for i in range(6)]
    return {
        "init_scheduler": ("/rank/0/initialize", {"num_pages": 0, "role": "scheduler"}),
        "init_worker0": ("/rank/0/initialize", {"num_pages": 8, "role": "worker"}),
        "init_worker1": ("/rank/1/initialize", {"num_pages": 4, "role": "worker"}),
        "init_negative": ("/rank/-3/initialize", {"num_pages": 2}),
        "allocate": ("/keys/batch_allocate", {"rank": 0, "keys": [[k, ""] for k in keys[:4]]}),
        "allocate_dup": ("/keys/batch_allocate", {"rank": 1, "keys": [[keys[0], ""], keys[1], [keys[0], ""]]}),
        "allocate_many": ("/keys/batch_allocate", {"rank": 1, "keys": [[k, ""] for k in keys]}),
        "confirm": ("/keys/confirm_write", {"rank": 0, "confirmations": [[keys[0], 0], [keys[1], 1]],
                                            "pages_to_release": []}),
        "confirm_fail": ("/keys/confirm_write", {"rank": 0, "confirmations": [], "pages_to_release": [2, 3]}),
        "exists": ("/keys/batch_exists", {"keys": keys + [keys[0]]}),
        "locations": ("/keys/get_locations", {"rank": 0, "keys": keys[:3]}),
        "sha256_keys": ("/keys/batch_exists", {"keys": [key(i, 64) for i in range(40)]}),
        "delete": ("/keys/delete", {"keys": [keys[1], keys[4], keys[1], "nope"]}),
        "inspect": ("/keys/inspect", {"keys": [keys[0], keys[2], keys[5], "nope", keys[0]]}),
    }


def http_streams():
    b = vllm_bodies()
    streams = {name: post(path, body(obj)) for name, (path, obj) in b.items()}
    flow = ["init_scheduler", "init_worker0", "init_worker1", "allocate", "confirm", "exists",
            "locations", "allocate_dup", "confirm_fail", "allocate_many"]
    streams["pipelined_flow"] = b"".join(streams[n] for n in flow)
    streams["rank_info"] = b"GET /rank/0 HTTP/1.1\r\nHost: t\r\n\r\n"
    streams["stats"] = b"GET /stats HTTP/1.1\r\nHost: t\r\n\r\nPOST /stats HTTP/1.1\r\n\r\n"
    # Rank 1 (4 pages) fills up, then takes more keys: eviction; then a delete.
    streams["evict_then_delete"] = (streams["pipelined_flow"] + streams["allocate_many"] +
                                    streams["locations"] + streams["delete"] + streams["exists"])
    streams["probes"] = (b"GET /health HTTP/1.1\r\n\r\nGET /ready HTTP/1.1\r\n\r\n"
                         b"GET /metrics HTTP/1.1\r\n\r\nPOST /health HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    streams["rank_info_bad"] = b"GET /rank/x1 HTTP/1.1\r\nHost: t\r\n\r\n"
    streams["clear"] = post("/clear", b"")
    streams["flow_then_clear"] = streams["pipelined_flow"] + post("/clear", b"{}") + streams["exists"]
    streams["chunked_allocate"] = chunked("/keys/batch_allocate", body(b["allocate"][1]), 4,
                                          b"X-Trailer: 1\r\n")
    streams["chunked_then_plain"] = chunked("/keys/batch_exists", body(b["exists"][1])) + streams["locations"]
    streams["expect_continue"] = post("/keys/batch_exists", body(b["sha256_keys"][1]), b"Expect: 100-continue\r\n")
    streams["http10"] = post("/keys/batch_exists", body(b["exists"][1]), version=b"HTTP/1.0")
    streams["http10_keepalive"] = (post("/rank/0", b"", b"Connection: keep-alive\r\n", b"HTTP/1.0") +
                                   streams["exists"])
    streams["connection_close"] = post("/keys/batch_exists", b'{"keys":[]}', b"Connection: close\r\n") + streams["exists"]
    streams["leading_crlf"] = b"\r\n\r\n" + streams["exists"] + b"\r\n" + streams["locations"]
    streams["query_string"] = b"POST /keys/batch_exists?x=1 HTTP/1.1\r\nContent-Length: 11\r\n\r\n{\"keys\":[]}"
    streams["wrong_method"] = b"GET /keys/batch_exists HTTP/1.1\r\n\r\nPUT /clear HTTP/1.1\r\n\r\n"
    streams["not_found"] = b"POST /nope HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    streams["length_and_chunked"] = (b"POST /clear HTTP/1.1\r\nContent-Length: 3\r\n"
                                     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    streams["bad_length"] = b"POST /clear HTTP/1.1\r\nContent-Length: 1x\r\n\r\n"
    streams["two_lengths"] = b"POST /clear HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
    streams["unknown_coding"] = b"POST /clear HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    streams["bad_chunk"] = b"POST /clear HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    streams["bad_version"] = b"POST /clear HTTP/2.0\r\n\r\n"
    streams["bad_request_line"] = b"POST  /clear HTTP/1.1\r\n\r\n"
    streams["bare_lf"] = b"POST /clear HTTP/1.1\nContent-Length: 0\n\n"
    streams["obs_fold"] = b"POST /clear HTTP/1.1\r\nX: a\r\n b\r\n\r\n"
    streams["huge_length"] = b"POST /keys/batch_exists HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"
    streams["long_header"] = b"GET /rank/1 HTTP/1.1\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n"
    streams["nan_body"] = post("/rank/2/initialize", b'{"num_pages":NaN}')
    streams["trailing_body"] = post("/keys/batch_exists", b'{"keys":[]} x')
    streams["float_pages"] = post("/rank/2/initialize", b'{"num_pages":8.0,"role":"worker"}')
    streams["grow_shrink"] = (post("/rank/7/initialize", b'{"num_pages":2}') +
                              post("/rank/7/initialize", b'{"num_pages":5}') +
                              post("/rank/7/initialize", b'{"num_pages":3}'))
    streams["confirm_unreserved"] = (post("/rank/4/initialize", b'{"num_pages":3}') +
                                     post("/keys/confirm_write", b'{"rank":4,"confirmations":[["a",1]]}') +
                                     post("/keys/confirm_write", b'{"rank":4,"confirmations":[["a",9]]}') +
                                     post("/keys/confirm_write", b'{"rank":4,"pages_to_release":[5]}'))
    streams["bad_keys"] = post("/keys/batch_allocate", b'{"rank":0,"keys":[["a"],1,["a","b","c"]]}')
    # SGLang's HiCache API (docs/sglang-api.md): a save, a failed write's release, a load,
    # eviction, a tenant, and bad input.
    h = [key(i, 64) for i in range(5)]
    sg = [
        ("/0/initialize", {"num_pages": 3, "namespace": "kv"}),
        ("/0/initialize", {"num_pages": 2, "namespace": "mamba"}),
        ("/0/reserve_and_allocate_page_indices", {"keys": [[k, ""] for k in h[:3]] + [[h[0], ""]],
                                                  "namespace": "kv"}),
        ("/0/confirm_write", {"written_keys_to_confirm": [[h[0], 2], [h[1], 1]],
                              "pages_to_release": [0], "namespace": "kv"}),
        ("/0/exists", {"keys": h, "namespace": "kv"}),
        ("/0/get_page_indices", {"keys": h[:2], "namespace": "kv"}),
        ("/0/reserve_and_allocate_page_indices", {"keys": [[k, ""] for k in h[2:]], "namespace": "kv"}),
        ("/0/inspect", {"keys": h + ["nope"], "namespace": "kv"}),
        ("/0/delete_keys", {"keys": [h[0]], "namespace": "kv"}),
        ("/0/clear", {"namespace": "mamba"}),
    ]
    streams["sglang_flow"] = b"".join(post(p, body(o)) for p, o in sg)
    streams["sglang_tenant"] = (post("/llama70b/1/initialize", b'{"num_pages":2}') +
                                post("/llama70b/1/reserve_and_allocate_page_indices", b'{"keys":["a","b","c"]}') +
                                post("/llama70b/x/exists", b'{}') + post("/1/exists", b'{"keys":["a"]}') +
                                post("/llama70b/1/inspect", b'{"keys":["a","b","z"]}') +
                                b"GET /stats HTTP/1.1\r\n\r\n" + b"GET /status.json HTTP/1.1\r\n\r\n")
    streams["sglang_bad"] = (post("/2/exists", b'{"keys":"ab"}') + post("/2/clear", b"") +
                             post("/2/initialize", b'{"num_pages":true}') +
                             post("/2/initialize", b'{"num_pages":1,"namespace":null}') +
                             post("/99999999999999999999/exists", b'{}') +
                             post("/2/initialize", b'{"num_pages":2}') +
                             post("/2/confirm_write", b'{"written_keys_to_confirm":[["a",5]]}') +
                             post("/2/confirm_write", b'{"written_keys_to_confirm":[["a",1]],"pages_to_release":[1]}') +
                             post("/+02/reserve_and_allocate_page_indices", b'{"keys":[["a"],"b"]}'))
    return streams


JSON_BODIES = [
    b'{"num_pages":0,"role":"scheduler"}', b'{"num_pages":16,"role":"worker"}', b'{}',
    b'{"role":"Worker","num_pages":3}', b'{"num_pages":"3"}', b'{"num_pages":1e3}',
    b'{"num_pages":9223372036854775808}', b'{"num_pages":-1}', b'{"num_pages":268435457}',
    b'{"rank":0,"keys":[["' + key(1).encode() + b'",""],"' + key(2).encode() + b'"]}',
    b'{"rank":-5,"keys":[]}', b'{"rank":null,"keys":[]}', b'{"rank":1,"keys":{}}',
    b'{"rank":1,"keys":[["a","b","c"]]}', b'{"rank":1,"keys":[[1,""]]}',
    b'{"rank":0,"confirmations":[["a",0],["b",1]],"pages_to_release":[2,3]}',
    b'{"rank":0,"confirmations":[["a",-1]]}', b'{"rank":0,"pages_to_release":"x"}',
    b'{"keys":["a","b","a"]}', b'{"keys":[1]}', b'{"keys":"a"}',
    b'{"rank":true,"keys":[]}', b'{"rank":1.0,"keys":[]}',
    b'\xef\xbb\xbf{"keys":[]}', b'{"keys":["\\u00e9\\ud83d\\ude00\\n"]}', b'{"keys":["\xc3\xa9"]}',
    b'{"keys":["\xff"]}', b'{"keys":[]} {}', b'[1,2]', b'"x"', b'', b'{"a":NaN}', b'{"a":Infinity}',
    b'{"a":[' * 40 + b']}' * 40, b'{"rank":1,"rank":2,"keys":[]}', b'{"x":{"y":[1,2,{"z":null}]},"keys":[]}',
    b'{"keys":[], "a": 1e999}', b'{"keys":[],"a":-0}', b'{"keys":[],"a":123456789012345678901234567890}',
]

# sglang_state_fuzz: state files of SGLang's own metadata server, as its save_to_disk
# writes them (json.dump, indent=4), and broken ones.
SGLANG_STATES = [
    {"0:kv": {"num_pages": 6, "free_pages": [1, 0], "key_to_index": [[key(1, 64), 5], [key(2, 64), 3]]},
     "3": {"num_pages": 3, "free_pages": [2], "key_to_index": [["a", 0], ["b", 1]]},
     "0:indexer": {"num_pages": 2, "free_pages": [0, 1], "key_to_index": []}},
    {"-1:ns:with:colons": {"num_pages": 0, "free_pages": [], "key_to_index": []}},
    {"0:kv": {"num_pages": 3, "free_pages": [2, 1, 0], "key_to_index": [["a", 1]]}},
    {"0:kv": {"num_pages": 2, "free_pages": [0, 0], "key_to_index": []}},
    {"0:kv": {"num_pages": 2, "free_pages": [], "key_to_index": [["a", 0], ["a", 1]]}},
    {"0:kv": {"num_pages": 2, "free_pages": [], "key_to_index": [["a", 0], ["b", 0]]}},
    {"0": {"num_pages": 1, "free_pages": [0], "key_to_index": []},
     "0:kv": {"num_pages": 1, "free_pages": [0], "key_to_index": []}},
    {"x:kv": {}}, {"0:": {}}, {"0:kv": []}, {"0:kv": {"num_pages": True}}, {},
]

# tenants_file_fuzz: --tenants-file texts, good and bad (docs/operations.md, *Tenants*).
H = [key(i, 64) for i in range(4)]
TENANTS_FILES = [
    f"# tenants\nllama70b {H[0]} ranks=8 vllm\nqwen {H[1]},{H[2]} ranks=4  # rotating\n\n_x.y-z {H[3]}\n",
    f"a {H[0]}\r\nb {H[1]} ranks=0\n",
    f"a {H[0]}\na {H[1]}\n",                       # a name twice
    f"a {H[0]}\nb {H[0]}\n",                       # a hash twice
    f"a {H[0]},{H[0]}\n",                           # a hash twice on one line
    f"a {H[0]} vllm\nb {H[1]} vllm\n",             # two vllm tenants
    f"rank {H[0]}\n", f"9a {H[0]}\n", f"a {H[0][:63]}\n", f"a {H[0]} pages=4\n",
    f"a {H[0]},{H[1]},{H[2]}\n", f"a {H[0]} ranks=-1\n", f"a {H[0]} ranks=99999999999999999999\n",
    f"a {H[0].upper()}\n", "", "\n\n# only comments\n",
    f"a {H[0]} pages=0 ranks=2 vllm\nb {H[1]} pages=281474976710656\n",
    f"a {H[0]} pages=281474976710657\n", f"a {H[0]} pages=-1\n", f"a {H[0]} pages=1 pages=2\n",
]


def write(harness, name, data):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# The corpora this script writes (each is written afresh).
HARNESSES = ("http_parser_fuzz", "json_decode_fuzz", "pipeline_fuzz", "sglang_state_fuzz",
             "tenants_file_fuzz")


def main():
    for harness in HARNESSES:
        shutil.rmtree(os.path.join(CORPUS, harness), ignore_errors=True)
    streams = http_streams()
    for i, (name, data) in enumerate(sorted(streams.items())):
        # http_parser_fuzz: byte 0 = limits/options, bytes 1-2 = split seed.
        write("http_parser_fuzz", name, bytes([0, i & 0xFF, 0]) + data)
        write("http_parser_fuzz", name + "-small-limits-grow", bytes([0x3A, (i * 7) & 0xFF, 1]) + data)
        # pipeline_fuzz: byte 0 = home core (+0x80: clear first), bytes 1-2 = split seed.
        write("pipeline_fuzz", name, bytes([i % 3, i & 0xFF, 0]) + data)
    # json_decode_fuzz: byte 0 = endpoint (0 initialize, 1 allocate, 2 confirm, 3 exists,
    # 4 locations, 5 delete, 6 inspect); initialize: byte 1 = rank text length, then the
    # rank text.
    for i, b in enumerate(JSON_BODIES):
        for endpoint in range(7):
            if endpoint == 0:
                for rank in (b"0", b"-7", b"+12", b"9223372036854775808", b"x"):
                    write("json_decode_fuzz", f"{i:02d}-init-{rank.decode()}", bytes([0, len(rank)]) + rank + b)
            else:
                write("json_decode_fuzz", f"{i:02d}-{endpoint}", bytes([endpoint]) + b)
    for i, state in enumerate(SGLANG_STATES):
        write("sglang_state_fuzz", f"{i:02d}", json.dumps(state, indent=4).encode())
    write("sglang_state_fuzz", "truncated", json.dumps(SGLANG_STATES[0], indent=4).encode()[:-20])
    for i, text in enumerate(TENANTS_FILES):
        write("tenants_file_fuzz", f"{i:02d}", text.encode())


if __name__ == "__main__":
    main()
