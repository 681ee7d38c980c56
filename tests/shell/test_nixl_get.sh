#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `ecx get --data nixl` from a real nixl agent serving the way vLLM's
# ECCPUConnector producer does (tests/nixl/nixl_producer.py: XferAcks with
# NIXL agent metadata and vLLM's descriptor list over ZeroMQ):
#   1. three items (1, 2 and 3 blocks: whole blocks, announced with shape, as
#      vLLM 0.34 does; ecx's defaults speak its version 2) are fetched and
#      equal the producer's bytes; the producer receives each READ's
#      notification "{session_id}:{mm_hash}";
#   2. acks whose agent_metadata has one byte mutated (every byte, two ways;
#      inside the UCX worker address and rkeys too, where UCX 1.13 can
#      abort: ecx's guard tries those in a child, docs/NIXL.md §6), is
#      truncated (every 7th length), or whose mem_descriptor has one of its
#      first 64 bytes mutated: every such item ends "local" (BAD_ACK, or
#      READ_FAILED where the mutant is still valid metadata, e.g. another
#      agent name; QUARANTINED where its READ was under way when the next
#      mutant's metadata replaced the peer) or, for a byte UCX ignores or
#      another agent name NIXL reads through, "ready" and byte-exact;
#      ecx exits normally: no crash;
#   3. then a new ecx get fetches a real item.
# usage: test_nixl_get.sh ECX_BINARY BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ecx=$1
. "$here/../nixl/find_python.sh" "$2"
. "$here/lib.sh"
tmp=$(mktemp -d /tmp/ecx-nixl-get.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; cleanup' EXIT # (and lib.sh's $T)
port=$(free_port)
timeout 300 "$NIXL_PY" "$here/../nixl/nixl_producer.py" "$tmp" "$port" 8192 8 280 \
  >"$tmp/prod.out" 2>"$tmp/prod.err" &
pid=$!
for _ in $(seq 300); do [ -f "$tmp/announce.json" ] && break; sleep 0.1; done
[ -f "$tmp/announce.json" ] || { cat "$tmp/prod.err" >&2; exit 1; }
mkdir "$tmp/got"
# The ack timeout is long: a loaded machine's Python producer answering a
# hundred mutants at once is slow, and an ACK_TIMEOUT says nothing of them.
get() { ECX_SHM_DIR=$tmp "$ecx" get --data nixl --params "$tmp/${ann:-announce}.json" --out "$tmp/got" \
          --ack-timeout-ms 30000 --json "$@"; }
# The mutants in two gets, each of fewer items than ZeroMQ's receive HWM
# (1000): past it, a consumer slower than its acks (under ASan) can meet
# libzmq's `_input_stopped` assertion (zeromq/libzmq#3937; since avoided, see
# test_ack_flood.sh).
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
ann = json.load(open(sys.argv[1] + "/announce.json"))
for name, want in (("ucx", lambda h: h.startswith("ucx-")), ("rest", lambda h: not h.startswith("ucx-"))):
    json.dump({h: v for h, v in ann.items() if want(h)}, open(f"{sys.argv[1]}/{name}.json", "w"))
PY

get --mm-hash good-0 --mm-hash good-1 --mm-hash good-2 >"$tmp/good.json" 2>"$tmp/good.err" ||
  { cat "$tmp/good.json" "$tmp/good.err" >&2; exit 1; }
for h in good-0 good-1 good-2; do
  cmp "$tmp/got/$h" "$tmp/items/$h" || { cat "$tmp/good.json" >&2; exit 1; }
done
echo "ecx get --data nixl: good-0, good-1, good-2 ready, every byte equal to the nixl agent's"

rm -f "$tmp"/got/*
: >"$tmp/all.json"
for ann in rest ucx; do
  set +e
  get >>"$tmp/all.json" 2>"$tmp/$ann.err"
  rc=$?
  set -e
  [ "$rc" -lt 128 ] || { tail -20 "$tmp/$ann.err" >&2; echo "ecx get died (rc $rc)" >&2; exit 1; }
done
ann=
/usr/bin/python3 - "$tmp" <<'PY'
import collections, json, sys
seen = collections.Counter()
for line in open(sys.argv[1] + "/all.json"):
    r = json.loads(line)
    h = r["mm_hash"]
    kind = h.split("-")[0]
    if kind == "good":
        continue  # fetched alongside mutants, whose acks replace the peer
    # A mutant that still names the producer's own worker and memory (a
    # byte UCX ignores; another agent name, which NIXL may load and read
    # through as well when it reuses the worker's endpoint) can be read:
    # then every byte must be the producer's.
    if kind in ("ucx", "meta") and r["outcome"] == "ready":
        got, want = (open(f"{sys.argv[1]}/{d}/{h}", "rb").read() for d in ("got", "items"))
        if got != want:
            sys.exit(f"mutant {h}: ready but its bytes differ")
        seen[(kind, "ready")] += 1
        continue
    if r["outcome"] != "local" or r["reason"] not in ("BAD_ACK", "READ_FAILED", "QUARANTINED"):
        sys.exit(f"mutant {h}: {r['outcome']} {r['reason']}")
    seen[(kind, r["reason"])] += 1
print("mutants: " + ", ".join(f"{k} {r}: {n}" for (k, r), n in sorted(seen.items())))
if seen[("meta", "BAD_ACK")] < 100 or seen[("desc", "BAD_ACK")] < 32 or seen[("trunc", "BAD_ACK")] < 10 \
        or seen[("ucx", "BAD_ACK")] < 10:
    sys.exit("too few mutants refused")
PY
rm -f "$tmp"/got/*
# (Once in about twenty runs this get was REFUSED: the Python producer had
# stopped listening during the mutants. Its state and log say why.)
get --mm-hash good-1 >"$tmp/after.json" 2>"$tmp/after.err" && cmp "$tmp/got/good-1" "$tmp/items/good-1" ||
  { cat "$tmp/after.json" "$tmp/after.err" >&2
    if kill -0 "$pid" 2>/dev/null; then echo "the nixl producer is running" >&2
    else r=0; wait "$pid" || r=$?; echo "the nixl producer exited (rc $r)" >&2; pid=; fi
    echo "its stderr, last lines:" >&2; tail -30 "$tmp/prod.err" >&2; exit 1; }
echo "after the mutants: good-1 ready, every byte equal"
touch "$tmp/stop"
wait "$pid"
pid=
for h in good-0 good-1 good-2; do
  grep -Eq "^notif ecx-[0-9a-f]{32} [0-9a-f-]{36}:$h$" "$tmp/prod.out" ||
    { cat "$tmp/prod.out" >&2; echo "no notification for $h" >&2; exit 1; }
done
echo "the nixl agent got each READ's notification: $(grep -c '^notif' "$tmp/prod.out") in all"
echo ok
