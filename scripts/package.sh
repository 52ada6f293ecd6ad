#!/usr/bin/env bash
# Builds the Debian package (hf3fs-metad_VERSION_ARCH.deb) from this tree: installs the
# build dependencies (scripts/setup.sh), configures a release build in build-package
# without the tests, builds only the server and runs `cpack -G DEB`. Prints the .deb's
# path on the last line; progress goes to stderr.
#   --build-dir DIR   use DIR instead (an existing release tree is reused as configured:
#                     scripts/test.sh packages its own build/ this way)
#   --no-setup        skip scripts/setup.sh (the caller ran it)
set -euo pipefail
cd "$(dirname "$0")/.."

dir=build-package
setup=1
while (($#)); do
  case "$1" in
    --build-dir) dir="${2:?--build-dir needs a directory}"; shift 2 ;;
    --no-setup) setup=0; shift ;;
    *) echo "usage: scripts/package.sh [--build-dir DIR] [--no-setup]" >&2; exit 2 ;;
  esac
done

if ((setup)); then
  echo "package: checking the build dependencies (scripts/setup.sh)" >&2
  scripts/setup.sh
fi
if [[ -f "$dir/CMakeCache.txt" ]]; then
  # A sanitizer or debug build must not become the package.
  grep -qx 'CMAKE_BUILD_TYPE:STRING=Release' "$dir/CMakeCache.txt" ||
    { echo "package: $dir is not a Release build tree" >&2; exit 1; }
  grep -q '^METAD_SANITIZE:STRING=.' "$dir/CMakeCache.txt" &&
    { echo "package: $dir is a sanitizer build tree" >&2; exit 1; }
  echo "package: reusing the release tree $dir" >&2
  cmake -S . -B "$dir" >/dev/null
else
  echo "package: configuring a release build in $dir" >&2
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DMETAD_TESTS=OFF >/dev/null
fi
echo "package: building $dir/hf3fs-metad (server only)" >&2
cmake --build "$dir" -j"$(nproc)" --target hf3fs-metad >&2
echo "package: cpack -G DEB" >&2
rm -f "$dir"/hf3fs-metad_*.deb
(cd "$dir" && cpack -G DEB) >&2
debs=("$dir"/hf3fs-metad_*.deb)
[[ -f "${debs[0]}" ]] || { echo "package: cpack made no .deb" >&2; exit 1; }
realpath "${debs[0]}"
