#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install the Debian 12 packages ecx needs, if any are missing. Idempotent:
# when everything is present it only checks and exits 0.
set -euo pipefail

PKGS=(
  build-essential binutils cmake pkg-config clang libclang-rt-14-dev
  libzmq3-dev libmsgpack-dev libsodium-dev libjansson-dev libcmocka-dev
  libucx-dev ucx-utils libxxhash-dev iproute2 libmicrohttpd-dev
  python3 python3-zmq python3-msgpack python3-dev python3-venv python3-pip
  valgrind procps util-linux
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: not root; run: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
