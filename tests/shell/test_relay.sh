#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_relay — a registration serves only the control-plane peer that first
# sent it (issue 20, item 6): a hostile producer B that owns no region
# relays a real producer A's genuine acks (asked of A in the consumer's own
# session id with B) as its own. The consumer fetches x from A (A's
# registration is A's session's), then y and w from B: y relayed from A's y,
# w from A's x. Neither may become ready: on shm, B's relayed y would have
# mapped A's region for B's session and w would then be A's x copied under
# B's item; on tcp, y would be A's y. Both fall back BAD_ACK, logged and
# counted; x is exact; B's acks were relayed; A serves on.
# Before the fix: on shm y and w were ready, w byte for byte A's x; on tcp y
# was ready (w READ_FAILED: A's grant check wants w's own key).
# The defaults: protocol version 2, 8 KiB blocks (items of 25 blocks).
# usage: test_relay.sh PATH_TO_ECX [KEEP=DIR in the environment: copies of the outputs]
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm

mkdir -p "$T/in"
head -c 204800 /dev/urandom >"$T/in/x"
head -c 204800 /dev/urandom >"$T/in/y"
"$ECX" serve --listen 127.0.0.1:0 --preload "$T/in" \
  --announce-out "$T/ann.json" 2>"$T/serve.log" &
spid=$!
pids+=($spid)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; cat "$T/serve.log" >&2; exit 1; }
APORT=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["x"]["peer_port"])' "$T/ann.json")

for data in shm tcp; do
  rm -f "$T/B.port"
  $PY "$(dirname "$0")/../support/relay_producer.py" "$T/B.port" "$APORT" "y=y@0.3,w=x@0.6" \
    2>"$T/relay-$data.log" &
  rpid=$!
  pids+=($rpid)
  wait_file "$T/B.port" || { bad "$data: the relay did not start"; continue; }
  BPORT=$(cat "$T/B.port")
  $PY - "$T/ann.json" "$BPORT" "$T/params.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
b = dict(a["x"], peer_port=int(sys.argv[2]))
json.dump({"x": a["x"], "y": b, "w": b}, open(sys.argv[3], "w"))
PY
  rm -rf "$T/out" && mkdir -p "$T/out"
  timeout 30 "$ECX" get --params "$T/params.json" --out "$T/out" --data $data \
    --json >"$T/get-$data.json" 2>"$T/get-$data.log"
  check "$data: x from A is exact" 'cmp -s "$T/in/x" "$T/out/x"'
  check "$data: y from B (A's y, relayed) is not fetched" '[ ! -s "$T/out/y" ]'
  check "$data: w from B (A's x, relayed) is not fetched" '[ ! -s "$T/out/w" ]'
  check "$data: no file of B's holds A's x" '! cmp -s "$T/in/x" "$T/out/w" 2>/dev/null'
  check "$data: y and w fell back BAD_ACK" \
    '[ "$(grep -c "\"BAD_ACK\"" "$T/get-$data.json")" = 2 ]'
  check "$data: the relayed registration was logged" \
    'grep -q "sent the data-plane registration of 127.0.0.1:$APORT" "$T/get-$data.log"'
  check "$data: B did relay A's acks for y and w" \
    'grep -q "relayed y (status 0)" "$T/relay-$data.log" &&
     grep -q "relayed w (status 0)" "$T/relay-$data.log"'
  if [ -n "${KEEP:-}" ]; then # keep what ran, for a look by hand
    cp "$T"/get-$data.* "$T/relay-$data.log" "$KEEP"/ && cp -r "$T/out" "$KEEP/out-$data"
  fi
  kill "$rpid" 2>/dev/null; wait "$rpid" 2>/dev/null
done
check "A is still serving" 'kill -0 $spid'
finish
