#!/usr/bin/env bash
# Fails on a sideways include: the leaf modules (http, api, shard, store, net, ha) include
# only themselves and the shared headers in include/metad; server/ wires them; only
# main.cpp includes server's public header. Prints each offending line.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for module in http api shard store net ha; do
  # "metad/..." is include/metad; any other quoted project include must be the module's own.
  bad=$(grep -rnE '^#include "(http|api|shard|store|net|ha|server)/' "src/$module" |
        grep -vE "^[^:]+:[0-9]+:#include \"$module/" || true)
  if [[ -n "$bad" ]]; then
    echo "sideways include in src/$module (a leaf module includes only itself and metad/):"
    echo "$bad"
    status=1
  fi
done
exit $status
