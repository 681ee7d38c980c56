#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_formats — the benchmarks' tiny runs: each exits as it should and
# prints every line and key its readers (BENCHMARKS.md, bench/compare.sh,
# people) rely on. Behaviour and format only, never the figures.
# usage: test_formats.sh CASE PROGRAM... (the cases below, one per ctest test)
set -u
. "$(dirname "$0")/lib.sh"
case=$1
shift

# in_order DESCRIPTION FILE ERE...: the first line matching each ERE comes
# after the first line matching the one before it.
in_order() {
  local what=$1 file=$2 last=0 n; shift 2
  for re in "$@"; do
    n=$(grep -nE -- "$re" "$file" | head -1 | cut -d: -f1)
    if [ -z "$n" ] || [ "$n" -le "$last" ]; then bad "$what: '$re' not after line $last"; return; fi
    last=$n
  done
  ok
}

case $case in
bench_data) # bench_data BENCH_DATA: the summary line, every path built in measured
  expect 0 "" "bench_data tiny" -- "$1" --size 300000 --iters 3 --warmup 1 --block-bytes 65536
  has_line "bench_data's summary" "$T/cmd.stdout" size=300000 shm_gbps=NUM ucx_gbps=NUM \
    memcpy_gbps=NUM shm_ratio=NUM ucx_ratio=NUM tcp_gbps=NUM tcp_ratio=NUM ;;

bench_copy) # bench_copy BENCH_COPY: the copy kernels against memcpy, one line per size
  expect 0 "" "bench_copy tiny" -- "$1" --size 300000 --size 1000 --iters 3
  has_line "bench_copy's 1000-byte line" "$T/cmd.stdout" size=1000 memcpy_ms=NUM copy_ratio=NUM ;;

call_overhead) # call_overhead CALL_OVERHEAD: the C baseline's one line (the defaults,
  # protocol version 2: sizes are whole 8 KiB blocks; 2949120 = 360 rows)
  expect 0 "" "call_overhead tiny" -- "$1" --calls 2000 --items 10 --size 2949120 --xfer-iters 2
  has_line "call_overhead's line" "$T/cmd.stdout" c fetch_pending_ns=NUM poll0_ns=NUM \
    poll0_nothread_ns=NUM size=2949120 save_ms=NUM fetch_ms=NUM read_ms=NUM xfer_ms=NUM
  expect 2 "whole blocks of 8192" "call_overhead, not whole blocks" -- "$1" --size 3000000 ;;

startup) # startup STARTUP: what a new context costs before its first item is in, one line
  # (the defaults, protocol version 2: whole 8 KiB blocks; 2949120 = 360 rows)
  expect 0 "" "startup tiny" -- "$1" --rounds 1 --size 2949120 --idle-ms 0
  has_line "startup's line" "$T/cmd.stdout" create_ms=NUM first_save_ms=NUM held_ms=NUM \
    idle_save_ms=NUM free_ms=NUM size=2949120 rounds=1
  expect 2 "whole blocks of 8192" "startup, not whole blocks" -- "$1" --size 3000000 ;;

ctrl_instr) # ctrl_instr SOURCE_DIR BUILD_DIR: instructions per request (77: no valgrind)
  timeout 280 env CTRL_N1=40 CTRL_N2=120 CTRL_ITEMS=4 CTRL_REPEAT=1 \
    bash "$1/bench/ctrl_instr.sh" "$2" >"$T/cmd.stdout" 2>"$T/cmd.stderr"
  rc=$?
  [ $rc = 77 ] && { cat "$T/cmd.stdout" "$T/cmd.stderr"; exit 77; }
  check "ctrl_instr.sh exit 0 (got $rc): $(tail -3 "$T/cmd.stderr")" '[ $rc = 0 ]'
  has_line "ctrl_instr's summary" "$T/cmd.stdout" ecx_instr_per_req=INT echo_instr_per_req=INT ratio=NUM ;;

bench_vllm) # bench_vllm SOURCE_DIR ECX VENV_DIR: vLLM's own NIXL fetch rate, in our format
  EXPECT_TIMEOUT=280 expect 0 "" "bench_vs_vllm.sh tiny" -- bash "$1/tests/nixl/bench_vs_vllm.sh" "$2" "$3" 2 64Ki 2
  has_line "vLLM to vLLM" "$T/cmd.stdout" pair=vllm-consumer:vllm-producer items=2 size=65536 \
    cold_items_s=NUM cold_gbps=NUM best_items_s=NUM best_gbps=NUM
  has_line "vLLM to vLLM over UCX's tcp" "$T/cmd.stdout" pair=vllm-consumer:vllm-producer:ucx-tcp items=2
  in_order "the default transport first" "$T/cmd.stdout" '^pair=vllm-consumer:vllm-producer ' \
    '^pair=vllm-consumer:vllm-producer:ucx-tcp '
  if built nixl; then # ecx's pairs with vLLM on the nixl wheel's UCX too (ECX_NIXL_UCX)
    has_line "ecx get from vLLM, peer UCX" "$T/cmd.stdout" pair=ecx-get:vllm-producer:peer-ucx items=2
    has_line "vLLM from ecx serve, peer UCX" "$T/cmd.stdout" pair=vllm-consumer:ecx-serve:peer-ucx items=2
  fi ;;

bench_data_cli) # bench_data_cli ECX: `ecx bench data --data all` (ucx skipped where not built in),
  # at the defaults (protocol version 2, 8 KiB blocks): 288Ki = 36 whole blocks
  EXPECT_TIMEOUT=120 expect 0 "" "ecx bench data tiny" -- "$1" bench data --size 288Ki --count 3 \
    --warmup 1 --data all
  has_line "bench data's line" "$T/cmd.stdout" size=294912 shm_gbps=NUM ucx_gbps=NUM memcpy_gbps=NUM \
    shm_ratio=NUM ucx_ratio=NUM tcp_gbps=NUM tcp_ratio=NUM
  skipped='bench: ucx is not built into this libecx; skipped'
  if built ucx; then
    check "ucx measured" "! grep -q '$skipped' '$T/cmd.stderr' && ! grep -q ' ucx_gbps=0.000 ' '$T/cmd.stdout'"
  else
    check "ucx skipped, said so" "grep -q '$skipped' '$T/cmd.stderr' && grep -q ' ucx_gbps=0.000 ' '$T/cmd.stdout'"
  fi
  # a size that is not whole blocks: a usage error naming the whole-block size
  expect 2 "not whole blocks of 8192.*give 303104 \\(37 blocks\\)" "bench data, not whole blocks" -- \
    "$1" bench data --size 300K --data shm
  # version 1 on purpose: any byte count is an item there
  EXPECT_TIMEOUT=60 expect 0 "" "bench data, version 1, 300K" -- "$1" bench data --size 300K \
    --count 1 --warmup 0 --data shm "${V1[@]}"
  has_line "bench data's line, version 1" "$T/cmd.stdout" size=300000 shm_gbps=NUM ;;

bench_stall) # bench_stall ECX: every line and key of `ecx bench stall`, shm then tcp, at the
  # defaults (protocol version 2, 8 KiB blocks): 288Ki = 36 whole blocks
  EXPECT_TIMEOUT=120 expect 0 "" "ecx bench stall tiny" -- "$1" bench stall --size 288Ki --count 2 \
    --warmup 1 --data shm,tcp --step-ms 0,5
  o=$T/cmd.stdout
  for p in shm tcp; do
    has_line "$p: the fetch line" "$o" path=$p size=294912 memcpy_ms=NUM rtt_ms=NUM cold_ms=NUM \
      warm_ms=NUM cold_ratio=NUM warm_ratio=NUM after_idle_ms=NUM after_idle_ratio=NUM after_idle_minflt=INT
    # polling without pause is the reference: its ratios are 1
    has_line "$p: step 0" "$o" path=$p size=294912 step_ms=0 polls=INT poll_max_ms=NUM \
      poll_p999_ms=NUM poll_p50_ms=NUM fetch_max_ms=NUM ready_ms=NUM \
      ready_ratio_vs_continuous=1.000 ready_floor_ratio=1.000
    has_line "$p: step 5" "$o" path=$p size=294912 step_ms=5 polls=INT poll_max_ms=NUM \
      poll_p999_ms=NUM poll_p50_ms=NUM fetch_max_ms=NUM ready_ms=NUM \
      ready_ratio_vs_continuous=NUM ready_floor_ratio=NUM
  done
  in_order "shm's lines, then tcp's" "$o" '^path=shm .* memcpy_ms=' '^path=shm .* step_ms=0 ' \
    '^path=shm .* step_ms=5 ' '^path=tcp .* memcpy_ms=' '^path=tcp .* step_ms=0 ' '^path=tcp .* step_ms=5 ' ;;

bench_stall_bad_args) # bench_stall_bad_args ECX: usage errors, exit 2 and the message
  expect 0 "" "bench stall --help" -- "$1" bench stall --help
  check "--help says its usage" 'grep -q "usage: ecx bench stall" "$T/cmd.stdout"'
  expect 2 "--size: '2Gi' is not 1 byte to 1Gi" "size too large" -- "$1" bench stall --size 2Gi
  expect 2 "--step-ms: '1001' is not an integer" "step too long" -- "$1" bench stall --step-ms 5,1001
  expect 2 "--data takes all, shm, tcp or ucx.*'foo'" "unknown path" -- "$1" bench stall --data shm,foo
  expect 2 "--count: '0' is not an integer" "count 0" -- "$1" bench stall --count 0
  expect 2 "takes no arguments .'extra'" "stray argument" -- "$1" bench stall extra
  expect 2 "not whole blocks of 8192.*give 303104 \\(37 blocks\\)" "size not whole blocks" -- \
    "$1" bench stall --size 300K
  "$1" bench stall --help >"$T/help.txt"
  check "--help names the default block size" 'grep -q "(default 8Ki" "$T/help.txt"' ;;

bench_compare) # bench_compare SOURCE_DIR ECX: bench/compare.sh quick, both producers and the ratios
  EXPECT_TIMEOUT=280 COMPARE_QUICK=1 expect 0 "" "compare.sh quick" -- bash "$1/bench/compare.sh" "$2"
  has_line "ecx's line" "$T/cmd.stdout" producer=ecx window=64
  has_line "python's line" "$T/cmd.stdout" producer=python window=64
  has_line "the ratios" "$T/cmd.stdout" ratio_req_per_s_w64=NUM ratio_p50_w1=NUM
  in_order "ecx, python, then the ratios" "$T/cmd.stdout" '^producer=ecx window=64 ' \
    '^producer=python window=64 ' 'ratio_req_per_s_w64=' ;;

tcp_vs_raw) # tcp_vs_raw SOURCE_DIR BUILD_DIR: raw_tcp's own runs and errors, then
  # bench/tcp_vs_raw.sh tiny on loopback (no namespaces, not pinned)
  port=$(free_port)
  "$2/raw_tcp" serve "127.0.0.1:$port" 100000 >"$T/raw.out" 2>&1 &
  rpid=$!
  for _ in $(seq 50); do grep -q listening "$T/raw.out" && break; sleep 0.1; done
  expect 0 "" "raw_tcp get" -- "$2/raw_tcp" get "127.0.0.1:$port" 99999 3
  has_line "raw_tcp's last line" "$T/cmd.stdout" raw_tcp: size=99999 rounds=3 median_ms=NUM
  has_line "raw_tcp's round line" "$T/cmd.stdout" round=3 ms=NUM
  if wait $rpid; then ok; else bad "raw_tcp serve: exit $? when its peer closed (want 0)"; fi
  expect 2 "usage: raw_tcp" "raw_tcp, size 0" -- "$2/raw_tcp" get "127.0.0.1:$port" 0 1
  expect 2 "usage: raw_tcp" "raw_tcp, unknown command" -- "$2/raw_tcp" put x 1 1
  expect 1 "not HOST:PORT" "raw_tcp, no port" -- "$2/raw_tcp" get 127.0.0.1 10 1
  expect 1 "cannot connect" "raw_tcp, nobody listening" -- "$2/raw_tcp" get "127.0.0.1:$(free_port)" 10 1
  servers() { pgrep -f 'announce-out /dev/shm/ecx-tvr\.' | sort; }
  before=$(servers)
  EXPECT_TIMEOUT=120 TVR_NETNS=0 TVR_PIN=0 TVR_SIZES=65536 TVR_ROUNDS=3 TVR_PASSES=2 \
    expect 0 "" "tcp_vs_raw.sh tiny" -- bash "$1/bench/tcp_vs_raw.sh" "$2"
  has_line "a pass's line" "$T/cmd.stdout" size=65536 pass=2 raw_ms=NUM ecx_ms=NUM tcp_vs_raw=NUM
  has_line "the summary" "$T/cmd.stdout" where=loopback pinned=no size=65536 tcp_vs_raw=NUM
  left=$(comm -13 <(echo "$before") <(servers))
  if [ -z "$left" ]; then ok; else bad "tcp_vs_raw.sh left its ecx serve running: $left"; fi
  TVR_NETNS=0 TVR_SIZES=64k expect 1 "is not a byte count" "tcp_vs_raw.sh, a bad size" -- \
    bash "$1/bench/tcp_vs_raw.sh" "$2" ;;

*) echo "test_formats: no case '$case'" >&2; exit 2 ;;
esac
finish
