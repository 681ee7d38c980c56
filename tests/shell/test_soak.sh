#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_soak — SOAK_SECONDS (default 60) of real processes on loopback:
# producer A (never killed, short leases, items not ready for the first
# seconds) and producer B (SIGKILLed and restarted on the same port every few
# seconds), and SOAK_CONSUMERS (default 4) loops of `ecx get` asking for
# random subsets of both plus an item nobody holds; some gets are SIGKILLed
# mid-fetch. Checks: every get that was not killed exits 0 or 3 (never 1: a
# byte mismatch), reports each item once, and falls back only for expected
# reasons (NACK_MISSING for the missing item; connection-loss reasons for B's
# items, and only while B was being killed); every output file matches an
# independent Python computation of the synthetic content; at the end (leases
# run out) A's metrics account for every grant and block: no grant active,
# nothing pinned or not ready, free + ready == the region's blocks. A still
# serves, exits 0 on SIGTERM, and no region file is left.
# The defaults: protocol version 2 (8 KiB blocks, whole-block items; B's
# items retry an ack timeout while B is down, as vLLM >= 0.32 re-requests).
# usage: test_soak.sh PATH_TO_ECX   (env: SOAK_SECONDS, SOAK_CONSUMERS, SOAK_SEED)
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm

SECS=${SOAK_SECONDS:-60}
NCONS=${SOAK_CONSUMERS:-4}
SEED=${SOAK_SEED:-$RANDOM}
BB=8Ki           # block size, the default (protocol version 2): items span many blocks
LEASE=2000       # ms: grants of killed consumers run out within the test
A_ITEMS="16:1Mi 8:2560Ki" # version 2: whole blocks
B_ITEMS="12:296Ki"
echo "soak: ${SECS}s, $NCONS consumers, seed $SEED"

# ---- producer A: never killed ------------------------------------------
MPORT=$(free_port)
a_args=()
for s in $A_ITEMS; do a_args+=(--synthetic "$s"); done
"$ECX" serve --listen 127.0.0.1:0 "${a_args[@]}" --block-bytes $BB --lease-ms $LEASE \
  --ready-delay-ms 3000 --metrics "127.0.0.1:$MPORT" --announce-out "$T/annA.json" 2>"$T/serveA.log" &
apid=$!
pids+=($apid)
wait_file "$T/annA.json" || { echo "FAIL: producer A did not start" >&2; cat "$T/serveA.log" >&2; exit 1; }

# ---- producer B: SIGKILLed and restarted on one port --------------------
BPORT=$(free_port)
start_b() { # start_b N: instance N; 0 once it announces
  rm -f "$T/annB.json"
  "$ECX" serve --listen "127.0.0.1:$BPORT" --synthetic $B_ITEMS --block-bytes $BB --lease-ms $LEASE \
    --ready-delay-ms 800 --announce-out "$T/annB.json" 2>"$T/serveB.$1.log" &
  bpid=$!
  pids+=($bpid)
  wait_file "$T/annB.json"
}
start_b 0 || { echo "FAIL: producer B did not start" >&2; cat "$T/serveB.0.log" >&2; exit 1; }

# All announcements, and one item nobody holds, announced as if A had it.
$PY - "$T/annA.json" "$T/annB.json" "$T/all.json" "$T/hashes.json" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
missing = "soak-missing-item"
allann = dict(a); allann.update(b)
allann[missing] = dict(next(iter(a.values())))
json.dump(allann, open(sys.argv[3], "w"))
json.dump({"A": sorted(a), "B": sorted(b), "missing": missing,
           "sizes": {h: v["size_bytes"] for h, v in allann.items()}}, open(sys.argv[4], "w"))
PY

# ---- consumers: loops of `ecx get`, some SIGKILLed ----------------------
# Each get is one JSON line in $T/cons.N.jsonl: what it asked, when it ran,
# its exit status, whether it was killed, its --json results, its stderr
# reason lines and any unexpected stderr, and the SHA-256 of each file.
cat >"$T/consumer.py" <<'PY'
import hashlib, json, os, random, re, shutil, subprocess, sys, time
ecx, allann, hashes, workdir, secs, seed, log, bb = sys.argv[1:9]
H = json.load(open(hashes))
rng = random.Random(int(seed))
end = time.time() + float(secs)
reason_line = re.compile(r"^(\S+): ([A-Z_]+)$")
benign = re.compile(r"^(ecx: \d+ fetched, \d+ fell back|ecx (warn|info|debug): )")
out = open(log, "w")
n = 0
while time.time() < end and n < 100000:
    n += 1
    want = rng.sample(H["A"], rng.randint(1, 6)) + rng.sample(H["B"], rng.randint(1, 4)) + [H["missing"]]
    rng.shuffle(want)
    d = os.path.join(workdir, "out")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cmd = [ecx, "get", "--params", allann, "--out", d, "--verify-synthetic", "--json",
           "--ack-timeout-ms", "500", "--block-bytes", bb]
    for h in want: cmd += ["--mm-hash", h]
    kill_after = rng.uniform(0.0, 0.3) if rng.random() < 0.15 else None
    t0 = time.time()
    with open(os.path.join(workdir, "so"), "w") as so, open(os.path.join(workdir, "se"), "w") as se:
        p = subprocess.Popen(cmd, stdout=so, stderr=se)
        killed = hung = False
        if kill_after is not None:
            try: p.wait(timeout=kill_after)
            except subprocess.TimeoutExpired: p.kill(); killed = True
        try: rc = p.wait(timeout=45)       # bounded: a get that hangs is a failure
        except subprocess.TimeoutExpired: p.kill(); rc = p.wait(); hung = True
    t1 = time.time()
    rec = {"n": n, "t0": t0, "t1": t1, "want": want, "rc": rc, "killed": killed, "hung": hung,
           "results": {}, "reasons": {}, "odd": [], "files": {}}
    if not killed:
        for line in open(os.path.join(workdir, "so")):
            try: r = json.loads(line)
            except ValueError: rec["odd"].append("stdout: " + line.rstrip()); continue
            key = r.get("mm_hash")
            if key in rec["results"]: rec["odd"].append("reported twice: %s" % key)
            rec["results"][key] = [r.get("outcome"), r.get("reason"), r.get("verified")]
        err = open(os.path.join(workdir, "se"), errors="replace").read().splitlines()
        if rc != 0 and any(not l.endswith(": NACK_MISSING") for l in err if reason_line.match(l)):
            rec["log"] = [l[:200] for l in err if l.startswith("ecx ")][-6:]   # for the report
        for line in err:
            line = line.rstrip()
            m = reason_line.match(line)
            if m: rec["reasons"][m.group(1)] = m.group(2)
            elif line and not benign.match(line): rec["odd"].append(line[:300])
            elif re.search(r"Sanitizer|runtime error|Assertion", line): rec["odd"].append(line[:300])
        for f in os.listdir(d):
            data = open(os.path.join(d, f), "rb").read()
            rec["files"][f] = [len(data), hashlib.sha256(data).hexdigest()]
    out.write(json.dumps(rec) + "\n"); out.flush()
PY
for i in $(seq "$NCONS"); do
  mkdir -p "$T/c$i"
  $PY "$T/consumer.py" "$ECX" "$T/all.json" "$T/hashes.json" "$T/c$i" "$SECS" "$((SEED * 100 + i))" \
    "$T/cons.$i.jsonl" $BB &
  cpids+=($!)
  pids+=($!)
done

# ---- the killer: SIGKILL B every 4-8 s, down 0.2-1.2 s, restart --------
# Events in $T/events: "kill T" and "up T" (seconds since the epoch).
end=$((SECONDS + SECS))
b_kills=0 b_restart_failed=0
while [ $SECONDS -lt $((end - 8)) ] && [ $b_kills -lt 50 ]; do
  sleep "$((4 + RANDOM % 5)).$((RANDOM % 10))"
  kill -9 "$bpid"; wait "$bpid" 2>/dev/null
  echo "kill $(date +%s.%N)" >>"$T/events"
  b_kills=$((b_kills + 1))
  sleep "0.$((2 + RANDOM % 10))"
  if start_b "$b_kills"; then echo "up $(date +%s.%N)" >>"$T/events"
  else b_restart_failed=$((b_restart_failed + 1)); echo "up $(date +%s.%N)" >>"$T/events"; fi
done
check "producer B restarted on its port every time ($b_restart_failed failed)" '[ $b_restart_failed = 0 ]'
for p in "${cpids[@]}"; do wait "$p"; done      # each stops by itself after SECS
kill -TERM "$bpid"; wait "$bpid"; brc=$?
check "last producer B exits 0 on SIGTERM (got $brc)" '[ $brc = 0 ]'
check "producer A is alive after the soak" 'kill -0 $apid'

# ---- what the consumers saw --------------------------------------------
# Prints "ok WHAT" / "bad WHAT" lines, then "summary ..." and "figures ...".
cat "$T"/cons.*.jsonl >"$T/all.jsonl"
$PY - "$T/all.jsonl" "$T/hashes.json" "$T/events" <<'PY' >"$T/verdict"
import hashlib, json, sys
from collections import Counter
recs = [json.loads(l) for l in open(sys.argv[1])]
H = json.load(open(sys.argv[2]))
ev = [l.split() for l in open(sys.argv[3])] if len(sys.argv) > 3 else []
A, B, missing, sizes = set(H["A"]), set(H["B"]), H["missing"], H["sizes"]

def mask64(x): return x & 0xFFFFFFFFFFFFFFFF
def synthetic(h, size):          # tools/opts.c synthetic_fill, independently
    seed = int.from_bytes(bytes.fromhex(h[:16]), "little")
    out = bytearray()
    for k in range((size + 7) // 8):
        z = mask64(seed + (k + 1) * 0x9e3779b97f4a7c15)
        z = mask64((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9)
        z = mask64((z ^ (z >> 27)) * 0x94d049bb133111eb)
        out += (z ^ (z >> 31)).to_bytes(8, "little")
    return hashlib.sha256(bytes(out[:size])).hexdigest()
ref = {h: synthetic(h, sizes[h]) for h in A | B}

# B's outage windows: from each kill until 1.5 s after B is back (its items
# are not ready for 0.8 s after a start).
windows, k = [], None
for kind, t in ev:
    if kind == "kill": k = float(t)
    elif k is not None: windows.append((k - 0.1, float(t) + 1.5)); k = None
def near_kill(r): return any(r["t0"] < w1 and r["t1"] > w0 for w0, w1 in windows)

# Not in this list, on purpose: BAD_ACK ("ack unusable"). The soak once caught
# a producer killed between its OK ack and the consumer's data-plane connect
# reported as BAD_ACK, with UCX's "connect failed" on stdout (breaking
# `ecx get --json`); both are fixed (READ_FAILED; UCX logs via ecx, stderr).
# REFUSED: B is down between a kill and its restart, so its port refuses.
# HANDSHAKE: B was killed while a consumer's connection to it was in its
# ZeroMQ handshake (B hung up before the handshake completed).
B_REASONS = {"ACK_TIMEOUT", "READ_FAILED", "QUARANTINED", "LEASE_EXPIRED", "SEND_FAILED",
             "NOT_READY_TIMEOUT", "REFUSED", "HANDSHAKE"}
bad = Counter(); examples = {}
cur = None
def fail(what, ex):
    bad[what] += 1
    if what not in examples:
        examples[what] = ex + "".join("\n    | " + l for l in (cur or {}).get("log", []))
ready = Counter(); fallbacks = Counter(); killed = hung = 0; rcs = Counter()
a_ready = a_in_killed = 0
for r in recs:
    if r["killed"]:
        killed += 1
        a_in_killed += sum(h in A for h in r["want"])
        continue
    rcs[r["rc"]] += 1
    cur = r
    tag = "get %d (rc %d)" % (r["n"], r["rc"])
    if r["hung"]: hung += 1; fail("a get ran over 45 s", tag)
    if r["rc"] not in (0, 3): fail("a get exited other than 0 or 3", tag + ": " + "; ".join(r["odd"][:3]))
    for line in r["odd"]: fail("unexpected output", tag + ": " + line)
    if set(r["results"]) != set(r["want"]):
        fail("items reported != items asked", tag)
    for h, (outcome, reason, verified) in r["results"].items():
        src = "A" if h in A else "B" if h in B else "missing"
        if outcome == "ready":
            ready[src] += 1
            if src == "A": a_ready += 1
            if not verified: fail("ready but not verified", tag + " " + h)
            f = r["files"].get(h)
            if not f or f[0] != sizes[h] or f[1] != ref.get(h):
                fail("output file differs from the synthetic content", "%s %s %s" % (tag, h, f))
            continue
        fallbacks[reason] += 1
        if r["reasons"].get(h) != reason:
            fail("stderr reason differs from --json", "%s %s %s/%s" % (tag, h, r["reasons"].get(h), reason))
        if h in r["files"]: fail("a fallen-back item has an output file", tag + " " + h)
        if src == "missing":
            if reason != "NACK_MISSING": fail("missing item: not NACK_MISSING", "%s %s" % (tag, reason))
        elif src == "A":
            fail("an item of producer A (never killed) fell back", "%s %s %s" % (tag, h[:12], reason))
        elif reason not in B_REASONS:
            fail("an item of B fell back for an unexpected reason", "%s %s %s" % (tag, h[:12], reason))
        elif not near_kill(r):
            fail("an item of B fell back away from B's kills", "%s %s %s" % (tag, h[:12], reason))
    if r["rc"] == 0 and any(v[0] != "ready" for v in r["results"].values()):
        fail("exit 0 with an item fallen back", tag)
    if r["rc"] == 3 and all(v[0] == "ready" for v in r["results"].values()):
        fail("exit 3 with every item ready", tag)

gets = len(recs)
print("ok" if gets >= 20 else "bad", "consumers ran enough gets (%d)" % gets)
print("ok" if killed >= 2 else "bad", "some gets were killed mid-fetch (%d)" % killed)
print("ok" if ready["A"] >= 3 * (gets - killed) else "bad",
      "most items of A arrived (%d in %d gets)" % (ready["A"], gets - killed))
print("ok" if ready["B"] >= (gets - killed) // 2 else "bad", "items of B arrived too (%d)" % ready["B"])
print("ok" if fallbacks["NACK_MISSING"] == gets - killed else "bad",
      "the missing item was NACK_MISSING in every get (%d of %d)" % (fallbacks["NACK_MISSING"], gets - killed))
for what, n in sorted(bad.items()):
    print("bad", "%s: %d time(s), e.g. %s" % (what, n, examples[what]))
print("summary: gets=%d killed=%d exit0=%d exit3=%d ready A=%d B=%d fallbacks %s" % (
    gets, killed, rcs[0], rcs[3], ready["A"], ready["B"],
    " ".join("%s=%d" % kv for kv in sorted(fallbacks.items())) or "none"))
print("figures", a_ready, a_in_killed)
PY
while read -r verdict what; do
  case $verdict in
    ok) ok ;;
    bad) bad "$what" ;;
    summary:) summary="$what" ;;
    figures) read -r a_ready a_in_killed <<<"$what" ;;
    *) echo "  $verdict $what" >&2 ;;
  esac
done <"$T/verdict"
check "the consumer analysis ran" '[ -n "${summary:-}" ] && [ -n "${a_ready:-}" ]'

# ---- A's books at the end: leases ran out, every block accounted for ---
sleep "$(( (LEASE + 1500) / 1000 ))"
m=$(metrics_of "$MPORT")
val() { echo "$m" | awk -v k="$1" '$1 == k { print $2 }'; }
grants=$(val ecx_producer_grants_total) active=$(val ecx_producer_active_grants)
done_=$(val ecx_producer_completions_total) failed_=$(val ecx_producer_send_failed_total)
expired=$(val ecx_producer_expired_leases_total) regrants=$(val ecx_producer_regrants_total)
evicted=$(val ecx_producer_evicted_grants_total)
free=$(val 'ecx_region_blocks{state="free"}') ready=$(val 'ecx_region_blocks{state="ready"}')
pinned=$(val 'ecx_region_blocks{state="pinned"}') notready=$(val 'ecx_region_blocks{state="not_ready"}')
notready_nacks=$(val 'ecx_producer_nacks_total{status="NACK_NOT_READY"}')
missing_nacks=$(val 'ecx_producer_nacks_total{status="NACK_MISSING"}')
bb=$(val ecx_region_block_bytes)
total=$($PY -c 'import sys; bb=int(sys.argv[1]); u={"Ki": 1 << 10, "Mi": 1 << 20}; print(sum(int(n) * -(-int(s[:-2]) * u[s[-2:]] // bb) for n, s in (x.split(":") for x in sys.argv[2:])))' "${bb:-1}" $A_ITEMS)
check "A: no grant active (got $active)" '[ "$active" = 0 ]'
check "A: nothing pinned (got $pinned)" '[ "$pinned" = 0 ]'
check "A: nothing not ready (got $notready)" '[ "$notready" = 0 ]'
check "A: free $free + ready $ready == $total blocks" '[ $((free + ready)) = "$total" ]'
check "A: every item still held ($ready of $total blocks ready)" '[ "$ready" = "$total" ]'
check "A: every grant ended: $grants granted == $done_ completed + $failed_ failed + $expired expired + $regrants replaced + $evicted evicted" \
  '[ "$grants" = $((done_ + failed_ + expired + regrants + evicted)) ]'
check "A: completions ($done_) cover the items delivered ($a_ready) and no more than those plus killed gets' ($a_in_killed)" \
  '[ "$done_" -ge "${a_ready:-0}" ] && [ "$done_" -le $(( ${a_ready:-0} + ${a_in_killed:-0} )) ]'
check "A: answered NACK_NOT_READY while not ready (got ${notready_nacks:-none})" '[ "${notready_nacks:-0}" -gt 0 ]'
check "A: answered NACK_MISSING (got ${missing_nacks:-none})" '[ "${missing_nacks:-0}" -gt 0 ]'

# ---- A still serves; clean shutdown; no region left ---------------------
# This get also reaps the regions the SIGKILLed processes left behind.
mkdir -p "$T/final"
expect 0 "" "A still serves all its items, verified" -- "$ECX" get --params "$T/annA.json" --out "$T/final" \
  --verify-synthetic --block-bytes $BB
kill -TERM "$apid"; wait "$apid"; arc=$?
check "producer A exits 0 on SIGTERM (got $arc)" '[ $arc = 0 ]'
check "no region files left (found: $(ls "$SHM" | tr '\n' ' '))" '[ -z "$(ls "$SHM")" ]'
echo "soak: ${summary:-no summary}; B killed $b_kills times; A grants=$grants completed=$done_ expired=$expired"
finish
