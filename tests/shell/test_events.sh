#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_events — encoder-cache events (issue 25, docs/EVENTS.md) with real
# processes: two producers and subscribers; saves, evictions and a restart
# arrive in order without gaps; late, restarted and slow subscribers end with
# exactly the producers' contents; a subscriber that never reads does not
# grow the producer; hostile replay requests get errors. tests/support/events_check.py
# does the work.
# usage: test_events.sh PATH_TO_EVENTS_PRODUCER PATH_TO_ECX SRC_DIR
set -u
. "$(dirname "$0")/lib.sh"
private_shm
# Three free port pairs (PUB on P, replay on P + 1) on loopback.
ports=$($PY - <<'PY'
import socket
out = []
while len(out) < 3:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", p + 1)); out.append(p)
    except OSError:
        pass
    s.close(); t.close()
print(*out)
PY
)
timeout 240 $PY "$(dirname "$0")/../support/events_check.py" "$1" "$2" "$3" $ports
