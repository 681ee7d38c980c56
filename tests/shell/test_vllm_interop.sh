#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_vllm_interop — ecx against vLLM 0.34.0's own ECCPUConnector code
# (tests/nixl/vllm_peer.py: vLLM's session / ZeroMQ control / NIXL data layers,
# real NIXL over UCX, in the venv tests/nixl/venv.sh builds):
#   0. baseline: vLLM consumer <-> vLLM producer on loopback, every byte checked,
#      NIXL notifications unpin every grant, and the loopback fetch rate;
#   A. the vLLM consumer against `ecx serve --connector-version 2 --data nixl`:
#      byte-exact fetches released by vLLM's notifications, NACK_MISSING,
#      NACK_INCOMPAT, NACK_VERSION, NACK_NOT_READY (retried), NOT_READY then
#      OK; a v1 announcement (no shape) is refused by vLLM's admission check; an
#      item wider than a block row arrives with `serve --width`, is refused without;
#   B. `ecx get --connector-version 2 --data nixl` against the vLLM producer:
#      byte-exact fetches released by ecx's notifications, and the same
#      statuses the other way;
#   C. full data: lease expiry, kill -9 of either side mid-READ then both
#      recover, producer restart with new metadata.
# Leases stay at their 30 s defaults except where a lease is what is tested
# (C1, C2): a READ on a loaded machine may take seconds.
# usage: test_vllm_interop.sh PATH_TO_ECX VENV_BUILD_DIR
set -u
ECX=$1
VDIR=$2
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
. "$HERE/../nixl/env.sh"
VPY=$(bash "$HERE/../nixl/venv.sh" "$VDIR") || { echo "FAIL: tests/nixl/venv.sh $VDIR" >&2; exit 1; }
PEER="$HERE/../nixl/vllm_peer.py"
HIDDEN=4096 BLOCK=8192      # bfloat16 rows of 4096: block_size_bytes = hidden x 2
F=(--vllm-version 0.34.0 --model llava-hf/llava-1.5-7b-hf --dtype torch.bfloat16 --block-bytes $BLOCK)
V2=(--connector-version 2)
DATA=(--data nixl)
# field FILE MM_HASH KEY: one key of one JSON line of the peer's / ecx's output
field() { $PY -c 'import json,sys
for l in open(sys.argv[1]):
    l = l.strip()
    if l.startswith("{"):
        r = json.loads(l)
        if r["mm_hash"] == sys.argv[2]: print(r.get(sys.argv[3])); break
else: print("absent")' "$@"; }
ann_keys() { $PY -c 'import json,sys; a=json.load(open(sys.argv[1])); k=sorted(a); print(a[k[0]]["peer_port"], *k)' "$1"; }
status_of() { $PY -c 'import json,sys; s=json.load(open(sys.argv[1])); v=s
for k in sys.argv[2].split("."): v=v.get(k, 0) if isinstance(v, dict) else 0
print(v)' "$1" "$2"; }
# wait_status FILE KEY VALUE: until the vLLM producer's status file says so (10 s)
wait_status() { for _ in $(seq 100); do [ "$(status_of "$1" "$2" 2>/dev/null)" = "$3" ] && return 0; sleep 0.1; done; return 1; }
# a vLLM peer takes seconds to start (torch, NIXL, UCX): 60 s
wait_peer() { for _ in $(seq 600); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
has_metric() { local m; m=$(metrics_of "$1") && grep -q "^$2 $3\$" <<<"$m"; }
wait_metric() { for _ in $(seq 100); do has_metric "$1" "$2" "$3" && return 0; sleep 0.1; done; return 1; }
# the region a SIGKILLed vLLM peer leaves behind (ECSharedRegion unlinks it only on cleanup)
drop_region() { rm -f "/dev/shm/vllm_ec_ecxpeer-$1-$2.mmap"; }
# On exit: SIGTERM first (vLLM peers then remove their regions), 10 s, then lib.sh's cleanup
# (SIGKILL), then whatever region a killed peer left.
vllm_cleanup() {
  local p i
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for i in $(seq 100); do
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && break; done
    kill -0 "$p" 2>/dev/null || break
    sleep 0.1
  done
  cleanup
  for p in "${pids[@]}"; do drop_region prod "$p"; drop_region cons "$p"; done
}
trap vllm_cleanup EXIT
echo "vllm_interop: venv $VPY"

# ---------- 0. baseline: vLLM consumer <-> vLLM producer ----------
"$VPY" "$PEER" producer --synthetic 3:100K --announce-out "$T/v0.json" --status-file "$T/v0.st" 2>"$T/v0.err" &
pids+=($!)
wait_peer "$T/v0.json" || { bad "vLLM producer did not start: $(tail -3 "$T/v0.err")"; finish; exit; }
timeout 120 "$VPY" "$PEER" consumer --params "$T/v0.json" --verify-synthetic >"$T/c0.out" 2>"$T/c0.err"
check "baseline: vLLM consumer fetched and verified every item from the vLLM producer (exit $?)" \
  "[ \$(grep -c '\"outcome\": \"ready\".*\"verified\": true' '$T/c0.out') = 3 ]"
check "baseline: notifications released every grant" "wait_status '$T/v0.st' active_xfers 0 && wait_status '$T/v0.st' pinned 0"
check "baseline: the producer granted 3" "[ \"\$(status_of '$T/v0.st' acks.OK)\" = 3 ]"
timeout 300 "$VPY" "$PEER" bench --items 8 --size 1M --rounds 2 >"$T/bench.out" 2>"$T/bench.err"
check "baseline: bench prints its rate" "grep -qE '\"items_per_s\": [0-9.]+, \"gb_per_s\": [0-9.]+' '$T/bench.out'"
grep '^{' "$T/bench.out"

# ---------- A. vLLM consumer against ecx serve ----------
MPORT=$(free_port)
"$ECX" serve --listen 127.0.0.1:0 --synthetic 2:80Ki "${V2[@]}" "${F[@]}" "${DATA[@]}" --announce-out "$T/a.json" \
  --metrics "127.0.0.1:$MPORT" 2>"$T/a.log" &
pids+=($!)
"$ECX" serve --listen 127.0.0.1:0 --synthetic 1:80Ki "${V2[@]}" "${F[@]}" --ready-delay-ms 600000 \
  --announce-out "$T/slow.json" 2>"$T/slow.log" &
pids+=($!)
# A version-1 producer (a vLLM before 0.32 speaks 1; 0.34.0 with version 1 is refused):
# its announcement has no shape, which vLLM 0.34's admission refuses before asking.
"$ECX" serve --listen 127.0.0.1:0 --synthetic 1:80Ki "${F[@]}" --vllm-version 0.31.0 --announce-out "$T/v1.json" 2>"$T/v1.log" &
pids+=($!)
for f in a slow v1; do wait_file "$T/$f.json" || { bad "ecx serve ($f) did not start: $(tail -3 "$T/$f.log")"; finish; exit; }; done
read -r APORT AH0 AH1 < <(ann_keys "$T/a.json")
check "A: v2 announcement carries shape [10, 4096] and size_bytes 81920" \
  "$PY -c 'import json,sys; a=json.load(open(sys.argv[1])); assert all(v[\"shape\"]==[10,4096] and v[\"size_bytes\"]==81920 for v in a.values())' '$T/a.json'"
# one params file: ecx's two items and an mm_hash it lacks (NACK_MISSING)
$PY - "$T/a.json" "$T/a+miss.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
a["00" * 32] = dict(next(iter(a.values())))
json.dump(a, open(sys.argv[2], "w"))
PY
timeout 60 "$VPY" "$PEER" consumer --params "$T/a+miss.json" --verify-synthetic >"$T/ca.out" 2>"$T/ca.err"
check "A: missing item: NACK_MISSING" "[ \"\$(field '$T/ca.out' $(printf '0%.0s' {1..64}) reason)\" = NACK_MISSING ]"
check "A: vLLM consumer fetched ecx's items, every byte checked" \
  "[ \"\$(field '$T/ca.out' $AH0 verified)\" = True ] && [ \"\$(field '$T/ca.out' $AH1 verified)\" = True ]"
check "A: vLLM's notifications released ecx's grants" "wait_metric $MPORT ecx_producer_active_grants 0"
check "A: ...by completion, not lease" "has_metric $MPORT ecx_producer_expired_leases_total 0"
timeout 60 "$VPY" "$PEER" consumer --params "$T/a.json" --model other-model >"$T/ci.out" 2>"$T/ci.err"
check "A: other model: NACK_INCOMPAT" "[ \"\$(field '$T/ci.out' $AH0 reason)\" = NACK_INCOMPAT ]"
timeout 60 "$VPY" "$PEER" consumer --params "$T/a.json" --send-version 1 >"$T/cv.out" 2>"$T/cv.err"
check "A: explicit connector_version 1 to a v2 producer: NACK_VERSION" "[ \"\$(field '$T/cv.out' $AH0 reason)\" = NACK_VERSION ]"
read -r SPORT SH < <(ann_keys "$T/slow.json")
timeout 60 "$VPY" "$PEER" consumer --params "$T/slow.json" --wait-s 3 >"$T/cs.out" 2>"$T/cs.err"
check "A: not ready: NACK_NOT_READY, retried, then encode locally" \
  "[ \"\$(field '$T/cs.out' $SH reason)\" = NACK_NOT_READY ] && [ \"\$(field '$T/cs.out' $SH retries)\" -ge 2 ]"
# not ready for 3 s from its start: the vLLM consumer (seconds to import on a loaded
# machine) is started first and waits for the announcement, then asks at once
timeout 90 "$VPY" "$PEER" consumer --params "$T/late.json" --params-wait --verify-synthetic \
  >"$T/cl.out" 2>"$T/cl.err" &
cpid=$!
for _ in $(seq 600); do grep -q waiting_for_params "$T/cl.err" 2>/dev/null && break; sleep 0.1; done
"$ECX" serve --listen 127.0.0.1:0 --synthetic 1:80Ki "${V2[@]}" "${F[@]}" "${DATA[@]}" --ready-delay-ms 3000 \
  --announce-out "$T/late.json.tmp" 2>"$T/late.log" &
pids+=($!)
wait_file "$T/late.json.tmp" || bad "ecx serve (late) did not start: $(tail -3 "$T/late.log")"
mv "$T/late.json.tmp" "$T/late.json"
read -r LPORT LH < <(ann_keys "$T/late.json")
wait $cpid
check "A: not ready for 5 s: retried until an OK ack" \
  "[ \"\$(field '$T/cl.out' $LH status)\" = OK ] && [ \"\$(field '$T/cl.out' $LH retries)\" -ge 1 ]"
read -r V1PORT V1H < <(ann_keys "$T/v1.json")
timeout 60 "$VPY" "$PEER" consumer --params "$T/v1.json" >"$T/c1.out" 2>"$T/c1.err"
check "A: a v1 announcement (no shape): vLLM 0.34's admission refuses it, no request sent" \
  "[ \"\$(field '$T/c1.out' $V1H reason)\" = SIZE_UNUSABLE ]"

# An item wider than a block row (DeepStack packs layers on the last dimension):
# 880 x 16384 bfloat16 over 4096-wide rows. Announced [3520, 4096] (no --width), vLLM's
# admission refuses it ("expected 880 rows"); with --width 16384, [880, 16384] arrives.
mkdir -p "$T/wide-gen" "$T/wide"
"$ECX" serve --listen 127.0.0.1:0 --synthetic 1:$((880 * 16384 * 2)) "${F[@]}" \
  --announce-out "$T/wide-gen.json" 2>"$T/wide-gen.log" &
gpid=$!
pids+=($gpid)
wait_file "$T/wide-gen.json" || bad "ecx serve (wide-gen) did not start: $(tail -3 "$T/wide-gen.log")"
"$ECX" get --params "$T/wide-gen.json" --out "$T/wide" "${F[@]}" --verify-synthetic >/dev/null 2>&1 ||
  bad "the wide item's synthetic content could not be written"
kill -INT $gpid
for w in "" 16384; do
  "$ECX" serve --listen 127.0.0.1:0 --preload "$T/wide" "${V2[@]}" "${F[@]}" "${DATA[@]}" \
    ${w:+--width $w} --announce-out "$T/wide$w.json" 2>"$T/wide$w.log" &
  pids+=($!)
  wait_file "$T/wide$w.json" || bad "ecx serve (wide$w) did not start: $(tail -3 "$T/wide$w.log")"
done
read -r _ WH < <(ann_keys "$T/wide.json")
timeout 60 "$VPY" "$PEER" consumer --params "$T/wide.json" --expect-rows 880 >"$T/cw0.out" 2>"$T/cw0.err"
check "A: 880 x 16384 announced [3520, 4096]: vLLM's admission refuses it (SIZE_MISMATCH)" \
  "[ \"\$(field '$T/cw0.out' $WH reason)\" = SIZE_MISMATCH ]"
timeout 60 "$VPY" "$PEER" consumer --params "$T/wide16384.json" --expect-rows 880 --verify-synthetic \
  >"$T/cw.out" 2>"$T/cw.err"
check "A: serve --width 16384 announces [880, 16384]: vLLM fetched it, every byte checked" \
  "[ \"\$(field '$T/cw.out' $WH verified)\" = True ]"

# ---------- B. ecx get against the vLLM producer ----------
"$VPY" "$PEER" producer --synthetic 2:80Ki --announce-out "$T/b.json" --status-file "$T/b.st" 2>"$T/b.err" &
pids+=($!)
"$VPY" "$PEER" producer --synthetic 1:80Ki --announce-out "$T/bver.json" --demand-version 3 2>"$T/bver.err" &
pids+=($!)
for f in b bver; do wait_peer "$T/$f.json" || { bad "vLLM producer ($f) did not start: $(tail -3 "$T/$f.err")"; finish; exit; }; done
read -r BPORT BH0 BH1 < <(ann_keys "$T/b.json")
GET=("$ECX" get "${V2[@]}" "${F[@]}" "${DATA[@]}" --json)
mkdir -p "$T/ob" "$T/oi" "$T/ov" "$T/osl"
timeout 60 "${GET[@]}" --params "$T/b.json" --out "$T/ob" --verify-synthetic >"$T/gb.out" 2>"$T/gb.err"
rc=$?
check "B: ecx get fetched the vLLM producer's items, verified (exit $rc)" "[ $rc = 0 ]"
check "B: ecx's notifications released vLLM's grants" "wait_status '$T/b.st' active_xfers 0 && wait_status '$T/b.st' pinned 0"
timeout 30 "${GET[@]}" --peer "127.0.0.1:$BPORT" --mm-hash nothing-here --size 8192 --out "$T/miss.bin" >"$T/gm.out" 2>"$T/gm.err"
check "B: missing item: NACK_MISSING" "[ \"\$(field '$T/gm.out' nothing-here reason)\" = NACK_MISSING ]"
timeout 30 "$ECX" get "${V2[@]}" "${F[@]}" --model other-model --json --params "$T/b.json" --out "$T/oi" >"$T/gi.out" 2>"$T/gi.err"
check "B: other model: NACK_INCOMPAT" "[ \"\$(field '$T/gi.out' $BH0 reason)\" = NACK_INCOMPAT ]"
read -r VPORT VH < <(ann_keys "$T/bver.json")
timeout 30 "${GET[@]}" --params "$T/bver.json" --out "$T/ov" >"$T/gv.out" 2>"$T/gv.err"
check "B: vLLM's NACK_VERSION decoded by ecx" "[ \"\$(field '$T/gv.out' $VH reason)\" = NACK_VERSION ]"
# A v1 request would omit the version, so vLLM (v2) would read it as 2: ecx refuses the
# contradictory pair (vLLM 0.34 speaks 2) before sending anything.
timeout 30 "$ECX" get --connector-version 1 "${F[@]}" "${DATA[@]}" --json --peer "127.0.0.1:$BPORT" --mm-hash "$BH1" --size 80Ki --out "$T/v1.bin" >"$T/gv1.out" 2>"$T/gv1.err"
rc=$?
check "B: --connector-version 1 with --vllm-version 0.34.0 is refused (exit $rc)" \
  "[ $rc = 2 ] && grep -q 'speaks protocol version 2' '$T/gv1.err'"
# not ready for 3 s after it announces; ecx get asks at once
"$VPY" "$PEER" producer --synthetic 1:80Ki --announce-out "$T/bslow.json" --status-file "$T/bslow.st" --ready-delay-ms 3000 2>"$T/bslow.err" &
pids+=($!)
wait_peer "$T/bslow.json" || bad "vLLM producer (bslow) did not start: $(tail -3 "$T/bslow.err")"
read -r SLPORT SLH < <(ann_keys "$T/bslow.json")
timeout 30 "${GET[@]}" --params "$T/bslow.json" --out "$T/osl" --verify-synthetic >"$T/gs.out" 2>"$T/gs.err"
rc=$?
check "B: NACK_NOT_READY from vLLM retried by ecx until an OK ack" \
  "[ \"\$(status_of '$T/bslow.st' acks.NACK_NOT_READY)\" -ge 1 ] && [ \"\$(status_of '$T/bslow.st' acks.OK)\" = 1 ]"
check "B: ... and then fetched it (exit $rc)" "[ $rc = 0 ]"

# ---------- C. full data (needs ecx's nixl data path) ----------
# count_verified FILE [ROUND]: consumer lines ready and verified (in that round)
count_verified() { $PY -c 'import json,sys
n = 0
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l)
        if r["outcome"] == "ready" and r["verified"] and (len(sys.argv) < 3 or r.get("round") == int(sys.argv[2])): n += 1
print(n)' "$@"; }
metric_ge() { local v; v=$(metrics_of "$1" | awk -v m="$2" '$1 == m {print $2}'); [ -n "$v" ] && [ "${v%.*}" -ge "$3" ]; }
# wait_gone PID SECONDS: the process exited within SECONDS
wait_gone() { for _ in $(seq $(($2 * 10))); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; return 1; }
part_c() {
  local big=(--synthetic 8:16Mi) p pid port
  # C1. vLLM consumer killed -9 while ecx serve's grants are active: the lease frees them,
  #     then a new vLLM consumer fetches everything, every byte checked.
  p=$(free_port); MP=$(free_port)
  "$ECX" serve --listen 127.0.0.1:$p "${big[@]}" "${V2[@]}" "${F[@]}" "${DATA[@]}" --lease-ms 2000 \
    --metrics "127.0.0.1:$MP" --announce-out "$T/c1.json" 2>"$T/c1.log" &
  local spid=$!; pids+=($spid)
  wait_file "$T/c1.json" || { bad "C1: ecx serve did not start: $(tail -3 "$T/c1.log")"; return; }
  "$VPY" "$PEER" consumer --params "$T/c1.json" >"$T/c1k.out" 2>"$T/c1k.err" &
  pid=$!; pids+=($pid)
  for _ in $(seq 600); do metric_ge $MP ecx_producer_grants_total 1 && break; sleep 0.1; done
  kill -9 $pid; wait $pid 2>/dev/null; drop_region cons $pid
  sleep 0.5
  # UCX 1.13.1 may abort on a peer that died mid-wireup ("got REP message",
  # docs/NIXL.md §5): only the NIXL agent process dies then, and ecx restarts it.
  check "C1: ecx serve alive after its vLLM consumer was SIGKILLed" "kill -0 $spid"
  if grep -q "NIXL agent process (pid [0-9]*, agent [^)]*) ended" "$T/c1.log"; then
    echo "C1: the NIXL agent process ended and was restarted:" \
      "$(grep -o "ended: [^;]*" "$T/c1.log" | head -1)$(grep -q "got REP message" "$T/c1.log" && echo " (UCX 1.13.1's wireup assertion)")"
  fi
  check "C1: ecx's grants to a SIGKILLed vLLM consumer end (completion or lease)" \
    "wait_metric $MP ecx_producer_active_grants 0"
  timeout 120 "$VPY" "$PEER" consumer --params "$T/c1.json" --verify-synthetic >"$T/c1r.out" 2>"$T/c1r.err"
  check "C1: then a new vLLM consumer fetches all 8, verified" "[ \$(count_verified '$T/c1r.out') = 8 ]"
  check "C1: ...and its notifications release every grant" "wait_metric $MP ecx_producer_active_grants 0"

  # C2. ecx get killed -9 while the vLLM producer's grants are active: its lease frees them,
  #     then a new ecx get fetches everything.
  "$VPY" "$PEER" producer "${big[@]}" --lease-s 2 --announce-out "$T/c2.json" --status-file "$T/c2.st" 2>"$T/c2.err" &
  pids+=($!)
  wait_peer "$T/c2.json" || { bad "C2: vLLM producer did not start: $(tail -3 "$T/c2.err")"; return; }
  mkdir -p "$T/oc2" "$T/oc2r"
  "${GET[@]}" --params "$T/c2.json" --out "$T/oc2" >/dev/null 2>"$T/c2k.err" &
  pid=$!; pids+=($pid)
  for _ in $(seq 600); do [ "$(status_of "$T/c2.st" acks.OK 2>/dev/null)" -ge 1 ] 2>/dev/null && break; sleep 0.1; done
  kill -9 $pid; wait $pid 2>/dev/null
  local c2j="$T/c2.json" c2st="$T/c2.st" c2err="$T/c2.err"
  if wait_status "$c2st" active_xfers 0 && wait_status "$c2st" pinned 0; then
    ok
  elif grep -q "Assertion" "$c2err"; then
    # The vLLM producer's own UCX (1.23, in the nixl wheel) asserted when its consumer died
    # mid-READ, and that process serves no more: the reference side did not recover, not
    # counted against ecx. ecx's side must: a new ecx get fetches all 8 from a new producer.
    echo "NOT COUNTED (vLLM side): C2: the vLLM producer's UCX asserted after its consumer" \
      "was SIGKILLed mid-READ: $(grep -m1 Assertion "$c2err")" >&2
    c2j="$T/c2b.json" c2st="$T/c2b.st" c2err="$T/c2b.err"
    "$VPY" "$PEER" producer "${big[@]}" --announce-out "$c2j" --status-file "$c2st" 2>"$c2err" &
    pids+=($!)
    wait_peer "$c2j" || { bad "C2: the second vLLM producer did not start: $(tail -3 "$c2err")"; return; }
  else
    bad "C2: the vLLM producer's grants to a SIGKILLed ecx get end"
  fi
  timeout 120 "${GET[@]}" --params "$c2j" --out "$T/oc2r" --verify-synthetic >"$T/c2r.out" 2>"$T/c2r.err"
  check "C2: then a new ecx get fetches all 8 from vLLM, verified (exit $?)" "[ \$(grep -c '\"outcome\":\"ready\"' '$T/c2r.out') = 8 ]"
  check "C2: ...and its notifications release every grant" "wait_status '$c2st' active_xfers 0"
  [ "$(grep -c '"outcome":"ready"' "$T/c2r.out")" = 8 ] || { echo "C2 vLLM producer status: $(cat "$c2st")"
    echo "C2 killed get:"; tail -5 "$T/c2k.err"; echo "C2 second get:"; cat "$T/c2r.out"; tail -5 "$T/c2r.err"
    echo "C2 vLLM producer:"; grep -v '^{' "$c2err" | tail -8; } >&2

  # C3. ecx serve killed -9 while a vLLM consumer reads: the consumer falls back (READ
  #     failure or quarantine) and exits; C4. the vLLM producer killed -9 while ecx get
  #     reads: ecx falls back and exits 3.
  p=$(free_port)
  "$ECX" serve --listen 127.0.0.1:$p "${big[@]}" "${V2[@]}" "${F[@]}" "${DATA[@]}" --announce-out "$T/c3.json" 2>"$T/c3.log" &
  local spid=$!; pids+=($spid)
  wait_file "$T/c3.json" || { bad "C3: ecx serve did not start"; return; }
  "$VPY" "$PEER" consumer --params "$T/c3.json" --verify-synthetic --ack-timeout-s 5 --wait-s 20 \
    >"$T/c3.out" 2>"$T/c3.err" &
  pid=$!; pids+=($pid)
  sleep 3; kill -9 $spid; wait $spid 2>/dev/null
  check "C3: a vLLM consumer whose ecx producer died mid-READ ends (within 90 s)" "wait_gone $pid 90"
  check "C3: ...with an answer for every item" "[ \$(grep -c mm_hash '$T/c3.out') = 8 ]"
  "$VPY" "$PEER" producer "${big[@]}" --announce-out "$T/c4.json" 2>"$T/c4.err" &
  local vpid=$!; pids+=($vpid)
  wait_peer "$T/c4.json" || { bad "C4: vLLM producer did not start"; return; }
  mkdir -p "$T/oc4"
  "${GET[@]}" --params "$T/c4.json" --out "$T/oc4" >"$T/c4.out" 2>"$T/c4g.err" &
  pid=$!; pids+=($pid)
  sleep 0.3; kill -9 $vpid; wait $vpid 2>/dev/null; drop_region prod $vpid
  check "C4: ecx get whose vLLM producer died mid-READ ends (within 90 s)" "wait_gone $pid 90"
  check "C4: ...with an answer for every item" "[ \$(grep -c mm_hash '$T/c4.out') = 8 ]"

  # C5. ecx serve restarted on the same port (new NIXL metadata) between two fetches of one
  #     vLLM consumer: it re-registers the producer and fetches everything again.
  p=$(free_port)
  "$ECX" serve --listen 127.0.0.1:$p --synthetic 4:1Mi "${V2[@]}" "${F[@]}" "${DATA[@]}" --announce-out "$T/c5.json" 2>"$T/c5.log" &
  spid=$!; pids+=($spid)
  wait_file "$T/c5.json" || { bad "C5: ecx serve did not start"; return; }
  "$VPY" "$PEER" consumer --params "$T/c5.json" --verify-synthetic --again-after "$T/c5.go" >"$T/c5.out" 2>"$T/c5.err" &
  pid=$!; pids+=($pid)
  for _ in $(seq 600); do [ "$(count_verified "$T/c5.out" 1)" = 4 ] && break; sleep 0.1; done
  kill $spid; wait $spid 2>/dev/null
  "$ECX" serve --listen 127.0.0.1:$p --synthetic 4:1Mi "${V2[@]}" "${F[@]}" "${DATA[@]}" --announce-out "$T/c5b.json" 2>"$T/c5b.log" &
  pids+=($!)
  wait_file "$T/c5b.json" && touch "$T/c5.go"
  check "C5: vLLM consumer: 4 verified before the restart" "[ \$(count_verified '$T/c5.out' 1) = 4 ]"
  check "C5: ...and 4 verified from the restarted producer" "wait_gone $pid 120 && [ \$(count_verified '$T/c5.out' 2) = 4 ]"
  [ "$(count_verified "$T/c5.out" 2)" = 4 ] || { echo "C5 consumer:"; cat "$T/c5.out"
    grep -v '^{' "$T/c5.err" | tail -5; tail -3 "$T/c5.log" "$T/c5b.log"; } >&2
}
part_c
finish
