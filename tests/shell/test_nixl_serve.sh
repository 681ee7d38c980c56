#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `ecx serve --data nixl` serves both kinds of consumer (docs/NIXL.md §8).
# 1. A real nixl agent, the way vLLM's ECCPUConnector fetches
#    (tests/nixl/nixl_fetch.py): XferReq over ZeroMQ with a plain uuid4
#    session, add_remote_agent(ack.agent_metadata), descriptors from
#    ack.mem_descriptor and src_block_indices, one READ with the notification
#    "{session_id}:{mm_hash}", every byte compared: NIXL's form.
# 2. `ecx get --data nixl` (marked session id) from the same producer gets
#    ecx's own checked form: the same-host path (shm), tickets with tokens and
#    checksums, every byte compared; and `ecx get` (auto) likewise.
# The producer's metrics must show every grant released by its notification,
# only the nixl agent's acks in NIXL's form, no forged notification.
# usage: test_nixl_serve.sh ECX_BINARY BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ecx=$1
. "$here/../nixl/find_python.sh" "$2"
. "$here/lib.sh"
tmp=$(mktemp -d /tmp/ecx-nixl-serve.XXXXXX)
shm=$(mktemp -d /dev/shm/ecx-nixl-serve.XXXXXX) # the shm path wants tmpfs
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp" "$shm"; cleanup' EXIT # (and lib.sh's $T)
mkdir "$tmp/items"
# The defaults (vLLM 0.34.0, protocol version 2, 8 KiB blocks): an item is
# whole rows of one block (serve --preload), so no item ends inside a block.
head -c 4718592 /dev/urandom >"$tmp/items/item-multi"   # llava-1.5's 576 rows
head -c 8192 /dev/urandom >"$tmp/items/item-one"        # exactly 1 block
head -c 24576 /dev/urandom >"$tmp/items/item-small"     # 3 blocks
port=$(free_port) mport=$(free_port)
ECX_SHM_DIR=$shm "$ecx" serve --data nixl --preload "$tmp/items" --listen "127.0.0.1:$port" \
  --announce-out "$tmp/ann.json" --metrics "127.0.0.1:$mport" \
  >"$tmp/serve.log" 2>&1 &
pid=$!
for _ in $(seq 200); do [ -f "$tmp/ann.json" ] && break; sleep 0.05; done
[ -f "$tmp/ann.json" ] || { cat "$tmp/serve.log" >&2; exit 1; }
timeout 120 "$NIXL_PY" "$here/../nixl/nixl_fetch.py" "$tmp/ann.json" "$tmp/items" 8192 \
  2>"$tmp/py.log" | grep -v "NIXL INFO" || { cat "$tmp/py.log" "$tmp/serve.log" >&2; exit 1; }
metrics() { /usr/bin/python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "http://127.0.0.1:$mport/metrics"; }
# ecx get, nixl mode then auto: ecx's form, over shm, checksums verified
# (a mismatch would be CORRUPT: the item would fall back and not be written).
for mode in nixl auto; do
  rm -rf "$tmp/got" && mkdir "$tmp/got"
  ECX_LOG=debug ECX_SHM_DIR=$shm "$ecx" get --data $mode --params "$tmp/ann.json" --out "$tmp/got" \
    >"$tmp/get.out" 2>&1 || { cat "$tmp/get.out" >&2; exit 1; }
  for f in "$tmp"/items/*; do cmp "$f" "$tmp/got/$(basename "$f")"; done
  grep -q "data: producer registered, path shm" "$tmp/get.out" ||
    { echo "ecx get --data $mode did not use shm:" >&2; cat "$tmp/get.out" >&2; exit 1; }
  if grep -q "path nixl" "$tmp/get.out"; then echo "ecx get --data $mode used NIXL" >&2; exit 1; fi
  echo "ecx get --data $mode from it: $(ls "$tmp/got" | wc -l) items over shm, every byte equal"
done
for _ in $(seq 100); do
  m=$(metrics)
  grep -qx "ecx_producer_completions_total 9" <<<"$m" && break
  sleep 0.05
done
echo "$m" | grep -E "^ecx_producer_(grants_total|nixl_grants_total|completions_total|active_grants|forged_notifications_total|refused_reads_total) "
grep -qx "ecx_producer_completions_total 9" <<<"$m" || { echo "grants not released" >&2; exit 1; }
grep -qx "ecx_producer_active_grants 0" <<<"$m" || { echo "grants still held" >&2; exit 1; }
grep -qx "ecx_producer_nixl_grants_total 3" <<<"$m" || { echo "not 3 NIXL-form acks" >&2; exit 1; }
grep -qx "ecx_producer_forged_notifications_total 0" <<<"$m" || { echo "forged notifications" >&2; exit 1; }
echo ok
