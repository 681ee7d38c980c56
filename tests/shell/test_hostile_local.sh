#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_hostile_local — bounds against hostile peers and careless operators,
# with real processes on loopback: a multipart message that never ends
# against `ecx serve` (its RSS stays bounded, a well-behaved `ecx get` is
# served meanwhile) and against `ecx get` from a hostile producer (bounded,
# falls back); key, allow-list and params files that are FIFOs, devices,
# directories or too big fail at once with a message; `get --size 0` says
# why; `get` output is 0600; idle HTTP connections cannot lock /metrics.
# usage: test_hostile_local.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm
HOSTILE="$(dirname "$0")/../support/hostile_peer.py"
# Under ASan, freed memory waits in a quarantine: keep it small so RSS
# shows what is held, not what was freed.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16"
BOUND_KIB=$((128 * 1024)) # RSS growth allowed while a peer floods for 3 s
kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }

# 1. Endless multipart message against serve, while a consumer fetches.
umask 022
mkdir -p "$T/out"
MPORT=$(free_port)
"$ECX" serve --listen 127.0.0.1:0 --synthetic 8:1Mi --announce-out "$T/ann.json" \
  --metrics "127.0.0.1:$MPORT" 2>"$T/serve.log" &
spid=$!
pids+=($spid)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; cat "$T/serve.log" >&2; exit 1; }
PORT=$($PY -c 'import json,sys; print(list(json.load(open(sys.argv[1])).values())[0]["peer_port"])' "$T/ann.json")
rss0=$(kib "$spid" VmRSS)
timeout 20 $PY "$HOSTILE" dealer "$PORT" 3 >"$T/flood.out" &
fpid=$!
sleep 1
"$ECX" get --params "$T/ann.json" --out "$T/out" --verify-synthetic >"$T/get.out" 2>"$T/get.err"
rc=$?
wait "$fpid"
grow=$(($(kib "$spid" VmHWM) - rss0))
echo "serve: RSS grew $grow KiB under the flood ($(cat "$T/flood.out"))"
check "get during the flood exits 0 (got $rc: $(tail -c 300 "$T/get.err"))" '[ $rc = 0 ]'
check "serve RSS grew $grow KiB, bound $BOUND_KIB" '[ "$grow" -lt "$BOUND_KIB" ]'
check "the flooding connection was dropped" 'grep -q "dropped a connection holding" "$T/serve.log"'
metrics=$(metrics_of "$MPORT")
check "metrics count the drops" 'echo "$metrics" | grep -qE "^ecx_producer_pending_drops_total [1-9]"'
check "output files are 0600 under umask 022" '[ "$(stat -c %a "$T/out"/* | sort -u)" = 600 ]'

# 2. /metrics with idle connections: 64 from another address do not hold off
# a scrape (MHD accepts one connection per serve-loop turn, so it waits its
# turn, ~1.3 s); 64 from the scraper's own address hold it off only until
# they time out (3 s).
scrape_after_idle() { # SOURCE_ADDRESS: seconds until a scrape from 127.0.0.1 got through
  $PY - "$MPORT" "$1" <<'EOF'
import socket, sys, time, urllib.request
port, src = int(sys.argv[1]), sys.argv[2]
idle = []
for _ in range(64):
    s = socket.socket()
    s.bind((src, 0))
    try:
        s.connect(("127.0.0.1", port))
    except OSError:
        pass
    idle.append(s)
t0 = time.monotonic()
while time.monotonic() - t0 < 8:
    try:
        body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=2).read()
        if b"ecx_producer_requests_total" in body:
            print("%.2f" % (time.monotonic() - t0))
            break
    except OSError:
        time.sleep(0.2)
else:
    print("never")
EOF
}
t=$(scrape_after_idle 127.0.0.2)
check "scrape beside 64 idle connections from another address (took $t s)" '[ "$t" != never ] && awk -v t="$t" "BEGIN{exit !(t < 3)}"'
t=$(scrape_after_idle 127.0.0.1)
check "scrape after 64 idle connections from its own address (took $t s)" '[ "$t" != never ] && awk -v t="$t" "BEGIN{exit !(t < 6)}"'
kill -INT "$spid"
wait "$spid"
rc=$?
check "serve exits 0 after all that (got $rc)" '[ $rc = 0 ]'

# 3. A hostile producer floods `ecx get`: bounded, and its item falls back.
# The baseline is the same fetch from a producer that never answers.
# Protocol version 1 on purpose ("${V1[@]}"): both gets end on the 3 s ack
# timeout (then a tombstone) within the 15 s watch; under version 2 an ack
# timeout is retried for the 60 s per-item wait. (--size 10: any byte count.)
peak_of_get() { # PORT: peak RSS (KiB) of a get from it; its stderr in $T/hget.err
  "$ECX" get "${V1[@]}" --peer "127.0.0.1:$1" --mm-hash h --size 10 --ack-timeout-ms 3000 \
    --out "$T/h.bin" 2>"$T/hget.err" &
  local gpid=$!
  $PY "$HOSTILE" rss "$gpid" 15
  wait "$gpid"
  echo "$?" >"$T/hget.rc"
}
base=$(peak_of_get "$(free_port)")
rm -f "$T/hport"
timeout 20 $PY "$HOSTILE" router "$T/hport" 4 >"$T/hflood.out" &
hpid=$!
pids+=($hpid)
wait_file "$T/hport"
peak=$(peak_of_get "$(cat "$T/hport")")
wait "$hpid"
echo "get: peak RSS $peak KiB, $base KiB without a flood ($(cat "$T/hflood.out"))"
check "get from a hostile producer falls back (exit $(cat "$T/hget.rc"))" '[ "$(cat "$T/hget.rc")" = 3 ]'
check "get RSS grew $((peak - base)) KiB, bound $BOUND_KIB" '[ $((peak - base)) -lt "$BOUND_KIB" ]'
check "get dropped the flooding connection" 'grep -q "dropped a connection holding" "$T/hget.err"'

# 4. Local files that are not what they claim to be.
expect 0 "" "keygen" -- "$ECX" keygen "$T/k"
mkfifo "$T/fifo"
mkdir "$T/dir"
head -c 70000 /dev/zero | tr '\0' '#' >"$T/big.key"
head -c 5000000 /dev/zero | tr '\0' '#' >"$T/big.allow"
for bad in "$T/fifo:not a regular file" "/dev/zero:not a regular file" "$T/dir:is a directory" \
  "$T/nope:No such file"; do
  f=${bad%%:*} why=${bad#*:}
  expect 1 "--curve-secret '$f': cannot read: .*$why" "serve --curve-secret $f" -- \
    "$ECX" serve --listen 127.0.0.1:0 --curve-secret "$f"
  expect 1 "--curve-allow '$f': cannot read: .*$why" "serve --curve-allow $f" -- \
    "$ECX" serve --listen 127.0.0.1:0 --curve-secret "$T/k.key" --curve-allow "$f"
  expect 1 "--curve-server-key '$f': cannot read: .*$why" "get --curve-server-key $f" -- \
    "$ECX" get --peer 127.0.0.1:1 --mm-hash h --size 8Ki --out "$T/x" --curve-server-key "$f"
  expect 1 "--curve-secret '$f': cannot read: .*$why" "get --curve-secret $f" -- \
    "$ECX" get --peer 127.0.0.1:1 --mm-hash h --size 8Ki --out "$T/x" \
    --curve-server-key "$T/k.pub" --curve-secret "$f"
  expect 1 "--params '$f': cannot read: .*$why" "get --params $f" -- \
    "$ECX" get --params "$f" --out "$T/out"
done
expect 1 "larger than 65536 bytes" "oversized key file" -- \
  "$ECX" serve --listen 127.0.0.1:0 --curve-secret "$T/big.key"
expect 1 "larger than 4194304 bytes" "oversized allow file" -- \
  "$ECX" serve --listen 127.0.0.1:0 --curve-secret "$T/k.key" --curve-allow "$T/big.allow"

# 5. Usage messages.
expect 2 "--size must be at least 1 byte" "get --size 0" -- \
  "$ECX" get --peer 127.0.0.1:1 --mm-hash h --size 0 --out "$T/x"
check "no region files left behind" '[ -z "$(ls "$SHM" | grep "\.mmap$")" ]'

finish
