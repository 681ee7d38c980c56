#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctrl_instr — producer CPU per control request, in instructions: ecx's
# producer (build/ctrl_serve: a producer context holding ready items,
# driven by ecx_poll) next to a bare ZeroMQ ROUTER that answers every frame
# with a fixed frame (build/zmq_echo), both under callgrind, both loaded by
# `ecx bench ctrl` (one DEALER, window W, every ack decoded and checked).
#
# Each server serves N1 and then N2 requests in a fresh process; its cost
# per request is (Ir(N2) - Ir(N1)) / (N2 - N1), the instructions of the
# server process only (all its threads, libzmq's I/O thread included), so
# start-up, item loading and shutdown cancel out. How requests batch up
# between wake-ups depends on timing, which moves the figure by a few
# percent now and then, so the whole measurement runs CTRL_REPEAT times and
# the medians are reported.
#
# The load: `ecx bench ctrl` cycles through the items with one session id,
# so after the first round every request is an OK grant that replaces the
# same session's grant of that item (unpin, pin, new token): the grant
# table holds one grant per item and never fills. --require-ok makes any
# NACK fail the run.
#
# usage: bench/ctrl_instr.sh [BUILD_DIR]           (default: build)
# env:   CTRL_N1 (2000), CTRL_N2 (12000), CTRL_WINDOW (64), CTRL_REPEAT (3),
#        CTRL_ITEMS (32), CTRL_ITEM_BYTES (327680), CTRL_BLOCK_BYTES (65536),
#        CTRL_VALGRIND_OPTS (extra valgrind options),
#        CTRL_PROFILE=DIR  keep the callgrind files in DIR and write
#                          callgrind_annotate's per-function profiles of
#                          the last N2 runs to DIR/ecx.annotate, echo.annotate
# Output (stdout, one line):
#   ecx_instr_per_req=<n> echo_instr_per_req=<n> ratio=<x.xx>
# Exit: 0 if every run answered every request OK; 1 otherwise; 77 if
# valgrind is not installed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-$here/../build}
N1=${CTRL_N1:-2000} N2=${CTRL_N2:-12000} W=${CTRL_WINDOW:-64} REPEAT=${CTRL_REPEAT:-3}
ITEMS=${CTRL_ITEMS:-32} ITEM_BYTES=${CTRL_ITEM_BYTES:-327680} BLOCK=${CTRL_BLOCK_BYTES:-65536}
command -v valgrind >/dev/null || { echo "ctrl_instr: valgrind not installed (scripts/deps.sh)" >&2; exit 77; }
for b in ecx ctrl_serve zmq_echo; do
  [ -x "$BUILD/$b" ] || { echo "ctrl_instr: no $BUILD/$b (build first)" >&2; exit 1; }
done
[ "$N2" -gt "$N1" ] || { echo "ctrl_instr: CTRL_N2 must exceed CTRL_N1" >&2; exit 1; }

tmp=$(mktemp -d /tmp/ecx-ctrl-instr.XXXXXX)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# run NAME N: start server NAME under callgrind, load it with N requests,
# stop it; prints its total Ir.
run() {
  local name=$1 n=$2 out="$tmp/$1.$2.callgrind" ann="$tmp/$1.$2.json"
  local cmd=("$BUILD/zmq_echo" "$ann")
  [ "$name" = ecx ] && cmd=("$BUILD/ctrl_serve" "$ann" "$ITEMS" "$ITEM_BYTES" "$BLOCK")
  rm -f "$ann" "$out" # from an earlier repeat
  valgrind --tool=callgrind ${CTRL_VALGRIND_OPTS:-} --callgrind-out-file="$out" "${cmd[@]}" 2>"$tmp/$name.$n.log" &
  server=$!
  for _ in $(seq 600); do
    [ -s "$ann" ] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  if [ ! -s "$ann" ]; then
    echo "ctrl_instr: $name did not start:" >&2; tail -n 20 "$tmp/$name.$n.log" >&2; return 1
  fi
  "$BUILD/ecx" bench ctrl --params "$ann" --requests "$n" --warmup 0 --window "$W" \
    --block-bytes "$BLOCK" --require-ok --timeout-ms 120000 >"$tmp/$name.$n.bench" 2>&1
  local brc=$?
  kill -TERM "$server"; wait "$server"; local src=$?; server=
  if [ $brc -ne 0 ] || [ $src -ne 0 ]; then
    echo "ctrl_instr: $name, $n requests: bench exit $brc, server exit $src" >&2
    tail -n 5 "$tmp/$name.$n.bench" "$tmp/$name.$n.log" >&2
    return 1
  fi
  grep -h "^ctrl_serve:\|^zmq_echo:" "$tmp/$name.$n.log" | sed "s/^/ctrl_instr: $n requests: /" >&2
  local ir
  ir=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p; s/^totals: *\([0-9]*\).*/\1/p' "$out" | head -n 1)
  [ -n "$ir" ] || { echo "ctrl_instr: no total in $out" >&2; return 1; }
  echo "$ir"
}

declare -A ir
per() { echo $(( (ir[$1.$N2] - ir[$1.$N1]) / (N2 - N1) )); }
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ecx_all=() echo_all=()
for r in $(seq "$REPEAT"); do
  for n in "$N1" "$N2"; do
    for name in ecx echo; do
      ir[$name.$n]=$(run "$name" "$n") || exit 1
    done
  done
  ecx_all+=("$(per ecx)") echo_all+=("$(per echo)")
  echo "ctrl_instr: run $r: Ir ecx ${ir[ecx.$N1]} / ${ir[ecx.$N2]}, echo ${ir[echo.$N1]} / ${ir[echo.$N2]}: per request ecx ${ecx_all[-1]} echo ${echo_all[-1]}" >&2
done
e=$(median "${ecx_all[@]}") z=$(median "${echo_all[@]}")
if [ -n "${CTRL_PROFILE:-}" ]; then
  mkdir -p "$CTRL_PROFILE"
  cp "$tmp"/*.callgrind "$CTRL_PROFILE"/
  callgrind_annotate --inclusive=no "$tmp/ecx.$N2.callgrind" >"$CTRL_PROFILE/ecx.annotate" 2>/dev/null
  callgrind_annotate --inclusive=no "$tmp/echo.$N2.callgrind" >"$CTRL_PROFILE/echo.annotate" 2>/dev/null
fi
awk -v e="$e" -v z="$z" 'BEGIN { printf "ecx_instr_per_req=%d echo_instr_per_req=%d ratio=%.2f\n", e, z, (z > 0 ? e / z : 0) }'
