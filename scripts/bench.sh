#!/usr/bin/env bash
# The benchmark suite (issue 3): builds a release tree, then runs wrk against the server
# (one Lua script per endpoint, bench/wrk/) and against nginx's fixed `return 200` as the
# yardstick, replays the vLLM connector (bench/load), and prints ONE Markdown table:
# median req/s, p50/p99, server CPU per request (utime+stime from /proc/PID/stat over
# requests) and ratios to nginx, for --io uring and --io epoll. Loopback only.
#
#   scripts/bench.sh            full run (10 s per case, 3 runs each; + micro + memory)
#   scripts/bench.sh --quick    ~1.5 minutes (1 s per case, 3 runs; replay once)
#   scripts/bench.sh --memory   RSS per page and per (key, rank) binding only
#   scripts/bench.sh --micro    the Google Benchmark programs only
#   scripts/bench.sh --scaling  1, 2, 4, 8 server cores (8 needs >= 16 CPUs; fewer run
#                               the counts that fit in half the CPUs)
#   scripts/bench.sh --stale    ~5 minutes: stale-key reclamation, 60 s connector replays
#                               into pools 40x smaller than the working set, one row per 5 s
#   scripts/bench.sh --fanout   ~2 minutes: cross-core messages and server CPU per request
#                               at --threads 1..32 (all on the server's CPU), and the cost
#                               of one hop (bench/fanout.py)
#   scripts/bench.sh --restart  ~10 minutes: restart of a --data-dir server holding 1M, 4M,
#                               8M, 16M bindings (keys x 8 ranks): time to listening after a
#                               kill -9 (from the log) and after a graceful stop (from the
#                               snapshots the previous start wrote), VmRSS before and after
#                               (RESTART_BINDINGS="1 2" picks the millions to run)
#   scripts/bench.sh --repl     ~4 minutes: the fresh allocate → release pair (-t64 -c64)
#                               with synchronous replication to a hot standby (etcd, a
#                               leader and a standby, both on the server's CPU), in clear
#                               text and over mutual TLS, against local --durability sync
#                               alone, alternating, 3 rounds (REPL_ROUNDS=N); then an
#                               empty standby's catch-up and its promotion at 1M, 4M, 8M
#                               and 16M bindings (REPL_BINDINGS="1 8" picks; " ": none),
#                               each the median of 3 runs (REPL_RUNS=N; REPL_STANDBY_CPUS=1
#                               puts the standby on CPU 1, apart from the leader;
#                               REPL_KEEP_LOGS=DIR keeps both nodes' logs of each run)
#   scripts/bench.sh --sglang   ~2 minutes: SGLang's calls against vLLM's at 128 keys;
#                               with --sglang-ref FILE (SGLang's mini_3fs_metadata_server.py,
#                               which is not in this repository) also against SGLang's own
#                               server in the same run (Debian's python3-fastapi, uvicorn)
# Where throughput is too noisy to show a few percent (a shared host), the same rows'
# instructions per request under callgrind: bench/callgrind_rows.py BINARY (an A/B of
# two builds, or of server flags such as --tenants-file, deterministic to ~0.5%).
# Options: --no-build (use the binaries already in the build dir), --build-dir DIR;
# BENCH_TMPDIR=DIR puts the scratch files and data directories there (default /tmp).
# Pinning: the server (and nginx) on CPU 0, wrk and the load generator on CPU 1 (with
# --scaling: the server on the first half of the CPUs, wrk on the second).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-bench"
mode=full
do_build=1
sglang_ref=""
while (($#)); do
  case "$1" in
    --quick | --memory | --micro | --scaling | --stale | --fanout | --restart | --sglang | --repl) mode=${1#--} ;;
    --no-build) do_build=0 ;;
    --build-dir) build=$(realpath -m "$2"); shift ;;
    --sglang-ref) sglang_ref=$(realpath "$2"); shift ;;
    -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown flag $1" >&2; exit 2 ;;
  esac
  shift
done

tools="taskset"
case $mode in
  quick | full) tools+=" wrk nginx curl" ;;
  scaling | sglang) tools+=" wrk curl" ;;
  repl) tools+=" wrk curl /usr/bin/etcd python3 openssl /usr/sbin/haproxy" ;;  # no nginx: scripts/bench-kit.sh packs these two
  memory | stale | restart) tools+=" curl" ;;  # waits for the server's port with it
  fanout) tools+=" python3" ;;
esac
[[ -z $sglang_ref ]] || tools+=" /usr/bin/python3"
for tool in $tools; do
  command -v "$tool" >/dev/null || { echo "bench.sh: $tool missing: run scripts/setup.sh --bench" >&2; exit 1; }
done
if ((do_build)); then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMETAD_BENCH=ON -DMETAD_TESTS=OFF >/dev/null
  targets=(hf3fs-metad metad-load)
  [[ $mode == restart || $mode == repl ]] && targets+=(metad-memory)
  [[ $mode == stale || $mode == fanout || $mode == restart || $mode == repl ]] || targets+=(metad-memory bench_parser bench_decode bench_shard)
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >/dev/null
fi
server_bin="$build/hf3fs-metad"
load_bin="$build/bench/metad-load"
wrk_dir="$root/bench/wrk"

case $mode in
  quick) seconds=1; warmup=1; runs=3; replay_seconds=3; replay_runs=1 ;;
  sglang) seconds=3; warmup=1; runs=3; replay_seconds=0; replay_runs=0 ;;
  repl) seconds=3; warmup=1; runs=3; replay_seconds=0; replay_runs=0 ;;
  scaling) seconds=3; warmup=2; runs=3; replay_seconds=5 ;;  # ~4 minutes on 16 CPUs
  *) seconds=10; warmup=2; runs=3; replay_seconds=10; replay_runs=3 ;;
esac
server_port=18310
nginx_port=18399
server_cpus=0
load_cpus=1
hz=$(getconf CLK_TCK)

# BENCH_TMPDIR=/dev/shm: data directories on tmpfs (fdatasync costs nothing: what is
# left of a synchronous write is CPU and the round trip to the standby).
tmp=$(mktemp -d "${BENCH_TMPDIR:-/tmp}/metad-bench.XXXXXX")
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# utime + stime (clock ticks) of a process and its threads; field 2 may hold spaces, so
# count fields after the last ')'.
cpu_ticks() {
  local total=0 pid stat
  for pid in "$@"; do
    stat=$(<"/proc/$pid/stat")
    stat=${stat##*) }
    read -r -a f <<<"$stat"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}

wait_port() {
  local _
  for _ in $(seq 100); do
    curl -s -o /dev/null -m 1 "http://127.0.0.1:$1/" && return 0
    sleep 0.05
  done
  echo "bench.sh: nothing listening on port $1" >&2
  return 1
}

server_pid=""
start_server() {  # io cpus [extra server flags]
  taskset -c "$2" "$server_bin" --port "$server_port" --cpus "$2" --io "$1" --log-level warn "${@:3}" &
  server_pid=$!
  pids+=("$server_pid")
  wait_port "$server_port"
}
stop_server() {
  kill "$server_pid"
  wait "$server_pid" 2>/dev/null || true
}

nginx_pids=()
start_nginx() {
  mkdir -p "$tmp/nginx"
  cat >"$tmp/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 120s;
  client_body_temp_path $tmp/nginx/body;
  proxy_temp_path $tmp/nginx/proxy;
  fastcgi_temp_path $tmp/nginx/fastcgi;
  uwsgi_temp_path $tmp/nginx/uwsgi;
  scgi_temp_path $tmp/nginx/scgi;
  server {
    listen 127.0.0.1:$nginx_port;
    location / {
      default_type application/json;
      return 200 '{"message":"Rank 0 initialized with 1024 pages"}';
    }
  }
}
EOF
  taskset -c "$server_cpus" nginx -p "$tmp/nginx" -e "$tmp/nginx/error.log" -c "$tmp/nginx/nginx.conf" &
  pids+=($!)
  nginx_pids=($!)
  wait_port "$nginx_port"
  # Count the worker's CPU too (the master only forks it).
  local workers
  mapfile -t workers < <(pgrep -P "${nginx_pids[0]}")
  nginx_pids+=("${workers[@]}")
}

# Server CPU µs per request: clock ticks used, requests served.
us_per_request() { awk -v d="$1" -v hz="$hz" -v n="$2" 'BEGIN {printf "%.2f", d / hz * 1e6 / n}'; }

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }

rows="$tmp/rows"
: >"$rows"
# One wrk case: a warm-up run (its Lua setup() pre-populates the state), then $runs
# measured runs; appends "case|transport|req/s|p50|p99|cpu_us|bad" with the medians.
wrk_case() {  # name transport port script threads connections cpus pids...
  local name=$1 io=$2 port=$3 script=$4 threads=$5 conns=$6 cpus=$7
  shift 7
  local url="http://127.0.0.1:$port" run out t0 t1 req bad=0
  local -a rps=() p50=() p99=() cpu=()
  taskset -c "$cpus" wrk -t"$threads" -c"$conns" -d"${warmup}s" -s "$wrk_dir/$script" "$url" >"$tmp/warm.log"
  for run in $(seq "$runs"); do
    t0=$(cpu_ticks "$@")
    out=$(taskset -c "$cpus" wrk -t"$threads" -c"$conns" -d"${seconds}s" --latency -s "$wrk_dir/$script" "$url" | grep METAD_WRK)
    t1=$(cpu_ticks "$@")
    req=$(field requests <<<"$out")
    rps+=("$(field rps <<<"$out")")
    p50+=("$(field p50_us <<<"$out")")
    p99+=("$(field p99_us <<<"$out")")
    cpu+=("$(us_per_request $((t1 - t0)) "$req")")
    bad=$((bad + $(field bad <<<"$out")))
  done
  echo "$name|$io|$(printf '%s\n' "${rps[@]}" | median)|$(printf '%s\n' "${p50[@]}" | median)|$(printf '%s\n' "${p99[@]}" | median)|$(printf '%s\n' "${cpu[@]}" | median)|$bad" >>"$rows"
}

# Connector replay, 4 engines x TP 8 (68 streams), one fresh server per run; one row
# per endpoint (CPU per request is over all endpoints: they share the server).
# One connector replay against a fresh server: replay_run transport server_cpus
# load_cpus [metad-load flags]. Leaves metad-load's report in $tmp/replay.log, its total
# in $replay_total and the server's CPU per request in $replay_cpu.
replay_total=0
replay_cpu=0
replay_run() {
  local io=$1 cpus=$2 on=$3 t0 t1
  shift 3
  start_server "$io" "$cpus"
  t0=$(cpu_ticks "$server_pid")
  taskset -c "$on" "$load_bin" --port "$server_port" --tp 8 --seconds "$replay_seconds" "$@" \
    >"$tmp/replay.log" || echo "bench.sh: metad-load reported errors" >&2
  t1=$(cpu_ticks "$server_pid")
  stop_server
  replay_total=$(field total_requests <<<"$(grep total_requests "$tmp/replay.log")")
  replay_cpu=$(us_per_request $((t1 - t0)) "$replay_total")
}

replay_case() {  # transport rate
  local io=$1 rate=$2 label="replay 4x8" run spin=()
  # Paced runs measure latency: the generator polls on its core, so that waking it (tens
  # of µs in a VM) is not counted as the server's. Back-to-back runs measure CPU per
  # request with a generator that sleeps, as a real client does.
  [[ $rate != 0 ]] && label="replay 4x8 @${rate}/s" && spin=(--spin)
  : >"$tmp/replay.rows"
  for run in $(seq "$replay_runs"); do
    replay_run "$io" "$server_cpus" "$load_cpus" --engines 4 --rate "$rate" "${spin[@]}"
    cp "$tmp/replay.log" "$tmp/replay-$io-$rate-$run.log"
    awk -F'|' -v cpu="$replay_cpu" \
      '/^\| (batch|confirm|get)/ {gsub(/ /, ""); print $2, $4, $6, $7, $5, cpu}' "$tmp/replay.log" >>"$tmp/replay.rows"
  done
  local ep sel
  for ep in batch_exists batch_allocate confirm_write get_locations; do
    sel=$(grep "^$ep " "$tmp/replay.rows")
    echo "$label: $ep|$io|$(awk '{print $2}' <<<"$sel" | median)|$(awk '{print $3}' <<<"$sel" | median)|$(awk '{print $4}' <<<"$sel" | median)|$(awk '{print $6}' <<<"$sel" | median)|$(awk '{s += $5} END {print s}' <<<"$sel")" >>"$rows"
  done
}

print_table() {
  local nginx_row nginx_rps nginx_cpu
  nginx_row=$(grep '^nginx return 200|' "$rows" || true)
  nginx_rps=$(cut -d'|' -f3 <<<"$nginx_row")
  nginx_cpu=$(cut -d'|' -f6 <<<"$nginx_row")
  echo
  echo "| case | transport | req/s (median of $runs) | p50 µs | p99 µs | server CPU µs/req | req/s ÷ nginx | CPU/req ÷ nginx | errors |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
  awk -F'|' -v nr="${nginx_rps:-0}" -v nc="${nginx_cpu:-0}" '{
    r = (nr > 0) ? sprintf("%.2f", $3 / nr) : "-"
    c = (nc > 0) ? sprintf("%.2f", $6 / nc) : "-"
    printf "| %s | %s | %.0f | %.0f | %.0f | %.2f | %s | %s | %d |\n", $1, $2, $3, $4, $5, $6, r, c, $7
  }' "$rows"
  echo
  echo "wrk -t2 -c64 (alloc→release pair: -t8 -c8, one stream per wrk thread) on CPU $load_cpus;" \
    "server/nginx on CPU $server_cpus; ${seconds} s per run; replay: metad-load, ${replay_seconds} s x $replay_runs," \
    "CPU/req over all its endpoints; errors: non-expected statuses and socket errors."
}

run_wrk_suite() {
  start_nginx
  wrk_case "nginx return 200" nginx "$nginx_port" initialize.lua 2 64 "$load_cpus" "${nginx_pids[@]}"
  kill "${nginx_pids[0]}"
  local io c
  for io in uring epoll; do
    for c in "initialize:initialize.lua:2:64" "initialize (invalid)→400:initialize_invalid.lua:2:64" \
      "batch_exists 1250 keys, 1M dir:batch_exists.lua:2:64" "get_locations 128 keys:get_locations.lua:2:64" \
      "batch_allocate 128 hits:batch_allocate.lua:2:64" "confirm_write 128 no-op:confirm_write.lua:2:64" \
      "alloc→release pair 128 keys (req = half pair):alloc_release.lua:8:8"; do
      IFS=: read -r name script threads conns <<<"$c"
      start_server "$io" "$server_cpus"
      wrk_case "$name" "$io" "$server_port" "$script" "$threads" "$conns" "$load_cpus" "$server_pid"
      stop_server
    done
    # The mutating pair at 64 connections, in memory and with every change fdatasynced
    # before its answer (group commit; the target is >= 50% of the in-memory figure).
    start_server "$io" "$server_cpus"
    wrk_case "alloc→release pair, 64 conns, in memory" "$io" "$server_port" alloc_release.lua 64 64 \
      "$load_cpus" "$server_pid"
    stop_server
    rm -rf "$tmp/data"
    start_server "$io" "$server_cpus" --data-dir "$tmp/data" --durability sync
    wrk_case "alloc→release pair, 64 conns, --durability sync" "$io" "$server_port" alloc_release.lua \
      64 64 "$load_cpus" "$server_pid"
    stop_server
    # Saves into a full pool: every allocation of 128 new keys evicts the 128 least
    # recently used complete keys first (issue 5's eviction path).
    start_server "$io" "$server_cpus" --eviction lru --read-lease-ms 0
    POOL_PAGES=8192 wrk_case "alloc→confirm pair 128 new keys, full pool, evicts 128 (req = half pair)" \
      "$io" "$server_port" alloc_confirm.lua 8 8 "$load_cpus" "$server_pid"
    stop_server
    replay_case "$io" 0
    replay_case "$io" 100
  done
  print_table
}

run_memory() {
  start_server uring "$server_cpus"
  taskset -c "$load_cpus" "$build/bench/metad-memory" --pid "$server_pid" --port "$server_port" \
    --ranks 8 --pages 2097152 --keys 1000000 --order batch
  stop_server
  # Bytes per (key, rank) binding by key shape and API (each shape has its own stored form:
  # see docs/api.md and docs/sglang-api.md), 8 ranks (SGLang: 8 pools), each batch of 128
  # keys allocated (reserved) and confirmed on every rank before the next, a fresh server
  # per cell. MEMORY_SHAPE_KEYS sets the keys (200000).
  local shape api out cells
  echo
  echo "| key shape | vLLM API bytes/binding | SGLang API bytes/binding |"
  echo "|---|---:|---:|"
  for shape in hex32 hex64 HEX64 HEX32 other other65; do
    cells=""
    for api in vllm sglang; do
      start_server uring "$server_cpus"
      out=$(taskset -c "$load_cpus" "$build/bench/metad-memory" --pid "$server_pid" \
        --port "$server_port" --ranks 8 --pages 262144 --keys "${MEMORY_SHAPE_KEYS:-200000}" \
        --order batch --shape "$shape" --api "$api") || { echo "$out" >&2; stop_server; return 1; }
      stop_server
      cells+=" $(awk -F'|' '/bytes\/binding/ {gsub(/ bytes\/binding| /, "", $5); print $5}' <<<"$out") |"
    done
    echo "| $shape |$cells"
  done
}

run_micro() {
  local b
  for b in parser decode shard; do
    taskset -c "$server_cpus" "$build/bench/bench_$b" --benchmark_min_time=0.2
  done
}

# Busy and total clock ticks, summed over a CPU list such as "8-15" or "1,3".
cpu_jiffies() {
  awk -v list="$1" 'BEGIN {
    n = split(list, parts, ",")
    for (i = 1; i <= n; i++) {
      m = split(parts[i], r, "-")
      for (c = r[1]; c <= (m > 1 ? r[2] : r[1]); c++) want["cpu" c] = 1
    }
  }
  $1 in want { t = 0; for (i = 2; i <= 9; i++) t += $i; busy += t - $5 - $6; total += t }
  END { print busy, total }' /proc/stat
}

# One row of the scaling table: name cores req/s p99 cpu_us base_req/s jiffies0 jiffies1.
scaling_row() {
  awk -v name="$1" -v n="$2" -v r="$3" -v p="$4" -v c="$5" -v b="$6" -v j0="$7" -v j1="$8" \
    'BEGIN {split(j0, a, " "); split(j1, z, " ")
      printf "| %s | %d | %.0f | %.0f | %.2f | %.2f | %.2f | %.0f%% |\n", name, n, r, p, c, r / b, r / (b * n),
        100 * (z[1] - a[1]) / (z[2] - a[2])}'
}

# 1, 2, 4, 8 server cores on CPUs 0..n-1, as many of them as fit in half the machine;
# the load on the other half (the same load capacity for every n). Efficiency = req/s(n)
# / (n x req/s(1)); the target is >= 0.8 with 8 cores (16+ CPUs). The wrk load is
# spread over 8 ranks (one per wrk thread, rank r on core r mod n), as TP 8 spreads it;
# one rank would put every rank-bound request on one core. The connector replay runs
# back to back with one metad-load loop per load CPU and 2 engines per loop (at least
# 4). "load busy" is how much of its CPUs the load used (warm-up included): near 100%,
# the load generator, not the server, limits the row.
run_scaling() {
  local cpus_total half
  cpus_total=$(nproc)
  half=$((cpus_total / 2))
  ((half >= 1)) || { echo "bench.sh: --scaling needs >= 2 CPUs" >&2; exit 1; }
  local load="$half-$((cpus_total - 1))" load_threads=$((cpus_total - half)) n c name script j0 j1
  local -a counts=()
  for n in 1 2 4 8; do ((n <= half)) && counts+=("$n"); done
  ((half >= 8)) || echo "bench.sh: $cpus_total CPUs: server cores ${counts[*]} only (8 needs 16 CPUs)" >&2
  echo "| case | server cores | req/s | p99 µs | CPU µs/req | speedup | efficiency | load busy |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  local base rps p99 cpu
  for c in "initialize, 8 ranks:initialize.lua" "get_locations 128 keys, 8 ranks of 128k keys:get_locations.lua" \
    "batch_exists 1250 keys, 1M dir:batch_exists.lua"; do
    IFS=: read -r name script <<<"$c"
    base=""
    for n in "${counts[@]}"; do
      : >"$rows"
      start_server uring "0-$((n - 1))"
      j0=$(cpu_jiffies "$load")
      METAD_BENCH_RANKS=8 METAD_BENCH_KEYS=131072 wrk_case "$name" uring "$server_port" "$script" "$load_threads" 256 "$load" "$server_pid"
      j1=$(cpu_jiffies "$load")
      stop_server
      IFS='|' read -r _ _ rps _ p99 cpu _ <"$rows"
      base=${base:-$rps}
      scaling_row "$name" "$n" "$rps" "$p99" "$cpu" "$base" "$j0" "$j1"
    done
  done
  local engines=$((load_threads * 2 > 4 ? load_threads * 2 : 4))
  name="replay ${engines}x8 back to back (p99: worst endpoint)"
  base=""
  for n in "${counts[@]}"; do
    j0=$(cpu_jiffies "$load")
    replay_run uring "0-$((n - 1))" "$load" --engines "$engines" --threads "$load_threads"
    j1=$(cpu_jiffies "$load")
    rps=$(awk -v t="$replay_total" -v s="$replay_seconds" 'BEGIN {print t / s}')
    p99=$(awk -F'|' '/^\| (batch|confirm|get)/ {if ($7 + 0 > m) m = $7 + 0} END {print m}' "$tmp/replay.log")
    base=${base:-$rps}
    scaling_row "$name" "$n" "$rps" "$p99" "$replay_cpu" "$base" "$j0" "$j1"
  done
}

# Stale-key reclamation under a pool far smaller than the working set: 4 engines x TP 8
# back to back, 50,000 pages per rank against 4 x 400 prompts x 1,250 keys = 2M keys
# per rank (the pools fill in the first window), --eviction lru. A save task fails on
# each rank independently (--fail-fraction), so a failure leaves its keys confirmed on
# the other ranks only: incomplete, never evictable. One 60 s run per configuration on a
# fresh server; metad-load prints its counters and the server's GET /stats every 5 s
# (--report-every), and each row is one window: its allocation results and the share of
# them that were -1, the batch_exists keys found, keys evicted and stale keys reclaimed
# (differences of the /stats counters), then the keys, the read-leased keys, the
# incomplete keys and the pages they hold at the window's end. --read-lease-ms 0 but in
# the last configuration: the replay's load streams read most cached keys again within
# seconds, so with the default 10 s lease a full pool stays leased and refuses
# allocations whatever the grace (that run shows it).
stale_grace_ms=3000
stale_pages=50000
stale_seconds=60
stale_window=5
stale_table() {  # log: the window lines of one run
  echo "| t (s) | allocation results | -1 | batch_exists found | evicted | stale reclaimed | keys | leased keys | incomplete keys | incomplete pages |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  awk -v pool=$((stale_pages * 8)) '
    function stat(name) {  # a counter of the /stats JSON
      return match(s, "\"" name "\":[0-9]+") ? substr(s, RSTART + length(name) + 3, RLENGTH - length(name) - 3) : 0
    }
    function pct(a, b) { return b > 0 ? sprintf("%.1f%%", 100 * a / b) : "-" }
    /^window=/ {
      for (i = 1; i <= NF; i++) { eq = index($i, "="); v[substr($i, 1, eq - 1)] = substr($i, eq + 1) }
      s = v["stats"]
      if (s == "-") { print "bench.sh: GET /stats failed at t=" v["t"] > "/dev/stderr"; next }
      res = v["alloc_results"] - p["res"]; ev = stat("evicted_keys"); st = stat("stale_keys")
      printf "| %.0f | %d | %s | %s | %d | %d | %d | %d | %d | %d (%s) |\n", v["t"], res,
        pct(v["alloc_refused"] - p["ref"], res), pct(v["exists_found"] - p["found"], v["exists_asked"] - p["asked"]),
        ev - p["ev"], st - p["st"], stat("keys"), stat("leased_keys"), stat("incomplete_keys"),
        stat("incomplete_pages"), pct(stat("incomplete_pages"), pool)
      p["res"] = v["alloc_results"]; p["ref"] = v["alloc_refused"]; p["found"] = v["exists_found"]
      p["asked"] = v["exists_asked"]; p["ev"] = ev; p["st"] = st
    }' "$1"
}

run_stale() {
  local c label grace fail lease
  for c in "(a) --incomplete-grace-ms 0 (no stale-key reclamation), --fail-fraction 0.01|0|0.01|0" \
    "(b) --incomplete-grace-ms $stale_grace_ms, --fail-fraction 0.01|$stale_grace_ms|0.01|0" \
    "(c) --incomplete-grace-ms $stale_grace_ms, --fail-fraction 0.05|$stale_grace_ms|0.05|0" \
    "(d) --incomplete-grace-ms $stale_grace_ms, --fail-fraction 0|$stale_grace_ms|0|0" \
    "(e) as (b) with the default --read-lease-ms (10000)|$stale_grace_ms|0.01|10000"; do
    IFS="|" read -r label grace fail lease <<<"$c"
    start_server uring "$server_cpus" --threads 1 --eviction lru --incomplete-grace-ms "$grace" \
      --read-lease-ms "$lease"
    taskset -c "$load_cpus" "$load_bin" --port "$server_port" --engines 4 --tp 8 --pages "$stale_pages" \
      --seconds "$stale_seconds" --report-every "$stale_window" --fail-fraction "$fail" \
      >"$tmp/stale.log" 2>"$tmp/stale.err" || { echo "bench.sh: metad-load reported errors" >&2; cat "$tmp/stale.err" >&2; }
    stop_server
    echo "$label"
    echo
    stale_table "$tmp/stale.log"
    echo
    grep -E '^(total_requests|batch_exists keys)' "$tmp/stale.log"
    echo
  done
  echo "4 engines x TP 8 back to back (metad-load on CPU $load_cpus), --pages $stale_pages per rank" \
    "($((stale_pages * 8)) in all) against 2,000,000 keys per rank; server --eviction lru on CPU" \
    "$server_cpus; ${stale_seconds} s per run, a row per ${stale_window} s; incomplete pages: % of all pages."
}

run_fanout() {
  echo "Server on CPU $server_cpus (every --threads count on it), the client on CPU $load_cpus;" \
    "8 keep-alive connections, ranks 0-7 with 1,250 saved keys each."
  taskset -c "$load_cpus" python3 "$root/bench/fanout.py" "$server_bin" --server-cpus "$server_cpus" \
    --threads 1,2,4,8,16,32 --seconds 3
}

# Restart of a --data-dir server on 2 cores (CPUs 0-1, --threads 2). For each size, a
# fresh directory is filled by metad-memory (8 ranks of 2^21 pages, K keys confirmed on
# every rank, --durability none: the log is written, not synced), then:
# - log: kill -9, restart (the state is in the log segments) — from a copy of the killed
#   directory each run, so every run replays the same log;
# - snapshot: graceful stop, restart (the state is in the snapshots that the previous
#   start wrote, the logs are empty).
# Time: from exec to the port accepting connections (polled every 5 ms). RSS: VmRSS once
# listening (after 1 s, so that nothing still settling is missed), against the RSS of
# the server that built the state. Medians of $restart_runs runs.
restart_runs=${RESTART_RUNS:-3}
rss_mib() { awk '/^VmRSS:/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
# Starts the server on $1 and waits for its port; leaves the seconds it took in
# $restart_s and the CPU seconds it used meanwhile (utime + stime, all threads) in $restart_cpu.
restart_s=0
restart_cpu=0
start_timed() {
  local t0 t1 _
  t0=$(date +%s.%N)
  taskset -c 0-1 "$server_bin" --port "$server_port" --cpus 0-1 --log-level warn --data-dir "$1" \
    --durability none &
  server_pid=$!
  pids+=("$server_pid")
  for _ in $(seq 20000); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$server_port") 2>/dev/null; then
      t1=$(date +%s.%N)
      restart_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
      restart_cpu=$(awk -v hz="$hz" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$server_pid/stat")
      return 0
    fi
    kill -0 "$server_pid" 2>/dev/null || { echo "bench.sh: the server exited" >&2; return 1; }
    sleep 0.005
  done
  echo "bench.sh: nothing listening on port $server_port" >&2
  return 1
}
kill9_server() {
  kill -9 "$server_pid"
  wait "$server_pid" 2>/dev/null || true
}

run_restart() {
  local millions keys dir="$tmp/data" rss0 run
  echo "| bindings | keys x ranks | from the log: s (CPU s) | from snapshots: s (CPU s) | RSS before (MiB) | RSS after, log (MiB) | RSS after, snapshots (MiB) | after ÷ before | data dir (MiB) |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for millions in ${RESTART_BINDINGS:-1 4 8 16}; do
    keys=$((millions * 125000))
    rm -rf "$dir" "$dir.killed"
    start_timed "$dir"
    "$build/bench/metad-memory" --pid "$server_pid" --port "$server_port" --ranks 8 \
      --pages 2097152 --keys "$keys" >"$tmp/memory.log" || { cat "$tmp/memory.log" >&2; exit 1; }
    rss0=$(rss_mib "$server_pid")
    kill9_server
    cp -a "$dir" "$dir.killed"
    local -a log_s=() log_cpu=() log_rss=() snap_s=() snap_cpu=() snap_rss=()
    for run in $(seq "$restart_runs"); do
      rm -rf "$dir"
      cp -a "$dir.killed" "$dir"
      start_timed "$dir"
      log_s+=("$restart_s")
      log_cpu+=("$restart_cpu")
      sleep 1
      log_rss+=("$(rss_mib "$server_pid")")
      stop_server
    done
    for run in $(seq "$restart_runs"); do
      start_timed "$dir"
      snap_s+=("$restart_s")
      snap_cpu+=("$restart_cpu")
      sleep 1
      snap_rss+=("$(rss_mib "$server_pid")")
      stop_server
    done
    local lm sm lc sc lr sr size
    lm=$(printf '%s\n' "${log_s[@]}" | median)
    sm=$(printf '%s\n' "${snap_s[@]}" | median)
    lc=$(printf '%s\n' "${log_cpu[@]}" | median)
    sc=$(printf '%s\n' "${snap_cpu[@]}" | median)
    lr=$(printf '%s\n' "${log_rss[@]}" | median)
    sr=$(printf '%s\n' "${snap_rss[@]}" | median)
    size=$(du -sm "$dir.killed" | cut -f1)
    awk -v m="$millions" -v k="$keys" -v lm="$lm" -v sm="$sm" -v lc="$lc" -v sc="$sc" -v r0="$rss0" \
      -v lr="$lr" -v sr="$sr" -v sz="$size" 'BEGIN {a = lr > sr ? lr : sr
        printf "| %dM | %d x 8 | %.2f (%.2f) | %.2f (%.2f) | %d | %d | %d | %.2f | %d |\n", m, k, lm, lc, sm, sc, r0, lr, sr, a / r0, sz}'
    echo "bench.sh: ${millions}M: log ${log_s[*]} s (CPU ${log_cpu[*]}), snapshots ${snap_s[*]} s (CPU ${snap_cpu[*]}); RSS log ${log_rss[*]}, snapshots ${snap_rss[*]} MiB" >&2
    rm -rf "$dir" "$dir.killed"
  done
  echo
  echo "Server on CPUs 0-1 (--cpus 0-1), --durability none; state built by metad-memory (8 ranks" \
    "x 2,097,152 pages); time from exec to listening, median of $restart_runs, with the server's CPU" \
    "time until then (both cores); RSS 1 s after listening; after ÷ before: the larger of the two" \
    "restarts' RSS; data dir: size after the kill."
}

# SGLang's calls against vLLM's at 128 keys, uring, one server core: the read of a
# batch's pages and the save pair on the write-failure path (reserve/allocate 128 fresh
# keys, then release them). Pools and ranks of 131,072 bound keys. With --sglang-ref,
# the SGLang rows run against SGLang's own server too (one uvicorn process on the same
# CPU, as SGLang starts it).
ref_port=18311
start_reference() {
  taskset -c "$server_cpus" /usr/bin/python3 "$root/bench/sglang_ref/run_reference.py" \
    "$sglang_ref" --host 127.0.0.1 --port "$ref_port" >"$tmp/reference.log" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  wait_port "$ref_port"
}
run_sglang() {
  local c
  for c in "vLLM get_locations 128 keys:get_locations.lua:2:64" \
    "SGLang get_page_indices 128 keys:sglang_get_page_indices.lua:2:64" \
    "SGLang exists 128 keys:sglang_exists.lua:2:64" \
    "vLLM alloc→release pair 128 keys (req = half pair):alloc_release.lua:8:8" \
    "SGLang reserve→release pair 128 keys (req = half pair):sglang_reserve_release.lua:8:8"; do
    IFS=: read -r name script threads conns <<<"$c"
    start_server uring "$server_cpus"
    METAD_BENCH_KEYS=131072 wrk_case "$name" uring "$server_port" "$script" "$threads" "$conns" \
      "$load_cpus" "$server_pid"
    stop_server
    [[ -n $sglang_ref && $name == SGLang* ]] || continue
    start_reference
    METAD_BENCH_KEYS=131072 wrk_case "$name" "SGLang's server" "$ref_port" "$script" "$threads" \
      "$conns" "$load_cpus" "$server_pid"
    stop_server
  done
  print_table
  [[ -z $sglang_ref ]] || echo "SGLang's server: $(head -1 "$tmp/reference.log" | sed 's/^run_reference: //')" \
    "(uvicorn $(/usr/bin/python3 -c 'import uvicorn; print(uvicorn.__version__)'), its default access log on)."
}

# --repl: one etcd (tuned as deploy/etcd: 50/500 ms); per round a fresh cluster (its own
# name, empty data directories): the leader, then the standby, which copies the leader's
# state and joins /sync; wrk runs once /sync lists it. The control is the same server
# alone with --durability sync. Server CPU per request counts the leader only.
run_repl() {
  local etcd_port=18391 etcd_peer=18392 repl_port=18393 standby_port=18311 round etcd_pid
  local etcd_url="http://127.0.0.1:$etcd_port"
  /usr/bin/etcd --name b1 --data-dir "$tmp/etcd" --listen-client-urls "$etcd_url" \
    --advertise-client-urls "$etcd_url" --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "b1=http://127.0.0.1:$etcd_peer" --heartbeat-interval 50 \
    --election-timeout 500 >"$tmp/etcd.log" 2>&1 &
  etcd_pid=$!
  pids+=("$etcd_pid")
  for _ in $(seq 100); do
    curl -s -o /dev/null -m 1 -X POST -d '{"key":"eA=="}' "$etcd_url/v3/kv/range" && break
    sleep 0.1
  done
  "$root/scripts/repl-certs.sh" "$tmp/pki" a b
  # One replicated pair (a leads, b joins /sync), then wrk on a: repl_pair_case cluster
  # label [--repl-tls-ca FILE: both nodes over TLS, each with its own certificate].
  repl_pair_case() {
    local cluster=$1 label=$2 tls_a=() tls_b=()
    if (($# > 2)); then
      tls_a=("$3" "$4" --repl-tls-cert "$tmp/pki/a.crt" --repl-tls-key "$tmp/pki/a.key")
      tls_b=("$3" "$4" --repl-tls-cert "$tmp/pki/b.crt" --repl-tls-key "$tmp/pki/b.key")
    fi
    rm -rf "$tmp/a" "$tmp/b"
    local ha=(--ha-etcd "$etcd_url" --ha-cluster "$cluster")
    start_server uring "$server_cpus" "${ha[@]}" --ha-node a --data-dir "$tmp/a" \
      --repl-listen "127.0.0.1:$repl_port" "${tls_a[@]}"
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$server_port/ready" && break; sleep 0.05; done
    taskset -c "$server_cpus" "$server_bin" --port "$standby_port" --cpus "$server_cpus" \
      --io uring --log-level warn "${ha[@]}" --ha-node b --data-dir "$tmp/b" \
      --repl-listen "127.0.0.1:$((repl_port + 1))" "${tls_b[@]}" &
    local standby_pid=$!
    pids+=("$standby_pid")
    local _
    for _ in $(seq 200); do sync_lists_b "$etcd_url" "$cluster" && break; sleep 0.05; done
    sync_lists_b "$etcd_url" "$cluster" || { echo "bench.sh: b never joined /sync of $cluster" >&2; exit 1; }
    wrk_case "$label" uring "$server_port" alloc_release.lua 64 64 "$load_cpus" "$server_pid"
    kill -9 "$server_pid" "$standby_pid"
    wait "$server_pid" "$standby_pid" 2>/dev/null || true
  }
  for round in $(seq "${REPL_ROUNDS:-3}"); do
    rm -rf "$tmp/data"
    start_server uring "$server_cpus" --data-dir "$tmp/data" --durability sync
    wrk_case "alloc→release pair, 64 conns, local --durability sync" uring "$server_port" \
      alloc_release.lua 64 64 "$load_cpus" "$server_pid"
    stop_server
    repl_pair_case "bench-$round" "alloc→release pair, 64 conns, sync + standby in /sync"
    # The same over mutual TLS (--repl-tls-*, certificates by scripts/repl-certs.sh).
    repl_pair_case "bench-tls-$round" "alloc→release pair, 64 conns, sync + standby in /sync, TLS" \
      --repl-tls-ca "$tmp/pki/ca.crt"
  done
  print_table
  echo "Replication: leader and standby both on CPU $server_cpus (one disk); each round a fresh" \
    "cluster; rows alternate control, replication and replication over TLS, ${REPL_ROUNDS:-3} rounds."
  echo
  echo "| bindings (keys x 8 ranks) | state sent, MB | catch-up s (start → in /sync) | s per GB | leader's longest answer meanwhile, ms | kill -9 → standby /ready ms | kill -9 → first answer through HAProxy ms | promotion ms (directory + rest) |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
  local m
  local m run
  for m in ${REPL_BINDINGS:-1 4 8 16}; do
    : >"$tmp/catch-up-rows"
    for run in $(seq "${REPL_RUNS:-3}"); do repl_catch_up "$m" "$etcd_url" "$repl_port" "$run"; done
    # Each column's median over the runs (the promotion's split: its own runs' medians).
    awk -F'|' -v m="$m" '
      function median(col,   n, i, j, t, v) {
        n = 0
        for (i = 1; i <= rows; ++i) { v[++n] = cell[i, col] + 0 }
        for (i = 2; i <= n; ++i) for (j = i; j > 1 && v[j - 1] > v[j]; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        return v[int((n + 1) / 2)]
      }
      { ++rows; for (i = 1; i <= NF; ++i) cell[rows, i] = $i
        split($9, p, /[ ()+]+/); pr[rows] = p[2]; pd[rows] = p[3]; ps[rows] = p[4] }
      END {
        for (i = 1; i <= rows; ++i) { cell[i, 20] = pr[i]; cell[i, 21] = pd[i]; cell[i, 22] = ps[i] }
        printf "| **%dM, median** | %.1f | %.2f | %.1f | %d | %d | %d | %.1f (%.1f + %.1f) |\n", m, median(3),
          median(4), median(5), median(6), median(7), median(8), median(20), median(21), median(22)
      }' "$tmp/catch-up-rows"
  done
  echo "(each size: ${REPL_RUNS:-3} runs, then their median, column by column; standby on CPU ${REPL_STANDBY_CPUS:-$server_cpus})"
  kill "$etcd_pid"
}

# An empty standby joins a leader holding M million bindings (metad-memory fills it);
# then the leader is killed (-9) and the standby takes over. One table row.
now_ms() { date +%s%3N; }
sync_lists_b() {  # etcd_url cluster
  local key
  key=$(printf '/hf3fs-metad/%s/sync' "$2" | base64 -w0)
  curl -s -X POST -d "{\"key\":\"$key\"}" "$1/v3/kv/range" |
    python3 -c 'import base64,json,sys; kv=json.load(sys.stdin).get("kvs",[]); sys.exit(0 if kv and "\"b\"" in base64.b64decode(kv[0]["value"]).decode() else 1)'
}
repl_catch_up() {  # millions etcd_url repl_port run
  local keys=$(($1 * 1048576 / 8)) cluster="catch-up-$1-$4" t0 t1 t2 t3 bytes promoted
  local ha=(--ha-etcd "$2" --ha-cluster "$cluster" --durability sync --io uring --log-level info)
  rm -rf "$tmp/a" "$tmp/b"
  taskset -c "$server_cpus" "$server_bin" --port "$server_port" --cpus "$server_cpus" "${ha[@]}" \
    --ha-node a --data-dir "$tmp/a" --repl-listen "127.0.0.1:$3" >"$tmp/a.log" 2>&1 &
  local leader=$!
  pids+=("$leader")
  for _ in $(seq 200); do curl -sf -o /dev/null "http://127.0.0.1:$server_port/ready" && break; sleep 0.05; done
  "$build/bench/metad-memory" --pid "$leader" --port "$server_port" --ranks 8 \
    --pages $((keys * 2)) --keys "$keys" >"$tmp/memory.log" || { cat "$tmp/memory.log" >&2; exit 1; }
  # The leader's longest answer while the standby copies its state (asked every 5 ms
  # on the load CPU): how long a core stood still for the snapshot.
  : >"$tmp/stall"
  taskset -c "$load_cpus" python3 -c '
import http.client, sys, time
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
worst = 0.0
while True:
    t = time.monotonic()
    c.request("POST", "/keys/batch_exists", body=b"{\"keys\":[]}")
    c.getresponse().read()
    took = time.monotonic() - t
    if took > worst:
        worst = took
        with open(sys.argv[2], "a") as f:
            f.write(f"{worst * 1000:.0f} at {t:.3f}\n")
    time.sleep(0.005)' "$server_port" "$tmp/stall" &
  local prober=$!
  pids+=("$prober")
  t0=$(now_ms)
  # REPL_STANDBY_CPUS: the standby's CPU (default the leader's: one CPU for both nodes
  # and the leader's cutting child; another CPU is closer to two hosts).
  local standby_cpus=${REPL_STANDBY_CPUS:-$server_cpus}
  taskset -c "$standby_cpus" "$server_bin" --port 18311 --cpus "$standby_cpus" "${ha[@]}" \
    --ha-node b --data-dir "$tmp/b" --repl-listen "127.0.0.1:$(($3 + 1))" >"$tmp/b.log" 2>&1 &
  local standby=$!
  pids+=("$standby")
  local deadline=$((SECONDS + 300))
  until sync_lists_b "$2" "$cluster"; do
    ((SECONDS < deadline)) || { echo "bench.sh: the standby never joined /sync" >&2; exit 1; }
    sleep 0.02
  done
  t1=$(now_ms)
  kill "$prober"
  wait "$prober" 2>/dev/null || true
  # HAProxy in front, as deploy/haproxy/hf3fs-metad-ha.cfg ships (/ready checked every
  # 100 ms): what a client sees of the takeover. Its first check of b fails: wait until
  # every answer comes from a.
  local haproxy proxy
  read -r proxy haproxy < <(cd "$root/tests/e2e" && python3 -c '
import sys, test_ha
proc, url = test_ha.start_haproxy(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
print(url, proc.pid)' "$tmp" "$server_port" 18311)
  pids+=("$haproxy")
  local ok=0
  for _ in $(seq 100); do
    if [[ $(curl -s -o /dev/null -w '%{http_code}' -X POST -d '{"keys":[]}' "$proxy/keys/batch_exists") == 200 ]]; then
      ok=$((ok + 1))
      ((ok < 10)) || break
    else
      ok=0
    fi
    sleep 0.05
  done
  kill -9 "$leader"
  t2=$(now_ms)
  deadline=$((SECONDS + 60))
  # Through HAProxy and straight to b, alternately, every ~10 ms.
  local t_proxy=0
  t3=0
  while ((t3 == 0 || t_proxy == 0)); do
    ((SECONDS < deadline)) || { echo "bench.sh: the standby never took over" >&2; tail "$tmp/b.log" >&2; exit 1; }
    if ((t_proxy == 0)) && [[ $(curl -s -o /dev/null -m 1 -w '%{http_code}' -X POST -d '{"keys":[]}' "$proxy/keys/batch_exists") == 200 ]]; then
      t_proxy=$(now_ms)
    fi
    if ((t3 == 0)) && curl -sf -o /dev/null -m 1 "http://127.0.0.1:18311/ready"; then
      t3=$(now_ms)
    fi
    sleep 0.005
  done
  kill "$haproxy" 2>/dev/null || true
  # REPL_KEEP_LOGS=DIR: both nodes' logs of each run, for a look at the timeline.
  if [[ -n ${REPL_KEEP_LOGS:-} ]]; then
    mkdir -p "$REPL_KEEP_LOGS"
    cp "$tmp/a.log" "$REPL_KEEP_LOGS/$cluster-a.log"
    cp "$tmp/b.log" "$REPL_KEEP_LOGS/$cluster-b.log"
  fi
  bytes=$(grep -o 'its state at [0-9]*: [0-9]* bytes' "$tmp/a.log" | awk '{s += $5} END {print s + 0}')
  promoted=$(grep -o 'promoted in [0-9.]* ms' "$tmp/b.log" | awk '{print $3}')
  # Its split (replayer.cpp, promote_standby): finishing the directory, then the rest
  # (none from a build before that line: '-').
  local split_c split_d
  split_c=$(grep -o 'keys finished in [0-9.]* ms' "$tmp/b.log" | awk '{print $4}' || true)
  split_d=$(grep -o 'rest done in [0-9.]* ms' "$tmp/b.log" | awk '{print $4}' || true)
  promoted+=" (${split_c:--} + ${split_d:--})"
  awk -v m="$1" -v b="$bytes" -v c="$((t1 - t0))" -v f="$((t3 - t2))" -v h="$((t_proxy - t2))" -v p="$promoted" \
    -v w="$(sort -n "$tmp/stall" | tail -1 | cut -d' ' -f1)" 'BEGIN {
    printf "| %dM | %.1f | %.2f | %.1f | %s | %d | %d | %s |\n", m, b / 1e6, c / 1000, (c / 1000) / (b / 1e9), w, f, h, p }' |
    tee -a "$tmp/catch-up-rows"
  kill -9 "$standby"
  wait "$leader" "$standby" 2>/dev/null || true
}

case $mode in
  repl) run_repl ;;
  sglang) run_sglang ;;
  fanout) run_fanout ;;
  restart) run_restart ;;
  quick) run_wrk_suite ;;
  memory) run_memory ;;
  micro) run_micro ;;
  scaling) run_scaling ;;
  stale) run_stale ;;
  full) run_wrk_suite; echo; run_memory; echo; run_micro ;;
esac
