#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# startup_before_after — what a new context costs before its first item is
# in (issue 23 §4), for two builds in one run: bench/startup.c compiled
# against each build's libecx.so, the two alternating RUNS times so that
# drift on a shared machine hits both alike.
#
# usage: bench/startup_before_after.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR
#   (each a CMake build dir holding libecx.so; include/ecx.h of this tree)
# env:   SBA_RUNS (3), SBA_ROUNDS (3: rounds per run), SBA_SIZE (28835840: whole 8 KiB blocks),
#        SBA_IDLE_MS (500)
# Output: one line per run and build (bench/startup.c's figures), then the
# medians of each figure and after ÷ before:
#   create_ms first_save_ms create_and_first_save_ms held_ms idle_save_ms free_ms
set -u
[ $# = 2 ] || { echo "usage: $0 BEFORE_BUILD_DIR AFTER_BUILD_DIR" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
RUNS=${SBA_RUNS:-3} ROUNDS=${SBA_ROUNDS:-3} SIZE=${SBA_SIZE:-28835840} IDLE=${SBA_IDLE_MS:-500}
T=$(mktemp -d /tmp/ecx-sba.XXXXXX)
trap 'rm -rf "$T"' EXIT
. "$HERE/build_against.sh"
build_against startup.c startup "$1" "$2" "$T" || exit 1
for r in $(seq "$RUNS"); do
  for side in before after; do
    line=$("$T/startup-$side" --rounds "$ROUNDS" --size "$SIZE" --idle-ms "$IDLE") ||
      { echo "startup_before_after: a $side run failed" >&2; exit 1; }
    echo "run=$r $side $line"
    echo "$side $line" >>"$T/all"
  done
done
/usr/bin/python3 - "$T/all" <<'PY'
import statistics, sys
v = {"before": {}, "after": {}}
for line in open(sys.argv[1]):
    side, *kv = line.split()
    d = dict(x.split("=") for x in kv)
    d["create_and_first_save_ms"] = float(d["create_ms"]) + float(d["first_save_ms"])
    for k in ("create_ms", "first_save_ms", "create_and_first_save_ms", "held_ms",
              "idle_save_ms", "free_ms"):
        v[side].setdefault(k, []).append(float(d[k]))
for k in v["before"]:
    b, a = statistics.median(v["before"][k]), statistics.median(v["after"][k])
    print("%s before=%.2f after=%.2f ratio_after_before=%.3f" % (k, b, a, a / b))
PY
