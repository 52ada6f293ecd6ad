#!/usr/bin/env bash
# The long failover run (design-ha.md §4.1 T1; not part of scripts/test.sh): a tuned
# 1-member etcd, two hf3fs-metad nodes with --repl-listen, HAProxy in front (the shipped
# -ha config), vLLM-like writers at a fixed rate through it, and N rounds (default 20) of
# kill -9 the leader -> the other serves -> restart the killed one -> back in /sync.
# Prints a per-round table (kill -> /ready 200, kill -> first API 200 through HAProxy,
# rejoin time, acknowledged writes lost, client calls failed after vLLM's retries) and the
# median/max; writes rounds.csv, summary.txt and the logs under --out (default
# /tmp/ha-failover-<date>). Exit status 1 if any acknowledged write was lost, 2 if the run
# could not finish. The work is done by scripts/ha_failover.py; every flag goes to it
# (--help lists them; --binary defaults to build/hf3fs-metad).
#
#   scripts/ha-failover.sh --rounds 5 --out /tmp/ha-run
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in /usr/bin/etcd /usr/sbin/haproxy; do
  [[ -x $tool ]] || { echo "ha-failover: $tool missing (scripts/setup.sh --test)" >&2; exit 2; }
done
exec /usr/bin/python3 scripts/ha_failover.py "$@"
