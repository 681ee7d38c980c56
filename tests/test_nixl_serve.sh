#!/usr/bin/env bash
# `ecx serve --data nixl` with a real nixl agent as the consumer, the way
# vLLM's ECCPUConnector fetches (tests/nixl/nixl_fetch.py): XferReq over
# ZeroMQ, add_remote_agent(ack.agent_metadata), descriptors from
# ack.mem_descriptor and src_block_indices, one READ with the notification
# "{session_id}:{mm_hash}", every byte compared; then the producer's metrics
# must show each grant released by its notification. Then `ecx get --data
# nixl` fetches the same items from it (ecx to ecx over NIXL), every byte
# compared, its grants released too.
# usage: test_nixl_serve.sh ECX_BINARY BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ecx=$1
. "$here/nixl/find_python.sh" "$2"
. "$here/lib.sh"
tmp=$(mktemp -d /tmp/ecx-nixl-serve.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir "$tmp/items"
head -c 2500000 /dev/urandom >"$tmp/items/item-multi"   # 3 blocks, the last partial
head -c 1048576 /dev/urandom >"$tmp/items/item-one"     # exactly 1 block
head -c 1000 /dev/urandom >"$tmp/items/item-small"
port=$(free_port) mport=$(free_port)
ECX_SHM_DIR=$tmp "$ecx" serve --data nixl --preload "$tmp/items" --listen "127.0.0.1:$port" \
  --announce-out "$tmp/ann.json" --metrics "127.0.0.1:$mport" --block-bytes 1Mi \
  >"$tmp/serve.log" 2>&1 &
pid=$!
for _ in $(seq 200); do [ -f "$tmp/ann.json" ] && break; sleep 0.05; done
[ -f "$tmp/ann.json" ] || { cat "$tmp/serve.log" >&2; exit 1; }
timeout 120 "$NIXL_PY" "$here/nixl/nixl_fetch.py" "$tmp/ann.json" "$tmp/items" 1048576 \
  2>"$tmp/py.log" | grep -v "NIXL INFO" || { cat "$tmp/py.log" "$tmp/serve.log" >&2; exit 1; }
metrics() { /usr/bin/python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "http://127.0.0.1:$mport/metrics"; }
mkdir "$tmp/got"
ECX_SHM_DIR=$tmp "$ecx" get --data nixl --params "$tmp/ann.json" --out "$tmp/got" --block-bytes 1Mi \
  >"$tmp/get.out" 2>&1 || { cat "$tmp/get.out" >&2; exit 1; }
for f in "$tmp"/items/*; do cmp "$f" "$tmp/got/$(basename "$f")"; done
echo "ecx get --data nixl from it: $(ls "$tmp/got" | wc -l) items, every byte equal"
for _ in $(seq 100); do
  m=$(metrics)
  echo "$m" | grep -qx "ecx_producer_completions_total 6" && break
  sleep 0.05
done
echo "$m" | grep -E "^ecx_producer_(grants_total|completions_total|active_grants|forged_notifications_total) "
echo "$m" | grep -qx "ecx_producer_completions_total 6" || { echo "grants not released" >&2; exit 1; }
echo "$m" | grep -qx "ecx_producer_active_grants 0" || { echo "grants still held" >&2; exit 1; }
echo ok
