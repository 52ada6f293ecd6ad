"""Clients that try to join, read or take a leader's replication streams (issue 30,
findings 1 and 2), for tests/e2e/test_repl_tls.py. Run as its own process, so that its
handshakes do not take the test's writers' interpreter lock:

    python3 repl_intruder.py PORT CLUSTER SECONDS KIND:ARGS...

Each KIND is tried in turn, one connection at a time, for SECONDS; it prints one JSON line:
{kind: {"tries", "bytes" (application bytes the leader sent it), "answers" (replication
answers among them, by status), "errors" (why connections ended, by kind)}}. Kinds:

  plain:NODE                    TCP, a hello for core 0 claiming NODE, no TLS
  tls:CERT:KEY:NODE             TLS with that certificate (the leader's not checked), a
                                hello for core 0 claiming NODE
"""

import collections
import json
import socket
import ssl
import sys
import time

from failover_harness import repl_answers, repl_hello


def _read_to_end(sock, timeout=2.0):
    """Application bytes until the peer ends the stream (or `timeout`), and why it ended."""
    sock.settimeout(0.2)
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except ssl.SSLError as e:
            return got, f"ssl: {e.reason}"
        except OSError as e:
            return got, type(e).__name__
        if not data:
            return got, "end"
        got += data
    return got, "timeout"


def try_once(port, cluster, kind, args):
    """One connection of `kind`: (application bytes received, why it ended)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=2)
    try:
        if kind == "plain":
            raw.sendall(repl_hello(cluster, args[0], cores=2, core=0))
            return _read_to_end(raw)
        cert, key, node = args
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.load_cert_chain(cert, key)
        try:
            sock = ctx.wrap_socket(raw)
        except (ssl.SSLError, OSError) as e:
            return b"", f"handshake: {getattr(e, 'reason', None) or type(e).__name__}"
        try:
            sock.sendall(repl_hello(cluster, node, cores=2, core=0))
        except (ssl.SSLError, OSError) as e:
            return b"", f"send: {getattr(e, 'reason', None) or type(e).__name__}"
        return _read_to_end(sock)
    finally:
        raw.close()


def main():
    port, cluster, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    kinds = [spec.split(":") for spec in sys.argv[4:]]
    stats = {spec: {"tries": 0, "bytes": 0, "answers": collections.Counter(),
                    "errors": collections.Counter()} for spec in sys.argv[4:]}
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        for spec, (kind, *args) in zip(sys.argv[4:], kinds):
            got, why = try_once(port, cluster, kind, args)
            s = stats[spec]
            s["tries"] += 1
            s["bytes"] += len(got)
            s["answers"].update(a[0] for a in repl_answers(got))
            s["errors"][why] += 1
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
