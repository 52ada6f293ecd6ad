#!/usr/bin/env bash
# Packs what `scripts/bench.sh --scaling` runs into one folder, for a machine that has
# none of our packages (a borrowed 16-core host without internet): the release server
# and load generator, wrk and curl (wrk's Lua setup populates the server through curl),
# every shared library they load, and this machine's dynamic loader. Each program is
# started through a wrapper that runs the packed loader on the packed libraries, so the
# other machine's own libraries (or their absence) do not matter.
#
#   scripts/bench-kit.sh [DIR]     default DIR: build-kit (ignored by git, ~24 MB)
#
# Then, on the other machine, from the repository root (the tree and DIR copied there):
#   PATH=$PWD/build-kit/bin:$PATH scripts/bench.sh --scaling --no-build --build-dir build-kit
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
kit=$(realpath -m "${1:-$root/build-kit}")
build="$root/build-bench"

for tool in wrk curl ldd; do
  command -v "$tool" >/dev/null || { echo "bench-kit.sh: $tool missing: run scripts/setup.sh --bench" >&2; exit 1; }
done
# Only a folder this script made is replaced: it carries a marker.
marker="$kit/.bench-kit"
if [[ -e "$kit" && ! -e "$marker" ]] && [[ -n "$(ls -A "$kit")" ]]; then
  echo "bench-kit.sh: $kit exists and is not a kit; give an empty or new folder" >&2
  exit 1
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMETAD_BENCH=ON -DMETAD_TESTS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target hf3fs-metad metad-load >/dev/null

rm -rf "$kit"
mkdir -p "$kit/real" "$kit/lib" "$kit/bin" "$kit/bench"
: >"$marker"

# pack NAME BINARY WRAPPER: the binary, its libraries, and a wrapper at WRAPPER.
pack() {
  local name=$1 binary=$2 wrapper=$3 lib
  cp -L "$binary" "$kit/real/$name"
  # ldd prints "name => /path (addr)" for libraries and "/path (addr)" for the loader.
  if ldd "$binary" | grep "not found" >/dev/null; then
    echo "bench-kit.sh: $binary needs a library this machine lacks:" >&2
    ldd "$binary" | grep "not found" >&2
    exit 1
  fi
  while read -r lib; do
    [[ -e "$kit/lib/$(basename "$lib")" ]] || cp -L "$lib" "$kit/lib/"
  done < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
  # The wrapper finds the kit from its own path, so the kit can be moved.
  local up
  up=$(realpath --relative-to="$(dirname "$wrapper")" "$kit")
  cat >"$wrapper" <<EOF
#!/bin/sh
kit=\$(CDPATH= cd -P -- "\$(dirname -- "\$(readlink -f -- "\$0")")/$up" && pwd)
exec "\$kit/lib/$(basename "$loader")" --inhibit-cache --library-path "\$kit/lib" "\$kit/real/$name" "\$@"
EOF
  chmod +x "$wrapper"
}

loader=$(ldd "$build/hf3fs-metad" | awk '$1 ~ /^\// && $1 ~ /ld-linux/ {print $1}')
[[ -n "$loader" && "$loader" != *$'\n'* ]] || { echo "bench-kit.sh: no single dynamic loader in ldd's output" >&2; exit 1; }
[[ "$kit" != *:* ]] || { echo "bench-kit.sh: the kit's path may not contain ':' (--library-path)" >&2; exit 1; }
pack hf3fs-metad "$build/hf3fs-metad" "$kit/hf3fs-metad"
pack metad-load "$build/bench/metad-load" "$kit/bench/metad-load"
pack wrk "$(command -v wrk)" "$kit/bin/wrk"
pack curl "$(command -v curl)" "$kit/bin/curl"

# Smoke test: every packed program starts through its wrapper.
"$kit/hf3fs-metad" --help >/dev/null
"$kit/bench/metad-load" --help >/dev/null
"$kit/bin/curl" --version >/dev/null
wrk_version=$("$kit/bin/wrk" -v 2>&1 || true)  # wrk -v exits 1
[[ $wrk_version == wrk* ]] || { echo "bench-kit.sh: packed wrk does not start: $wrk_version" >&2; exit 1; }
echo "bench-kit.sh: $kit ($(du -sh "$kit" | cut -f1)); on the other machine:"
echo "  PATH=\$PWD/$(realpath --relative-to="$root" "$kit")/bin:\$PATH scripts/bench.sh --scaling --no-build --build-dir $(realpath --relative-to="$root" "$kit")"
