#!/usr/bin/env bash
# The Debian package, as an operator gets it: builds it (scripts/package.sh, reusing a
# release tree with --build-dir), checks its control data (Depends on the runtime
# libraries, conffiles, maintainer scripts) and its files (at the installed paths, no
# tests or benchmarks), runs the maintainer scripts against a scratch root (DPKG_ROOT:
# they must not touch the host), extracts it with `dpkg -x` and serves from the
# extracted binary: --version, /health and one batch_exists on an ephemeral port, then
# SIGTERM must exit 0. Skips (exit 0) where dpkg-deb is missing.
#   tests/package_test.sh [--build-dir DIR]   (default: scripts/package.sh's build-package)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v dpkg-deb >/dev/null || ! command -v cpack >/dev/null; then
  echo "package test: skipped (no dpkg-deb or cpack here)"
  exit 0
fi
package_args=(--no-setup)
[[ "${1:-}" == --build-dir ]] && package_args+=(--build-dir "${2:?--build-dir needs a directory}")

scratch=$(mktemp -d)
server_pid=""
cleanup() {
  [[ -n "$server_pid" ]] && kill -KILL "$server_pid" 2>/dev/null
  rm -rf "$scratch"
}
trap cleanup EXIT
fail() {
  echo "package test: FAIL: $*" >&2
  exit 1
}

deb=$(scripts/package.sh "${package_args[@]}" | tail -n 1)
[[ -f "$deb" ]] || fail "scripts/package.sh printed no package path"
echo "package test: $deb"

# --- control data ----------------------------------------------------------------------
[[ $(dpkg-deb -f "$deb" Package) == hf3fs-metad ]] || fail "Package is not hf3fs-metad"
version=$(sed -n 's/^project(hf3fs_metad VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[[ $(dpkg-deb -f "$deb" Version) == "$version" ]] || fail "Version is not $version"
depends=$(dpkg-deb -f "$deb" Depends)
# The binary's own libraries, as dpkg-shlibdeps names them on this system.
for lib in liburing libfmt libsimdjson libssl libstdc++ libc6; do
  [[ "$depends" == *"$lib"* ]] || fail "Depends lacks $lib: $depends"
done
dpkg-deb -e "$deb" "$scratch/control"
[[ $(cat "$scratch/control/conffiles") == /etc/default/hf3fs-metad ]] ||
  fail "conffiles: $(cat "$scratch/control/conffiles")"
for script in postinst prerm postrm; do
  [[ -x "$scratch/control/$script" ]] || fail "no executable $script"
  sh -n "$scratch/control/$script" || fail "$script does not parse"
done

# --- files -----------------------------------------------------------------------------
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$scratch/files"
for path in /usr/bin/hf3fs-metad /usr/lib/systemd/system/hf3fs-metad.service \
  /etc/default/hf3fs-metad /usr/share/hf3fs-metad/nginx/hf3fs-metad.conf \
  /usr/share/hf3fs-metad/nginx/hf3fs-metad-tls.conf \
  /usr/share/hf3fs-metad/haproxy/hf3fs-metad-tls.cfg \
  /usr/share/hf3fs-metad/haproxy/hf3fs-metad-central.cfg \
  /usr/share/doc/hf3fs-metad/README.md /usr/share/doc/hf3fs-metad/api.md; do
  grep -qx "$path" "$scratch/files" || fail "the package lacks $path"
done
# Only the server: no test, fuzzer or benchmark binary, no static library or header.
if grep -E '_tests$|_fuzz$|metad-load|bench|\.a$|/include/' "$scratch/files"; then
  fail "the package holds files beyond the server (above)"
fi

# --- maintainer scripts in a scratch root (the chroot case) ----------------------------
# A systemctl that fails loudly proves the scripts never reach the host's systemd here.
mkdir -p "$scratch/bin" "$scratch/root"
printf '#!/bin/sh\necho "systemctl called: $*" >&2\nexit 1\n' >"$scratch/bin/systemctl"
chmod +x "$scratch/bin/systemctl"
run_script() {
  DPKG_ROOT="$scratch/root" PATH="$scratch/bin:$PATH" "$scratch/control/$1" "${@:2}" \
    >"$scratch/script.out" 2>&1 || fail "$1 $2 exited $?: $(cat "$scratch/script.out")"
  if grep -q "systemctl called" "$scratch/script.out"; then
    fail "$1 $2 called systemctl under DPKG_ROOT: $(cat "$scratch/script.out")"
  fi
}
run_script postinst configure
grep -q "openssl rand" "$scratch/script.out" || fail "postinst printed no token instructions"
[[ $(stat -c %a "$scratch/root/etc/hf3fs-metad") == 700 ]] || fail "/etc/hf3fs-metad is not 0700"
run_script prerm remove
run_script postrm remove
run_script postrm purge
[[ ! -e "$scratch/root/etc/hf3fs-metad" ]] || fail "purge left the empty /etc/hf3fs-metad"

# --- the extracted package serves ------------------------------------------------------
dpkg -x "$deb" "$scratch/root"
unit="$scratch/root/usr/lib/systemd/system/hf3fs-metad.service"
grep -q '^ExecStart=/usr/bin/hf3fs-metad ' "$unit" || fail "the unit's ExecStart is not /usr/bin"
grep -q '^EnvironmentFile=-/etc/default/hf3fs-metad$' "$unit" || fail "the unit reads no /etc/default"
grep -q '\$METAD_ARGS$' "$unit" || fail "the unit does not pass \$METAD_ARGS"
binary="$scratch/root/usr/bin/hf3fs-metad"
"$binary" --version >"$scratch/version" || fail "--version exited $?"
grep -q "^hf3fs-metad $version (transports: io_uring, epoll)$" "$scratch/version" ||
  fail "--version: $(cat "$scratch/version")"
echo "package test: $(head -n 1 "$scratch/version"); $(sed -n 2p "$scratch/version")"

"$binary" --port 0 --threads 1 --summary-interval-ms 0 2>"$scratch/server.log" &
server_pid=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$scratch/server.log" | head -n 1)
  [[ -n "$port" ]] && break
  kill -0 "$server_pid" 2>/dev/null || fail "the server exited: $(cat "$scratch/server.log")"
  sleep 0.1
done
[[ -n "$port" ]] || fail "no 'listening on' line: $(cat "$scratch/server.log")"

# One request per connection, answered then closed (HTTP/1.0), with bash's /dev/tcp.
request() {
  local body="${3:-}"
  exec 3<>"/dev/tcp/127.0.0.1/$port"
  printf '%s %s HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' \
    "$1" "$2" "${#body}" "$body" >&3
  cat <&3
  exec 3<&-
}
answer=$(request GET /health)
[[ "$answer" == "HTTP/1.1 200"* && "$answer" == *'{"status":"ok"}' ]] || fail "/health: $answer"
answer=$(request POST /keys/batch_exists '{"keys":["a","b"]}')
[[ "$answer" == "HTTP/1.1 200"* && "$answer" == *'{"exists":[false,false]}' ]] ||
  fail "batch_exists: $answer"

kill -TERM "$server_pid"
status=0
wait "$server_pid" || status=$?
server_pid=""
((status == 0)) || fail "SIGTERM: exit status $status: $(cat "$scratch/server.log")"
echo "package test: OK (Depends: $depends)"
