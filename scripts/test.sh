#!/usr/bin/env bash
# Installs what is missing, checks that no leaf module includes another
# (scripts/check-includes.sh), then builds and runs every test:
#   1. under AddressSanitizer + UndefinedBehaviorSanitizer (every test),
#   2. under ThreadSanitizer (the cross-core code: mailbox, pipeline, durability, e2e),
#   3. the libFuzzer harnesses for 30 s each (clang, ASan + UBSan),
#   4. the release build: a one-minute soak at 256 connections, the Debian package built
#      from it and served from (tests/package_test.sh, ~10 s), then every test — its
#      ctest summary is the last line.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
export CTEST_OUTPUT_ON_FAILURE=1
jobs=$(nproc)
# No retries: a flaky test is a bug to find. Each failure is printed in full.

echo "== Module boundaries =="
scripts/check-includes.sh

echo "== ASan + UBSan =="
dir=$(scripts/build.sh asan)
# The etcd integration tests (label etcd) run in the release stage only.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$dir" -j"$jobs" --timeout 600 -LE etcd

echo "== TSan (cross-core) =="
dir=$(scripts/build.sh tsan)
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir "$dir" -j"$jobs" --timeout 600 \
    -R '^(Mailbox|.*Pipeline|Durability|ReplLink|e2e_cpp)'

echo "== Fuzzing =="
scripts/fuzz.sh 30

echo "== Release: soak =="
dir=$(scripts/build.sh release)
/usr/bin/python3 bench/soak/soak.py --binary "$dir/hf3fs-metad" --seconds 60 --connections 256

echo "== Release: Debian package =="
tests/package_test.sh --build-dir "$dir"

echo "== Release =="
ctest --test-dir "$dir" -j"$jobs" --timeout 600
