#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_pin_hogs — issue 20, item 4, with real processes on loopback: three
# consumer connections pin every item of a full region (8 x 8 MiB) and never
# read, then the encoder (tests/support/pin_saver.c fill) saves 8 new items. Under the
# library's defaults (50 % per connection, 75 % for all together) every save
# finds room, the pins past 75 % were answered NOT_READY and counted, and a
# well-behaved consumer is served (its NOT_READY retries succeed once the
# hogs' 8 s leases end). With the total bound at 100 % (what the code did
# before), the same hogs make the saves fail: the test can tell.
# usage: test_pin_hogs.sh PIN_SAVER ECX
set -u
SAVER=$1 ECX=$2
. "$(dirname "$0")/lib.sh"
private_shm

run() { # PIN_PCT: one round in $T/$1
  local D=$T/$1
  mkdir -p "$D"
  timeout 100 "$SAVER" fill "$D" "$1" 0 >"$D/saver.out" 2>"$D/saver.log" &
  SPID=$!
  pids+=($SPID)
  wait_file "$D/ann.json" || { bad "pin $1: the producer did not start"; return 1; }
  timeout 80 $PY "$(dirname "$0")/../support/pin_hog.py" "$D" 3 >"$D/hog.out" 2>&1 &
  pids+=($!)
  wait_file "$D/hog.out" || { bad "pin $1: the hogs got no acks"; return 1; }
  touch "$D/go"
  for _ in $(seq 300); do grep -q '^saves' "$D/saver.out" && break; sleep 0.1; done
  echo "  max_pin_pct $1: hogs: $(cat "$D/hog.out"); producer: $(tr '\n' ' ' <"$D/saver.out")"
}

run 0 # the default, 75 %
D=$T/0
check "the hogs got only up to 75 % of the region (6 items, then NOT_READY)" \
  'grep -q "not_ready [1-9][0-9]* .* distinct 6$" "$D/hog.out"'
check "every save of the encoder found room" 'grep -q "^saves 8 failed 0$" "$D/saver.out"'
check "the refused pins were counted" \
  'grep -q "^ecx_producer_refused_pins_total [1-9]" "$D/saver.out"'
mkdir -p "$D/out"
expect 0 "" "a well-behaved consumer is served (NOT_READY retried until the hogs' leases end)" -- \
  "$ECX" get --params "$D/good.json" --data tcp --block-bytes 64Ki --out "$D/out"
check "its bytes are the item's" '$PY -c "
import sys
from array import array
b = open(sys.argv[1], \"rb\").read()
sys.exit(len(b) != 8 << 20 or b != array(\"Q\", ((0x27 << 56) | i for i in range(len(b) // 8))).tobytes())
" "$D/out/n7"'
touch "$D/quit"
wait $SPID
check "the producer exited 0" '[ $? = 0 ]'

run 100 # no total bound: the per-connection shares alone
D=$T/100
check "without the total bound the hogs pin the whole region" 'grep -q "distinct 8$" "$D/hog.out"'
check "... and the encoder's saves fail (what the bound prevents)" \
  '! grep -q "^saves 8 failed 0$" "$D/saver.out"'
touch "$D/quit"
wait $SPID
finish
