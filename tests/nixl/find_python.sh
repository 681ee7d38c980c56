# SPDX-License-Identifier: Apache-2.0
# Sourced by the NIXL tests: sets NIXL_PY to a python that imports the real
# nixl package (nixl_cu12) and msgspec, or exits 77 (ctest: skipped) saying
# why. Looks at $ECX_NIXL_PYTHON, then BUILD_DIR/nixl-venv/bin/python (what
# tests/nixl/venv.sh BUILD_DIR creates), then the default build's (so the
# sanitizer builds find it too). Needs $1 = the build directory.
NIXL_PY=
_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
for c in "${ECX_NIXL_PYTHON:-}" "${1:-.}/nixl-venv/bin/python" "$_root/build/nixl-venv/bin/python"; do
  if [ -n "$c" ] && [ -x "$c" ] && "$c" -c 'import nixl_cu12._api, msgspec' >/dev/null 2>&1; then
    NIXL_PY=$c
    break
  fi
done
if [ -z "$NIXL_PY" ]; then
  echo "SKIP: no python with the real nixl package (set ECX_NIXL_PYTHON, or run tests/nixl/venv.sh ${1:-BUILD_DIR})"
  exit 77
fi
