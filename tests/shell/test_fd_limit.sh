#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_fd_limit — a producer whose descriptors would run out under a flood of
# connections (issue 10: libzmq used to spin at 100% CPU at fd exhaustion
# until peers left). With a 128-descriptor limit, 300 idle TCP connections
# to `ecx serve` are refused beyond its cap and counted, the producer does
# not spin, and a well-behaved consumer is served meanwhile.
# The defaults: protocol version 2, 8 KiB blocks (items of 1 MiB).
# usage: test_fd_limit.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm
MPORT=$(free_port)
(ulimit -n 128 && exec "$ECX" serve --listen 127.0.0.1:0 --synthetic 2:1Mi \
  --announce-out "$T/ann.json" --metrics "127.0.0.1:$MPORT") 2>"$T/serve.log" &
spid=$!
pids+=($spid)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; cat "$T/serve.log" >&2; exit 1; }
PORT=$($PY -c 'import json,sys; print(next(iter(json.load(open(sys.argv[1])).values()))["peer_port"])' "$T/ann.json")
# Hold 300 connections open for 6 s (bounded), in the background.
$PY - "$PORT" >"$T/flood.out" 2>&1 <<'PY' &
import socket, sys, time
conns = []
for _ in range(300):
    try:
        conns.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2))
    except OSError as e:
        print("connect failed:", e)
print("held", len(conns), flush=True)
time.sleep(6)
PY
fpid=$!
pids+=($fpid)
sleep 2
ticks() { awk '{print $14 + $15}' "/proc/$spid/stat"; }
t0=$(ticks); sleep 2; t1=$(ticks)
hz=$(getconf CLK_TCK)
check "the producer does not spin while flooded ($((t1 - t0)) ticks of $((2 * hz)) in 2 s)" '[ $((t1 - t0)) -lt $hz ]'
mkdir -p "$T/out"
expect 0 "" "a consumer is served during the flood" -- "$ECX" get --params "$T/ann.json" --out "$T/out" \
  --verify-synthetic
m=$(metrics_of "$MPORT")
# Beyond the cap each newcomer from the flood's address replaces the flood's
# own oldest idle connection (conn_budget.h), or is refused.
check "connections beyond the cap were refused or evicted and counted" \
  'echo "$m" | grep -qE "^ecx_producer_(refused|evicted)_connections_total [1-9]"'
wait "$fpid"
check "the flood itself ran ($(cat "$T/flood.out"))" 'grep -q "^held" "$T/flood.out"'
check "the producer lives" 'kill -0 $spid'
finish
