#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# first_fetch_before_after — an engine's first fetch from a fresh consumer
# context (issue 26, first row), for two builds in one run: bench/first_fetch.c
# compiled against each build's libecx.so, the two alternating RUNS times.
#
# usage: bench/first_fetch_before_after.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR
# env:   FFBA_RUNS (3), FFBA_SIZE (256000000), FFBA_DATA (shm)
# Output: one line per run and build (bench/first_fetch.c's).
set -u
[ $# = 2 ] || { echo "usage: $0 BEFORE_BUILD_DIR AFTER_BUILD_DIR" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
RUNS=${FFBA_RUNS:-3} SIZE=${FFBA_SIZE:-256000000} DATA=${FFBA_DATA:-shm}
T=$(mktemp -d /tmp/ecx-ffba.XXXXXX)
trap 'rm -rf "$T"' EXIT
for side in before after; do
  dir=$1; [ $side = after ] && dir=$2
  dir=$(cd "$dir" && pwd) || exit 1
  [ -e "$dir/libecx.so" ] || { echo "first_fetch_before_after: no libecx.so in $dir" >&2; exit 1; }
  cc -O2 "$HERE/first_fetch.c" -I"$HERE/../include" -L"$dir" -lecx -Wl,-rpath,"$dir" \
    -o "$T/first_fetch-$side" || exit 1
done
rc=0
for r in $(seq "$RUNS"); do
  for side in before after; do
    line=$("$T/first_fetch-$side" --size "$SIZE" --data "$DATA") || rc=1
    echo "run $r $side: $line"
  done
done
exit $rc
