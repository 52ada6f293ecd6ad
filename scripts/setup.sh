#!/usr/bin/env bash
# Installs the Debian packages the build, the tests and the benchmarks need (as root),
# skipping apt entirely when everything is already there.
set -euo pipefail

packages=(build-essential cmake pkg-config liburing-dev libasio-dev libsimdjson-dev
  libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev python3 python3-requests)
if [[ "${1:-}" == "--bench" ]]; then packages+=(wrk nginx-light curl); fi
if [[ "${1:-}" == "--fuzz" ]]; then packages+=(clang-14 libclang-rt-14-dev); fi

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
