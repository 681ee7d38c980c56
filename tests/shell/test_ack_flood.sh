#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_ack_flood — a hostile producer floods a slow library consumer with
# acks nobody asked for (tests/support/flood_peer.py, tests/support/flood_consumer.c, real
# processes on loopback). With a receive HWM on the consumer's DEALER,
# libzmq 4.3.4 aborted the consumer: a connection stopped by the full pipe
# died on its heartbeat timeout and the reconnected one was told to restart
# reading (`_input_stopped`, zeromq/libzmq#3937), or the producer hung up on
# the stopped connection and the next heartbeat wrote to it (`!_io_error`).
# Each case must leave the consumer alive, its peak RSS under 256 MiB (the
# inflow guard's watchdog drops a connection past 32 MiB undelivered while
# the consumer does not call in), the hostile item ended in a reason and a
# well-behaved producer still usable.
# Protocol version 1 on purpose ("${V1[@]}", with 64 KiB blocks as
# flood_consumer.c has them): the hostile item (1000 bytes, no shape) ends on
# version 1's 2 s ack timeout if nothing else ends it.
# usage: test_ack_flood.sh ECX FLOOD_CONSUMER
set -u
ECX=$1 PROG=$2
here=$(dirname "$0")
. "$here/lib.sh"
private_shm
RSS_LIMIT_KIB=$((256 * 1024))
"$ECX" serve --listen 127.0.0.1:0 --synthetic 1:1M "${V1[@]}" --block-bytes 64Ki --announce-out "$T/ann.json" \
  2>"$T/serve.log" &
pids+=($!)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; exit 1; }
read -r HASH ANN < <($PY -c 'import json,sys; d=json.load(open(sys.argv[1])); h=next(iter(d)); print(h, json.dumps(d[h]))' "$T/ann.json")

# flood NAME COUNT PAD STALL_MS MODE [HANGUP_S]
flood() {
  local name=$1 count=$2 pad=$3 stall=$4 mode=$5
  rm -f "$T/port"
  $PY "$here/../support/flood_peer.py" "$T/port" "$count" "$pad" 60 ${6:+"$6"} >"$T/$name.peer" 2>&1 &
  local peer=$!
  pids+=($peer)
  wait_file "$T/port" || { bad "$name: the hostile producer did not start"; return; }
  timeout 90 "$PROG" "$(cat "$T/port")" "$ANN" "$HASH" "$stall" "$mode" >"$T/$name.out" \
    2>"$T/$name.err"
  local rc=$? out
  kill "$peer" 2>/dev/null
  out=$(cat "$T/$name.out")
  echo "  $name: rc $rc: $out"
  check "$name: the consumer survives (rc $rc): $(grep -m1 Assertion "$T/$name.err" ||
    grep -v 'ignored an ack' "$T/$name.err" | tail -3)" '[ $rc = 0 ]'
  check "$name: the hostile item ends in a reason" 'echo "$out" | grep -Eq "hostile=[A-Z_]+ "'
  check "$name: the good producer still works" 'echo "$out" | grep -q "good=ready"'
  local rss
  rss=$(echo "$out" | sed -n 's/.*peak_rss_kib=\([0-9]*\).*/\1/p')
  check "$name: peak RSS ${rss:-?} KiB under $RSS_LIMIT_KIB" '[ -n "$rss" ] && [ "$rss" -lt $RSS_LIMIT_KIB ]'
}

# Stalled (8 s, past the 2 s + 4 s heartbeat) in the middle of reading the flood.
flood mid-stall 20000 1024 8000 mid
check "mid-stall: the flood closed the session" 'grep -q "ack_floods=[1-9]" "$T/mid-stall.out"'
# The same with 1 MiB acks: while the consumer does not call in, the inflow
# guard's watchdog drops the connection past 32 MiB undelivered.
flood big-acks 2000 1048576 8000 mid
# Stalled right after asking; the producer floods, then hangs up.
flood hangup-stall 20000 1024 8000 between 0.5
# Polling all along, against a long flood: cut after the slack, the item falls back BAD_ACK.
flood polling 200000 0 0 mid
check "polling: the flood closed the session, BAD_ACK" \
  'grep -q "hostile=BAD_ACK .*ack_floods=[1-9]" "$T/polling.out"'
# The same with replies of three frames, which ctrl drops before the consumer sees them.
FLOOD_FRAMING=bad flood bad-framing 200000 0 0 mid
check "bad-framing: the flood closed the session, BAD_ACK" \
  'grep -q "hostile=BAD_ACK .*ack_floods=[1-9]" "$T/bad-framing.out"'
finish
