#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_grant_forgery — issue 9's "grants belong to the connection that asked",
# with real processes: a third process that knows a consumer's session id
# cannot take its grant over from another connection, nor release it with
# forged completions on the same-host path or forged declines on tcp; all are counted; nothing is
# released; and `ecx serve` never logs a session id at the default level.
# The defaults: protocol version 2, 8 KiB blocks (the item is 25 of them).
# usage: test_grant_forgery.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm

mkdir -p "$T/in"
head -c 204800 /dev/urandom >"$T/in/item"
MPORT=$(free_port)
"$ECX" serve --listen 127.0.0.1:0 --preload "$T/in" --lease-ms 1500 \
  --announce-out "$T/ann.json" --metrics "127.0.0.1:$MPORT" 2>"$T/serve.log" &
spid=$!
pids+=($spid)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; cat "$T/serve.log" >&2; exit 1; }
PORT=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["item"]["peer_port"])' "$T/ann.json")
# The forger's hand-written requests carry the hash of serve's factors: the
# defaults (vLLM 0.34.0, protocol version 2, 8 KiB blocks).
COMPAT=$("$ECX" compat-hash 0.34.0 llava-hf/llava-1.5-7b-hf torch.bfloat16 8192)

timeout 20 $PY "$(dirname "$0")/../support/grant_forger.py" "$PORT" "$COMPAT" item >"$T/forger.out" 2>&1
rc=$?
check "the forger ran every step (rc $rc: $(tr '\n' ' ' <"$T/forger.out"))" '[ $rc = 0 ] && grep -q "forged 2" "$T/forger.out" && grep -q "declined 2" "$T/forger.out"'
for _ in $(seq 10); do metrics_of "$MPORT" | grep -q "^ecx_producer_forged_notifications_total 4$" && break; sleep 0.1; done
check "another connection cannot take the grant over (NACK_INTERNAL)" 'grep -q "takeover status 4" "$T/forger.out"'
check "a grant holder gets the region descriptor" 'grep -q "shm F" "$T/forger.out"'
m=$(metrics_of "$MPORT")
check "the forged completions (shm 'D', tcp 'C') counted" 'echo "$m" | grep -q "^ecx_producer_forged_notifications_total 4$"'
check "the takeover counted" 'echo "$m" | grep -q "^ecx_producer_foreign_requests_total 1$"'
check "nothing released: both grants still held" 'echo "$m" | grep -q "^ecx_producer_active_grants 2$"'
check "no completion counted" 'echo "$m" | grep -q "^ecx_producer_completions_total 0$"'
check "garbage on the shm socket closes the connection" 'grep -q "shm garbage closed" "$T/forger.out"'
check "garbage on the tcp port closes the connection" 'grep -q "tcp garbage closed" "$T/forger.out"'
check "the shm drop counted" 'echo "$m" | grep -q "^ecx_producer_data_connections_dropped_total{path=\"shm\"} 1$"'
check "the tcp drop counted" 'echo "$m" | grep -q "^ecx_producer_data_requests_dropped_total{path=\"tcp\"} 1$"'
sleep 2 # the leases (1.5 s) expire
m=$(metrics_of "$MPORT")
check "the leases release them" 'echo "$m" | grep -q "^ecx_producer_active_grants 0$"'
check "lease expiries were logged" 'grep -q "lease expired for item" "$T/serve.log"'
check "no session id in the producer's log" '! grep -q "victim-session\|attacker-session" "$T/serve.log"'
mkdir -p "$T/out"
expect 0 "" "a real consumer is served after all that" -- "$ECX" get --params "$T/ann.json" --out "$T/out"
check "its bytes are exact" 'cmp -s "$T/in/item" "$T/out/item"'
finish
