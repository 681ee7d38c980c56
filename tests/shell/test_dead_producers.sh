#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_dead_producers — 2,000 producers that never answer leave a consumer
# (the library, in a real process) able to reach a live one, with bounded
# descriptors (issue 10, item 5), and a live producer's item asked for in the
# same batch as 300 dead ones is not held up by them (issue 20, item 6). usage: test_dead_producers.sh ECX DEAD_PRODUCERS
# Protocol version 1 on purpose ("${V1[@]}", with 64 KiB blocks as
# dead_producers.c has them): the dead items end on version 1's ack timeout.
set -u
ECX=$1 PROG=$2
. "$(dirname "$0")/lib.sh"
private_shm
"$ECX" serve --listen 127.0.0.1:0 --synthetic 1:1M "${V1[@]}" --block-bytes 64Ki --announce-out "$T/ann.json" \
  2>"$T/serve.log" &
pids+=($!)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; exit 1; }
read -r HASH ANN < <($PY -c 'import json,sys; d=json.load(open(sys.argv[1])); h=next(iter(d)); print(h, json.dumps(d[h]))' "$T/ann.json")
timeout 120 "$PROG" "$ANN" "$HASH" 2000 >"$T/out" 2>"$T/err"
rc=$?
check "2000 dead producers, then a live one (rc $rc): $(cat "$T/out") $(tail -3 "$T/err")" '[ $rc = 0 ]'
check "the live item arrived" 'grep -q "live=ready bytes=1000000" "$T/out"'
echo "  $(cat "$T/out")"
# Issue 20, item 6: 300 dead producers (more than the 256-session cap) and a
# live one in one batch; the live item must not wait for the dead ones' ack
# timeout (10 s here), nor fall back.
timeout 120 "$PROG" "$ANN" "$HASH" 300 batch >"$T/out" 2>"$T/err"
rc=$?
check "300 dead producers and a live one in one batch (rc $rc): $(cat "$T/out") $(tail -3 "$T/err")" '[ $rc = 0 ]'
echo "  $(cat "$T/out")"
finish
