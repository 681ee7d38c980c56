#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_slow_reader — issue 20, item 1, on the tcp path, with real processes
# on loopback: a consumer holds one grant of a 16 MiB item and reads it over
# a 4 KiB receive buffer, 64 KiB every 20 ms, past its 1 s lease, while a
# busy producer (tests/support/pin_saver.c churn) saves a new 4 MiB item every 20 ms
# into whatever is unpinned. The slow reader must get the granted item's own
# bytes or a cut connection, never another item's bytes; the producer must
# cut the send (its lease expired) rather than unpin under it, keep saving,
# serve a well-behaved consumer afterwards, and exit cleanly.
# usage: test_slow_reader.sh PIN_SAVER ECX
set -u
SAVER=$1 ECX=$2
. "$(dirname "$0")/lib.sh"
private_shm

timeout 150 "$SAVER" churn "$T" tcp 1000 >"$T/saver.out" 2>"$T/saver.log" &
spid=$!
pids+=($spid)
wait_file "$T/ann.json" || { echo "FAIL: the producer did not start" >&2; cat "$T/saver.log" >&2; exit 1; }

timeout 60 $PY "$(dirname "$0")/../support/slow_reader.py" "$T" 20 >"$T/reader.out" 2>&1
rc=$?
sed 's/^/    reader: /' "$T/reader.out"
check "the slow reader got no byte of another item (rc $rc)" '[ $rc = 0 ]'
check "its send was cut, not completed with the lease long gone" \
  'grep -q "ended cut" "$T/reader.out"'
touch "$T/stop"
wait_file "$T/good.json" || bad "the producer never saved its last item"
sed 's/^/    producer: /' "$T/saver.out"
check "the producer kept saving all along" \
  'grep -q "^saves [1-9][0-9]* failed 0$" "$T/saver.out"'
check "the cut was counted" 'grep -q "^ecx_producer_cut_sends_total [1-9]" "$T/saver.out"'
check "the lease expiry said the send is cut" 'grep -q "its send is cut" "$T/saver.log"'

mkdir -p "$T/out"
expect 0 "" "a well-behaved consumer is served afterwards" -- \
  "$ECX" get --params "$T/good.json" --data tcp --block-bytes 64Ki --out "$T/out"
check "its bytes are the item's" '$PY -c "
import sys
from array import array
b = open(sys.argv[1], \"rb\").read()
sys.exit(b != array(\"Q\", ((0xaa << 56) | i for i in range(len(b) // 8))).tobytes())
" "$T/out/good"'
touch "$T/quit"
wait $spid
src=$?
check "the producer exited 0 (rc $src)" '[ $src = 0 ]'
check "nothing left pinned at the end" 'grep -q "^ecx_producer_draining_grants 0$" "$T/saver.out"'
[ $failed = 0 ] || sed 's/^/    producer log: /' "$T/saver.log" | tail -20 >&2
finish
