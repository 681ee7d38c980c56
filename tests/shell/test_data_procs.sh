#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_data_procs — producer and consumer of the data plane in two
# processes on this host, through each path: shm, tcp, UCX as UCX likes
# it, UCX over TCP only, auto (which must pick shm here), and an auto
# consumer of a tcp-only producer (tcp). Every byte is
# checked by data_peer; each run is bounded by its timeout.
set -u
HELPER=$1
TMO=${TMO:-20000}
. "$(dirname "$0")/lib.sh" # built; $SHM, removed on exit
private_shm
work=$SHM
fail=0

run() { # name pbackend cbackend want_path [env...]
    local name=$1 pb=$2 cb=$3 want=$4
    shift 4
    local file=$work/$name.meta
    env "$@" "$HELPER" produce "$work" "$pb" 64 65536 "$file" 4 "$TMO" >"$work/$name.p" 2>&1 &
    local ppid=$!
    env "$@" "$HELPER" consume "$work" "$cb" 64 65536 "$file" "$want" "$TMO" >"$work/$name.c" 2>&1
    local crc=$?
    wait $ppid
    local prc=$?
    if [ $crc -ne 0 ] || [ $prc -ne 0 ]; then
        echo "FAIL $name (consumer rc=$crc producer rc=$prc)"
        sed 's/^/  c: /' "$work/$name.c"
        sed 's/^/  p: /' "$work/$name.p"
        fail=1
    else
        echo "ok   $name: $(grep -c 'bad bytes' "$work/$name.c") fetches verified, $(grep -c '^notif' "$work/$name.p") notifications"
    fi
}

run shm shm shm shm
run tcp tcp tcp tcp
run auto-tcp tcp auto tcp
if built ucx; then
    run ucx ucx ucx ucx
    run ucx-tcp ucx ucx ucx UCX_TLS=tcp
fi
run auto auto auto shm
built nixl && run nixl nixl nixl shm # ecx to ecx in nixl mode: its auto paths (docs/NIXL.md §8)
exit $fail
