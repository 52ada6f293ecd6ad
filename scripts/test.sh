#!/usr/bin/env bash
# The README's test command, and what .ci/run runs. Installs what is missing, then runs
# each stage below, printing its wall time and how many test cases it ran; a summary
# table ends the run. Stages pick their tests by ctest label (tests/CMakeLists.txt;
# tests/README.md has the table of stages, labels and measured times):
#   boundaries  scripts/check-includes.sh: no leaf module includes another
#   asan        ASan+UBSan build of everything; -LE etcd: unit, the wire e2e suites on
#               both transports, the other e2e suites once
#   tsan        TSan build of the threaded targets only; -L threads: the threaded unit
#               binaries, the C++ e2e flows, the replication e2e cases on a real etcd
#   fuzz        the libFuzzer harnesses, 30 s each, side by side (scripts/fuzz.sh)
#   release     the release build: a 30 s soak at 256 connections, the Debian package
#               built and served from, then every test (etcd suites included) but the
#               epoll wire suites (the production transport is io_uring; epoll's run
#               under ASan and TSan)
#
#   scripts/test.sh            everything (20 min from a fresh clone on 2 cores; the
#                              stage times: tests/README.md)
#   scripts/test.sh --quick    the edit-compile-test loop: the ASan build's unit tests
#                              (-L unit), incremental (~30 s of tests on a built tree)
# No retries: a flaky test is a bug to find. Each failure is printed in full.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac

if ((quick)); then scripts/setup.sh; else scripts/setup.sh --test; fi
export CTEST_OUTPUT_ON_FAILURE=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
jobs=$(nproc)
reports=$(mktemp -d /tmp/metad-test.XXXXXX)
summary=()
started=$SECONDS
current=""
# The table of stages, also when one failed (it names the one that did).
finish() {
  local rc=$?
  rm -rf "$reports"
  echo
  echo "== Stages (wall time; test cases run) =="
  printf '%s\n' "${summary[@]}"
  ((rc == 0)) || echo "FAILED in stage: $current (exit status $rc)"
  echo "total          $((SECONDS - started)) s"
}
trap finish EXIT
# stage NAME COMMAND...: runs COMMAND, then prints and records its wall time.
stage() {
  local name=$1 began=$SECONDS
  shift
  current=$name
  echo "== $name =="
  "$@"
  local took=$((SECONDS - began))
  echo "== $name: ${took} s =="
  summary+=("$(printf '%-14s %5d s  %s' "$name" "$took" "${counts:-}")")
  counts=""
}
# run_ctest NAME DIR ARGS...: ctest with a JUnit report, then the counts of what ran.
run_ctest() {
  local name=$1 dir=$2
  shift 2
  local junit="$reports/$name.xml"
  ctest --test-dir "$dir" -j"$jobs" --timeout 600 --output-junit "$junit" \
    --test-output-size-passed 4000000 "$@"
  counts=$(/usr/bin/python3 scripts/test-counts.py "$junit")
  echo "$name: $counts"
}

if ((quick)); then
  dir=$(scripts/build.sh asan)
  stage "unit (asan)" run_ctest quick "$dir" -L unit
  exit 0
fi

# build FLAVOUR [TARGET...]: sets dir to the build directory.
build() { dir=$(scripts/build.sh "$@"); }

stage boundaries scripts/check-includes.sh
stage "asan build" build asan
# The etcd suites run in the release stage (and TSan's replication cases).
stage "asan tests" run_ctest asan "$dir" -LE etcd
stage "tsan build" build tsan threaded_tests
stage "tsan tests" run_ctest tsan "$dir" -L threads
stage fuzz scripts/fuzz.sh 30
stage "release build" build release
stage soak /usr/bin/python3 bench/soak/soak.py --binary "$dir/hf3fs-metad" --seconds 30 \
  --connections 256
stage package tests/package_test.sh --build-dir "$dir"
stage "release tests" run_ctest release "$dir" -E '_epoll$'

