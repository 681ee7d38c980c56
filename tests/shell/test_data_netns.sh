#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_data_netns — the data plane across two network namespaces joined by
# a veth pair this test creates (10.213.0.1/24 and 10.213.0.2/24, inside
# those namespaces only): producer in one, consumer in the other. Runs tcp,
# UCX over TCP only, UCX with its own transport choice, auto (which must
# take tcp: the same-host path's socket is not reachable from another
# network namespace, and an auto producer publishes no UCX), and an auto
# consumer of a UCX-only producer (ucx), and nixl to nixl (ecx's own form:
# tcp, docs/NIXL.md §8). Skips (exit 77) unless root with `ip netns`.
# Everything it creates is removed on exit.
set -u
HELPER=$1
TMO=${TMO:-20000}
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
if ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
    echo "SKIP: ip netns unavailable"; exit 77
fi
A=ecxdA$$ B=ecxdB$$ VA=ecxva$$ VB=ecxvb$$
. "$(dirname "$0")/lib.sh" # built; $SHM, removed on exit
private_shm
work=$SHM
cleanup_netns() {
    ip netns del "$A" 2>/dev/null
    ip netns del "$B" 2>/dev/null
    ip link del "$VA" 2>/dev/null
}
trap 'cleanup_netns; cleanup' EXIT
set -e
if ! ip netns add "$A" 2>/dev/null; then echo "SKIP: cannot create a network namespace"; exit 77; fi
ip netns add "$B"
ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$A"
ip link set "$VB" netns "$B"
ip -n "$A" addr add 10.213.0.1/24 dev "$VA"
ip -n "$B" addr add 10.213.0.2/24 dev "$VB"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up
ip -n "$B" link set "$VB" up
set +e
fail=0

run() { # name pbackend cbackend want_path [env...]
    local name=$1 pb=$2 cb=$3 want=$4
    shift 4
    local file=$work/$name.meta
    ip netns exec "$A" env "$@" "$HELPER" produce "$work" "$pb" 64 65536 "$file" 4 "$TMO" \
        >"$work/$name.p" 2>&1 &
    local ppid=$!
    ip netns exec "$B" env "$@" "$HELPER" consume "$work" "$cb" 64 65536 "$file" "$want" "$TMO" \
        >"$work/$name.c" 2>&1
    local crc=$?
    wait $ppid
    local prc=$?
    if [ $crc -ne 0 ] || [ $prc -ne 0 ]; then
        echo "FAIL $name (consumer rc=$crc producer rc=$prc)"
        sed 's/^/  c: /' "$work/$name.c"
        sed 's/^/  p: /' "$work/$name.p"
        fail=1
    else
        echo "ok   $name: $(grep -c 'bad bytes' "$work/$name.c") fetches verified across namespaces, $(grep -c '^notif' "$work/$name.p") notifications"
    fi
}

run tcp tcp tcp tcp
if built ucx; then
    run ucx-tcp ucx ucx ucx UCX_TLS=tcp
    run ucx-default ucx ucx ucx
fi
run auto auto auto tcp
built ucx && run auto-ucx ucx auto ucx
built nixl && run nixl nixl nixl tcp # ecx to ecx in nixl mode: its auto paths (docs/NIXL.md §8)
exit $fail
