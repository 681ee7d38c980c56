#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_integrity — end-to-end integrity with real processes: a byte of a
# committed item changed in the producer's region (as corruption in memory or
# in transit would) makes `ecx get` fall back with CORRUPT on every data path,
# never write the item out as ready (the same fetch before the flip is
# byte-exact), and the producer keeps serving. Both kinds of producer: auto
# (shm + tcp) and ucx. The defaults (protocol version 2, 8 KiB blocks): the
# item is whole blocks (3 MiB, 384 blocks).
# usage: test_integrity.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm

mkdir -p "$T/in"
head -c 3145728 /dev/urandom >"$T/in/aaa"

# producer DATA PATH...: serve the item with --data DATA, fetch it clean over
# each consumer PATH, flip a byte of it in the producer's region, fetch again.
producer() {
  local data=$1; shift
  local before; before=$(ls "$SHM")
  rm -f "$T/ann.json"
  "$ECX" serve --listen 127.0.0.1:0 --preload "$T/in" --data "$data" \
    --announce-out "$T/ann.json" 2>"$T/serve-$data.log" &
  local spid=$!
  pids+=($spid)
  wait_file "$T/ann.json" || { echo "FAIL: serve --data $data did not start" >&2; cat "$T/serve-$data.log" >&2; exit 1; }
  local region; region=$SHM/$(comm -13 <(echo "$before") <(ls "$SHM") | grep '\.mmap$' | head -1)
  check "serve --data $data: its region file exists" '[ -f "$region" ]'
  for path in "$@"; do
    rm -rf "$T/out" && mkdir -p "$T/out"
    expect 0 "" "clean fetch from --data $data over $path" -- "$ECX" get --params "$T/ann.json" \
      --out "$T/out" --data "$path"
    check "clean fetch from --data $data over $path is byte-exact" 'cmp -s "$T/in/aaa" "$T/out/aaa"'
  done
  # The only item starts at block 0: flip one byte in its middle.
  $PY - "$region" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(1234567); b = f.read(1); f.seek(1234567); f.write(bytes([b[0] ^ 0x10]))
PY
  for path in "$@"; do
    rm -rf "$T/out" && mkdir -p "$T/out"
    expect 3 "aaa: CORRUPT" "flipped byte, --data $data over $path" -- "$ECX" get --params "$T/ann.json" \
      --out "$T/out" --data "$path"
    check "nothing written out as ready (--data $data over $path)" '[ ! -e "$T/out/aaa" ]'
  done
  check "serve --data $data is still serving" 'kill -0 $spid'
  kill $spid; wait $spid 2>/dev/null
}

producer auto shm tcp auto # an auto producer publishes shm and tcp
built ucx && producer ucx ucx auto # UCX only when asked for
finish
