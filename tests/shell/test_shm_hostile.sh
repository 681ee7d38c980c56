#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_shm_hostile — the same-host path against hostile producers and
# consumers, real processes (issue 9): the consumer reads nothing but the
# region the producer at the other end of its socket hands over, and no
# producer can make it die of a signal.
#   - metadata naming another (real) producer's socket: that producer knows
#     no grant with our token, so it refuses; the READ fails, no byte written
#   - a socket that passes a FIFO, /dev/zero, a directory, a too-small file:
#     refused at fstat, no byte written, and the FIFO named as the region
#     path is never opened (the consumer would hang on it)
#   - a region file truncated after the first item: the next READ fails,
#     no SIGBUS, and neither does faulting in the rest of the mapping
#     (the background pre-fault) over the truncated file
#   - a sparse 2 GiB memfd offered as the region: the pre-fault maps only
#     what the file holds, so the consumer's RssShmem stays within 64 MiB;
#     a real region is still pre-faulted whole
#   - a connection that said nothing for too long is closed by the producer;
#     the consumer's first READ then connects again and succeeds
#   - a byte flipped in the producer's region after commit: CORRUPT
#   - a consumer of another uid: refused (and counted) by the producer;
#     our own consumer of another uid does not take this path at all
# usage: test_shm_hostile.sh PATH_TO_SHM_HOSTILE
set -u
H=$1
. "$(dirname "$0")/lib.sh"
private_shm

start() { # start NAME ARGS...: a background process logging to $T/NAME.log
  local name=$1; shift
  "$H" "$@" 2>"$T/$name.log" &
  pids+=($!)
}

start A produce "$SHM" "$T/A.ack"
start B produce "$SHM" "$T/B.ack"
wait_file "$T/A.ack" && wait_file "$T/B.ack" || { echo "FAIL: producers did not start" >&2; cat "$T"/*.log >&2; exit 1; }

expect 0 "" "a clean fetch, twice on one connection, the mapping faulted in between" -- \
  "$H" consume "$SHM" "$T/A.ack" done settle warm done
expect 0 "" "a first READ after the producer dropped our silent connection" -- \
  "$H" consume "$SHM" "$T/A.ack" pause done
check "A closed the silent connection" 'grep -q "presented no grant in 2000 ms" "$T/A.log"'
expect 0 "" "A's grant at B's socket: refused, nothing written" -- \
  "$H" consume "$SHM" "$T/A.ack" --sock-of "$T/B.ack" refused refused
check "B counted the refusal" 'grep -q "refused a connection that holds no live grant" "$T/B.log"'

declare -A why=([fifo]="not a regular file" [devzero]="not a regular file" \
  [dir]="not a regular file" [small]="smaller than its region")
for kind in fifo devzero dir small; do
  mkdir -p "$SHM/$kind"
  start "fake-$kind" fake "$SHM/$kind" "$kind" "$T/$kind.ack"
  wait_file "$T/$kind.ack" || { bad "fake $kind did not start"; continue; }
  expect 0 "refused the producer's descriptor: ${why[$kind]}" "a passed $kind is refused" -- \
    "$H" consume "$SHM" "$T/$kind.ack" refused
done

# A same-uid producer offers a 2 GiB memfd with nothing in it: the consumer's
# background pre-fault maps what the file holds (nothing), never 2 GiB of
# holes, which it would have to allocate.
start fake-sparse fake "$SHM" sparse "$T/sparse.ack"
wait_file "$T/sparse.ack" || bad "fake sparse did not start"
expect 0 "" "a sparse 2 GiB region: its holes are not faulted in" -- \
  "$H" consume "$SHM" "$T/sparse.ack" corrupt settle bounded

start C produce "$SHM" "$T/C.ack" truncate
wait_file "$T/C.ack" || { echo "FAIL: producer C did not start" >&2; exit 1; }
expect 0 "" "region truncated after the first item: the next READ fails, no signal" -- \
  "$H" consume "$SHM" "$T/C.ack" done pause settle failed failed
check "C did truncate its region" 'grep -q "truncated to one block: yes" "$T/C.log"'

region=$(sed -n 4p "$T/A.ack")
$PY - "$region" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(300001); b = f.read(1); f.seek(300001); f.write(bytes([b[0] ^ 0x01]))
PY
expect 0 "do not match its checksum" "a byte flipped after commit: CORRUPT" -- \
  "$H" consume "$SHM" "$T/A.ack" corrupt

if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  chmod 755 "$T" && chmod 644 "$T/A.ack"
  expect 0 "" "a raw consumer of another uid gets no descriptor" -- "${nobody[@]}" "$H" raw "$T/A.ack"
  check "A refused and counted it" 'grep -q "refused a connection from uid 65534 (not ours); 1 refused so far" "$T/A.log"'
  mkdir -p "$SHM/nobody" && chown 65534:65534 "$SHM/nobody" && chmod 755 "$SHM"
  expect 0 "" "our consumer of another uid does not take the shm path" -- \
    "${nobody[@]}" "$H" consume "$SHM/nobody" "$T/A.ack" nopath
else
  echo "SKIP: consumers of another uid (needs root and setpriv)"
fi
check "every producer is still alive" 'for p in "${pids[@]}"; do kill -0 $p || exit 1; done'
finish
