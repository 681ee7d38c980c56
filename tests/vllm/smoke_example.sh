#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Smoke test of the harness with vLLM's in-tree ECExampleConnector (disk store).
#
#   tests/vllm/smoke_example.sh            # python from $ECX_VLLM_PYTHON, else venv.sh
#   ECX_VLLM_PYTHON=/tmp/vllmcpu/venv/bin/python tests/vllm/smoke_example.sh
#
# Checks (tiny random Qwen2-VL, seed 0; "poisoned" = same model with the vision
# tower redrawn from seed 1; greedy, ignore_eos, $MAX_TOKENS tokens):
#   1. real model alone -> REF tokens; poisoned model alone -> different tokens
#      (so the image embeddings decide the output).
#   2. producer(real, ec_producer) gets the request (max_tokens 1) and writes
#      the encoder cache; consumer(real, ec_consumer) answers == REF.
#   3. with an image uuid: producer(real) writes, consumer(POISONED) answers ==
#      REF, i.e. the consumer used the transferred embeddings, not its own
#      encoder (mm hashes include the model path, hence the uuid).
# Env: ECX_VLLM_PYTHON, ECX_VLLM_VENV_DIR (for venv.sh, default /tmp/ecx-vllm),
#      MAX_TOKENS (12), KEEP_WORK=1 to keep the scratch dir,
#      FORWARD_EC_PARAMS=1 (default) passes the producer's response
#      ec_transfer_params on in the consumer request, as a proxy would.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MAX_TOKENS=${MAX_TOKENS:-12}

if [[ -n "${ECX_VLLM_PYTHON:-}" ]]; then
    PY=$ECX_VLLM_PYTHON
else
    PY=$("$HERE/venv.sh" "${ECX_VLLM_VENV_DIR:-/tmp/ecx-vllm}") || { echo "venv.sh failed" >&2; exit 1; }
fi
WORK=$(mktemp -d /tmp/ecx-vllm-smoke.XXXXXX)
source "$HERE/lib.sh"
cleanup() {
    local rc=$?
    stop_all_servers
    if [[ $rc -ne 0 ]]; then log "logs kept in $WORK"; elif [[ "${KEEP_WORK:-0}" != 1 ]]; then rm -rf "$WORK"; fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
vllm_env

log "python: $PY; work: $WORK"
"$PY" "$HERE/make_model.py" "$WORK/real" --seed 0 >"$WORK/real.json" || fail "make_model real"
"$PY" "$HERE/make_model.py" "$WORK/poison" --seed 0 --poison-vision 1 >"$WORK/poison.json" || fail "make_model poison"
log "models written: $(cat "$WORK/real.json")"

STORE="$WORK/ecstore"
mkdir -p "$STORE"
ec_cfg() { printf '{"ec_connector":"ECExampleConnector","ec_role":"%s","ec_connector_extra_config":{"shared_storage_path":"%s"}}' "$1" "$STORE"; }

# ---- 1. references: real and poisoned, each alone (no connector) ----------
P_REAL=$(free_port); P_POIS=$(free_port)
start_server solo_real "$WORK/real" "$P_REAL"
start_server solo_poison "$WORK/poison" "$P_POIS"
wait_server solo_real "$P_REAL"; wait_server solo_poison "$P_POIS"
log "rss after start: solo_real $(group_rss_mb "$(cat "$WORK/solo_real.pid")") MiB, solo_poison $(group_rss_mb "$(cat "$WORK/solo_poison.pid")") MiB"
chat "$P_REAL" "$WORK/warm.json" --max-tokens 2 --image-seed 7          # warm-up (first request is slow)
t0=$(date +%s%N)
chat "$P_REAL" "$WORK/ref.json" --max-tokens "$MAX_TOKENS"
log "solo_real request: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
chat "$P_REAL" "$WORK/ref_uuid.json" --max-tokens "$MAX_TOKENS" --uuid ecx-smoke-img
chat "$P_POIS" "$WORK/pois.json" --max-tokens "$MAX_TOKENS"
chat "$P_POIS" "$WORK/pois_uuid.json" --max-tokens "$MAX_TOKENS" --uuid ecx-smoke-img
REF=$(token_ids "$WORK/ref.json"); POIS=$(token_ids "$WORK/pois.json")
log "REF    = $REF"
log "POISON = $POIS"
[[ "$REF" != "None" && ${#REF} -gt 2 ]] || fail "no token ids in reference answer"
[[ "$(token_ids "$WORK/ref_uuid.json")" == "$REF" ]] || fail "uuid changed the real model's answer"
[[ "$(token_ids "$WORK/pois_uuid.json")" == "$POIS" ]] || fail "uuid changed the poisoned model's answer"
[[ "$POIS" != "$REF" ]] || fail "poisoned vision gives the same tokens: the image does not matter"
log "rss after requests: solo_real $(group_rss_mb "$(cat "$WORK/solo_real.pid")") MiB"
stop_all_servers
log "references done"

# ---- 2+3. producer(real) -> consumer(real) and consumer(poisoned) ----------
P_PROD=$(free_port); P_CONS=$(free_port); P_CPOI=$(free_port)
start_server producer "$WORK/real" "$P_PROD" --ec-transfer-config "$(ec_cfg ec_producer)"
start_server consumer "$WORK/real" "$P_CONS" --ec-transfer-config "$(ec_cfg ec_consumer)"
start_server consumer_poison "$WORK/poison" "$P_CPOI" --ec-transfer-config "$(ec_cfg ec_consumer)"
wait_server producer "$P_PROD"; wait_server consumer "$P_CONS"; wait_server consumer_poison "$P_CPOI"
for n in producer consumer consumer_poison; do log "rss $n: $(group_rss_mb "$(cat "$WORK/$n.pid")") MiB"; done

t0=$(date +%s%N)
chat "$P_PROD" "$WORK/prod.json" --max-tokens 1
log "producer request (max_tokens 1): $(( ($(date +%s%N) - t0) / 1000000 )) ms; ec_transfer_params=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["ec_transfer_params"])' "$WORK/prod.json")"
nfiles=$(find "$STORE" -name '*.safetensors' | wc -l)
[[ $nfiles -ge 1 ]] || fail "producer wrote no encoder cache under $STORE"
log "store: $(find "$STORE" -name '*.safetensors' -printf '%P (%s bytes) ')"
"$PY" - "$STORE" <<'PYEOF' >&2
import glob, sys
from safetensors.torch import load_file
for f in sorted(glob.glob(sys.argv[1] + "/*/*.safetensors")):
    for k, v in load_file(f).items():
        print(f"  {f.split('/')[-2][:16]}..: {k} {tuple(v.shape)} {v.dtype} {v.device}")
PYEOF
fwd() {  # fwd RESULT_JSON -> client.py args forwarding its ec_transfer_params
    local p; p=$(ec_params "$1")
    if [[ "${FORWARD_EC_PARAMS:-1}" == 1 && "$p" != null ]]; then printf '%s\n' --ec-transfer-params "$p"; fi
}
mapfile -t FWD < <(fwd "$WORK/prod.json")
t0=$(date +%s%N)
chat "$P_CONS" "$WORK/cons.json" --max-tokens "$MAX_TOKENS" "${FWD[@]}"
log "consumer request: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
CONS=$(token_ids "$WORK/cons.json")
log "CONSUMER(real) = $CONS"
[[ "$CONS" == "$REF" ]] || fail "consumer(real) answer differs from the real model alone"
grep -q "Success load encoder cache\|Loaded encoder cache" "$WORK/consumer.log" 2>/dev/null && log "(consumer log shows a cache load)" || true

# 3. uuid: mm hash == uuid on both sides, so the poisoned consumer finds the real embeddings
chat "$P_PROD" "$WORK/prod_uuid.json" --max-tokens 1 --uuid ecx-smoke-img
[[ -f "$STORE/ecx-smoke-img/encoder_cache.safetensors" ]] || fail "producer did not store the uuid-keyed cache"
mapfile -t FWD < <(fwd "$WORK/prod_uuid.json")
chat "$P_CPOI" "$WORK/cpoi.json" --max-tokens "$MAX_TOKENS" --uuid ecx-smoke-img "${FWD[@]}"
CPOI=$(token_ids "$WORK/cpoi.json")
log "CONSUMER(poisoned, uuid) = $CPOI"
[[ "$CPOI" == "$REF" ]] || fail "poisoned consumer did not use the transferred embeddings (got $CPOI)"
# control: without a stored entry the poisoned consumer computes its own (poisoned) embeddings
chat "$P_CPOI" "$WORK/cpoi_miss.json" --max-tokens "$MAX_TOKENS" --uuid ecx-smoke-not-stored
[[ "$(token_ids "$WORK/cpoi_miss.json")" == "$POIS" ]] || fail "poisoned consumer on a cache miss should answer like the poisoned model"
for n in producer consumer consumer_poison; do log "rss $n after requests: $(group_rss_mb "$(cat "$WORK/$n.pid")") MiB"; done
stop_all_servers
log "PASS smoke_example (ECExampleConnector): consumer == real model alone, poisoned != real, poisoned consumer + transfer == real"
