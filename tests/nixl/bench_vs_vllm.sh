#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_vs_vllm.sh ECX BUILD_DIR [ITEMS] [SIZE] [ROUNDS] — NIXL fetch rates on loopback, in one
# run: vLLM 0.34.0's own consumer and producer (tests/nixl/vllm_peer.py, the reference) and
# ecx (`--data nixl`) in every pairing, ITEMS items of SIZE bytes (default 32 x 4.7M, rounded
# up to whole 8 KiB rows) all requested at once, every byte checked after the timing.
#   cold: the first fetch in a fresh consumer process (sessions, NIXL registration included);
#   best: the best of ROUNDS fetches (default 5) with the same sessions and a cold cache
#         (vLLM: rounds of one consumer; ecx: `ecx get --rounds ROUNDS`, which evicts
#         every item between rounds so that each round asks the producer again).
# Time runs from the first request to the last item landed (vLLM: fetch(); ecx get: the
# round's largest per-item latency, all items being in flight at once; files are written
# after the round).
# vLLM's pair runs twice: with UCX's own choice of transports (shared memory + cma on one
# host) and with UCX_TLS=tcp,self, the transport ecx's nixl path uses on its own UCX (Debian's,
# tcp only). ecx's pairs with vLLM run twice too: on its own UCX, and (":peer-ucx") with
# ECX_NIXL_UCX set to the nixl wheel's UCX, the one vLLM runs (docs/NIXL.md §5).
# Prints one line per pairing: pair=... items=N size=S cold_items_s= cold_gbps= best_items_s= best_gbps=
set -u
ECX=$1
HERE=$(cd "$(dirname "$0")" && pwd)
N=${3:-32} SIZE=${4:-4.7M} R=${5:-5}
. "$HERE/env.sh"
VPY=$(bash "$HERE/venv.sh" "$2") || exit 1
PEER="$HERE/vllm_peer.py"
T=$(mktemp -d /tmp/ecx-bench-vllm.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$T"' EXIT
F=(--vllm-version 0.34.0 --model llava-hf/llava-1.5-7b-hf --dtype torch.bfloat16 --block-bytes 8192)
NIXL=0
"$ECX" serve --help 2>&1 | grep -q nixl && NIXL=1
wait_for() { for _ in $(seq 600); do [ -s "$1" ] && return 0; sleep 0.1; done; echo "bench: $1 never came" >&2; return 1; }
ROWS=$("$VPY" -c "import sys; sys.path.insert(0, '$HERE'); import vllm_peer as v; print((v.parse_size('$SIZE') + 8191) // 8192)" 2>/dev/null)
BYTES=$((ROWS * 8192))

# line PAIR COLD_S BEST_S: the rates
line() { "$VPY" -c 'import sys
p, n, b, c, w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
print("pair=%s items=%d size=%d cold_items_s=%.1f cold_gbps=%.3f best_items_s=%.1f best_gbps=%.3f"
      % (p, n, b, n / c, n * b / c / 1e9, n / w, n * b / w / 1e9))' "$1" "$N" "$BYTES" "$2" "$3"; }
# vllm_consumer PARAMS: cold and best fetch_s of a vLLM consumer's ROUNDS rounds
vllm_consumer() {
  "$VPY" "$PEER" consumer --params "$1" --verify-synthetic --rounds "$R" >"$T/vc.out" 2>"$T/vc.err" ||
    { echo "bench: vLLM consumer failed: $(grep -v '^{' "$T/vc.err" | tail -3)" >&2; return 1; }
  "$VPY" -c 'import json, sys
t = [json.loads(l)["fetch_s"] for l in open(sys.argv[1]) if l.startswith("{\"round\"")]
print(t[0], min(t))' "$T/vc.err"
}
# ecx_gets PARAMS: cold (round 1) and best of ROUNDS rounds of one `ecx get` process
ecx_gets() {
  rm -rf "$T/o"; mkdir -p "$T/o"
  "$ECX" get --params "$1" --out "$T/o" --json --verify-synthetic --connector-version 2 "${F[@]}" \
    --data nixl --rounds "$R" >"$T/g.out" 2>"$T/g.err" || { echo "bench: ecx get failed: $(tail -3 "$T/g.err")" >&2; return 1; }
  "$VPY" -c 'import json, sys
t = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    t[r.get("round", 1)] = max(t.get(r.get("round", 1), 0), r["latency_ms"] / 1e3)
print(t[1], min(t.values()))' "$T/g.out"
}

# vLLM producer, and (with nixl) ecx serve --data nixl, both serving the same items
"$VPY" "$PEER" producer --synthetic "$N:$BYTES" --announce-out "$T/v.json" 2>"$T/vp.err" &
pids+=($!)
wait_for "$T/v.json" || exit 1
read -r c b < <(vllm_consumer "$T/v.json") && line vllm-consumer:vllm-producer "$c" "$b"
# the same over UCX's tcp transport only, as ecx's nixl path moves bytes (docs/NIXL.md)
UCX_TLS=tcp,self "$VPY" "$PEER" producer --synthetic "$N:$BYTES" --announce-out "$T/vt.json" 2>"$T/vpt.err" &
pids+=($!)
wait_for "$T/vt.json" || exit 1
read -r c b < <(UCX_TLS=tcp,self vllm_consumer "$T/vt.json") && line vllm-consumer:vllm-producer:ucx-tcp "$c" "$b"
if [ "$NIXL" = 1 ]; then
  PEER_UCX=$(nixl_ucx_dir "$VPY")
  ECX_NIXL_UCX=$PEER_UCX "$ECX" serve --listen 127.0.0.1:0 --synthetic "$N:$BYTES" --connector-version 2 \
    "${F[@]}" --data nixl --announce-out "$T/ep.json" 2>"$T/esp.err" &
  pids+=($!)
  wait_for "$T/ep.json" || exit 1
  read -r c b < <(ECX_NIXL_UCX=$PEER_UCX ecx_gets "$T/v.json") && line ecx-get:vllm-producer:peer-ucx "$c" "$b"
  read -r c b < <(vllm_consumer "$T/ep.json") && line vllm-consumer:ecx-serve:peer-ucx "$c" "$b"
  "$ECX" serve --listen 127.0.0.1:0 --synthetic "$N:$BYTES" --connector-version 2 "${F[@]}" --data nixl \
    --announce-out "$T/e.json" 2>"$T/es.err" &
  pids+=($!)
  wait_for "$T/e.json" || exit 1
  read -r c b < <(ecx_gets "$T/v.json") && line ecx-get:vllm-producer "$c" "$b"
  read -r c b < <(vllm_consumer "$T/e.json") && line vllm-consumer:ecx-serve "$c" "$b"
  read -r c b < <(ecx_gets "$T/e.json") && line ecx-get:ecx-serve "$c" "$b"
else
  echo "bench: ecx has no nixl data path (ecx serve --help): only vLLM's own rate above"
fi
