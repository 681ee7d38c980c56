#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_ctrl_idle — issue 20 item 3: idle control-plane connections do not
# lock consumers out of `ecx serve` at the default descriptor limit. The
# producer runs under `ulimit -n 1024`; an attacker opens 1000 ZeroMQ
# connections that complete the ZMTP handshake and then say nothing: from 8
# addresses in 8 /24s (125 each), then from 127.0.0.1 itself (the
# consumer's own address). It reopens whatever the producer closes.
# Throughout, `ecx get --data tcp` fetches all 4 items, byte-exact; the
# producer lives, never holds more than its bound of descriptors, and counts
# the connections it refused or evicted.
# The defaults: protocol version 2, 8 KiB blocks (items of 37 blocks).
# usage: test_ctrl_idle.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm
HOG="$(dirname "$0")/../support/conn_hog.py"
MPORT=$(free_port)
(ulimit -n 1024 && exec "$ECX" serve --listen 127.0.0.1:0 --synthetic 4:296Ki \
  --data tcp --announce-out "$T/ann.json" --metrics "127.0.0.1:$MPORT") 2>"$T/serve.log" &
spid=$!
pids+=($spid)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; cat "$T/serve.log" >&2; exit 1; }
PORT=$($PY -c 'import json,sys; print(next(iter(json.load(open(sys.argv[1])).values()))["peer_port"])' "$T/ann.json")
check "the producer runs with 1024 descriptors" \
  'grep -qE "^Max open files +1024 " /proc/$spid/limits'

fds_max=0
fds() { local n; n=$(ls /proc/$spid/fd 2>/dev/null | wc -l); [ "$n" -gt "$fds_max" ] && fds_max=$n; }
good() {
  rm -rf "$T/out"; mkdir -p "$T/out"
  fds
  expect 0 "" "$1: ecx get --data tcp gets 4 of 4" -- "$ECX" get --params "$T/ann.json" \
    --out "$T/out" --data tcp --verify-synthetic
  check "$1: 4 files written" '[ "$(ls "$T/out" | wc -l)" = 4 ]'
  fds
}
attack() { # NAME ADDRS PER_ADDR SECONDS
  local name=$1
  timeout 60 $PY "$HOG" zmtp "$PORT" "$4" "$2" "$3" >"$T/hog-$name.out" 2>&1 &
  local hpid=$!
  pids+=($hpid)
  sleep 4 # the flood is in
  good "$name, at 4 s"
  fds; sleep 2; fds
  good "$name, at 6+ s"
  wait "$hpid"
  check "$name: the attack ran ($(tail -n1 "$T/hog-$name.out"))" \
    'grep -qE "^summary opened=[0-9]{3,} closed=[0-9]+ max_open=[0-9]{3,}" "$T/hog-$name.out"'
  check "$name: the producer lives" 'kill -0 $spid'
}
a=()
for k in 1 2 3 4 5 6 7 8; do a+=("127.0.$k.9"); done
attack prefixes "$(IFS=,; echo "${a[*]}")" 125 12
attack one-address 127.0.0.1 1000 10
good "after the attacks"
m=$(metrics_of "$MPORT")
# Over a cap, a newcomer from an attacker's address replaces that address's
# oldest idle connection (or another's heavier one): evicted, not refused.
check "idle connections were evicted for newcomers and counted" \
  'echo "$m" | grep -qE "^ecx_producer_evicted_connections_total [1-9]"'
# The default cap leaves 64 + 512 of the 1024 descriptors to the rest.
echo "the producer held at most $fds_max descriptors"
check "the producer held at most 700 descriptors (saw $fds_max)" '[ "$fds_max" -le 700 ]'
check "the producer lives" 'kill -0 $spid'
finish
