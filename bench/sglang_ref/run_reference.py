#!/usr/bin/env python3
"""Runs SGLang's own metadata server (mini_3fs_metadata_server.py, given by path) outside
an SGLang checkout, as the yardstick of `scripts/bench.sh --sglang --sglang-ref FILE`.

The file imports two names from the rest of SGLang (PoolName, Hf3fsMetadataInterface) and
orjson, which Debian 12 does not package. This runner provides the two names (the server
code never calls them) and, only when orjson is missing, a stand-in on the standard json
module (slower than orjson: the bench prints which one ran). Everything else is the file
as given, run as __main__ with the remaining arguments:

    run_reference.py FILE --host 127.0.0.1 --port 18311
"""
import enum
import json
import runpy
import sys
import types


def stub_module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class PoolName(str, enum.Enum):
    KV = "kv"

    def __str__(self):
        return self.value


class Hf3fsMetadataInterface:  # the clients' base class; unused by the server
    pass


for package in ("sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.storage",
                "sglang.srt.mem_cache.storage.hf3fs"):
    stub_module(package, __path__=[])
stub_module("sglang.srt.mem_cache.hicache_storage", PoolName=PoolName)
stub_module("sglang.srt.mem_cache.storage.hf3fs.storage_hf3fs",
            Hf3fsMetadataInterface=Hf3fsMetadataInterface)

try:
    import orjson  # noqa: F401
    print("run_reference: orjson", orjson.__version__, file=sys.stderr)
except ImportError:
    def dumps(obj, default=None, option=None):
        return json.dumps(obj, separators=(",", ":"), default=default).encode()

    stub_module("orjson", loads=json.loads, dumps=dumps, OPT_NON_STR_KEYS=1,
                OPT_SERIALIZE_NUMPY=2, JSONDecodeError=json.JSONDecodeError)
    print("run_reference: orjson missing, using json", file=sys.stderr)

if len(sys.argv) < 2:
    sys.exit("usage: run_reference.py FILE [server flags]")
path = sys.argv[1]
sys.argv = [path] + sys.argv[2:]
runpy.run_path(path, run_name="__main__")
