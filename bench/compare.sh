#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compare — ecx's producer against a minimal Python producer with the
# reference's behaviour (bench/py_producer.py), under the same `ecx bench
# ctrl` load: window 64 (throughput) and window 1 (latency).
#
# Both producers serve the same synthetic items and are started once; the
# loads then alternate between them (ecx w64, python w64, ecx w1, python w1,
# repeated RUNS times), so drift on this shared, noisy machine hits both
# alike. Only one producer is under load at a time. Each figure is the
# median over the runs, per metric.
#
# usage: bench/compare.sh [PATH_TO_ECX]        (default: build/ecx)
# env:   COMPARE_RUNS (5), COMPARE_REQ64 (20000), COMPARE_REQ1 (3000),
#        COMPARE_ITEMS (32:4718592, llava-1.5's 576 rows, as for serve --synthetic:
#        whole blocks under version 2), COMPARE_ARGS (factors given to both
#        producers and bench ctrl; default none: vLLM 0.34.0, version 2, 8 KiB
#        blocks. The figures before version 2: COMPARE_ARGS="--vllm-version
#        0.31.0 --block-bytes 1Mi" COMPARE_ITEMS=32:4.7M),
#        COMPARE_QUICK=1 (1 run, 400 / 100 requests: checks it works)
# Output: one line per producer and window, then the ratios:
#   producer=ecx window=64 runs=5 req_per_s=<n> p50_us=<n> p99_us=<n> ack_bytes=<n>
#   ...
#   ratio_req_per_s_w64=<ecx/python> ratio_p50_w1=<python/ecx>
# Exit: 0 if every run completed with every request answered OK, else 1.
set -u
here=$(cd "$(dirname "$0")" && pwd)
ECX=${1:-$here/../build/ecx}
RUNS=${COMPARE_RUNS:-5} REQ64=${COMPARE_REQ64:-20000} REQ1=${COMPARE_REQ1:-3000}
ITEMS=${COMPARE_ITEMS:-32:4718592}
read -r -a ARGS <<<"${COMPARE_ARGS:-}"
if [ "${COMPARE_QUICK:-0}" = 1 ]; then RUNS=1 REQ64=400 REQ1=100; fi
PY=/usr/bin/python3
[ -x "$ECX" ] || { echo "compare: no ecx binary at $ECX" >&2; exit 1; }

tmp=$(mktemp -d /tmp/ecx-compare.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

wait_file() { # FILE PID: up to 20 s for FILE, while PID lives
  for _ in $(seq 200); do
    [ -s "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

"$ECX" serve "${ARGS[@]}" --listen 127.0.0.1:0 --synthetic "$ITEMS" --announce-out "$tmp/ecx.json" \
  2>"$tmp/ecx.log" &
pids+=($!)
wait_file "$tmp/ecx.json" $! || { echo "compare: ecx serve did not start:" >&2; cat "$tmp/ecx.log" >&2; exit 1; }
"$PY" "$here/py_producer.py" "${ARGS[@]}" --synthetic "$ITEMS" --announce-out "$tmp/py.json" --seconds 300 \
  2>"$tmp/py.log" &
pids+=($!)
wait_file "$tmp/py.json" $! || { echo "compare: py_producer did not start:" >&2; cat "$tmp/py.log" >&2; exit 1; }

fail=0
# bench NAME WINDOW REQUESTS: one run; appends its last line to $tmp/NAME.wWINDOW
bench() {
  local out
  if out=$("$ECX" bench ctrl "${ARGS[@]}" --params "$tmp/$1.json" --window "$2" --requests "$3" \
    --warmup 200 --timeout-ms 60000 --require-ok 2>"$tmp/bench.err"); then
    tail -n 1 <<<"$out" >>"$tmp/$1.w$2"
  else
    echo "compare: bench ctrl against $1 (window $2) failed:" >&2
    cat "$tmp/bench.err" >&2
    fail=1
  fi
}
for r in $(seq "$RUNS"); do
  bench ecx 64 "$REQ64"; bench py 64 "$REQ64"
  bench ecx 1 "$REQ1"; bench py 1 "$REQ1"
done
[ "$fail" = 0 ] || exit 1

"$PY" - "$tmp" <<'EOF'
import statistics, sys
tmp = sys.argv[1]
med = {}
for prod, label in (("ecx", "ecx"), ("py", "python")):
    for win in (64, 1):
        rows = [dict(kv.split("=", 1) for kv in line.split())
                for line in open("%s/%s.w%d" % (tmp, prod, win)) if line.strip()]
        m = {k: statistics.median(float(r[k]) for r in rows)
             for k in ("req_per_s", "p50_us", "p99_us", "ack_bytes")}
        med[prod, win] = m
        print("producer=%s window=%d runs=%d req_per_s=%.0f p50_us=%.1f p99_us=%.1f ack_bytes=%.0f"
              % (label, win, len(rows), m["req_per_s"], m["p50_us"], m["p99_us"], m["ack_bytes"]))
r64 = med["ecx", 64]["req_per_s"] / med["py", 64]["req_per_s"]
p1 = med["py", 1]["p50_us"] / med["ecx", 1]["p50_us"]
print("ratio_req_per_s_w64=%.2f ratio_p50_w1=%.2f" % (r64, p1))
EOF
