#!/usr/bin/env bash
# test_integrity — end-to-end integrity with real processes: a byte of a
# committed item changed in the producer's region (as corruption in memory or
# in transit would) makes `ecx get` fall back with CORRUPT on every data path,
# never write the item out as ready; the untouched item beside it still
# arrives byte-exact; the producer keeps serving.
# usage: test_integrity.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm

mkdir -p "$T/in"
head -c 3000000 /dev/urandom >"$T/in/aaa"
"$ECX" serve --listen 127.0.0.1:0 --preload "$T/in" --block-bytes 64Ki --announce-out "$T/ann.json" \
  2>"$T/serve.log" &
spid=$!
pids+=($spid)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; cat "$T/serve.log" >&2; exit 1; }
region=$(ls "$SHM"/*.mmap | head -1)
check "the producer's region file exists" '[ -f "$region" ]'

for path in shm tcp auto; do
  rm -rf "$T/out" && mkdir -p "$T/out"
  expect 0 "" "clean fetch over $path" -- "$ECX" get --params "$T/ann.json" --out "$T/out" \
    --block-bytes 64Ki --data "$path"
  check "clean fetch over $path is byte-exact" 'cmp -s "$T/in/aaa" "$T/out/aaa"'
done

# The only item starts at block 0: flip one byte in its middle.
$PY - "$region" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(1234567); b = f.read(1); f.seek(1234567); f.write(bytes([b[0] ^ 0x10]))
PY
for path in shm tcp auto; do
  rm -rf "$T/out" && mkdir -p "$T/out"
  expect 3 "aaa: CORRUPT" "flipped byte over $path" -- "$ECX" get --params "$T/ann.json" \
    --out "$T/out" --block-bytes 64Ki --data "$path"
  check "nothing written out as ready over $path" '[ ! -e "$T/out/aaa" ]'
done
check "the producer is still serving" 'kill -0 $spid'
finish
