#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ucx_before_after — the ucx path's fetch-to-ready throughput of two builds
# in one run: BEFORE (UCX in the engine's process) and AFTER (UCX in
# ecx-ucx-agent, src/data/ucx/ucx_proc.h), `ecx bench data --data ucx` alternating
# between them RUNS times, so drift on a shared machine hits both alike.
#
# usage: bench/ucx_before_after.sh BEFORE_ECX AFTER_ECX
# env:   UBA_RUNS (3), UBA_SIZE (28835840: whole 8 KiB blocks, as version 2, the default, needs), UBA_COUNT (20)
# Output: one line per run and build, then the medians and their ratio:
#   before_ucx_gbps=<x> after_ucx_gbps=<x> ratio_after_before=<x>
set -u
BEFORE=$1 AFTER=$2
RUNS=${UBA_RUNS:-3} SIZE=${UBA_SIZE:-28835840} COUNT=${UBA_COUNT:-20}
b=() a=()
gbps() { "$1" bench data --data ucx --size "$SIZE" --count "$COUNT" 2>/dev/null |
           tail -1 | tr ' ' '\n' | sed -n 's/^ucx_gbps=//p'; }
for r in $(seq "$RUNS"); do
  x=$(gbps "$BEFORE"); y=$(gbps "$AFTER")
  [ -n "$x" ] && [ -n "$y" ] || { echo "ucx_before_after: a bench run failed" >&2; exit 1; }
  echo "run=$r before_ucx_gbps=$x after_ucx_gbps=$y"
  b+=("$x") a+=("$y")
done
/usr/bin/python3 - "${b[*]}" "${a[*]}" <<'PY'
import statistics, sys
b = statistics.median(map(float, sys.argv[1].split()))
a = statistics.median(map(float, sys.argv[2].split()))
print("before_ucx_gbps=%.2f after_ucx_gbps=%.2f ratio_after_before=%.2f" % (b, a, a / b))
PY
