#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_tcp_drip — issue 20 item 2: connections that hold the tcp data plane's
# slots cheaply do not lock a well-behaved consumer out. From many loopback
# addresses (all of 127/8 is lo), for 12 s each: 32 connections from each of
# 8 addresses in 8 /24s (the per-address cap times 8 = the total cap) that
# drip a request one byte a second; the same from 8 addresses of one /24
# (its prefix cap); and 256 that each send one request with a wrong token
# and then sit idle. The attacker reopens whatever the producer closes.
# Throughout, `ecx get --data tcp` fetches all 4 items, byte-exact, three
# times per attack; the producer lives, holds at most its bound of
# descriptors, and counts the evictions.
# The defaults: protocol version 2, 8 KiB blocks (items of 37 blocks).
# usage: test_tcp_drip.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm
HOG="$(dirname "$0")/../support/conn_hog.py"
MPORT=$(free_port)
"$ECX" serve --listen 127.0.0.1:0 --synthetic 4:296Ki --data tcp \
  --announce-out "$T/ann.json" --metrics "127.0.0.1:$MPORT" 2>"$T/serve.log" &
spid=$!
pids+=($spid)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; cat "$T/serve.log" >&2; exit 1; }
PORT=$($PY -c 'import json,sys; print(next(iter(json.load(open(sys.argv[1])).values()))["peer_port"])' "$T/ann.json")
# The data port: serve's other listening port.
DPORT=
for _ in $(seq 50); do
  DPORT=$(ss -ltnpH 2>/dev/null | grep "pid=$spid," | awk '{print $4}' | sed 's/.*://' |
    grep -vx -e "$PORT" -e "$MPORT" | head -1)
  [ -n "$DPORT" ] && break
  sleep 0.1
done
[ -n "$DPORT" ] || { echo "FAIL: no tcp data listener seen" >&2; exit 1; }

fds_max=0
good() { # WHAT: a consumer fetches all 4 items over tcp, byte-exact
  rm -rf "$T/out"; mkdir -p "$T/out"
  expect 0 "" "$1: ecx get --data tcp gets 4 of 4" -- "$ECX" get --params "$T/ann.json" \
    --out "$T/out" --data tcp --verify-synthetic
  check "$1: 4 files written" '[ "$(ls "$T/out" | wc -l)" = 4 ]'
  local n
  n=$(ls /proc/$spid/fd 2>/dev/null | wc -l)
  [ "$n" -gt "$fds_max" ] && fds_max=$n
}
attack() { # NAME MODE ADDRS PER_ADDR
  local name=$1
  timeout 30 $PY "$HOG" "$2" "$DPORT" 12 "$3" "$4" >"$T/hog-$name.out" 2>&1 &
  local hpid=$!
  pids+=($hpid)
  sleep 3 # every slot taken
  good "$name, at 3 s"
  sleep 3
  good "$name, at 6+ s"
  sleep 2
  good "$name, at 9+ s"
  wait "$hpid"
  check "$name: the attack ran ($(tail -1 "$T/hog-$name.out"))" \
    'grep -qE "^summary opened=[0-9]+ closed=[0-9]+ max_open=[1-9][0-9]{2,}" "$T/hog-$name.out"'
  check "$name: the producer lives" 'kill -0 $spid'
}
addrs() { # FMT: 8 addresses
  local a=() k
  for k in 1 2 3 4 5 6 7 8; do a+=("$(printf "$1" "$k")"); done
  (IFS=,; echo "${a[*]}")
}
attack prefixes drip "$(addrs 127.0.%d.7)" 32
m=$(metrics_of "$MPORT")
check "drip: connections were evicted for the consumer and counted" \
  'echo "$m" | grep -qE "^ecx_producer_data_connections_evicted_total\{path=\"tcp\"\} [1-9]"'
check "drip: dripping requests were closed at their deadline and counted" \
  'echo "$m" | grep -qE "^ecx_producer_data_connections_dropped_total\{path=\"tcp\"\} [1-9]"'
attack one-prefix drip "$(addrs 127.0.0.1%d)" 32
attack refused refused "$(addrs 127.0.%d.8)" 32
m=$(metrics_of "$MPORT")
check "refused: wrong-token requests were refused" \
  'echo "$m" | grep -qE "^ecx_producer_refused_reads_total [1-9]"'
# 256 data connections, the control plane's and the process's own: at most ~330.
echo "the producer held at most $fds_max descriptors"
check "the producer held at most 350 descriptors (saw $fds_max)" '[ "$fds_max" -le 350 ]'
check "the producer lives" 'kill -0 $spid'
finish
