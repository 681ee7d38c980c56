#!/usr/bin/env bash
# test_dead_producers — 2,000 producers that never answer leave a consumer
# (the library, in a real process) able to reach a live one, with bounded
# descriptors (issue 10, item 5). usage: test_dead_producers.sh ECX DEAD_PRODUCERS
set -u
ECX=$1 PROG=$2
. "$(dirname "$0")/lib.sh"
private_shm
"$ECX" serve --listen 127.0.0.1:0 --synthetic 1:1M --block-bytes 64Ki --announce-out "$T/ann.json" \
  2>"$T/serve.log" &
pids+=($!)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; exit 1; }
read -r HASH ANN < <($PY -c 'import json,sys; d=json.load(open(sys.argv[1])); h=next(iter(d)); print(h, json.dumps(d[h]))' "$T/ann.json")
timeout 120 "$PROG" "$ANN" "$HASH" 2000 >"$T/out" 2>"$T/err"
rc=$?
check "2000 dead producers, then a live one (rc $rc): $(cat "$T/out") $(tail -3 "$T/err")" '[ $rc = 0 ]'
check "the live item arrived" 'grep -q "live=ready bytes=1000000" "$T/out"'
echo "  $(cat "$T/out")"
finish
