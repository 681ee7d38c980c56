#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctrl_rate — control requests per second and the producer's system calls
# per request: ecx's producer (build/ctrl_serve, stepped by its context's
# progress thread) next to a bare ZeroMQ ROUTER echo (build/zmq_echo), and,
# given a second build directory, that build's ctrl_serve too ("before"),
# all loaded the same way in one run by this build's `ecx bench ctrl` (one
# DEALER, window W, every ack decoded and checked, --require-ok).
#
# Each round starts every server in turn (echo, before, ecx), warms it up
# with CTRL_WARMUP requests, then counts the server process's system calls
# (all its threads: perf stat -e raw_syscalls:sys_enter -p PID) while
# `ecx bench ctrl` sends CTRL_REQUESTS more; syscalls per request = that
# count / CTRL_REQUESTS. Medians over CTRL_ROUNDS rounds.
#
# usage: bench/ctrl_rate.sh [BUILD_DIR [BEFORE_BUILD_DIR]]   (default: build)
# env:   CTRL_REQUESTS (200000: shorter rounds, 0.1 s at these rates, moved
#        the ratio by +-0.15 between runs), CTRL_WARMUP (2000), CTRL_WINDOW (64),
#        CTRL_ROUNDS (3), CTRL_ITEMS (32), CTRL_ITEM_BYTES (327680),
#        CTRL_BLOCK_BYTES (65536), CTRL_ECHO_ACK_BYTES (the echo's ack size;
#        default its bare 92-byte ack; 432 is the size of ecx's acks here, so
#        that ZeroMQ moves the same bytes for both), CTRL_PIN (auto: with 2+
#        CPUs the server runs on CPU 0 and the load's client on CPU 1, as on
#        two hosts; 0: wherever the scheduler puts them), CTRL_LOAD (0: none;
#        1: a busy loop beside the servers for the whole run, on the
#        server's CPU when pinned: a busy producer host)
# Output (stdout): one line per server,
#   server=<echo|before|ecx> req_per_s=<median> syscalls_per_req=<median>
# then
#   ecx_vs_echo_req_per_s=<x> [before_vs_echo_req_per_s=<x> ecx_vs_before_req_per_s=<x>]
#     pinned=<yes|no> load=<0|1>
#   ecx_syscalls_per_req=<x> echo_syscalls_per_req=<x> [before_syscalls_per_req=<x>]
# Exit: 0 if every load got every ack OK; 1 otherwise; 77 without perf.
set -u
here=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-$here/../build}
BEFORE=${2:-}
REQ=${CTRL_REQUESTS:-200000} WARM=${CTRL_WARMUP:-2000} W=${CTRL_WINDOW:-64}
ROUNDS=${CTRL_ROUNDS:-3} ITEMS=${CTRL_ITEMS:-32} ITEM_BYTES=${CTRL_ITEM_BYTES:-327680}
BLOCK=${CTRL_BLOCK_BYTES:-65536}
PIN=${CTRL_PIN:-auto} LOAD=${CTRL_LOAD:-0}
if [ "$PIN" = auto ]; then
  PIN=0
  [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null && PIN=1
fi
on_server=() on_client=()
[ "$PIN" = 1 ] && on_server=(taskset -c 0) on_client=(taskset -c 1)
command -v perf >/dev/null || { echo "ctrl_rate: perf not installed" >&2; exit 77; }
for b in "$BUILD/ecx" "$BUILD/ctrl_serve" "$BUILD/zmq_echo" ${BEFORE:+"$BEFORE/ctrl_serve"}; do
  [ -x "$b" ] || { echo "ctrl_rate: no $b (build first)" >&2; exit 1; }
done

tmp=$(mktemp -d /tmp/ecx-ctrl-rate.XXXXXX)
server= loader=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  [ -n "$loader" ] && kill "$loader" 2>/dev/null && wait "$loader" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# run NAME: start it, warm it up, measure; prints "req_per_s syscalls_per_req".
run() {
  local name=$1 ann="$tmp/$1.json"
  local cmd=("$BUILD/zmq_echo" "$ann" ${CTRL_ECHO_ACK_BYTES:+"$CTRL_ECHO_ACK_BYTES"})
  [ "$name" = ecx ] && cmd=("$BUILD/ctrl_serve" "$ann" "$ITEMS" "$ITEM_BYTES" "$BLOCK")
  [ "$name" = before ] && cmd=("$BEFORE/ctrl_serve" "$ann" "$ITEMS" "$ITEM_BYTES" "$BLOCK")
  rm -f "$ann"
  "${on_server[@]}" "${cmd[@]}" 2>"$tmp/$name.log" &
  server=$!
  for _ in $(seq 300); do
    [ -s "$ann" ] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  [ -s "$ann" ] || { echo "ctrl_rate: $name did not start" >&2; tail -n 5 "$tmp/$name.log" >&2; return 1; }
  local bench=("${on_client[@]}" "$BUILD/ecx" bench ctrl --params "$ann" --window "$W" --block-bytes "$BLOCK"
               --require-ok --timeout-ms 120000)
  "${bench[@]}" --requests "$WARM" --warmup 0 >/dev/null 2>&1 || { echo "ctrl_rate: $name warm-up failed" >&2; return 1; }
  perf stat -x, -e raw_syscalls:sys_enter -p "$server" -o "$tmp/$name.perf" -- \
    "${bench[@]}" --requests "$REQ" --warmup 0 >"$tmp/$name.out" 2>"$tmp/$name.err"
  local brc=$?
  kill -TERM "$server"; wait "$server"; server=
  [ $brc -eq 0 ] || { echo "ctrl_rate: $name: bench exit $brc" >&2; tail -n 3 "$tmp/$name.err" >&2; return 1; }
  local rps calls
  rps=$(sed -n 's/.*req_per_s=\([0-9.]*\).*/\1/p' "$tmp/$name.out")
  calls=$(awk -F, '/raw_syscalls:sys_enter/ { print $1 }' "$tmp/$name.perf")
  [ -n "$rps" ] && [ -n "$calls" ] || { echo "ctrl_rate: $name: no figures" >&2; return 1; }
  awk -v r="$rps" -v c="$calls" -v n="$REQ" 'BEGIN { printf "%s %.2f\n", r, c / n }'
}

if [ "$LOAD" = 1 ]; then
  "${on_server[@]}" sh -c 'while :; do :; done' &
  loader=$!
fi
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
names=(echo ${BEFORE:+before} ecx)
declare -A rps calls
for r in $(seq "$ROUNDS"); do
  for name in "${names[@]}"; do
    out=$(run "$name") || exit 1
    set -- $out
    rps[$name]="${rps[$name]:-} $1" calls[$name]="${calls[$name]:-} $2"
    echo "ctrl_rate: round $r $name: $1 req/s, $2 syscalls/request" >&2
  done
done
declare -A mr mc
for name in "${names[@]}"; do
  mr[$name]=$(median ${rps[$name]}) mc[$name]=$(median ${calls[$name]})
  echo "server=$name req_per_s=${mr[$name]} syscalls_per_req=${mc[$name]}"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
line="ecx_vs_echo_req_per_s=$(ratio "${mr[ecx]}" "${mr[echo]}")"
pinned=no
[ "$PIN" = 1 ] && pinned=yes
[ -n "$BEFORE" ] && line+=" before_vs_echo_req_per_s=$(ratio "${mr[before]}" "${mr[echo]}") ecx_vs_before_req_per_s=$(ratio "${mr[ecx]}" "${mr[before]}")"
echo "$line pinned=$pinned load=$LOAD"
line="ecx_syscalls_per_req=${mc[ecx]} echo_syscalls_per_req=${mc[echo]}"
[ -n "$BEFORE" ] && line+=" before_syscalls_per_req=${mc[before]}"
echo "$line"
