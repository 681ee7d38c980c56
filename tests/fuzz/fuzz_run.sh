#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run a libFuzzer target for a bounded time. The wire decoder's is seeded
# with every frame in tests/vectors/wire.json (and its dictionary); another
# target with the hex lines of SEEDS. Exits non-zero if libFuzzer finds
# anything.
# usage: fuzz_run.sh FUZZ_BINARY SECONDS [SEEDS]
set -euo pipefail
bin=$1 secs=${2:-60} seeds=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
corpus=$(mktemp -d /tmp/ecx-fuzz-corpus.XXXXXX)
art=$(mktemp -d /tmp/ecx-fuzz-artifacts.XXXXXX)
trap 'rm -rf "$corpus"' EXIT
dict=()
if [ -n "$seeds" ]; then
  n=0
  while read -r h; do
    [ -n "$h" ] && /usr/bin/python3 -c 'import sys; open(sys.argv[2], "wb").write(bytes.fromhex(sys.argv[1]))' "$h" "$corpus/seed-$n"
    n=$((n + 1))
  done <"$seeds"
else
  dict=(-dict="$here/fuzz_wire.dict")
  /usr/bin/python3 - "$here/../vectors/wire.json" "$corpus" <<'PY'
import json, sys, os
v = json.load(open(sys.argv[1]))
for group in ("encode", "decode_ok", "decode_reject"):
    for i, c in enumerate(v[group]):
        open(os.path.join(sys.argv[2], f"{group}-{i}"), "wb").write(bytes.fromhex(c["hex"]))
PY
fi
echo "fuzz: $(ls "$corpus" | wc -l) seeds, ${secs}s"
set +e
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  "${dict[@]}" -artifact_prefix="$art/" "$corpus" >"$corpus/.log" 2>&1
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
