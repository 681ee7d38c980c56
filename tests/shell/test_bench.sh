#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_bench — `ecx bench ctrl` against `ecx serve`: every request answered,
# the last line's format, the NACK path, and bad input (missing or bad
# --params, window 0, an unreachable producer) failing fast with a clear
# message and the right exit status. Behaviour only, never timings.
# usage: test_bench.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
# err_has TEXT DESCRIPTION: the last command's stderr mentions TEXT.
err_has() { grep -qi -- "$1" "$T/cmd.stderr" && ok || bad "$2: stderr lacks '$1': $(head -c 400 "$T/cmd.stderr")"; }
LINE='^requests=[0-9]+ ok=[0-9]+ nack=[0-9]+ window=[0-9]+ ack_bytes=[0-9]+ req_per_s=[0-9]+ p50_us=[0-9.]+ p99_us=[0-9.]+$'

# The defaults on both sides (protocol version 2, 8 KiB blocks): items are
# whole blocks, 96Ki = 12 rows.
"$ECX" serve --listen 127.0.0.1:0 --synthetic 4:96Ki \
  --announce-out "$T/ann.json" 2>"$T/serve.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$T/ann.json" ] && break; sleep 0.1; done
[ -s "$T/ann.json" ] || { echo "FAIL: ecx serve did not start: $(cat "$T/serve.log")" >&2; exit 1; }

# 1. Every request answered OK, at window 8 and 1; the last line's format.
for w in 8 1; do
  expect 0 "" "bench ctrl window $w" -- "$ECX" bench ctrl --params "$T/ann.json" --requests 300 \
    --warmup 10 --window $w --require-ok --timeout-ms 20000
  last=$(tail -n 1 "$T/cmd.stdout")
  [[ $last =~ $LINE ]] && ok || bad "window $w: last line '$last'"
  [[ $last == "requests=300 ok=300 nack=0 window=$w "* ]] && ok || bad "window $w: not all OK: '$last'"
done

# 2. Another compat factor: the producer NACKs every request INCOMPAT; still
#    all answered (exit 0) unless --require-ok.
expect 0 "" "bench ctrl, other model" -- "$ECX" bench ctrl --params "$T/ann.json" --requests 50 \
  --warmup 0 --window 4 --model other --timeout-ms 20000
[[ $(tail -n 1 "$T/cmd.stdout") == "requests=50 ok=0 nack=50 "* ]] && ok || bad "other model: $(tail -n 1 "$T/cmd.stdout")"
err_has NACK_INCOMPAT "other model"
expect 1 "" "--require-ok with NACKs" -- "$ECX" bench ctrl --params "$T/ann.json" --requests 20 \
  --warmup 0 --model other --require-ok --timeout-ms 20000
err_has "require-ok" "--require-ok with NACKs"
# An empty session id is NACK_INTERNAL (docs/PROTOCOL.md §4.3), not a grant.
expect 0 "" "empty session id" -- "$ECX" bench ctrl --params "$T/ann.json" --requests 20 \
  --warmup 0 --session-id "" --timeout-ms 20000
err_has NACK_INTERNAL "empty session id"

# 3. Bad input.
expect 2 "" "no --params" -- "$ECX" bench ctrl --requests 10
err_has "needs --params" "no --params"
expect 1 "" "missing file" -- "$ECX" bench ctrl --params "$T/nope.json"
err_has "nope.json" "missing file"
echo '{"a": ' >"$T/bad.json"
expect 1 "" "bad JSON" -- "$ECX" bench ctrl --params "$T/bad.json"
err_has "bad.json" "bad JSON"
echo '[1, 2]' >"$T/arr.json"
expect 1 "" "JSON not an object" -- "$ECX" bench ctrl --params "$T/arr.json"
err_has "JSON object" "JSON not an object"
echo '{"h": {"metadata": {}}}' >"$T/noaddr.json"
expect 1 "" "no address" -- "$ECX" bench ctrl --params "$T/noaddr.json"
err_has "peer_host" "no address"
expect 2 "" "window 0" -- "$ECX" bench ctrl --params "$T/ann.json" --window 0
err_has "window" "window 0"
expect 2 "" "requests 0" -- "$ECX" bench ctrl --params "$T/ann.json" --requests 0
expect 2 "" "stray argument" -- "$ECX" bench ctrl --params "$T/ann.json" extra
expect 2 "" "unknown benchmark" -- "$ECX" bench fast
expect 2 "" "no benchmark" -- "$ECX" bench
expect 2 "" "bench data --data bogus" -- "$ECX" bench data --data bogus
expect 2 "" "bench data --count 0" -- "$ECX" bench data --count 0
expect 2 "" "bench data --size x" -- "$ECX" bench data --size x
# A port nobody listens on: bounded by --timeout-ms, clear error, exit 1.
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf '{"h": {"peer_host": "127.0.0.1", "peer_port": %s, "size_bytes": 1, "metadata": {}}}' "$port" >"$T/dead.json"
t0=$(date +%s%N)
expect 1 "" "unreachable producer" -- "$ECX" bench ctrl --params "$T/dead.json" --requests 10 --timeout-ms 500
t1=$(date +%s%N)
err_has "0 of 210 requests answered" "unreachable producer"
[ $(((t1 - t0) / 1000000)) -lt 5000 ] && ok || bad "unreachable producer took $(((t1 - t0) / 1000000)) ms"

# 4. Each benchmark's help describes its options, and only its own.
expect 0 "" "bench ctrl --help" -- "$ECX" bench ctrl --help
for o in --params --requests --warmup --window --timeout-ms --session-id --require-ok \
  --block-bytes --region-bytes --vllm-version --model --dtype; do
  grep -q -- "$o" "$T/cmd.stdout" && ok || bad "bench ctrl --help lacks $o"
done
grep -q "bench data" "$T/cmd.stdout" && bad "bench ctrl --help describes bench data" || ok
expect 0 "" "bench data --help" -- "$ECX" bench data --help
for o in --size --count --warmup --data --block-bytes --region-bytes --vllm-version --model --dtype; do
  grep -q -- "$o" "$T/cmd.stdout" && ok || bad "bench data --help lacks $o"
done
grep -q -- "--session-id" "$T/cmd.stdout" && bad "bench data --help describes bench ctrl" || ok
expect 0 "" "bench --help" -- "$ECX" bench --help
expect 0 "" "ecx --help" -- "$ECX" --help
grep -q "bench ctrl" "$T/cmd.stdout" && grep -q "bench data" "$T/cmd.stdout" && ok || bad "ecx --help lacks bench"

finish
