#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tcp_vs_raw — ecx's tcp path between two processes next to plain TCP, the
# way a consumer on another host sees it: `ecx serve --data tcp --synthetic
# 1:SIZE` and `ecx get --data tcp --rounds R --json --verify-synthetic`
# (each round's latency is fetch-to-ready: the control round trip, the READ,
# the checksum check; the same item, evicted between rounds) against
# build/raw_tcp (one connection, an 8-byte request, blocking reads: no
# header, no checksum), in alternating passes. With root and `ip netns`, the
# two sides run in two network namespaces this script creates, joined by a
# veth pair (10.215.0.1/24 and 10.215.0.2/24, inside them only: the kernel's
# path between hosts); else on loopback. With two CPUs or more, the
# producer's side (ecx serve, raw_tcp serve) runs on CPU 0 and the
# consumer's (ecx get, raw_tcp get) on CPU 1 (taskset), as two hosts would:
# unpinned, this VM's scheduler stacked both on one vCPU (likely: a TCP
# receiver is woken on its sender's CPU, and a halted vCPU counts as
# unavailable to the guest), so the two sides took turns and the figure
# measured that (BENCHMARKS.md).
#
# usage: bench/tcp_vs_raw.sh [BUILD_DIR [BEFORE_BUILD_DIR]]   (default: build)
#   BEFORE_BUILD_DIR: a second build's ecx, measured in the same passes.
# env:   TVR_SIZES (4718592,28835840: comma-separated), TVR_ROUNDS (40),
#        TVR_PASSES (3), TVR_NETNS (auto: namespaces when root; 0: loopback;
#        1: namespaces or fail), TVR_PIN (auto: pinned with 2+ CPUs; 0: not)
# Output (stdout): one line per size and pass,
#   size=B pass=N raw_ms=X ecx_ms=X tcp_vs_raw=X [before_ms=X before_vs_raw=X]
# (medians of the pass's rounds; tcp_vs_raw = raw_ms / ecx_ms, 1.0 is plain
# TCP's speed), then per size the medians over the passes:
#   where=<netns|loopback> pinned=<yes|no> size=B tcp_vs_raw=X [before_vs_raw=X]
# Exit: 0; 1 if a run failed or a fetch fell back or was not verified.
set -u
here=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-$here/../build}
BEFORE=${2:-}
SIZES=${TVR_SIZES:-4718592,28835840} ROUNDS=${TVR_ROUNDS:-40} PASSES=${TVR_PASSES:-3}
NETNS=${TVR_NETNS:-auto} PIN=${TVR_PIN:-auto}
PY=/usr/bin/python3
for b in "$BUILD/ecx" "$BUILD/raw_tcp" ${BEFORE:+"$BEFORE/ecx"}; do
  [ -x "$b" ] || { echo "tcp_vs_raw: no $b (build first)" >&2; exit 1; }
done
work=$(mktemp -d /dev/shm/ecx-tvr.XXXXXX) || exit 1
A=ecxtvrA$$ B=ecxtvrB$$ VA=ecxtva$$ VB=ecxtvb$$
pids=() # the servers running now
stop_serves() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  pids=()
}
cleanup() {
  stop_serves
  if [ "$NETNS" = 1 ]; then
    ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; ip link del "$VA" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

if [ "$NETNS" = auto ]; then
  NETNS=0
  [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && ip netns list >/dev/null 2>&1 && NETNS=1
fi
if [ "$NETNS" = 1 ]; then
  ip netns add "$A" && ip netns add "$B" &&
    ip link add "$VA" type veth peer name "$VB" &&
    ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" &&
    ip -n "$A" addr add 10.215.0.1/24 dev "$VA" && ip -n "$B" addr add 10.215.0.2/24 dev "$VB" &&
    ip -n "$A" link set lo up && ip -n "$B" link set lo up &&
    ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up ||
    { echo "tcp_vs_raw: cannot set up the network namespaces" >&2; exit 1; }
  host=10.215.0.1 where=netns
  ns_a=(ip netns exec "$A") ns_b=(ip netns exec "$B")
else
  host=127.0.0.1 where=loopback
  ns_a=() ns_b=()
fi
if [ "$PIN" = auto ]; then
  PIN=0
  [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null && PIN=1
fi
cpu_a=() cpu_b=() pinned=no
[ "$PIN" = 1 ] && cpu_a=(taskset -c 0) cpu_b=(taskset -c 1) pinned=yes
# Prefixes that run a command on side A (producer) or B (consumer). Used
# as "${in_a[@]}" CMD: a function run with & would be a subshell, whose pid
# kill would not reach the command behind it.
in_a=("${ns_a[@]}" "${cpu_a[@]}") in_b=("${ns_b[@]}" "${cpu_b[@]}")

free_port() { # a port nobody listens on now (the namespaces are empty anyway)
  $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_serve BUILD NAME: an ecx producer of one synthetic item of $SIZE
# bytes; its announcements file is $work/NAME.json once it listens.
start_serve() {
  local port
  port=$(free_port)
  rm -f "$work/$2.json"
  "${in_a[@]}" "$1/ecx" serve --listen "$host:$port" --data tcp --synthetic "1:$SIZE" \
    --announce-out "$work/$2.json" >"$work/$2.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$work/$2.json" ] && return 0; sleep 0.1; done
  echo "tcp_vs_raw: $1/ecx serve did not start:" >&2
  cat "$work/$2.log" >&2
  return 1
}

# ecx_ms BUILD NAME: the median fetch-to-ready of ROUNDS rounds, in ms.
ecx_ms() {
  mkdir -p "$work/out-$2"
  "${in_b[@]}" "$1/ecx" get --params "$work/$2.json" --out "$work/out-$2" --data tcp \
    --rounds "$ROUNDS" --json --verify-synthetic 2>"$work/$2.get" |
    $PY -c '
import json, statistics, sys
v = [json.loads(l) for l in sys.stdin]
bad = [r for r in v if r.get("outcome") != "ready" or not r.get("verified")]
if len(v) != int(sys.argv[1]) or bad:
    sys.exit("tcp_vs_raw: %d results, %d not ready and verified" % (len(v), len(bad)))
print("%.3f" % statistics.median(r["latency_ms"] for r in v))' "$ROUNDS" ||
    { cat "$work/$2.get" >&2; return 1; }
}

raw_ms() {
  local port out
  port=$(free_port)
  "${in_a[@]}" "$BUILD/raw_tcp" serve "$host:$port" "$SIZE" >"$work/raw.log" 2>&1 &
  local spid=$!
  for _ in $(seq 50); do grep -q listening "$work/raw.log" 2>/dev/null && break; sleep 0.1; done
  out=$("${in_b[@]}" "$BUILD/raw_tcp" get "$host:$port" "$SIZE" "$ROUNDS") ||
    { kill $spid 2>/dev/null; cat "$work/raw.log" >&2; return 1; }
  wait $spid
  echo "$out" | sed -n 's/.*median_ms=//p'
}

ratio() { $PY -c 'import sys; print("%.3f" % (float(sys.argv[1]) / float(sys.argv[2])))' "$1" "$2"; }

med() { printf '%s\n' "$@" | $PY -c 'import statistics, sys; print("%.3f" % statistics.median(float(x) for x in sys.stdin))'; }

IFS=, read -r -a size_list <<<"$SIZES"
for SIZE in "${size_list[@]}"; do
  case $SIZE in '' | *[!0-9]*) echo "tcp_vs_raw: TVR_SIZES: '$SIZE' is not a byte count" >&2; exit 1 ;; esac
  start_serve "$BUILD" ecx || exit 1
  if [ -n "$BEFORE" ]; then start_serve "$BEFORE" before || exit 1; fi
  r_all=() b_all=()
  for pass in $(seq "$PASSES"); do
    raw=$(raw_ms) || exit 1
    ecx=$(ecx_ms "$BUILD" ecx) || exit 1
    r_all+=("$(ratio "$raw" "$ecx")")
    line="size=$SIZE pass=$pass raw_ms=$raw ecx_ms=$ecx tcp_vs_raw=${r_all[-1]}"
    if [ -n "$BEFORE" ]; then
      before=$(ecx_ms "$BEFORE" before) || exit 1
      b_all+=("$(ratio "$raw" "$before")")
      line+=" before_ms=$before before_vs_raw=${b_all[-1]}"
    fi
    echo "$line"
  done
  stop_serves
  echo "where=$where pinned=$pinned size=$SIZE tcp_vs_raw=$(med "${r_all[@]}")${BEFORE:+ before_vs_raw=$(med "${b_all[@]}")}"
done
