#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang-14, ASan + UBSan) and runs each for SECONDS
# (default 30), as many at once as there are CPUs, from its seed corpus, recorded
# regressions and dictionary, in a temporary working corpus (nothing new is written into
# the repository). Fails if any harness
# crashes; the crashing input is kept under build-fuzz/artifacts/ — add it to
# tests/fuzz/regressions/<harness>/ once understood.
#   scripts/fuzz.sh [SECONDS] [HARNESS...]     e.g. scripts/fuzz.sh 120 pipeline_fuzz
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
shift || true
harnesses=("$@")
((${#harnesses[@]})) || harnesses=(http_parser_fuzz json_decode_fuzz pipeline_fuzz sglang_state_fuzz tenants_file_fuzz
  data_dir_fuzz)

scripts/setup.sh --fuzz >&2
dir=build-fuzz
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(dirname "$PWD")}" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# -DNDEBUG: simdjson's debug checks abort on some malformed input (scripts/build.sh).
cmake -S . -B "$dir" "${launcher[@]}" -DCMAKE_CXX_COMPILER=clang++-14 -DMETAD_FUZZ=ON \
  -DMETAD_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
cmake --build "$dir" -j"$(nproc)" --target "${harnesses[@]}" >&2

work=$(mktemp -d /tmp/metad-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
artifacts="$PWD/$dir/artifacts"
mkdir -p "$artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# run_one HARNESS: one harness for SECONDS; its log in $work/HARNESS.log, its exit status
# in $work/HARNESS.rc.
run_one() {
  local h=$1 max_len=32768 rc=0
  [[ $h == json_decode_fuzz ]] && max_len=16384
  mkdir -p "$work/$h" "$artifacts/$h"
  "$dir/tests/fuzz/$h" -max_total_time="$seconds" -max_len="$max_len" -timeout=20 \
    -rss_limit_mb=4096 -print_final_stats=1 -dict=tests/fuzz/metad.dict \
    -artifact_prefix="$artifacts/$h/" "$work/$h" \
    "tests/fuzz/regressions/$h" "tests/fuzz/corpus/$h" >"$work/$h.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$h.rc"
}

# As many harnesses at once as there are CPUs (each is one process).
echo "== ${#harnesses[@]} harnesses, ${seconds}s each, $(nproc) at a time ==" >&2
running=0
for h in "${harnesses[@]}"; do
  run_one "$h" &
  running=$((running + 1))
  if ((running >= $(nproc))); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=()
summary=()
for h in "${harnesses[@]}"; do
  log="$work/$h.log"
  rc=$(cat "$work/$h.rc")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  corpus=$(ls "$work/$h" | wc -l)
  if ((rc != 0)); then
    tail -60 "$log" >&2
    failed+=("$h")
    summary+=("$h: CRASH (rc $rc) after ${execs:-?} executions; input under $artifacts/$h/")
  else
    summary+=("$h: ${execs:-?} executions in ${seconds}s, ${cov:-cov: ?}, $corpus new corpus entries, no crash")
  fi
done
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all harnesses clean"
