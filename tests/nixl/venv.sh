#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# venv.sh BUILD_DIR — create (once) BUILD_DIR/nixl-venv: the Python side of the vLLM
# peer harness (tests/nixl/vllm_peer.py) and of the NIXL wire checks. Idempotent: when the
# venv is complete it only checks a stamp. Prints the venv's python on stdout; progress
# and errors go to stderr. Exit 0 ready, 1 failed (then nothing is printed).
#
# Pinned:  torch==2.13.0 (CPU build: installed FIRST, because nixl-cu12 has an unpinned
#          `Requires-Dist: torch` that would otherwise pull a multi-GB CUDA build),
#          nixl-cu12==1.5.1 (the NIXL library, its UCX and its plugins),
#          nixl==1.5.2 (meta package: the `nixl` import name; --no-deps, because its
#          metadata also requires nixl-cu13), msgspec, pyzmq, numpy (the versions below);
#          vllm==0.34.0: the wheel is downloaded with `pip download --no-deps` (never
#          installed) and only vllm/distributed/** (the ECCPUConnector modules and
#          nixl_utils.py) plus vllm/__init__-free stubs are unpacked, see vllm_peer.py.
# ECX_VLLM_WHEEL=/path/to/vllm-0.34.0-...whl skips the download; else a copy in
# $PIP_CACHE_WHEELS (default /tmp/pipt) is used when present, else pip downloads it.
set -euo pipefail
BUILD=${1:?usage: venv.sh BUILD_DIR}
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
V="$BUILD/nixl-venv"
PY=${ECX_VENV_PYTHON:-/usr/bin/python3}
TORCH=2.13.0 NIXL_CU12=1.5.1 NIXL=1.5.2 MSGSPEC=0.23.0 PYZMQ=27.3.0 NUMPY=2.4.6 VLLM=0.34.0
STAMP="torch=$TORCH nixl-cu12=$NIXL_CU12 nixl=$NIXL msgspec=$MSGSPEC pyzmq=$PYZMQ numpy=$NUMPY vllm=$VLLM v1"
log() { echo "venv.sh: $*" >&2; }

if [ -f "$V/.ecx-stamp" ] && [ "$(cat "$V/.ecx-stamp")" = "$STAMP" ] && [ -x "$V/bin/python" ]; then
  echo "$V/bin/python"; exit 0
fi
rm -rf "$V"
log "creating $V (one time; a few minutes)"
"$PY" -m venv "$V" >&2 || { log "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
PIP=("$V/bin/python" -m pip --disable-pip-version-check -q)
# torch first, the CPU build: from pip's own configuration where it offers the local
# 2.13.0+cpu wheel (find-links), else from PyTorch's CPU index. Never a plain `torch`.
if ! "${PIP[@]}" install "torch==$TORCH+cpu" >&2 2>"$BUILD/nixl-venv-torch.log"; then
  log "no torch $TORCH+cpu via pip's configuration: using https://download.pytorch.org/whl/cpu"
  "${PIP[@]}" install "torch==$TORCH+cpu" --index-url https://download.pytorch.org/whl/cpu \
    --extra-index-url https://pypi.org/simple >&2
fi
"${PIP[@]}" install "nixl-cu12==$NIXL_CU12" "msgspec==$MSGSPEC" "pyzmq==$PYZMQ" "numpy==$NUMPY" "torch==$TORCH" >&2
"${PIP[@]}" install --no-deps "nixl==$NIXL" >&2

# vllm: sources only, unpacked from the wheel (never installed: its dependencies are an
# engine's). Only the distributed/ tree the ECCPUConnector lives in is extracted.
WHEEL=${ECX_VLLM_WHEEL:-}
if [ -z "$WHEEL" ]; then
  c="${PIP_CACHE_WHEELS:-/tmp/pipt}/vllm-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl"
  if [ -f "$c" ]; then WHEEL=$c; else
    mkdir -p "$BUILD/nixl-dl"
    "${PIP[@]}" download --no-deps "vllm==$VLLM" -d "$BUILD/nixl-dl" >&2
    WHEEL=$(ls "$BUILD"/nixl-dl/vllm-"$VLLM"-*.whl | head -1)
  fi
fi
SRC="$V/vllm-src"
"$V/bin/python" - "$WHEEL" "$SRC" <<'PY' >&2
import sys, zipfile, os
whl, dest = sys.argv[1], sys.argv[2]
n = 0
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith("vllm/distributed/ec_transfer/") or name == "vllm/distributed/nixl_utils.py":
            if name.endswith(".py"):
                z.extract(name, dest); n += 1
print("venv.sh: unpacked %d vllm files into %s" % (n, dest))
PY
"$V/bin/python" -c 'import torch, msgspec, zmq, numpy, nixl._api; assert torch.__version__.startswith("2.13.0")' >&2
echo "$STAMP" >"$V/.ecx-stamp"
echo "$V/bin/python"
