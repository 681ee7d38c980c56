#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_demo — `ecx demo` as `make demo` runs it, small: it passes and prints
# its table; over UCX too; a byte flipped on purpose (--tamper) makes it
# fail with exit 1; bad options exit 2; and it leaves nothing of its own in
# /dev/shm or /tmp.
# usage: test_demo.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
out=$T/out err=$T/err

# run WANT_RC WHAT ARGS...: run the demo, check its exit status.
run() {
  local want=$1 what=$2; shift 2
  timeout 120 "$ECX" demo "$@" >"$out" 2>"$err"; local got=$?
  if [ "$got" = "$want" ]; then ok; else
    bad "$what: exit $got, want $want"; sed 's/^/  | /' "$out" "$err" | tail -30 >&2; fi
}
# has WHAT REGEX: the last run's stdout matches REGEX.
has() { grep -Eq -e "$2" "$out" && ok || bad "$1: no line matching '$2'"; }
# clean WHAT: the directories the last run named are gone.
clean() {
  local d
  for d in $(grep -Eo '/(dev/shm|tmp)/ecx-demo\.[A-Za-z0-9]+' "$out" "$err" | sort -u); do
    [ -e "$d" ] && bad "$1: $d left behind" || ok
  done
}

run 0 "small demo" --items 6 --consumers 2
has "small demo" 'items +bytes +time +throughput +p50 +p99'
has "small demo" '^ +6 +[0-9.]+ MB +[0-9.]+ s +[0-9]+ MB/s +[0-9.]+ ms +[0-9.]+ ms'
has "small demo" 'outcomes .*ready 7, NACK_MISSING 1'
has "small demo" 'main load: 6 items, 2 consumers +6/6 ready, 6/6 bytes verified +PASS'
has "small demo" 'miss: .*local \(NACK_MISSING\).*PASS'
has "small demo" 'not ready for .*retr.*ready in .*verified +PASS'
has "small demo" 'producer SIGKILLed.*local \(.*\).*PASS'
has "small demo" 'cleanup: .*no region files left +PASS'
has "small demo" '^PASS: every expectation held'
grep -q FAIL "$out" && bad "small demo: a FAIL line" || ok
clean "small demo"

if built ucx; then
  run 0 "demo over UCX" --items 3 --consumers 2 --data ucx
  has "demo over UCX" 'data path ucx'
  has "demo over UCX" '^PASS: every expectation held'
  clean "demo over UCX"
else
  # the producers it starts say why they stop; the work directory with their logs is kept
  run 1 "demo over UCX, not built in" --items 3 --consumers 2 --data ucx
  dir=$(grep -Eo '/tmp/ecx-demo\.[A-Za-z0-9]+' "$out" "$err" | head -1 | cut -d: -f2)
  [ -n "$dir" ] && grep -qs "ucx is not built in" "$dir"/producer-*.log && ok ||
    bad "demo --data ucx: no producer log says 'ucx is not built in'"
  [ -n "$dir" ] && rm -rf "$dir"
fi

# The checks must be able to fail: a byte flipped in every fetched item.
run 1 "tampered demo" --items 3 --consumers 1 --tamper
has "tampered demo" 'main load: .*0/3 bytes verified +FAIL'
has "tampered demo" '^FAIL: some expectation did not hold'
dir=$(grep -Eo '/tmp/ecx-demo\.[A-Za-z0-9]+' "$out" | head -1)
[ -n "$dir" ] && [ -d "$dir" ] && ok || bad "tampered demo: work directory not kept"
[ -n "$dir" ] && rm -rf "$dir"
[ -z "$(ls -d /dev/shm/ecx-demo.* 2>/dev/null | grep -F -f <(grep -Eo 'ecx-demo\.[A-Za-z0-9]+' "$out"))" ] && ok ||
  bad "tampered demo: region directory left"

run 2 "unknown option" --bogus
run 2 "bad --data" --data rdma
run 2 "bad --items" --items 0
run 2 "bad --consumers" --consumers 99
run 2 "stray argument" extra
run 0 "help" --help
has "help" '--consumers N'
has "help" 'auto, shm, tcp, ucx, nixl'

finish
