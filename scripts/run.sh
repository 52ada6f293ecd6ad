#!/usr/bin/env bash
# Installs what is missing, builds the release server (only it: the tests take minutes
# more and run.sh does not need them) and starts hf3fs-metad in the foreground on
# 127.0.0.1:18000 with durable state in ./data (Ctrl-C stops it). Extra arguments go to
# the server. One line per step on stderr, so a first run that takes minutes says why.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "run.sh: checking the build dependencies (scripts/setup.sh; apt-get only if some are missing)" >&2
scripts/setup.sh
echo "run.sh: building build/hf3fs-metad (release, server only; the first build takes a few minutes)" >&2
dir=$(scripts/build.sh release hf3fs-metad)
args=(--host 127.0.0.1 --port 18000 --data-dir ./data --durability sync "$@")
echo "run.sh: starting $dir/hf3fs-metad ${args[*]} (Ctrl-C stops it)" >&2
exec "$dir/hf3fs-metad" "${args[@]}"
