#!/usr/bin/env bash
# Installs what is missing, builds a release binary and starts hf3fs-metad in the
# foreground on 127.0.0.1:18000 with durable state in ./data (Ctrl-C stops it). Extra
# arguments go to the server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
dir=$(scripts/build.sh release)
exec "$dir/hf3fs-metad" --host 127.0.0.1 --port 18000 --data-dir ./data --durability sync "$@"
