#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_metrics_idle — issue 20 item 6 (/metrics): 200 connections to
# `ecx serve --metrics` from 25 loopback addresses (8 each, the per-address
# cap) that send half an HTTP request and then drip a header byte a second,
# reopened whenever closed, for 12 s. A scraper gets the metrics throughout;
# the server counts what it evicted and timed out, and lives.
# The defaults: protocol version 2, 8 KiB blocks (an item of 8 blocks).
# usage: test_metrics_idle.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm
HOG="$(dirname "$0")/../support/conn_hog.py"
MPORT=$(free_port)
"$ECX" serve --listen 127.0.0.1:0 --synthetic 1:64Ki \
  --announce-out "$T/ann.json" --metrics "127.0.0.1:$MPORT" 2>"$T/serve.log" &
spid=$!
pids+=($spid)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; cat "$T/serve.log" >&2; exit 1; }
a=()
for k in $(seq 25); do a+=("127.0.$k.10"); done
timeout 30 $PY "$HOG" http "$MPORT" 12 "$(IFS=,; echo "${a[*]}")" 8 >"$T/hog.out" 2>&1 &
hpid=$!
pids+=($hpid)
fds_max=0
scrape() {
  local n
  n=$(ls /proc/$spid/fd 2>/dev/null | wc -l); [ "$n" -gt "$fds_max" ] && fds_max=$n
  m=$(timeout 10 bash -c "$(declare -f metrics_of); PY=$PY; metrics_of $MPORT" 2>&1)
  check "$1: the scraper gets the metrics ($(echo "$m" | tail -n1 | head -c 200))" \
    'echo "$m" | grep -q "^ecx_producer_requests_total "'
}
sleep 3
scrape "at 3 s"
sleep 3
scrape "at 6+ s"
sleep 3
scrape "at 9+ s"
wait "$hpid"
check "the attack ran ($(tail -n1 "$T/hog.out"))" \
  'grep -qE "^summary opened=[0-9]{3,} closed=[0-9]+ max_open=[0-9]{3,}" "$T/hog.out"'
scrape "after"
check "connections evicted for the scraper were counted" \
  'echo "$m" | grep -qE "^ecx_metrics_http_connections_evicted_total [1-9]"'
check "dripping connections were timed out and counted" \
  'echo "$m" | grep -qE "^ecx_metrics_http_connections_timed_out_total [1-9]"'
echo "the producer held at most $fds_max descriptors"
check "the producer held at most 250 descriptors (saw $fds_max)" '[ "$fds_max" -le 250 ]'
check "the producer lives" 'kill -0 $spid'
finish
