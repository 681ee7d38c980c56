#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_huge_pages — regions on a tmpfs that has huge pages are backed by
# them, and a consumer's fetch through such a region is byte-exact (the
# cold-fetch-at-memory-speed setup of issue 12; README "Limits"). For each
# of huge=always and huge=advise (the latter relies on the creator's
# MADV_HUGEPAGE before it populates), a private tmpfs is mounted, ECX_SHM_DIR
# points at it, `ecx serve --synthetic` produces and `ecx get
# --verify-synthetic` fetches; the producer's mapping of its region must be
# PMD-mapped throughout (smaps ShmemPmdMapped). No timings are checked.
# Needs root (to mount) and a kernel with transparent huge pages for shmem:
# exits 77 (skipped) otherwise.
# usage: test_huge_pages.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to mount a tmpfs"
THP=/sys/kernel/mm/transparent_hugepage
[ -d "$THP" ] || skip "no transparent huge pages in this kernel"
grep -q '\[deny\]' "$THP/shmem_enabled" 2>/dev/null && skip "shmem huge pages denied system-wide"

MNT=$(mktemp -d /tmp/ecx-huge.XXXXXX)
mounted=
# Processes go first (they hold the mount), then the mount, then lib.sh's
# cleanup of $T.
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
      [ -n "$mounted" ] && { umount "$MNT" 2>/dev/null || umount -l "$MNT"; }
      rmdir "$MNT" 2>/dev/null; cleanup' EXIT

HPAGE=$(cat "$THP/hpage_pmd_size" 2>/dev/null || echo 2097152)
COUNT=4
BYTES=$((2 * HPAGE)) # items of whole huge pages: the region is too
fallbacks() { awk '$1 == "thp_file_fallback" { print $2 }' /proc/vmstat; }

# kB of the region file's mapping in process $1: "SIZE PMDMAPPED". The
# creator mapped it under its temporary name, since unlinked: smaps shows
# "<dir>/ecx_..._0.mmap.tmp.<pid>.<hex> (deleted)".
region_kb() {
  awk -v dir="$MNT/" '
    /^[0-9a-f]+-[0-9a-f]+ / { inr = (index($6, dir) == 1 && $6 ~ /\.mmap(\.tmp\.|$)/); next }
    inr && $1 == "Size:" { size += $2 }
    inr && $1 == "ShmemPmdMapped:" { pmd += $2 }
    END { print size + 0, pmd + 0 }' "/proc/$1/smaps"
}

for mode in always advise; do
  mount -t tmpfs -o "size=256M,huge=$mode,mode=0700" tmpfs "$MNT" 2>"$T/mount.err" ||
    skip "cannot mount a huge=$mode tmpfs: $(cat "$T/mount.err")"
  mounted=1
  export ECX_SHM_DIR=$MNT
  fb0=$(fallbacks)
  rm -f "$T/ann.json"
  "$ECX" serve --listen 127.0.0.1:0 --synthetic "$COUNT:$BYTES" --block-bytes 1Mi \
    --announce-out "$T/ann.json" 2>"$T/serve.log" &
  spid=$!
  pids+=($spid)
  if ! wait_file "$T/ann.json"; then
    bad "huge=$mode: serve did not start: $(head -c 300 "$T/serve.log")"
  else
    read -r size pmd < <(region_kb "$spid")
    want=$((COUNT * BYTES / 1024))
    if [ "$pmd" = 0 ] && [ "$(fallbacks)" != "$fb0" ]; then
      kill -9 "$spid"; wait "$spid" 2>/dev/null
      skip "huge=$mode: the kernel had no huge page free (thp_file_fallback rose)"
    fi
    check "huge=$mode: region mapped ($size kB, want $want)" '[ "$size" = "$want" ]'
    check "huge=$mode: region PMD-mapped throughout ($pmd of $size kB)" '[ "$size" -gt 0 ] && [ "$pmd" = "$size" ]'
    mkdir -p "$T/out-$mode"
    expect 0 "" "huge=$mode: get --verify-synthetic" -- "$ECX" get --params "$T/ann.json" \
      --out "$T/out-$mode" --block-bytes 1Mi --verify-synthetic
    n=$(ls "$T/out-$mode" | wc -l)
    check "huge=$mode: $COUNT items written (got $n)" '[ "$n" = "$COUNT" ]'
    for f in "$T/out-$mode"/*; do
      s=$(stat -c %s "$f")
      check "huge=$mode: $(basename "$f") is $BYTES bytes (got $s)" '[ "$s" = "$BYTES" ]'
    done
    kill -INT "$spid"
    wait "$spid"
    rc=$?
    check "huge=$mode: serve exits 0 on SIGINT (got $rc)" '[ $rc = 0 ]'
    check "huge=$mode: region file removed" '[ -z "$(ls "$MNT" | grep "\.mmap$")" ]'
  fi
  pids=()
  umount "$MNT" || umount -l "$MNT"
  mounted=
done
finish
