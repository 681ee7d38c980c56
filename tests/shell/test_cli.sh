#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_cli — run the ecx command as a user would: every wire vector through
# `ecx proto`, `ecx compat-hash` against the hash vectors and against
# /usr/bin/python3, and bad input with its exit code and message.
# usage: test_cli.sh PATH_TO_ECX VECTORS_DIR
set -u
ECX=$1 VEC=$2
. "$(dirname "$0")/lib.sh"

# 1. Every encode vector: decode gives the fields (defaults filled in), and
#    encoding those fields gives the same bytes back.
while IFS=$'\x1f' read -r kind name hex fields; do
  case $kind in
  encode)
    out=$("$ECX" proto decode "$hex") || { bad "decode $name"; continue; }
    same=$(/usr/bin/python3 -c '
import json, sys
got, want = json.loads(sys.argv[1]), json.loads(sys.argv[2])
defaults = {"req": {"session_id": "", "connector_version": 1},
            "ack": {"session_id": "", "src_block_indices": [], "agent_metadata": "", "mem_descriptor": ""}}
full = dict(defaults[want["type"]]); full.update(want)
print("yes" if got == full else "no: %r != %r" % (got, full))' "$out" "$fields")
    [ "$same" = yes ] && ok || bad "decode $name: $same"
    back=$(printf '%s' "$out" | "$ECX" proto encode) || { bad "encode $name"; continue; }
    [ "$back" = "$hex" ] && ok || bad "re-encode $name: $back != $hex" ;;
  decode_ok)
    expect 0 "" "decode_ok $name" -- "$ECX" proto decode --as "$fields" "$hex" ;;
  decode_reject)
    expect 1 "" "decode_reject $name" -- "$ECX" proto decode --as "$fields" "$hex"
    grep -q '^error: ' "$T/cmd.stderr" && ok || bad "decode_reject $name: no 'error:' line" ;;
  esac
done < <(/usr/bin/python3 -c '
import json, sys
v = json.load(open(sys.argv[1] + "/wire.json"))
for c in v["encode"]:
    print("encode", c["name"], c["hex"], json.dumps(c["fields"]), sep="\x1f")
for g in ("decode_ok", "decode_reject"):
    for c in v[g]:
        print(g, c["name"], c["hex"], c["as"], sep="\x1f")' "$VEC")

# 2. Raw bytes on stdin decode the same as hex on the command line.
hex=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]+"/wire.json"))["encode"][5]["hex"])' "$VEC")
a=$("$ECX" proto decode "$hex"); b=$(printf '%s' "$hex" | /usr/bin/python3 -c 'import sys; sys.stdout.buffer.write(bytes.fromhex(sys.stdin.read()))' | "$ECX" proto decode --as ack)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "stdin decode differs from hex argument"

# 3. compat-hash: every vector row whose strings are argv-safe (no NUL).
while IFS=$'\x1f' read -r v m d n want; do
  got=$("$ECX" compat-hash "$v" "$m" "$d" "$n") && [ "$got" = "$want" ] && ok || bad "compat-hash row '$m': $got != $want"
done < <(/usr/bin/python3 -c '
import json, sys
for r in json.load(open(sys.argv[1] + "/compat_hash.json")):
    if all("\0" not in r[k] and "\t" not in r[k] and "\n" not in r[k] for k in ("vllm_version","model","dtype")):
        print(r["vllm_version"], r["model"], r["dtype"], r["block_size_bytes"], r["sha256"], sep="\x1f")' "$VEC")

# 4. Bad input: clear message, right exit code.
expect 1 "" "odd hex" -- "$ECX" proto decode abc
expect 1 "" "non-hex" -- "$ECX" proto decode zz
expect 2 "" "bad --as" -- "$ECX" proto decode --as foo 80
expect 2 "" "two frames" -- "$ECX" proto decode 80 80
expect 2 "" "unknown command" -- "$ECX" frobnicate
expect 2 "" "no command" -- "$ECX"
expect 2 "" "proto without sub" -- "$ECX" proto
expect 2 "" "serve --connector-version 3" -- "$ECX" serve --connector-version 3
expect 2 "" "get --connector-version 3" -- "$ECX" get --connector-version 3 --peer 127.0.0.1:1 --mm-hash h --size 1 --out /dev/null
expect 2 "" "serve with a dtype ecx does not know" -- "$ECX" serve --listen 127.0.0.1:0 --synthetic 1:1Mi --connector-version 2 --dtype mystery
expect 2 "1000 bytes are not whole blocks of 8192" "serve v2 with items that are not whole blocks" -- "$ECX" serve --listen 127.0.0.1:0 --synthetic 1:1000 --connector-version 2
expect 2 "" "compat-hash arg count" -- "$ECX" compat-hash a b c
expect 2 "" "compat-hash bad number" -- "$ECX" compat-hash a b c 12x
expect 2 "" "compat-hash number too big" -- "$ECX" compat-hash a b c 9223372036854775808
expect 1 "" "compat-hash invalid utf-8" -- "$ECX" compat-hash a "$(printf '\xff')" c 1
encode_fails() { # JSON on stdin that must be refused with exit 1
  printf '%s' "$1" | "$ECX" proto encode >/dev/null 2>"$T/cmd.stderr"; local got=$?
  [ $got = 1 ] && grep -q '^error: ' "$T/cmd.stderr" && ok || bad "encode '$1': exit $got"
}
encode_fails 'not json'
encode_fails '[1,2]'
encode_fails '{"type":"nope","mm_hash":"h"}'
encode_fails '{"type":"req","mm_hash":"h"}'
encode_fails '{"type":"req","mm_hash":1,"compatibility_hash":"c"}'
encode_fails '{"type":"req","mm_hash":"h","compatibility_hash":"c","extra":1}'
encode_fails '{"type":"req","mm_hash":"h","compatibility_hash":"c","connector_version":1.5}'
encode_fails '{"type":"ack","mm_hash":"h","status":6}'
encode_fails '{"type":"ack","mm_hash":"h","status":0,"src_block_indices":[1,"2"]}'
encode_fails '{"type":"ack","mm_hash":"h","status":0,"agent_metadata":"abc"}'
encode_fails '{"type":"ack","mm_hash":"h","status":0,"mem_descriptor":"zz"}'
encode_fails '{"type":"ack","mm_hash":"h","status":0,"status":1}'
# A frame claiming 4 GB of entries is refused at once.
expect 1 "" "huge map claim" -- "$ECX" proto decode dfffffffff
# More than 64 MiB on stdin is refused, not buffered without bound.
head -c $((65 << 20)) /dev/zero | "$ECX" proto decode >/dev/null 2>"$T/cmd.stderr"
[ $? = 1 ] && grep -q 'larger than 64 MiB' "$T/cmd.stderr" && ok || bad "oversized stdin not refused"

# 5. Help exists for every command and names every option.
expect 0 "" "--help" -- "$ECX" --help
grep -q "compat-hash" "$T/cmd.stdout" && grep -q "proto decode" "$T/cmd.stdout" && ok || bad "--help incomplete"
expect 0 "" "proto --help" -- "$ECX" proto decode --help
grep -q -- "--as" "$T/cmd.stdout" && ok || bad "proto --help lacks --as"
expect 0 "" "compat-hash --help" -- "$ECX" compat-hash --help

finish
