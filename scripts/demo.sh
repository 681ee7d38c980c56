#!/usr/bin/env bash
# The main job until the loopback demo exists: show the wire codec and the
# compatibility hash on the project's test vectors.
# usage: demo.sh PATH_TO_ECX
set -euo pipefail
ECX=$1
VEC=$(cd "$(dirname "$0")/../tests/vectors" && pwd)
echo "== compatibility hash (llava-1.5, bfloat16, 1 MiB blocks)"
"$ECX" compat-hash 0.11.0 llava-hf/llava-1.5-7b-hf bfloat16 1048576
echo "== every wire vector, decoded by ecx and re-encoded byte-for-byte"
/usr/bin/python3 -c '
import json, sys
for c in json.load(open(sys.argv[1] + "/wire.json"))["encode"]:
    print(c["name"] + "\x1f" + c["hex"])' "$VEC" |
while IFS=$'\x1f' read -r name hex; do
  json=$("$ECX" proto decode "$hex")
  back=$(printf '%s' "$json" | "$ECX" proto encode)
  [ "$back" = "$hex" ] || { echo "MISMATCH: $name" >&2; exit 1; }
  printf '%-36s %s\n' "$name" "$(printf '%s' "$json" | cut -c1-90)"
done
echo "== a hostile frame (a map claiming 2^32 entries) is refused"
"$ECX" proto decode dfffffffff || echo "refused, exit $?"
