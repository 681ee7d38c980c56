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
. "$HERE/build_against.sh"
build_against first_fetch.c first_fetch "$1" "$2" "$T" || exit 1
rc=0
for r in $(seq "$RUNS"); do
  for side in before after; do
    line=$("$T/first_fetch-$side" --size "$SIZE" --data "$DATA") || rc=1
    echo "run $r $side: $line"
  done
done
exit $rc
