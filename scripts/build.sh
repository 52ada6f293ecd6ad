#!/usr/bin/env bash
# Configures and builds one flavour: release (default), asan (Address+UB sanitizers) or
# tsan (ThreadSanitizer); every target, or only the targets named after the flavour
# (scripts/build.sh release hf3fs-metad: the server alone, minutes faster than the tests).
# Prints the build directory on the last line.
set -euo pipefail
cd "$(dirname "$0")/.."

flavour="${1:-release}"
shift $(($# > 0 ? 1 : 0))
targets=()
for target in "$@"; do targets+=(--target "$target"); done
case "$flavour" in
  release) dir=build; args=(-DCMAKE_BUILD_TYPE=Release) ;;
  # -DNDEBUG: simdjson's debug checks abort on some malformed input (its assertions
  # are for its own development, not for hostile bodies).
  # -g1: line tables, enough for the sanitizers' stack traces; full -g costs ~30% more
  # compile time and 3x the object size.
  asan) dir=build-asan; args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DMETAD_SANITIZE=address,undefined) ;;
  tsan) dir=build-tsan; args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DMETAD_SANITIZE=thread) ;;
  *) echo "usage: scripts/build.sh [release|asan|tsan] [TARGET...]" >&2; exit 2 ;;
esac
jobs=$(nproc)
# ccache (scripts/setup.sh installs it): a second build, and a git worktree of this
# repository, rebuild only what changed (CCACHE_BASEDIR makes paths relative and
# CCACHE_NOHASHDIR leaves the build directory out of the hash, so worktrees share hits).
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(dirname "$PWD")}" CCACHE_NOHASHDIR=1
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-20G}"  # four flavours with debug info
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$dir" "${args[@]}" >/dev/null
cmake --build "$dir" -j"$jobs" "${targets[@]}" >&2
echo "$dir"
