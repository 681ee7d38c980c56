#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_serve_get — `ecx serve` and `ecx get` run as a user would: --preload
# of a directory with files, links and bad names; byte-exact output files;
# --metrics over HTTP; bad options and inputs with their exit codes and
# messages; SIGINT / SIGTERM shut down cleanly and remove the region file.
# usage: test_serve_get.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm

# --preload with the defaults (vLLM 0.34.0: protocol version 2, blocks of one
# 8 KiB row): regular files of whole rows are served; bad names, links,
# directories, empty files and files that are not whole rows are skipped
# with a message (the last names --width).
mkdir -p "$T/in/subdir" "$T/out"
head -c $((366 * 8192)) /dev/urandom >"$T/in/item-a.bin"
head -c 8192 /dev/urandom >"$T/in/tiny"
head -c 73728 /dev/urandom >"$T/in/has space"
head -c 3000000 /dev/urandom >"$T/in/ragged"
ln -s "$T/in/item-a.bin" "$T/in/link"
: >"$T/in/empty"
MPORT=$(free_port)
"$ECX" serve --listen 127.0.0.1:0 --preload "$T/in" --announce-out "$T/ann.json" \
  --metrics "127.0.0.1:$MPORT" 2>"$T/serve.log" &
spid=$!
pids+=($spid)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; cat "$T/serve.log" >&2; exit 1; }
check "announces exactly the two regular files of whole rows" '[ "$($PY -c "import json,sys; print(sorted(json.load(open(sys.argv[1]))))" "$T/ann.json")" = "['"'"'item-a.bin'"'"', '"'"'tiny'"'"']" ]'
for n in "has space" link subdir empty ragged; do
  check "skip message for '$n'" 'grep -q "skipping '"'"'$n'"'"'" "$T/serve.log"'
done
check "the ragged file's message names --width" 'grep -q "skipping '"'"'ragged'"'"': 3000000 bytes are not whole rows of the default width.*give --width" "$T/serve.log"'
check "the producer says what it is: protocol version 2 of vLLM 0.34.0, 8 KiB blocks" \
  'grep -q "producer: vllm-version 0.34.0, model llava-hf/llava-1.5-7b-hf, dtype torch.bfloat16, block-bytes 8192, protocol version 2" "$T/serve.log"'
check "announced with the shape [rows, 4096]" '$PY -c "import json,sys
a = json.load(open(sys.argv[1])); assert a[\"item-a.bin\"][\"shape\"] == [366, 4096] and a[\"tiny\"][\"shape\"] == [1, 4096], a" "$T/ann.json"'
"$ECX" get --params "$T/ann.json" --out "$T/out" >"$T/get.out" 2>"$T/get.err"
rc=$?
check "get exits 0 (got $rc)" '[ $rc = 0 ]'
check "item-a.bin byte-exact" 'cmp -s "$T/in/item-a.bin" "$T/out/item-a.bin"'
check "tiny byte-exact" 'cmp -s "$T/in/tiny" "$T/out/tiny"'
check "no temporary files left" '[ "$(ls "$T/out" | wc -l)" = 2 ]'
# One item by --peer into a file.
PORT=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["tiny"]["peer_port"])' "$T/ann.json")
expect 0 "1 fetched" "get --peer" -- "$ECX" get --peer "127.0.0.1:$PORT" --mm-hash item-a.bin \
  --size $((366 * 8192)) --out "$T/one.bin"
check "--peer output byte-exact" 'cmp -s "$T/in/item-a.bin" "$T/one.bin"'
# A wrong block size is another compatibility hash: NACK_INCOMPAT, exit 3.
expect 3 "tiny: NACK_INCOMPAT" "block size differs" -- "$ECX" get --params "$T/ann.json" --mm-hash tiny \
  --block-bytes 4Ki --out "$T/out"
# Metrics over HTTP, and 404 elsewhere.
metrics=$(metrics_of "$MPORT")
check "metrics count the grants" 'echo "$metrics" | grep -qE "^ecx_producer_grants_total [3-9]"'
check "metrics count the incompatible request" 'echo "$metrics" | grep -q "^ecx_producer_nacks_total{status=\"NACK_INCOMPAT\"} 1"'
for st in free not_ready ready pinned; do
  check "metrics report $st region blocks" 'echo "$metrics" | grep -q "^ecx_region_blocks{state=\"$st\"} [0-9]"'
done
check "nothing not-ready once served" 'echo "$metrics" | grep -q "^ecx_region_blocks{state=\"not_ready\"} 0$"'
code=$($PY -c 'import urllib.request,urllib.error,sys
try: urllib.request.urlopen("http://127.0.0.1:%s/other" % sys.argv[1], timeout=5); print(200)
except urllib.error.HTTPError as e: print(e.code)' "$MPORT")
check "other paths are 404 (got $code)" '[ "$code" = 404 ]'
# SIGINT: clean exit 0 and the region file is gone.
check "region file exists while serving" '[ -n "$(ls "$SHM" | grep "\.mmap$")" ]'
kill -INT "$spid"
wait "$spid"
rc=$?
check "serve exits 0 on SIGINT (got $rc)" '[ $rc = 0 ]'
check "region file removed" '[ -z "$(ls "$SHM" | grep "\.mmap$")" ]'

# An mm_hash of ECX_MM_HASH_MAX (255) bytes is a file name: served by
# --preload and written by get --out DIR; one byte more cannot be.
LONG=$(printf 'n%.0s' $(seq 255))
mkdir -p "$T/long" "$T/long-out"
head -c 73728 /dev/urandom >"$T/long/$LONG"
"$ECX" serve --listen 127.0.0.1:0 --preload "$T/long" \
  --announce-out "$T/long.json" 2>"$T/long.log" &
lpid=$!
pids+=($lpid)
if wait_file "$T/long.json"; then
  expect 0 "1 fetched" "get of a 255-byte mm_hash" -- "$ECX" get --params "$T/long.json" \
    --out "$T/long-out"
  check "255-byte name byte-exact" 'cmp -s "$T/long/$LONG" "$T/long-out/$LONG"'
else
  bad "serve --preload of a 255-byte name did not start: $(cat "$T/long.log")"
fi
kill -INT "$lpid"
wait "$lpid"
echo "{\"${LONG}x\":{\"peer_host\":\"127.0.0.1\",\"peer_port\":1,\"size_bytes\":5}}" >"$T/toolong.json"
expect 1 "cannot be a file name" "256-byte mm_hash as file name" -- "$ECX" get --params "$T/toolong.json" --out "$T/long-out"

# --width N (connector_version 2): a file of rows N elements wide is announced
# with its own shape [rows, N]. 880 x 16384 bfloat16 (DeepStack: wider than the
# 4096-wide rows that blocks of 8 KiB are) is fetched byte-exact; a file that
# is not whole rows is skipped; rows that end inside a block are padded with
# zeros up to whole blocks.
V2=(--connector-version 2 --dtype bfloat16 --block-bytes 8Ki)
mkdir -p "$T/wide" "$T/wide-out" "$T/pad" "$T/pad-out"
head -c $((880 * 16384 * 2)) /dev/urandom >"$T/wide/deepstack"
head -c $((16384 * 2 + 2)) /dev/urandom >"$T/wide/ragged"
"$ECX" serve --listen 127.0.0.1:0 --preload "$T/wide" "${V2[@]}" --width 16384 \
  --announce-out "$T/wide.json" 2>"$T/wide.log" &
wpid=$!
pids+=($wpid)
if wait_file "$T/wide.json"; then
  check "--width: announced [880,16384] in 3520 whole blocks of 8 KiB" '$PY -c "import json,sys
a = json.load(open(sys.argv[1])); assert list(a) == [\"deepstack\"], a
assert a[\"deepstack\"][\"shape\"] == [880, 16384] and a[\"deepstack\"][\"size_bytes\"] == 3520 * 8192, a" "$T/wide.json"'
  check "--width: a file that is not whole rows is skipped" \
    'grep -q "skipping '"'"'ragged'"'"': 32770 bytes are not whole rows of --width 16384" "$T/wide.log"'
  expect 0 "1 fetched" "get --connector-version 2 of the wide item" -- "$ECX" get \
    --params "$T/wide.json" --out "$T/wide-out" "${V2[@]}"
  check "--width: wide item byte-exact" 'cmp -s "$T/wide/deepstack" "$T/wide-out/deepstack"'
else
  bad "serve --width did not start: $(cat "$T/wide.log")"
fi
kill -INT "$wpid"
wait "$wpid"
head -c $((3 * 6144 * 2)) /dev/urandom >"$T/pad/three"  # 4.5 blocks
"$ECX" serve --listen 127.0.0.1:0 --preload "$T/pad" "${V2[@]}" --width 6144 \
  --announce-out "$T/pad.json" 2>"$T/pad.log" &
ppid_=$!
pids+=($ppid_)
if wait_file "$T/pad.json"; then
  check "--width: rows ending inside a block announced [3,6144] in 5 whole blocks" '$PY -c "import json,sys
a = json.load(open(sys.argv[1]))[\"three\"]; assert a[\"shape\"] == [3, 6144] and a[\"size_bytes\"] == 40960, a" "$T/pad.json"'
  expect 0 "1 fetched" "get --connector-version 2 of the padded item" -- "$ECX" get \
    --params "$T/pad.json" --out "$T/pad-out" "${V2[@]}"
  check "--width: the file's bytes, then zeros" '[ "$(stat -c %s "$T/pad-out/three")" = 40960 ] &&
    cmp -s -n 36864 "$T/pad/three" "$T/pad-out/three" &&
    cmp -s -i 36864:0 -n 4096 "$T/pad-out/three" /dev/zero'
else
  bad "serve --width 6144 did not start: $(cat "$T/pad.log")"
fi
kill -INT "$ppid_"
wait "$ppid_"

# --rounds: the same items fetched three times over the same sessions, each
# round from the producer again (ecx_evict between rounds): 3 x 4 requests,
# every round's bytes checked, one summary line per round.
RPORT=$(free_port)
"$ECX" serve --listen 127.0.0.1:0 --synthetic 4:64Ki --announce-out "$T/rounds.json" \
  --metrics "127.0.0.1:$RPORT" 2>"$T/rounds.log" &
rpid=$!
pids+=($rpid)
if wait_file "$T/rounds.json"; then
  mkdir -p "$T/orounds"
  "$ECX" get --params "$T/rounds.json" --out "$T/orounds" --rounds 3 --json --verify-synthetic \
    >"$T/rounds.out" 2>"$T/rounds.err"
  rc=$?
  check "get --rounds 3: exit 0 (rc $rc)" '[ $rc = 0 ]'
  check "get --rounds 3: 4 ready, verified lines in each round" '$PY -c "import json,sys,collections
c = collections.Counter(r[\"round\"] for r in map(json.loads, open(sys.argv[1])) if r[\"outcome\"] == \"ready\" and r[\"verified\"])
assert c == {1: 4, 2: 4, 3: 4}, c" "$T/rounds.out"'
  check "get --rounds 3: a summary line per round" \
    '[ "$(grep -c "^ecx: round [123]: 4 fetched, 0 fell back.*latency median" "$T/rounds.err")" = 3 ]'
  check "get --rounds 3: each round asked the producer again (12 requests)" \
    'metrics_of $RPORT | grep -qx "ecx_producer_requests_total 12"'
  check "get --rounds 3: the files hold the items" '[ "$(ls "$T/orounds" | wc -l)" = 4 ]'
else
  bad "serve --synthetic for --rounds did not start: $(tail -3 "$T/rounds.log")"
fi
kill $rpid 2>/dev/null; wait $rpid 2>/dev/null
expect 2 "--rounds: '0' is not an integer" "get --rounds 0" -- "$ECX" get --params "$T/rounds.json" --out "$T/orounds" --rounds 0

# Bad options and inputs.
expect 2 "not a size" "bad --block-bytes" -- "$ECX" serve --block-bytes 12x
expect 2 "at least 1" "zero --block-bytes" -- "$ECX" serve --block-bytes 0
expect 2 "COUNT:BYTES" "bad --synthetic" -- "$ECX" serve --synthetic 3
expect 2 "COUNT" "zero --synthetic count" -- "$ECX" serve --synthetic 0:1M
expect 2 "needs --connector-version 2" "--width in version 1" -- "$ECX" serve "${V1[@]}" --width 4096
expect 2 "width" "zero --width" -- "$ECX" serve --width 0
expect 2 "4700000 bytes are not whole blocks of 8192.*give 4702208 \(574 blocks\)" \
  "version 2: --synthetic BYTES not whole blocks" -- "$ECX" serve --synthetic 1:4.7M
expect 2 "speaks protocol version 2, not the --connector-version 1 given" \
  "a contradictory explicit pair" -- "$ECX" serve --vllm-version 0.34.0 --connector-version 1
expect 2 "one of auto, shm, tcp, ucx, nixl" "bad --data" -- "$ECX" serve --data rdma
expect 2 "no arguments" "stray argument" -- "$ECX" serve extra
expect 2 "takes HOST:PORT" "bad --listen" -- "$ECX" serve --listen nonsense
expect 1 "preload" "missing --preload dir" -- "$ECX" serve --preload "$T/nope"
expect 2 "exactly one of --params or --peer" "get without source" -- "$ECX" get --out "$T/x"
expect 2 "--peer needs" "get --peer without --size" -- "$ECX" get --peer 127.0.0.1:1 --mm-hash h --out "$T/x"
expect 1 "params" "missing params file" -- "$ECX" get --params "$T/nope.json" --out "$T/out"
echo '{not json' >"$T/bad.json"
expect 1 "params" "bad JSON" -- "$ECX" get --params "$T/bad.json" --out "$T/out"
echo '[1,2]' >"$T/arr.json"
expect 1 "must be a JSON object" "params not an object" -- "$ECX" get --params "$T/arr.json" --out "$T/out"
echo '{"../etc/passwd":{"peer_host":"127.0.0.1","peer_port":1,"size_bytes":5}}' >"$T/evil.json"
expect 1 "cannot be a file name" "unsafe mm_hash as file name" -- "$ECX" get --params "$T/evil.json" --out "$T/out"
check "nothing written outside --out" '[ ! -e "$T/etc" ]'
echo '{"h":{"metadata":{}}}' >"$T/nopeer.json"
expect 3 "h: NO_PEER" "announcement without a peer" -- "$ECX" get --params "$T/nopeer.json" --out "$T/out"
DEAD=$(free_port)
expect 2 "--size: 10 bytes are not whole blocks of 8192.*give 8192 \(1 block\)" "version 2: get --size not whole blocks" \
  -- "$ECX" get --peer "127.0.0.1:$DEAD" --mm-hash h --size 10 --out "$T/x"
expect 3 "h: REFUSED" "nobody listening: REFUSED at once" -- "$ECX" get --peer "127.0.0.1:$DEAD" --mm-hash h --size 8Ki \
  --ack-timeout-ms 300 --out "$T/x"
check "no region files left behind" '[ -z "$(ls "$SHM" | grep "\.mmap$")" ]'

finish
