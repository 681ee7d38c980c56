#!/usr/bin/env bash
# Run the wire-decoder fuzzer for a bounded time, seeded with every frame in
# tests/vectors/wire.json. Exits non-zero if libFuzzer finds anything.
# usage: fuzz_run.sh FUZZ_BINARY SECONDS
set -euo pipefail
bin=$1 secs=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
corpus=$(mktemp -d /tmp/ecx-fuzz-corpus.XXXXXX)
art=$(mktemp -d /tmp/ecx-fuzz-artifacts.XXXXXX)
trap 'rm -rf "$corpus"' EXIT
/usr/bin/python3 - "$here/vectors/wire.json" "$corpus" <<'PY'
import json, sys, os
v = json.load(open(sys.argv[1]))
for group in ("encode", "decode_ok", "decode_reject"):
    for i, c in enumerate(v[group]):
        open(os.path.join(sys.argv[2], f"{group}-{i}"), "wb").write(bytes.fromhex(c["hex"]))
PY
echo "fuzz: $(ls "$corpus" | wc -l) seeds, ${secs}s"
set +e
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -dict="$here/fuzz_wire.dict" -artifact_prefix="$art/" "$corpus" >"$corpus/.log" 2>&1
status=$?
set -e
grep -E "^(Done|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)" "$corpus/.log" || true
if [ "$status" -ne 0 ] || ls "$art" | grep -q .; then
  tail -40 "$corpus/.log" >&2
  echo "fuzz: FAILED (status $status); artifacts in $art" >&2
  exit 1
fi
rm -rf "$art"
echo "fuzz: no crash, leak or timeout found"
