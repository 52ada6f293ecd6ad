#!/usr/bin/env bash
# Installs the Debian packages the build needs (as root), plus those of the profiles
# named as arguments: --test (nginx and haproxy for the proxy tests, promtool for the
# metrics and alert rule checks, clang for the fuzzers, etcd-server for the ha
# module's integration tests, chromium for the status page's headless test), --bench
# (wrk, nginx), --fuzz
# (clang). Skips apt entirely when everything is already there.
set -euo pipefail

# dpkg-dev: dpkg-shlibdeps, which scripts/package.sh's cpack runs for the Depends line.
# ccache: scripts/build.sh and scripts/fuzz.sh use it when present.
# libssl-dev: OpenSSL, for TLS to etcd and between replicas; openssl: the CLI that
# makes certificates (docs/operations.md) and that the TLS tests run.
packages=(build-essential cmake pkg-config liburing-dev libasio-dev libsimdjson-dev
  libfmt-dev libssl-dev libgtest-dev libgmock-dev libbenchmark-dev python3 python3-requests
  dpkg-dev ccache openssl)
for profile in "$@"; do
  case "$profile" in
    --test) packages+=(nginx-light haproxy prometheus clang-14 libclang-rt-14-dev etcd-server chromium) ;;
    --bench) packages+=(wrk nginx-light curl) ;;
    --fuzz) packages+=(clang-14 libclang-rt-14-dev) ;;
    *) echo "usage: scripts/setup.sh [--test] [--bench] [--fuzz]" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [[ $(id -u) -eq 0 ]] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
