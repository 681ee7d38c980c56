#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ecx's NIXL peer (tests/support/nixl_peer.c over src/data/nixl/nixl_agent.c, Debian's UCX)
# against a real nixl agent (tests/nixl/nixl_peer.py, the nixl package's own
# UCX), over loopback, every byte checked:
#   1. a real agent READs blocks from ecx (ecx's metadata and descriptor
#      list), and ecx receives its notification;
#   2. ecx READs blocks from a real agent (its metadata and vLLM's
#      descriptor list), and the agent receives ecx's notification;
#   3. every prefix of a live real agent's metadata, and every one-byte
#      mutation (its UCX worker address and rkeys included, on which UCX
#      1.13 can abort: they go through the NIXL agent process,
#      docs/NIXL.md §5, §6, which then dies and is started again) is
#      refused or added as a peer without a crash; then the same proc
#      READs blocks of the real one and it gets the notification.
# Block runs: contiguous and not, 4 KiB and 1 MiB blocks.
# usage: test_nixl_peer.sh NIXL_PEER_BINARY BUILD_DIR (ecx-nixl-agent next to the binary)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1
. "$here/../nixl/find_python.sh" "$2"
tmp=$(mktemp -d /tmp/ecx-nixl-peer.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
py() { timeout 60 "$NIXL_PY" "$here/../nixl/nixl_peer.py" "$@" 2>>"$tmp/py.log"; }

for bs in 4096 1048576; do
  d="$tmp/a$bs"; mkdir -p "$d"
  timeout 60 "$bin" serve "$d" 8 "$bs" 40 >"$d/serve.out" 2>"$d/serve.err" & pids+=($!)
  out=$(py read "$d" 8 "$bs" "sess-$bs:hashA" 5 6 2) || { cat "$tmp/py.log" "$d/serve.err" >&2; exit 1; }
  echo "nixl reads from ecx ($bs): $out"
  wait "${pids[-1]}" || { cat "$d/serve.err" >&2; exit 1; }
  grep -qx "notif vllm-consumer sess-$bs:hashA" "$d/serve.out" || { cat "$d"/serve.* >&2; exit 1; }
  echo "ecx got: $(cat "$d/serve.out")"

  d="$tmp/b$bs"; mkdir -p "$d"
  py serve "$d" 8 "$bs" 40 >"$d/serve.out" & pids+=($!)
  for _ in $(seq 300); do [ -f "$d/nixl.md" ] && break; sleep 0.1; done
  timeout 60 "$bin" read "$d" 8 "$bs" "sess-$bs:hashB" 1 2 7 || { cat "$tmp/py.log" >&2; exit 1; }
  wait "${pids[-1]}" || { cat "$tmp/py.log" >&2; exit 1; }
  grep -qx "notif ecx-consumer sess-$bs:hashB" "$d/serve.out" || { cat "$d/serve.out" "$tmp/py.log" >&2; exit 1; }
  echo "nixl got: $(cat "$d/serve.out")"
done
d="$tmp/m"; mkdir -p "$d"
py serve "$d" 8 4096 200 >"$d/serve.out" & pids+=($!) # a live agent, so mutants reach UCX
for _ in $(seq 300); do [ -f "$d/nixl.md" ] && break; sleep 0.1; done
timeout 180 "$bin" mutate "$d" 8 4096 "sess-m:after-mutants" 3 4 || { cat "$tmp/py.log" >&2; exit 1; }
wait "${pids[-1]}" || { cat "$tmp/py.log" >&2; exit 1; }
grep -Eqx "notif ecx-[0-9a-f]{32} sess-m:after-mutants" "$d/serve.out" || { cat "$d/serve.out" >&2; exit 1; }
echo "nixl got: $(cat "$d/serve.out")"
echo "ok"
