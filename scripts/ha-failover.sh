#!/usr/bin/env bash
# The long failover run (docs/replication.md, "Test plan": T1; not part of scripts/test.sh): a tuned
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
#
# --flap N [--seed S] instead runs the test plan's T7 for N rounds (tests/e2e/test_partition.py
# case c, which scripts/test.sh runs for 6): a random kill -9 of the leader, cut of the
# leader or cut of the standby (Blackhole forwarders) per round under a writer, then
# restart or heal; the ledger is checked after every round and the answering node must
# switch exactly once per change of leader. Prints the seed; exit status 1 on a failure.
#
#   scripts/ha-failover.sh --flap 50
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in /usr/bin/etcd /usr/sbin/haproxy; do
  [[ -x $tool ]] || { echo "ha-failover: $tool missing (scripts/setup.sh --test)" >&2; exit 2; }
done
if [[ ${1:-} == --flap ]]; then
  [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "ha-failover: --flap N (rounds)" >&2; exit 2; }
  export FLAP_ROUNDS=$2
  [[ ${3:-} == --seed && ${4:-} =~ ^[0-9]+$ ]] && export FLAP_SEED=$4
  export METAD_BIN=${METAD_BIN:-$PWD/build/hf3fs-metad}
  cd tests/e2e
  exec /usr/bin/python3 -m unittest -v \
    test_partition.PartitionTest.test_c_flapping_never_two_leaders_and_the_ledger_holds
fi
exec /usr/bin/python3 scripts/ha_failover.py "$@"
