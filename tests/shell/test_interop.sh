#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_interop — ecx against a Python peer that speaks the reference's wire
# format (tests/pyref, python3-zmq + python3-msgpack under /usr/bin/python3):
#   A. the Python peer as a consumer against `ecx serve`: every NACK status,
#      session echo, NACK bytes identical to the reference's, malformed
#      frames ignored while the producer keeps serving, and a consumer
#      killed with SIGKILL whose pins the lease releases;
#   B. the Python peer as a producer against `ecx get`: each NACK, NOT_READY
#      then MISSING, no ack at all, garbage acks, an OK ack with unusable
#      metadata or the wrong block count: ecx answers encode-locally for each
#      and still fetches a real item in the same run.
# usage: test_interop.sh PATH_TO_ECX
set -u
ECX=$1
HERE=$(cd "$(dirname "$0")" && pwd)
PEER="$HERE/../pyref/ref_peer.py"
. "$HERE/lib.sh"
metric() { $PY - "$1" "$2" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode()
for line in body.splitlines():
    if line.startswith(sys.argv[2] + " "):
        print(line.split()[1]); break
else:
    print("missing")
PY
}
# Version 1 on purpose: tests/pyref speaks the version-1 reference's format
# (ref_wire.EC_CONNECTOR_VERSION = 1, vLLM 0.31's protocol.py): a request with
# an explicit connector_version 2 must be NACK_VERSION, its producer announces
# no shape and items of any byte count, and its compat hash is vLLM 0.31.0's.
# So every ecx here gets "${V1[@]}" (--vllm-version 0.31.0 --block-bytes 1Mi).
COMPAT=$("$ECX" compat-hash "${V1_COMPAT_ARGS[@]}")

# ---------- A. Python consumer against ecx serve ----------
MPORT=$(free_port)
"$ECX" serve "${V1[@]}" --listen 127.0.0.1:0 --synthetic 2:100K --announce-out "$T/ann.json" \
  --metrics "127.0.0.1:$MPORT" --lease-ms 5000 2>"$T/serve.log" &
pids+=($!)
"$ECX" serve "${V1[@]}" --listen 127.0.0.1:0 --synthetic 1:100K --ready-delay-ms 600000 \
  --announce-out "$T/slow.json" 2>"$T/slow.log" &
pids+=($!)
wait_file "$T/ann.json" && wait_file "$T/slow.json" || { echo "FAIL: servers did not start" >&2; cat "$T"/*.log >&2; exit 1; }
read -r PORT H0 H1 < <($PY -c 'import json,sys; a=json.load(open(sys.argv[1])); k=sorted(a); print(a[k[0]]["peer_port"], k[0], k[1])' "$T/ann.json")
read -r SPORT SH < <($PY -c 'import json,sys; a=json.load(open(sys.argv[1])); k=sorted(a)[0]; print(a[k]["peer_port"], k)' "$T/slow.json")

cat >"$T/script" <<EOF2
{"name":"ok","mm_hash":"$H0","session_id":"py-1"}
{"name":"incompat","mm_hash":"$H0","compatibility_hash":"bad","session_id":"py-1"}
{"name":"version","mm_hash":"$H0","session_id":"py-1","connector_version":2}
{"name":"no-session","mm_hash":"$H0"}
{"name":"missing","mm_hash":"unknown","session_id":"py-1"}
{"name":"junk-c1","raw_hex":"c1","expect_reply":false}
{"name":"junk-array","raw_hex":"93010203","expect_reply":false}
{"name":"junk-utf8","raw_hex":"83a474797065a3726571a76d6d5f68617368a2c328b2636f6d7061746962696c6974795f68617368d94061616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161","expect_reply":false}
{"name":"still-serving","mm_hash":"$H1","session_id":"py-2"}
EOF2
REF_PEER_HOLD=1 $PY "$PEER" consumer "$PORT" "$COMPAT" "$T/script" >"$T/consumer.out" 2>"$T/consumer.err" &
cpid=$!
pids+=($cpid)
for _ in $(seq 100); do [ "$(wc -l <"$T/consumer.out")" -ge 9 ] && break; sleep 0.1; done
$PY - "$T/consumer.out" "$HERE/../pyref" >"$T/checkA" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, sys.argv[2])
import ref_wire as w
got = {}
for line in open(sys.argv[1]):
    o = json.loads(line); got[o["sent"]] = o
def status(n): r = got[n]["reply"]; return None if r is None else r["status"]
fails = []
def want(cond, what):
    if not cond: fails.append(what)
want(status("ok") == 0, "ok -> OK")
r = got["ok"]["reply"]
want(r["session_id"] == "py-1", "session echoed")
want(len(r["src_block_indices"]) == 1 and r["agent_metadata"] > 0 and r["mem_descriptor"] > 0, "OK carries blocks and metadata")
want(r["mem_descriptor"] < 512 and r["agent_metadata"] < 512, "metadata and descriptor are small")
want(status("incompat") == 2, "wrong compat -> NACK_INCOMPAT")
want(status("version") == 3, "version 2 -> NACK_VERSION")
want(status("no-session") == 4, "no session -> NACK_INTERNAL")
want(status("missing") == 1, "unknown -> NACK_MISSING")
for name, st in (("incompat", 2), ("version", 3), ("missing", 1)):
    h = got[name]["reply"]["mm_hash"]
    want(got[name]["raw_hex"] == w.encode_ack(mm_hash=h, status=st).hex(), name + " NACK bytes equal the reference's")
for j in ("junk-c1", "junk-array", "junk-utf8"):
    want(got[j]["reply"] is None, j + " gets no reply")
want(status("still-serving") == 0, "still serving after junk")
print("\n".join(fails) if fails else "all good")
PY
check "python consumer vs ecx serve: $(cat "$T/checkA")" '[ "$(cat "$T/checkA")" = "all good" ]'
check "malformed frames counted" '[ "$(metric "$MPORT" ecx_producer_malformed_total)" = 3 ]'
check "two grants held by the python consumer" '[ "$(metric "$MPORT" ecx_producer_active_grants)" = 2 ]'
# NOT_READY from a producer whose saves have not landed.
echo "{\"name\":\"notready\",\"mm_hash\":\"$SH\",\"session_id\":\"py-3\"}" >"$T/script2"
$PY "$PEER" consumer "$SPORT" "$COMPAT" "$T/script2" >"$T/consumer2.out"
check "not yet ready -> NACK_NOT_READY" '$PY -c "import json,sys; sys.exit(json.load(open(sys.argv[1]))[\"reply\"][\"status\"] != 5)" "$T/consumer2.out"'
# Kill the consumer holding grants: the 5 s lease releases its pins.
kill -9 "$cpid"
wait "$cpid" 2>/dev/null
for _ in $(seq 80); do [ "$(metric "$MPORT" ecx_producer_active_grants)" = 0 ] && break; sleep 0.1; done
check "lease released the killed consumer's pins" '[ "$(metric "$MPORT" ecx_producer_active_grants)" = 0 ] && [ "$(metric "$MPORT" ecx_producer_expired_leases_total)" = 2 ]'

# ---------- B. Python producer against ecx get ----------
$PY "$PEER" producer "$T/pyport" 60 >"$T/pyprod.log" 2>&1 &
pids+=($!)
wait_file "$T/pyport" || { echo "FAIL: python producer did not start" >&2; exit 1; }
PYPORT=$(cat "$T/pyport")
$PY - "$T/ann.json" "$PYPORT" "$H0" >"$T/params.json" <<'PY'
import json, sys
real = json.load(open(sys.argv[1]))
port = int(sys.argv[2])
out = {}
for name in ("nack-missing-1", "nack-incompat-1", "nack-version-1", "nack-internal-1",
             "notready-then-missing-1", "silent-1", "garbage-1", "wrongtag-1", "badmeta-2", "badcount-2"):
    out[name] = {"peer_host": "127.0.0.1", "peer_port": port, "size_bytes": 2 << 20, "metadata": {}}
out[sys.argv[3]] = real[sys.argv[3]]
json.dump(out, sys.stdout)
PY
mkdir -p "$T/out"
"$ECX" get "${V1[@]}" --params "$T/params.json" --out "$T/out" --json --ack-timeout-ms 500 \
  >"$T/get.out" 2>"$T/get.err"
rc=$?
check "ecx get exits 3 when items fell back (got $rc)" '[ $rc = 3 ]'
$PY - "$T/get.out" "$T/pyprod.log" "$H0" >"$T/checkB" 2>&1 <<'PY'
import json, re, sys
res = {o["mm_hash"]: o for o in map(json.loads, open(sys.argv[1]))}
log = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
want = {"nack-missing-1": "NACK_MISSING", "nack-incompat-1": "NACK_INCOMPAT",
        "nack-version-1": "NACK_VERSION", "nack-internal-1": "NACK_INTERNAL",
        "notready-then-missing-1": "NACK_MISSING", "silent-1": "ACK_TIMEOUT",
        "garbage-1": "ACK_TIMEOUT", "wrongtag-1": "ACK_TIMEOUT",
        "badmeta-2": "BAD_ACK", "badcount-2": "BAD_ACK"}
fails = []
for h, reason in want.items():
    o = res.get(h)
    if not o or o["outcome"] != "local" or o["reason"] != reason:
        fails.append("%s: got %s, want local/%s" % (h, o and (o["outcome"], o["reason"]), reason))
real = res.get(sys.argv[3])
if not real or real["outcome"] != "ready":
    fails.append("the real item was not fetched: %s" % real)
asks = [e for e in log if e["mm_hash"] == "notready-then-missing-1"]
if len(asks) != 2:
    fails.append("NOT_READY should be asked again once, asked %d times" % len(asks))
sids = {e["session_id"] for e in log}
if len(sids) != 1 or not re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", sids.pop()):
    fails.append("one UUID4 session id per producer expected: %s" % {e["session_id"] for e in log})
print("\n".join(fails) if fails else "all good")
PY
check "ecx get vs python producer: $(cat "$T/checkB")" '[ "$(cat "$T/checkB")" = "all good" ]'
for h in nack-missing-1 silent-1 badmeta-2; do
  check "stderr names the reason for $h" 'grep -q "^$h: " "$T/get.err"'
done
check "real item written with its exact size" '[ "$(stat -c %s "$T/out/$H0")" = 100000 ]'

finish
