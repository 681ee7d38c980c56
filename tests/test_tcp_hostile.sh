#!/bin/bash
# test_tcp_hostile.sh UCX_HOSTILE — the tcp data path (data_tcp.c) with real
# processes on loopback: well-behaved READs of every shape are byte-exact;
# a replayed grant fails fast; a raw TCP client holding one grant's ticket
# gets that grant once and nothing else (wrong token, another key, replay,
# garbage, bad key lengths, half a request, a 2000-request flood, 100
# connections), and the producer lives and serves on; it listens on lo
# only (the advertised host); a hostile producer fails the consumer's READs
# without a byte written outside them; a producer SIGSTOPped for 12 s under
# 16 whole-region READs resumes and serves. At the end the producer's
# region and heap are untouched. Every wait is bounded.
set -u
BIN=$1
export HOSTILE_DATA=tcp
DIR=$(mktemp -d /dev/shm/ecx-tcph.XXXXXX)
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
G=$DIR/grants
ECX_LOG=info timeout 150 "$BIN" produce "$DIR" "$G" 140000 >"$DIR/prod.log" 2>&1 &
TPID=$!
for _ in $(seq 100); do
    PROD=$(pgrep -P $TPID)
    [ -n "$PROD" ] && [ -s "$G" ] && break
    sleep 0.1
done
[ -n "$PROD" ] && [ -s "$G" ] || fail "producer did not start"
alive() { kill -0 "$PROD" 2>/dev/null || fail "producer died ($1)"; }
consume() { # FIRST COUNT LAYOUT EXPECT TIMEOUT_MS
    timeout 60 "$BIN" consume "$DIR" "$G" "$@" >"$DIR/cons.log" 2>&1
    local rc=$?
    sed 's/^/    /' "$DIR/cons.log" | grep -v 'ecx warn' | head -20
    return $rc
}

if command -v ss >/dev/null; then
    socks=$(ss -ltnp 2>/dev/null | grep "pid=$PROD," | awk '{print $4}')
    [ -n "$socks" ] || fail "no listening socket seen"
    ! echo "$socks" | grep -vq '^127\.0\.0\.1:' || fail "listening beyond lo: $socks"
fi
consume 0 2 direct done 10000 || fail "one block / a run"
consume 2 3 reverse done 10000 || fail "scattered both sides, whole region, partial blocks"
consume 0 1 direct failed 10000 || fail "a replayed grant did not fail"
ms=$(sed -n 's/^g0 failed after \([0-9]*\) ms$/\1/p' "$DIR/cons.log")
[ -n "$ms" ] && [ "$ms" -lt 2000 ] || fail "the refusal took ${ms:-?} ms"

echo "== a hostile client"
timeout 90 "$BIN" tcp-attack "$G" >"$DIR/attack.log" 2>&1
rc=$?
sed 's/^/    /' "$DIR/attack.log"
[ $rc -eq 0 ] || fail "the attacker got something or a bound did not hold (rc $rc)"
alive "after the attack"
consume 6 1 reverse done 10000 || fail "a READ after the attack"

echo "== a hostile producer"
timeout 90 "$BIN" tcp-evil "$DIR" >"$DIR/evil.log" 2>&1
rc=$?
grep -v 'ecx warn' "$DIR/evil.log" | sed 's/^/    /'
[ $rc -eq 0 ] || fail "hostile producer (rc $rc)"

echo "== the producer stopped (12 s) under 16 whole-region READs; the consumer gives up after 3 s"
kill -STOP "$PROD"
timeout 60 "$BIN" consume "$DIR" "$G" 16 16 direct timeout 3000 >"$DIR/cons.log" 2>&1
rc=$?
sed 's/^/    /' "$DIR/cons.log" | grep -v 'ecx warn' | sed 's/ after [0-9]* ms//' | sort | uniq -c
[ $rc -eq 0 ] || fail "the stalled consumer (rc $rc)"
sleep 9
kill -CONT "$PROD"
sleep 1
alive "after SIGCONT"
consume 8 1 direct done 10000 || fail "a READ after the stall"
alive "after the stall"

kill -TERM "$PROD"
wait "$TPID"
rc=$?
PROD=
[ $rc -eq 0 ] || fail "producer exit $rc"
grep -q '^secret intact$' "$DIR/prod.log" || fail "the producer's heap changed"
grep -q '^notif sess16:item16 status -' "$DIR/prod.log" || fail "no failed send reported after the stall"
grep -q '^region intact$' "$DIR/prod.log" || fail "the region changed: $(grep '^block' "$DIR/prod.log")"
n5=$(grep -c '^notif sess5:item5 ' "$DIR/prod.log")
[ "$n5" -eq 1 ] || fail "g5 completed $n5 times"
echo "    producer: $(grep -c '^notif' "$DIR/prod.log") completions, region and heap intact"
grep 'data tcp: [0-9]* connections' "$DIR/prod.log" | sed 's/^/    /'
echo "PASS"
