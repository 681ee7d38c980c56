# SPDX-License-Identifier: Apache-2.0
# lib.sh — what the shell tests share: pass/fail counters and checks, a
# private temp dir ($T), an optional private region dir ($SHM, exported as
# ECX_SHM_DIR), child processes (pids+=($!)) killed and reaped on exit, and
# which data paths this build has, and ${V1[@]}: protocol version 1 on
# purpose. Source it, then call `finish` last.
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
# The defaults speak protocol version 2 (vLLM 0.34.0, 8 KiB blocks: one row of
# llava-1.5's 4096 bf16), where every item is whole blocks. A test that speaks
# version 1 on purpose (hand-written version-1 frames, its 2 s ack timeout,
# items of any byte count) gives "${V1[@]}" to serve, get, ping and bench:
# vLLM 0.31.0's factors with 1 MiB blocks, the defaults before version 2.
V1=(--vllm-version 0.31.0 --block-bytes 1Mi)
V1_COMPAT_ARGS=(0.31.0 llava-hf/llava-1.5-7b-hf torch.bfloat16 1048576)
ok() { pass=$((pass + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
# check DESCRIPTION 'SHELL CONDITION'
check() { if eval "$2"; then ok; else bad "$1"; fi; }
# expect CODE PATTERN DESCRIPTION -- CMD...: exit code and a stderr pattern (may be "");
# CMD's output stays in $T/cmd.stdout and $T/cmd.stderr. At most EXPECT_TIMEOUT
# seconds (20).
expect() {
  local want=$1 pat=$2 what=$3; shift 4
  timeout "${EXPECT_TIMEOUT:-20}" "$@" >"$T/cmd.stdout" 2>"$T/cmd.stderr"; local got=$?
  if [ "$got" = "$want" ] && { [ -z "$pat" ] || grep -qE -- "$pat" "$T/cmd.stderr"; }; then ok; else bad "$what: exit $got (want $want), stderr: $(head -c 300 "$T/cmd.stderr")"; fi
}
# has_line DESCRIPTION FILE TOKEN...: some line of FILE holds the tokens in
# that order, one space apart; in a token, NUM stands for a number (-1.5)
# and INT for an integer: has_line "summary" out size=300000 shm_gbps=NUM
has_line() {
  local what=$1 file=$2 re= t; shift 2
  for t in "$@"; do
    t=$(printf '%s' "$t" | sed 's/[][\.*^$+?(){}|]/\\&/g; s/NUM/-?[0-9.]+/g; s/INT/-?[0-9]+/g')
    re="${re:+$re }$t"
  done
  if grep -qE -- "(^| )$re( |$)" "$file"; then ok; else bad "$what: no line with: $* in: $(head -c 600 "$file")"; fi
}
# built PATH: this build has that data path (CMake sets ECX_PATHS_BUILT for
# the tests; run by hand, every path is taken to be built).
built() { case " ${ECX_PATHS_BUILT:-auto shm tcp ucx nixl} " in *" $1 "*) return 0 ;; esac; return 1; }
wait_file() { for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The body of http://127.0.0.1:PORT/metrics.
metrics_of() { $PY -c 'import urllib.request,sys; print(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode())' "$1"; }
finish() { echo "$pass passed, $failed failed"; [ "$failed" = 0 ]; }
