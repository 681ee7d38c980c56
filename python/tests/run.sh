#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make pytest: install the package as a newcomer would, into a fresh venv, from
# the checkout's tracked files only, then run the Python tests.
#   python/tests/run.sh VENV [PYTHON]
# pip's build isolation fetches scikit-build-core (and cmake/ninja if the
# system ones will not do) from PyPI; pytest and numpy come from PyPI too.
set -euo pipefail
venv=$1
python=${2:-python3}
root=$(cd "$(dirname "$0")/../.." && pwd)
src=$venv.src

rm -rf "$venv" "$src"
"$python" -m venv "$venv"
# A clean checkout: the tracked files (as in the working tree), nothing else.
mkdir -p "$src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$root" && git ls-files -z | while IFS= read -r -d '' f; do
     [ -e "$f" ] && printf '%s\0' "$f"; done | xargs -0 -r cp --parents -t "$src")
else
  cp -a "$root/." "$src"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check pytest numpy
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$src[events]"  # ecx.events: pyzmq, msgpack
cd "$root/python/tests"
# Not from the source tree: the test imports the installed package.
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider .
