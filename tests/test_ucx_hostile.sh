#!/bin/bash
# test_ucx_hostile.sh UCX_HOSTILE — the UCX data path (data_ucx.c) with
# real processes on loopback, under UCX's default transports and
# UCX_TLS=tcp: well-behaved READs of every shape are byte-exact; a replayed
# grant fails fast; an attacker holding one grant's ticket gets nothing
# else with crafted rkeys (get / put in and around the region, the heap,
# an unmapped address), wrong tokens, other keys, replays or garbage, and
# the producer lives and serves on; it listens on lo only (the advertised
# host's interface); a producer SIGSTOPped for 12 s under
# 16 READs resumes and serves (issue 10 #4); 1000 mutated UCX addresses in
# the metadata (digest-valid) never crash a consumer (issue 10 #3). It also shows the hole UCX
# 1.13 leaves open (a raw UCT tcp put writes the producer's memory) and
# that the consumer's checksum turns what it wrote into CORRUPT, never
# DONE. Every wait is bounded.
set -u
BIN=$1 PREFIX=ecx-ucxh
. "$(dirname "$0")/hostile_lib.sh"

for tls in default tcp; do
    if [ $tls = tcp ]; then export UCX_TLS=tcp; else unset UCX_TLS; fi
    echo "== UCX transports: $tls"
    start_producer
    listens_on_lo_only "$tls"
    reads_and_replay "$tls"
    timeout 90 "$BIN" attack "$G" 1000 >"$DIR/attack.log" 2>&1
    rc=$?
    grep -v 'ecx warn\|UCX  WARN' "$DIR/attack.log" | sed 's/^/    /'
    [ $rc -eq 0 ] || fail "$tls: the attacker got something (rc $rc)"
    alive "after the attack"
    consume 6 1 reverse done 10000 || fail "$tls: a READ after the attack"
    # A hostile producer's acks (issue 10 #3): mutated UCX bytes with a
    # valid digest never reach UCX's parsers and never crash the consumer.
    timeout 120 "$BIN" mutate "$DIR" "$G" 1000 >"$DIR/mutate.log" 2>&1 ||
        fail "$tls: mutated metadata (rc $?): $(tail -3 "$DIR/mutate.log")"
    grep -v 'ecx warn' "$DIR/mutate.log" | sed 's/^/    /'

    # UCX 1.13's own hole: its tcp transport writes a PUT wherever the
    # request says. The integrity check is what stands between that and
    # a wrong item marked ready.
    listener=$(sed -n 's/^listener //p' "$G")
    for port in $(ss -ltnp 2>/dev/null | grep "pid=$PROD," | awk '{print $4}' |
                  sed -n 's/^127\.0\.0\.1://p' | grep -vx "$listener"); do
        timeout 20 "$BIN" uct-put "$G" "$port" 57 | sed 's/^/    /'
    done
    consume 7 1 direct any 10000 || fail "$tls: g7"
    if grep -q '^g7 done' "$DIR/cons.log"; then
        echo "    (the raw UCT put did not land this time)"
    else
        grep -q '^g7 corrupt' "$DIR/cons.log" || fail "$tls: g7 after the raw put"
    fi

    # A producer stalled under load (issue 10 #4): 16 whole-region READs,
    # the producer stopped mid-flight (default) or before they reach it
    # (tcp), the consumer gives up after 3 s, and 12 s later the producer
    # resumes: it must live and serve.
    if [ $tls = tcp ]; then kill -STOP "$PROD"; fi
    timeout 60 "$BIN" consume "$DIR" "$G" 16 16 direct any 3000 >"$DIR/cons.log" 2>&1 &
    CONS=$!
    if [ $tls = default ]; then sleep 0.05; kill -STOP "$PROD"; fi
    wait $CONS
    rc=$?
    sed 's/^/    /' "$DIR/cons.log" | grep -v 'ecx warn' | sort | uniq -c | head -5
    [ $rc -eq 0 ] || [ $rc -eq 2 ] || fail "$tls: the stalled consumer (rc $rc)"
    sleep 9
    kill -CONT "$PROD"
    sleep 1
    alive "after SIGCONT"
    consume 8 1 direct done 10000 || fail "$tls: a READ after the stall"
    alive "after the stall"

    stop_producer "$tls"
    changed=$(grep '^block .* changed$' "$DIR/prod.log" | grep -v '^block 57 ' || true)
    [ -z "$changed" ] || fail "$tls: the region changed: $changed"
    echo "    producer: $(grep -c '^notif' "$DIR/prod.log") completions, region intact but for the raw UCT put"
done
echo "PASS"
