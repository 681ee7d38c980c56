#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_operator — a new operator's first hour (issue 23): each mistake made
# on purpose with the real ecx command, and what the operator is told checked
# (message, exit code, reason, time).
# usage: test_operator.sh PATH_TO_ECX
set -u
ECX=$1
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
private_shm
# timed CMD...: run it; rc = its exit status, ms = its wall time; output in $T/cmd.*
timed() {
  local t0; t0=$(date +%s%N)
  timeout 20 "$@" >"$T/cmd.stdout" 2>"$T/cmd.stderr"; rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
}
ecx_help_has() { "$ECX" "$1" --help | grep -q -- "$2"; }
port_of() { $PY -c 'import json,sys; a=json.load(open(sys.argv[1])); print(next(iter(a.values()))["peer_port"])' "$1"; }

# ---------- §1 compatibility factors as vLLM gives them ----------
MPORT=$(free_port)
"$ECX" serve --listen 127.0.0.1:0 --synthetic 2:64Ki --dtype torch.bfloat16 --metrics "127.0.0.1:$MPORT" \
  --announce-out "$T/a.json" 2>"$T/serve.log" &
pids+=($!)
wait_file "$T/a.json" || { echo "FAIL: serve did not start" >&2; cat "$T/serve.log" >&2; exit 1; }
PORT=$(port_of "$T/a.json")
H0=$($PY -c 'import json,sys; print(sorted(json.load(open(sys.argv[1])))[0])' "$T/a.json")
WANT=$("$ECX" compat-hash 0.34.0 llava-hf/llava-1.5-7b-hf torch.bfloat16 8Ki)
check "serve prints its factors, hash and protocol version at start" \
  "grep -q 'producer: vllm-version 0.34.0, model llava-hf/llava-1.5-7b-hf, dtype torch.bfloat16, block-bytes 8192, protocol version 2, compat hash $WANT' '$T/serve.log'"
metrics_of "$MPORT" >"$T/m.txt"
check "/metrics has ecx_info with the four factors, the hash and the version" \
  "grep -q '^ecx_info{vllm_version=\"0.34.0\",model=\"llava-hf/llava-1.5-7b-hf\",dtype=\"torch.bfloat16\",block_bytes=\"8192\",compat_hash=\"$WANT\",protocol_version=\"2\"} 1$' '$T/m.txt'"
# bfloat16, bf16 and torch.bfloat16 are one dtype: each fetches.
for d in bfloat16 bf16 torch.bfloat16; do
  expect 0 "" "get --dtype $d from serve --dtype torch.bfloat16" -- \
    "$ECX" get --dtype "$d" --peer "127.0.0.1:$PORT" --mm-hash "$H0" --size 64Ki --out "$T/o.$d"
done
expect 2 "is not one ecx knows; accepted: .*torch.bfloat16 \(bfloat16, bf16\)" "an unknown dtype lists the accepted ones" -- \
  "$ECX" get --dtype bfloat17 --peer "127.0.0.1:$PORT" --mm-hash "$H0" --size 64Ki --out "$T/o"
expect 2 "vllm-version 0.34.0 speaks protocol version 2, not the --connector-version 1" \
  "a contradictory --vllm-version / --connector-version pair is refused" -- \
  "$ECX" serve --listen 127.0.0.1:0 --synthetic 1:1Mi --vllm-version 0.34.0 --connector-version 1
# A NACK_INCOMPAT names this side's factors and where the producer's are.
expect 3 "this consumer: vllm-version 0.34.0, model other/model, dtype torch.bfloat16.*compat hash [0-9a-f]{64}" \
  "NACK_INCOMPAT prints the consumer's factors" -- \
  "$ECX" get --model other/model --peer "127.0.0.1:$PORT" --mm-hash "$H0" --size 64Ki --out "$T/o"
check "NACK_INCOMPAT says where to read the producer's factors" "grep -q 'ecx_info' '$T/cmd.stderr' && grep -q 'NACK_INCOMPAT' '$T/cmd.stderr'"

# ecx ping: each outcome with its exit code, each in under 2 s.
ping_case() { # WANT_RC PATTERN DESCRIPTION ARGS...
  local want=$1 pat=$2 what=$3; shift 3
  timed "$ECX" ping "$@"
  if [ "$rc" = "$want" ] && grep -qE -- "$pat" "$T/cmd.stdout" "$T/cmd.stderr" && [ "$ms" -lt 2000 ]; then ok
  else bad "ping $what: exit $rc (want $want) in $ms ms; $(head -c 300 "$T/cmd.stderr")"; fi
}
DEAD=$(free_port)
ping_case 0 "can fetch from" "compatible" "127.0.0.1:$PORT"
ping_case 0 "can fetch from" "compatible, dtype alias" "127.0.0.1:$PORT" --dtype bf16
ping_case 3 "nothing listening" "nothing listening" "127.0.0.1:$DEAD"
ping_case 4 "not a ZeroMQ peer" "the metrics port (HTTP)" "127.0.0.1:$MPORT"
ping_case 6 "another protocol version" "protocol version differs" "127.0.0.1:$PORT" --vllm-version 0.31.0
ping_case 7 "this side: vllm-version 0.33.0" "compat hash differs" "127.0.0.1:$PORT" --vllm-version 0.33.0
# A port that accepts and never speaks: not a ZeroMQ peer, still under 2 s.
$PY -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(); open("'"$T"'/mute","w").write(str(s.getsockname()[1])); c=[]; t=time.time()
while time.time()-t<30: c.append(s.accept())' &
pids+=($!)
wait_file "$T/mute"
ping_case 4 "not a ZeroMQ peer: it sent no ZeroMQ greeting" "a silent TCP server" "127.0.0.1:$(cat "$T/mute")"
# CURVE both ways.
"$ECX" keygen "$T/srv" >/dev/null 2>&1 && "$ECX" keygen "$T/other" >/dev/null 2>&1
"$ECX" serve --listen 127.0.0.1:0 --synthetic 1:8Ki --curve-secret "$T/srv.key" --announce-out "$T/c.json" 2>"$T/cserve.log" &
pids+=($!)
wait_file "$T/c.json"
CPORT=$(port_of "$T/c.json")
ping_case 5 "encrypts its control plane" "plaintext to a CURVE producer" "127.0.0.1:$CPORT"
ping_case 5 "refused the CURVE handshake" "wrong server key" "127.0.0.1:$CPORT" --curve-server-key "$T/other.pub"
ping_case 0 "can fetch from" "right server key" "127.0.0.1:$CPORT" --curve-server-key "$T/srv.pub"
ping_case 5 "speaks plaintext" "a key for a plaintext producer" "127.0.0.1:$PORT" --curve-server-key "$T/srv.pub"

# ---------- §2 a producer that is not there does not look like a slow one ----------
# Version 1 (vLLM 0.31.0's factors, lib.sh's V1) and the default, version 2.
speaks() { [ "$1" = 1 ] && echo "${V1[@]}"; }
for v in 1 2; do
  timed "$ECX" get $(speaks "$v") --peer "127.0.0.1:$DEAD" --mm-hash h --size 1Mi --out "$T/x"
  check "get v$v, nothing listening: REFUSED at once (exit $rc, $ms ms)" \
    "[ $rc = 3 ] && grep -q '^h: REFUSED' '$T/cmd.stderr' && [ $ms -lt 1500 ]"
done
# Not a ZeroMQ peer (no ZeroMQ greeting within 1 s of connecting): NOT_ZMQ then, not the ack
# timeout (2 s on version 1, every try's on version 2: 60 s).
for v in 1 2; do
  for what in "the metrics port (HTTP):$MPORT" "a silent TCP server:$(cat "$T/mute")"; do
    timed "$ECX" get $(speaks "$v") --peer "127.0.0.1:${what##*:}" --mm-hash h --size 1Mi --out "$T/x"
    check "get v$v, ${what%:*}: NOT_ZMQ within ~1 s (exit $rc, $ms ms)" \
      "[ $rc = 3 ] && grep -q '^h: NOT_ZMQ' '$T/cmd.stderr' && grep -q 'is not a ZeroMQ peer' '$T/cmd.stderr' && [ $ms -lt 2500 ]"
  done
done
# A ZeroMQ peer that accepts the request and stays silent still gets the ack timeout
# (version 1's: one timeout ends the item; version 2 re-requests, as vLLM does, until
# the item's 60 s wait).
$PY -c 'import zmq,time; s=zmq.Context().socket(zmq.ROUTER); p=s.bind_to_random_port("tcp://127.0.0.1"); open("'"$T"'/zmute","w").write(str(p)); time.sleep(30)' &
pids+=($!)
wait_file "$T/zmute"
timed "$ECX" get "${V1[@]}" --peer "127.0.0.1:$(cat "$T/zmute")" --mm-hash h --size 8Ki --ack-timeout-ms 1500 --out "$T/x"
check "a ZeroMQ producer that accepts and stays silent still gets the ack timeout (exit $rc, $ms ms)" \
  "[ $rc = 3 ] && grep -q '^h: ACK_TIMEOUT' '$T/cmd.stderr' && [ $ms -ge 1400 ]"
check "an ack timeout points at ecx ping" "grep -q 'ecx ping HOST:PORT' '$T/cmd.stderr'"
expect 2 "is a wildcard: give --advertise-host" "a wildcard --listen without --advertise-host" -- \
  "$ECX" serve --listen 0.0.0.0:0 --synthetic 1:8Ki

# ---------- §3 errors at the right time and with the right name ----------
REQ0=$(metrics_of "$MPORT" | awk '$1 == "ecx_producer_requests_total" {print $2}')
expect 1 "is not a directory this process can write to.*nothing was fetched" "--out DIR missing" -- \
  "$ECX" get --params "$T/a.json" --out "$T/no/such/dir"
expect 1 "its directory .* is not a directory" "--out FILE in a missing directory" -- \
  "$ECX" get --peer "127.0.0.1:$PORT" --mm-hash "$H0" --size 64Ki --out "$T/no/such/file"
REQ1=$(metrics_of "$MPORT" | awk '$1 == "ecx_producer_requests_total" {print $2}')
check "a missing --out is found before any request ($REQ0 -> $REQ1)" "[ '$REQ0' = '$REQ1' ]"
expect 3 "is 65536 bytes, not the 57344 announced" "a wrong --size says so" -- \
  "$ECX" get --peer "127.0.0.1:$PORT" --mm-hash "$H0" --size 56Ki --out "$T/w"
check "a wrong --size is SIZE_MISMATCH" "grep -q ': SIZE_MISMATCH$' '$T/cmd.stderr'"
# The consumer will not read what it was granted: it says so on the data plane and the
# producer lets the grant go now, not at the end of its 30 s lease (nixl: the lease).
active_grants() { metrics_of "$1" | awk '$1 == "ecx_producer_active_grants" {print $2}'; }
declined() { # PATH PORT METRICS_PORT MM_HASH
  expect 3 "SIZE_MISMATCH" "a wrong --size over $1" -- \
    "$ECX" get --data "$1" --peer "127.0.0.1:$2" --mm-hash "$4" --size 56Ki --out "$T/w"
  for _ in $(seq 50); do [ "$(active_grants "$3")" = 0 ] && break; sleep 0.1; done
  check "$1: the producer released the grant the consumer declined (active $(active_grants "$3"))" \
    "[ '$(active_grants "$3")' = 0 ] && metrics_of $3 | grep -q '^ecx_producer_expired_leases_total 0$'"
}
for d in shm tcp; do declined "$d" "$PORT" "$MPORT" "$H0"; done
# The producer above serves auto, which never publishes ucx: one that serves ucx.
if built ucx; then
  UMPORT=$(free_port)
  "$ECX" serve --data ucx --listen 127.0.0.1:0 --synthetic 1:64Ki --metrics "127.0.0.1:$UMPORT" \
    --announce-out "$T/u.json" 2>"$T/userve.log" &
  pids+=($!)
  if wait_file "$T/u.json"; then
    declined ucx "$(port_of "$T/u.json")" "$UMPORT" \
      "$($PY -c 'import json,sys; print(next(iter(json.load(open(sys.argv[1])))))' "$T/u.json")"
  else
    bad "ecx serve --data ucx did not start: $(head -c 300 "$T/userve.log")"
  fi
fi
expect 0 "" "get --json" -- "$ECX" get --json --peer "127.0.0.1:$PORT" --mm-hash "$H0" --size 64Ki --out "$T/j"
check "--json says written and what verified means" \
  "grep -q '\"written\": *true' '$T/cmd.stdout' && grep -q '\"verified\": *false' '$T/cmd.stdout' && ecx_help_has get 'verified (compared with --verify-synthetic'"
expect 1 "is a secret key .*--curve-server-key wants public keys" "a secret key as the server key" -- \
  "$ECX" get --curve-server-key "$T/srv.key" --peer "127.0.0.1:$CPORT" --mm-hash h --size 8Ki --out "$T/k"
expect 1 "'$T/srv.pub' is a public key.*--curve-secret wants a secret key" "a public key as one's own secret" -- \
  "$ECX" serve --listen 127.0.0.1:0 --synthetic 1:8Ki --curve-secret "$T/srv.pub"
expect 1 "is a secret key" "a secret key in the allow-list" -- \
  "$ECX" serve --listen 127.0.0.1:0 --synthetic 1:8Ki --curve-secret "$T/srv.key" --curve-allow "$T/other.key"
expect 0 "" "ecx --version" -- "$ECX" --version
check "--version prints the version" "grep -qE '^ecx [0-9]+\.[0-9]+\.[0-9]+ ' '$T/cmd.stdout'"
expect 2 "--listen takes HOST:PORT" "--listen with a port past 65535" -- "$ECX" serve --listen 127.0.0.1:99999
expect 2 "--mm-hash nope is not in --params" "an --mm-hash the params file lacks" -- \
  "$ECX" get --params "$T/a.json" --mm-hash nope --out "$T"
expect 2 "fractions must come to whole bytes" "a size that is not whole bytes" -- \
  "$ECX" get --peer "127.0.0.1:$PORT" --mm-hash h --size 1.5 --out "$T/x"
check "compat-hash takes size suffixes" "[ \"\$('$ECX' compat-hash v m d 8Ki)\" = \"\$('$ECX' compat-hash v m d 8192)\" ]"
printf '{"h":{"peer_host":"127.0.0.1","peer_port":"%s","size_bytes":10,"metadata":{}}}' "$PORT" >"$T/sp.json"
expect 3 "peer_port is missing or not a JSON integer" "a string peer_port: INVALID, with why" -- \
  "$ECX" get --params "$T/sp.json" --out "$T"
check "a string peer_port is INVALID" "grep -q '^h: INVALID' '$T/cmd.stderr'"
printf '{"h":"{not json"}' >"$T/bad.json"
expect 3 "announcement is not (a )?JSON" "a malformed announcement: INVALID, with why" -- \
  "$ECX" get --params "$T/bad.json" --out "$T"
check "a malformed announcement is INVALID" "grep -q '^h: INVALID' '$T/cmd.stderr'"
check "/healthz answers ok" "[ \"\$($PY -c 'import urllib.request,sys; print(urllib.request.urlopen(\"http://127.0.0.1:%s/healthz\" % sys.argv[1], timeout=5).read().decode().strip())' $MPORT)\" = ok ]"
expect 1 "^ecx: --metrics: Failed to bind" "a metrics port in use: every line has the ecx: prefix" -- \
  "$ECX" serve --listen 127.0.0.1:0 --synthetic 1:8Ki --metrics "127.0.0.1:$MPORT"
check "no unprefixed line on a metrics bind error" "! grep -v '^ecx: ' '$T/cmd.stderr'"
expect 0 "" "ecx --help" -- "$ECX" --help
check "ecx --help names ECX_LOG" "grep -q ECX_LOG '$T/cmd.stdout'"

expect 2 "ping takes HOST:PORT" "ping: a bad address" -- "$ECX" ping nowhere
expect 0 "" "ping --help" -- "$ECX" ping --help

finish
