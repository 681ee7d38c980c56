# SPDX-License-Identifier: Apache-2.0
# lib.sh — what the shell tests that run ecx processes share: pass/fail
# counters and checks, a private temp dir ($T), an optional private region
# dir ($SHM, exported as ECX_SHM_DIR), and child processes (pids+=($!))
# killed and reaped on exit. Source it, then call `finish` last.
PY=/usr/bin/python3
T=$(mktemp -d /tmp/ecx-test.XXXXXX)
SHM=
pids=()
pass=0 failed=0
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$T" ${SHM:+"$SHM"}
}
trap cleanup EXIT
# Regions of this test's processes go to a private directory.
private_shm() { SHM=$(mktemp -d /dev/shm/ecx-test-sh.XXXXXX); export ECX_SHM_DIR=$SHM; }
ok() { pass=$((pass + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
# check DESCRIPTION 'SHELL CONDITION'
check() { if eval "$2"; then ok; else bad "$1"; fi; }
# expect CODE PATTERN DESCRIPTION -- CMD...: exit code and a stderr pattern (may be "")
expect() {
  local want=$1 pat=$2 what=$3; shift 4
  timeout 20 "$@" >"$T/cmd.stdout" 2>"$T/cmd.stderr"; local got=$?
  if [ "$got" = "$want" ] && { [ -z "$pat" ] || grep -qE -- "$pat" "$T/cmd.stderr"; }; then ok; else bad "$what: exit $got (want $want), stderr: $(head -c 300 "$T/cmd.stderr")"; fi
}
wait_file() { for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The body of http://127.0.0.1:PORT/metrics.
metrics_of() { $PY -c 'import urllib.request,sys; print(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode())' "$1"; }
finish() { echo "$pass passed, $failed failed"; [ "$failed" = 0 ]; }
