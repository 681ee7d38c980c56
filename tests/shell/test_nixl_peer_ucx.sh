#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ECX_NIXL_UCX: ecx's NIXL agent process on the UCX its peers run (the nixl
# wheel's, docs/NIXL.md §5; agents/peer_ucx.h), against real nixl agents:
#   1. `ecx serve --data nixl`: a real nixl agent fetches items the way
#      vLLM's consumer does (tests/nixl/nixl_fetch.py), every byte compared:
#      it unpacks the real rkey ecx now publishes;
#   2. `ecx get --data nixl` from a real nixl agent serving as vLLM's
#      producer does (tests/nixl/nixl_producer.py), every byte compared, and
#      UCX's choice for that endpoint is one host's shared memory, not only
#      tcp (what ecx's own UCX is held to); the agent gets each READ's
#      notification;
#   3. the agent says which UCX it runs, and leaves no link directory;
#   4. ECX_NIXL_UCX naming no directory, one without libucp, a libucp that
#      does not load, or a path with ':': `ecx get` exits 1 with a line
#      saying so, and leaves no link directory either.
# usage: test_nixl_peer_ucx.sh ECX_BINARY BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ecx=$1
. "$here/../nixl/find_python.sh" "$2"
. "$here/lib.sh"
. "$here/../nixl/env.sh"
tmp=$T # lib.sh's: its cleanup kills $pids and removes it (errexit off for that)
trap 'set +e; cleanup' EXIT
private_shm
shm=$SHM
ucx=$(nixl_ucx_dir "$NIXL_PY")
ls "$ucx"/libucp* >/dev/null || { echo "no libucp in the nixl wheel's $ucx" >&2; exit 1; }
mkdir "$tmp/t" # TMPDIR of every ecx: where the agent's link directories go
no_links() {
  if compgen -G "$tmp/t/ecx-nixl-ucx-*" >/dev/null; then
    echo "$1: a link directory was left: $(ls "$tmp/t")" >&2; exit 1
  fi
}
run() { env TMPDIR="$tmp/t" ECX_SHM_DIR="$shm" ECX_NIXL_UCX="${dir:-$ucx}" "$ecx" "$@"; }

# 1. a real nixl agent reads from ecx serve
mkdir "$tmp/items"
head -c 4718592 /dev/urandom >"$tmp/items/item-multi"
head -c 24576 /dev/urandom >"$tmp/items/item-small"
port=$(free_port)
# (through env, not run(): a shell function started with & leaves its subshell's pid in $!)
env ECX_LOG=info TMPDIR="$tmp/t" ECX_SHM_DIR="$shm" ECX_NIXL_UCX="$ucx" "$ecx" serve --data nixl \
  --preload "$tmp/items" --listen "127.0.0.1:$port" --announce-out "$tmp/ann.json" >"$tmp/serve.log" 2>&1 &
serve=$!
pids+=($serve)
for _ in $(seq 200); do [ -f "$tmp/ann.json" ] && break; sleep 0.05; done
[ -f "$tmp/ann.json" ] || { cat "$tmp/serve.log" >&2; exit 1; }
timeout 120 "$NIXL_PY" "$here/../nixl/nixl_fetch.py" "$tmp/ann.json" "$tmp/items" 8192 \
  2>"$tmp/fetch.log" | grep -v "NIXL INFO" || { cat "$tmp/fetch.log" "$tmp/serve.log" >&2; exit 1; }
grep -E "nixl agent: on UCX [0-9.]+ from ECX_NIXL_UCX=" "$tmp/serve.log" ||
  { echo "ecx serve's agent did not say it runs the peers' UCX" >&2; cat "$tmp/serve.log" >&2; exit 1; }
kill "$serve" && wait "$serve" || true
no_links "ecx serve"

# 2. ecx get reads from a real nixl agent
port=$(free_port)
# (no timeout around it: it ends by itself after 120 s, and $! must be the python)
"$NIXL_PY" "$here/../nixl/nixl_producer.py" "$tmp/p" "$port" 8192 8 120 \
  >"$tmp/prod.out" 2>"$tmp/prod.err" &
pids+=($!)
for _ in $(seq 300); do [ -f "$tmp/p/announce.json" ] && break; sleep 0.1; done
[ -f "$tmp/p/announce.json" ] || { cat "$tmp/prod.err" >&2; exit 1; }
mkdir "$tmp/got"
UCX_LOG_LEVEL=info ECX_LOG=debug run get --data nixl --params "$tmp/p/announce.json" --out "$tmp/got" \
  --mm-hash good-0 --mm-hash good-1 --mm-hash good-2 --json >"$tmp/get.json" 2>"$tmp/get.log" ||
  { cat "$tmp/get.json" "$tmp/get.log" >&2; exit 1; }
for h in good-0 good-1 good-2; do cmp "$tmp/got/$h" "$tmp/p/items/$h"; done
echo "ecx get on the peers' UCX: good-0, good-1, good-2 ready, every byte equal to the nixl agent's"
lanes=$(grep -E "UCX says: .*cfg#" "$tmp/get.log" || true)
echo "its endpoint: ${lanes#*UCX says: }"
grep -Eq "cfg#.*(sysv|posix|cma)/memory" <<<"$lanes" ||
  { echo "UCX did not use one host's shared memory" >&2; cat "$tmp/get.log" >&2; exit 1; }
no_links "ecx get"

# 4. what is not a UCX directory
mkdir "$tmp/empty" "$tmp/bad" "$tmp/co:lon"
printf 'not a library\n' >"$tmp/bad/libucp.so.0"
cp "$ucx"/libucs* "$tmp/bad/"
ln -s "$ucx"/lib* "$tmp/co:lon/" # a good UCX, in a path LD_LIBRARY_PATH cannot hold
for dir in "$tmp/none" "$tmp/empty" "$tmp/bad" "$tmp/co:lon"; do
  set +e
  run get --data nixl --params "$tmp/p/announce.json" --out "$tmp/got" --mm-hash good-0 \
    >"$tmp/bad.out" 2>"$tmp/bad.err"
  rc=$?
  set -e
  [ "$rc" = 1 ] && grep -q "^ecx-nixl-agent: ECX_NIXL_UCX=$dir: " "$tmp/bad.err" ||
    { echo "ECX_NIXL_UCX=$dir: rc $rc" >&2; cat "$tmp/bad.err" >&2; exit 1; }
  echo "ECX_NIXL_UCX=${dir#$tmp/}: $(grep "^ecx-nixl-agent" "$tmp/bad.err" | head -1 | sed 's/.*: //')"
  no_links "ECX_NIXL_UCX=$dir"
done
dir=
touch "$tmp/p/stop"
wait "${pids[-1]}"
for h in good-0 good-1 good-2; do
  grep -Eq "^notif ecx-[0-9a-f]{32} [0-9a-f-]{36}:$h$" "$tmp/prod.out" ||
    { cat "$tmp/prod.out" >&2; echo "no notification for $h" >&2; exit 1; }
done
echo "the nixl agent got each READ's notification"
if pgrep -f "$tmp/items" >/dev/null; then
  echo "this test's ecx serve still runs: $(pgrep -fa "$tmp/items")" >&2; exit 1
fi
echo ok
