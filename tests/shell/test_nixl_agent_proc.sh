#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The NIXL agent process (src/data/nixl/nixl_proc.h, docs/NIXL.md §5): UCX 1.13.1's
# abort, which the real bug cannot produce on demand, injected by name
# (ECX_NIXL_AGENT_FAULT, in the helper) or from outside (a signal to the
# helper's pid), never reaches ecx:
#   A. `ecx serve --data nixl`, a real nixl agent fetching vLLM's way
#      (tests/nixl/nixl_fetch.py): the helper aborts (SIGABRT) on the last
#      notification of a fetch; then it is killed with SIGKILL, then with
#      SIGABRT, between fetches. Each time ecx serve lives, the helper is
#      restarted (ecx_nixl_agent_restarts_total), and a new fetch reads every
#      byte right with the new metadata (a new agent name each time).
#   B. one nixl consumer context (tests/support/nixl_refetch.c) fetching from a real
#      nixl producer (tests/nixl/nixl_producer.py), item after item: the
#      helper aborts on the second READ (that item falls back, READ_FAILED),
#      the third is fetched byte-exact through the new helper; the same with
#      SIGKILL and SIGABRT sent from outside before the second item.
#   C. the restart bound (tests/support/nixl_peer.c bound): helpers that abort on
#      every first READ are started 5 times in 10 s, then READs fail at
#      once (logged) until the window has passed.
#   D. ECX_NIXL_AGENT=/nonexistent: ecx serve --data nixl exits non-zero
#      saying which path it tried and the variable; no crash; the same with
#      a program that is not the helper (/bin/false).
# With "peer-ucx", all of it with every helper on the nixl wheel's UCX
# (ECX_NIXL_UCX, docs/NIXL.md §5: a helper runs itself again on it first),
# and no helper may leave its link directory behind.
# usage: test_nixl_agent_proc.sh ECX_BINARY NIXL_REFETCH_BINARY NIXL_PEER_BINARY BUILD_DIR [peer-ucx]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ecx=$1 refetch=$2 peer=$3
. "$here/../nixl/find_python.sh" "$4"
. "$here/lib.sh"
if [ "${5:-}" = peer-ucx ]; then
  . "$here/../nixl/env.sh" # (the environment test_nixl_peer_ucx.sh runs in, and nixl_ucx_dir)
  ECX_NIXL_UCX=$(nixl_ucx_dir "$NIXL_PY")
  mkdir "$T/tmp"
  export ECX_NIXL_UCX TMPDIR=$T/tmp
fi
set +e
shm=$(mktemp -d /dev/shm/ecx-nixl-proc.XXXXXX)
export ECX_SHM_DIR=$shm
trap 'cleanup; rm -rf "$shm"' EXIT
# wait_long FILE: a python peer's file (nixl's start takes seconds, more under load)
wait_long() { for _ in $(seq 600); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }

# ---- A: the producer's helper ------------------------------------------------
mkdir "$T/items"
# The defaults (protocol version 2, 8 KiB blocks): items are whole rows of a block.
head -c 4718592 /dev/urandom >"$T/items/item-multi"   # llava-1.5's 576 rows
head -c 8192 /dev/urandom >"$T/items/item-one"
head -c 24576 /dev/urandom >"$T/items/item-small"
port=$(free_port) mport=$(free_port)
ECX_NIXL_AGENT_FAULT=abort-notif:3 "$ecx" serve --data nixl --preload "$T/items" \
  --listen "127.0.0.1:$port" --announce-out "$T/ann.json" --metrics "127.0.0.1:$mport" \
  >"$T/serve.log" 2>&1 &
serve=$!
pids+=($serve)
wait_file "$T/ann.json" || { cat "$T/serve.log" >&2; exit 1; }
restarts() { metrics_of "$mport" | sed -n 's/^ecx_nixl_agent_restarts_total //p'; }
wait_restarts() { # N: until the metric says N (10 s)
  for _ in $(seq 100); do [ "$(restarts)" = "$1" ] && return 0; sleep 0.1; done; return 1
}
helper() { pgrep -P "$serve" -x ecx-nixl-agent; }
if [ "${5:-}" = peer-ucx ]; then
  check "peer-ucx: ecx serve's helper runs the libucp of $ECX_NIXL_UCX" \
    'grep -q "$(realpath "$ECX_NIXL_UCX")/libucp" "/proc/$(helper)/maps"'
fi
fetch() { timeout 120 "$NIXL_PY" "$here/../nixl/nixl_fetch.py" "$T/ann.json" "$T/items" 8192 \
            2>>"$T/py.log" | grep -v "NIXL INFO"; }
out=$(fetch)
check "a nixl agent fetches 3 items while the helper aborts on the last notification: $out" \
  '[ "$(grep -c "every byte equal" <<<"$out")" = 3 ]'
check "ecx serve restarted its helper after the abort (restarts $(restarts))" 'wait_restarts 1'
grep -q "NIXL agent process (pid [0-9]*, agent ecx-[0-9a-f]*) ended: signal 6" "$T/serve.log"
check "a WARN line says the helper ended by signal 6" '[ $? = 0 ]'
n=1
for sig in KILL ABRT; do
  md1=$(grep -c . "$T/serve.log")
  old=$(helper)
  out=$(fetch)
  check "a new nixl agent fetches 3 items with the new helper's metadata: $out" \
    '[ "$(grep -c "every byte equal" <<<"$out")" = 3 ]'
  kill -$sig "$old"
  n=$((n + 1))
  check "SIG$sig to the helper ($old): restarted (restarts $(restarts))" 'wait_restarts $n'
  check "ecx serve alive after SIG$sig to its helper" 'kill -0 $serve'
  new=$(helper)
  check "a new helper runs ($old -> $new)" '[ -n "$new" ] && [ "$new" != "$old" ]'
done
out=$(fetch)
check "after both kills a nixl agent fetches 3 items byte-exact: $out" \
  '[ "$(grep -c "every byte equal" <<<"$out")" = 3 ]'
check "ecx serve alive at the end" 'kill -0 $serve'
kill -TERM "$serve"; wait "$serve"
check "ecx serve exits normally (status $?), no helper left" '[ -z "$(pgrep -P $serve)" ]'
grep -E "ended|publishes new" "$T/serve.log" | sed 's/^/  serve: /'

# ---- B: the consumer's helper ------------------------------------------------
pport=$(free_port)
# (no `timeout` around the peers: they end by themselves, after 150 s and 60 s, and
# lib.sh's cleanup SIGKILLs $!, which must be the python, not a timeout that would
# leave it running)
"$NIXL_PY" "$here/../nixl/nixl_producer.py" "$T/p" "$pport" 8192 8 150 \
  >"$T/prod.out" 2>"$T/prod.err" &
pids+=($!)
wait_long "$T/p/announce.json" || { echo "FAIL: nixl_producer.py did not start" >&2; cat "$T/prod.err" >&2; exit 1; }
for how in fault KILL ABRT; do
  rm -rf "$T/got" && mkdir "$T/got"
  if [ $how = fault ]; then
    ECX_NIXL_AGENT_FAULT=abort-read:2 timeout 120 "$refetch" "$T/p/announce.json" "$T/got" \
      good-0 good-1 good-2 >"$T/re.out" 2>"$T/re.err"
  else
    timeout 120 "$refetch" "$T/p/announce.json" "$T/got" --kill "$(kill -l $how)@1" \
      good-0 good-1 good-2 >"$T/re.out" 2>"$T/re.err"
  fi
  rc=$?
  check "nixl_refetch ($how) exits 0, not killed (rc $rc): $(tail -3 "$T/re.err")" '[ $rc = 0 ]'
  echo "  $how: $(tr '\n' ';' <"$T/re.out")"
  check "$how: good-0 ready before" 'grep -qx "good-0 ready" "$T/re.out" && cmp -s "$T/got/good-0" "$T/p/items/good-0"'
  if [ $how = fault ]; then
    check "fault: good-1's READ was in flight when the helper aborted: READ_FAILED" 'grep -qx "good-1 local READ_FAILED" "$T/re.out"'
  else
    check "$how: good-1 ready through the new helper" 'grep -qx "good-1 ready" "$T/re.out" && cmp -s "$T/got/good-1" "$T/p/items/good-1"'
  fi
  check "$how: good-2 ready after the restart, byte-exact" 'grep -qx "good-2 ready" "$T/re.out" && cmp -s "$T/got/good-2" "$T/p/items/good-2"'
  check "$how: one restart" 'grep -qx "restarts 1" "$T/re.out"'
done

# ---- C: the restart bound --------------------------------------------------------
mkdir "$T/c"
"$NIXL_PY" "$here/../nixl/nixl_peer.py" serve "$T/c" 8 4096 60 >"$T/c/serve.out" 2>>"$T/py.log" &
pids+=($!)
wait_long "$T/c/nixl.md" || { echo "FAIL: nixl_peer.py did not start" >&2; cat "$T/py.log" >&2; exit 1; }
ECX_NIXL_AGENT_FAULT=abort-read:1:every timeout 120 "$peer" bound "$T/c" 8 4096 \
  >"$T/bound.out" 2>"$T/bound.err"
rc=$?
sed 's/^/  /' "$T/bound.out"
check "bound: nixl_peer bound exits 0 (rc $rc)" '[ $rc = 0 ]'
check "bound: 5 helpers each failed a READ, then 3 rounds refused at once, 4 restarts" \
  'grep -qx "bound: 5 READs failed, 3 refused at once, restarts 4" "$T/bound.out"'
check "bound: the log says NIXL fetches fail for a while" \
  'grep -q "started 5 times in 10 s: NIXL fetches fail" "$T/bound.err"'

# ---- D: no helper ------------------------------------------------------------
ECX_NIXL_AGENT=/nonexistent/ecx-nixl-agent timeout 20 "$ecx" serve --data nixl \
  --listen "127.0.0.1:$(free_port)" >"$T/none.out" 2>&1
rc=$?
check "no helper: ecx serve --data nixl exits non-zero, no crash (rc $rc)" '[ $rc -ne 0 ] && [ $rc -lt 128 ]'
check "no helper: the message names the path and ECX_NIXL_AGENT: $(head -3 "$T/none.out")" \
  'grep -q "/nonexistent/ecx-nixl-agent" "$T/none.out" && grep -q "ECX_NIXL_AGENT" "$T/none.out"'

# a program that is not the helper (ends at once, says nothing): the start fails cleanly
ECX_NIXL_AGENT=/bin/false timeout 20 "$ecx" serve --data nixl \
  --listen "127.0.0.1:$(free_port)" >"$T/false.out" 2>&1
rc=$?
check "a helper that ends at once: ecx serve --data nixl exits non-zero, no crash (rc $rc)" '[ $rc -ne 0 ] && [ $rc -lt 128 ]'
check "a helper that ends at once: 'did not start': $(head -3 "$T/false.out")" 'grep -q "did not start" "$T/false.out"'

if [ "${5:-}" = peer-ucx ]; then
  check "peer-ucx: no link directory left: $(ls "$T/tmp")" '[ -z "$(ls "$T/tmp")" ]'
fi

cleanup
check "no nixl peer of this test left running: $(pgrep -fa "$T/" | head -3)" '! pgrep -f "$T/" >/dev/null'

echo "passed $pass, failed $failed"
[ "$failed" = 0 ]
