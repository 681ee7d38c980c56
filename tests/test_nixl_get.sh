#!/usr/bin/env bash
# `ecx get --data nixl` from a real nixl agent serving the way vLLM's
# ECCPUConnector producer does (tests/nixl/nixl_producer.py: XferAcks with
# NIXL agent metadata and vLLM's descriptor list over ZeroMQ):
#   1. three items (1, 2 and 3 blocks, the last partial) are fetched and
#      equal the producer's bytes; the producer receives each READ's
#      notification "{session_id}:{mm_hash}";
#   2. acks whose agent_metadata has one byte mutated (every byte outside
#      the UCX worker address and rkeys, two ways), is truncated (every 7th
#      length), or whose mem_descriptor has one of its first 64 bytes
#      mutated: every such item ends "local" (BAD_ACK, or READ_FAILED where
#      the mutant is still valid metadata, e.g. another agent name), and
#      ecx exits normally: no crash.
# usage: test_nixl_get.sh ECX_BINARY BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ecx=$1
. "$here/nixl/find_python.sh" "$2"
. "$here/lib.sh"
tmp=$(mktemp -d /tmp/ecx-nixl-get.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
port=$(free_port)
timeout 300 "$NIXL_PY" "$here/nixl/nixl_producer.py" "$tmp" "$port" 1048576 8 280 \
  >"$tmp/prod.out" 2>"$tmp/prod.err" &
pid=$!
for _ in $(seq 300); do [ -f "$tmp/announce.json" ] && break; sleep 0.1; done
[ -f "$tmp/announce.json" ] || { cat "$tmp/prod.err" >&2; exit 1; }
mkdir "$tmp/got"
get() { ECX_SHM_DIR=$tmp "$ecx" get --data nixl --params "$tmp/announce.json" --out "$tmp/got" \
          --block-bytes 1Mi --json "$@"; }

get --mm-hash good-0 --mm-hash good-1 --mm-hash good-2 >"$tmp/good.json" 2>"$tmp/good.err" ||
  { cat "$tmp/good.json" "$tmp/good.err" >&2; exit 1; }
for h in good-0 good-1 good-2; do
  cmp "$tmp/got/$h" "$tmp/items/$h" || { cat "$tmp/good.json" >&2; exit 1; }
done
echo "ecx get --data nixl: good-0, good-1, good-2 ready, every byte equal to the nixl agent's"

rm -f "$tmp"/got/*
set +e
get >"$tmp/all.json" 2>"$tmp/all.err"
rc=$?
set -e
[ "$rc" -lt 128 ] || { tail -20 "$tmp/all.err" >&2; echo "ecx get died (rc $rc)" >&2; exit 1; }
/usr/bin/python3 - "$tmp/all.json" <<'PY'
import collections, json, sys
seen = collections.Counter()
for line in open(sys.argv[1]):
    r = json.loads(line)
    kind = r["mm_hash"].split("-")[0]
    if kind == "good":
        continue  # fetched alongside mutants, whose acks replace the peer
    if r["outcome"] != "local" or r["reason"] not in ("BAD_ACK", "READ_FAILED"):
        sys.exit(f"mutant {r['mm_hash']}: {r['outcome']} {r['reason']}")
    seen[(kind, r["reason"])] += 1
print("mutants: " + ", ".join(f"{k} {r}: {n}" for (k, r), n in sorted(seen.items())))
if seen[("meta", "BAD_ACK")] < 100 or seen[("desc", "BAD_ACK")] < 32 or seen[("trunc", "BAD_ACK")] < 10:
    sys.exit("too few mutants refused")
PY
touch "$tmp/stop"
wait "$pid"
pid=
for h in good-0 good-1 good-2; do
  grep -Eq "^notif ecx-[0-9a-f]{32} [0-9a-f-]{36}:$h$" "$tmp/prod.out" ||
    { cat "$tmp/prod.out" >&2; echo "no notification for $h" >&2; exit 1; }
done
echo "the nixl agent got each READ's notification: $(grep -c '^notif' "$tmp/prod.out") in all"
echo ok
