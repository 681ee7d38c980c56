# SPDX-License-Identifier: Apache-2.0
# hostile_lib.sh — what test_ucx_hostile.sh and test_tcp_hostile.sh share:
# a private dir ($DIR, $G the grants file), the producer process
# (tests/support/ucx_hostile.c's `produce`, which HOSTILE_DATA points at a path)
# started, watched and always killed, and well-behaved READs through it.
# $NET is the process that holds the producer's sockets: the producer, or
# for ucx its UCX process (ecx-ucx-agent, src/data/ucx/ucx_proc.h).
# Source it with BIN and the dir prefix set: BIN=... PREFIX=ecx-x . hostile_lib.sh
DIR=$(mktemp -d "/dev/shm/$PREFIX.XXXXXX")
G=$DIR/grants
PROD=
cleanup() {
    if [ -n "$PROD" ]; then kill -CONT "$PROD" 2>/dev/null; kill -KILL "$PROD" 2>/dev/null; fi
    rm -rf "$DIR"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    [ -f "$DIR/prod.log" ] && sed 's/^/  producer: /' "$DIR/prod.log" | tail -30
    exit 1
}
# Start the producer (140 s at most) and wait until it has written $G.
start_producer() {
    rm -f "$G"
    timeout 150 "$BIN" produce "$DIR" "$G" 140000 >"$DIR/prod.log" 2>&1 &
    TPID=$!
    for _ in $(seq 100); do
        PROD=$(pgrep -P $TPID)
        NET=$PROD
        [ -n "$PROD" ] && [ "${HOSTILE_DATA:-ucx}" = ucx ] && NET=$(pgrep -P "$PROD" -x ecx-ucx-agent)
        [ -n "$PROD" ] && [ -n "$NET" ] && [ -s "$G" ] && return 0
        sleep 0.1
    done
    fail "producer did not start"
}
alive() { kill -0 "$PROD" 2>/dev/null || fail "producer died ($1)"; }
consume() { # FIRST COUNT LAYOUT EXPECT TIMEOUT_MS
    timeout 60 "$BIN" consume "$DIR" "$G" "$@" >"$DIR/cons.log" 2>&1
    local rc=$?
    sed 's/^/    /' "$DIR/cons.log" | grep -v 'ecx warn' | head -20
    return $rc
}
# The producer listens on the advertised host's interface (lo) only.
listens_on_lo_only() {
    command -v ss >/dev/null || return 0
    local socks
    socks=$(ss -ltnp 2>/dev/null | grep "pid=$NET," | awk '{print $4}')
    [ -n "$socks" ] || fail "$1: no listening socket seen"
    ! echo "$socks" | grep -vq '^127\.0\.0\.1:' || fail "$1: listening beyond lo: $socks"
}
# Well-behaved READs of every shape, then a replayed grant that must fail fast.
reads_and_replay() {
    consume 0 2 direct done 10000 || fail "$1: one block / a run"
    consume 2 3 reverse done 10000 || fail "$1: scattered both sides, whole region, partial blocks"
    consume 0 1 direct failed 10000 || fail "$1: a replayed grant did not fail"
    local ms
    ms=$(sed -n 's/^g0 failed after \([0-9]*\) ms$/\1/p' "$DIR/cons.log")
    [ -n "$ms" ] && [ "$ms" -lt 2000 ] || fail "$1: the refusal took ${ms:-?} ms"
}
# End the producer (SIGTERM) and check it exited 0 with its heap secret intact.
stop_producer() {
    kill -TERM "$PROD"
    wait "$TPID"
    local rc=$?
    PROD=
    [ $rc -eq 0 ] || fail "$1: producer exit $rc"
    grep -q '^secret intact$' "$DIR/prod.log" || fail "$1: the producer's heap changed"
}
