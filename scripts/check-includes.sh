#!/usr/bin/env bash
# Fails on an include that breaks the module layering, and prints each offending line:
#   smp                           includes only itself (and include/metad)
#   http, api, shard, store, net, ha  include only themselves and smp (the leaves)
#   repl                          includes itself, store and smp (a level above the leaves:
#                                 it ships store's log frames)
#   pipeline                      includes itself, the leaves and smp
#   persist                       includes itself, pipeline, the leaves and smp
#   replica                       includes itself, persist, repl, pipeline, the leaves and smp
#                                 (replication's wiring into the cores' loops)
#   server                        may include everything
# "metad/..." is include/metad, which any module may include; only main.cpp includes
# server's public header (metad/server.hpp).
set -euo pipefail
cd "$(dirname "$0")/.."
allowed_smp="smp"
allowed_leaf="smp"
allowed_repl="smp|store"
allowed_pipeline="smp|http|api|shard|store|net|ha"
allowed_persist="pipeline|$allowed_pipeline"
allowed_replica="persist|repl|$allowed_persist"
status=0
check() {  # module allowed-others
  local module=$1 allowed=$2 bad
  # Any quoted include of a project module (a src/ directory) must be the module's own
  # or an allowed one.
  bad=$(grep -rnE '^#include "(smp|http|api|shard|store|net|ha|repl|pipeline|persist|replica|server)/' "src/$module" |
        grep -vE "^[^:]+:[0-9]+:#include \"($module|$allowed)/" || true)
  if [[ -n "$bad" ]]; then
    echo "src/$module includes a module it may not (it may include itself, ${allowed//|/, } and metad/):"
    echo "$bad"
    status=1
  fi
}
check smp "$allowed_smp"
for module in http api shard store net ha; do check "$module" "$allowed_leaf"; done
check repl "$allowed_repl"
check pipeline "$allowed_pipeline"
check persist "$allowed_persist"
check replica "$allowed_replica"
# metad/server.hpp is the embedding API: only main.cpp and server/ use it.
bad=$(grep -rn '^#include "metad/server.hpp"' src | grep -vE '^src/(main\.cpp|server/)' || true)
if [[ -n "$bad" ]]; then
  echo "only src/main.cpp and src/server/ include metad/server.hpp:"
  echo "$bad"
  status=1
fi
exit $status
