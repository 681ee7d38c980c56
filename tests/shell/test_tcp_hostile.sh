#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
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
BIN=$1 PREFIX=ecx-tcph
export HOSTILE_DATA=tcp
. "$(dirname "$0")/hostile_lib.sh"
export ECX_LOG=info
start_producer
unset ECX_LOG
listens_on_lo_only tcp
reads_and_replay tcp

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

stop_producer tcp
grep -q '^notif sess16:item16 status -' "$DIR/prod.log" || fail "no failed send reported after the stall"
grep -q '^region intact$' "$DIR/prod.log" || fail "the region changed: $(grep '^block' "$DIR/prod.log")"
n5=$(grep -c '^notif sess5:item5 ' "$DIR/prod.log")
[ "$n5" -eq 1 ] || fail "g5 completed $n5 times"
echo "    producer: $(grep -c '^notif' "$DIR/prod.log") completions, region and heap intact"
grep 'data tcp: [0-9]* connections' "$DIR/prod.log" | sed 's/^/    /'
echo "PASS"
