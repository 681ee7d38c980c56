#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_exports — libecx.so exports exactly the API include/ecx.h declares:
# the dynamic symbol table's defined names equal the names declared with
# ECX_API (no ecxi_ internals, nothing missing), the SONAME is
# libecx.so.ECX_ABI_VERSION, and the test-only fault backend is in neither
# the shared nor the static library.
# usage: test_exports.sh LIBECX_SO LIBECX_A ECX_H
set -euo pipefail
SO=$1 AR=$2 HDR=$3
T=$(mktemp -d /tmp/ecx-test-exports.XXXXXX)
trap 'rm -rf "$T"' EXIT
failed=0
bad() { failed=1; echo "FAIL: $*" >&2; }

# Declared: each ECX_API declaration, joined up to its ';' (declarations
# span lines), cut at the first '(' (or '[' / ';' for data); the identifier
# left at the end is the name.
awk '/^ECX_API[ \t]/ { d = ""; on = 1 }
     on { d = d " " $0; if (index($0, ";")) { on = 0; print d } }' "$HDR" |
  sed -E 's/[([;].*//; s/.*[^A-Za-z0-9_]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*$/\1/' |
  sort -u >"$T/declared"
# One name per ECX_API line, or the parse above went wrong.
n_api=$(grep -c '^ECX_API[[:space:]]' "$HDR" || true)
[ "$n_api" -gt 0 ] || bad "no ECX_API declarations found in $HDR"
[ "$(wc -l <"$T/declared")" = "$n_api" ] ||
  bad "parsed $(wc -l <"$T/declared") names from $n_api ECX_API declarations"

# Exported: defined dynamic symbols (functions and data; 'A' marks
# linker-made absolute symbols, not ours).
nm -D --defined-only "$SO" | awk 'NF == 3 && $2 != "A" { sub(/@.*/, "", $3); print $3 }' |
  sort -u >"$T/exported"

if ! cmp -s "$T/declared" "$T/exported"; then
  bad "exported symbols differ from ecx.h's ECX_API declarations"
  comm -23 "$T/declared" "$T/exported" | sed 's/^/  declared, not exported: /' >&2
  comm -13 "$T/declared" "$T/exported" | sed 's/^/  exported, not declared: /' >&2
fi
if grep -q '^ecxi_' "$T/exported"; then
  bad "internal symbols exported: $(grep '^ecxi_' "$T/exported" | head -5 | tr '\n' ' ')"
fi

# SONAME: libecx.so.<ECX_ABI_VERSION from the header>.
abi=$(sed -nE 's/^#define ECX_ABI_VERSION[[:space:]]+([0-9]+).*/\1/p' "$HDR")
soname=$(readelf -d "$SO" | sed -nE 's/.*\(SONAME\).*\[(.*)\].*/\1/p')
[ -n "$abi" ] || bad "no ECX_ABI_VERSION in $HDR"
[ "$soname" = "libecx.so.$abi" ] || bad "SONAME is '$soname', want libecx.so.$abi"

# The fault backend (tests/support/data_fault.c) is for tests only.
if nm "$SO" 2>/dev/null | grep -q 'ecxi_data_fault'; then
  bad "libecx.so contains the test-only fault backend (ecxi_data_fault*)"
fi
if ar t "$AR" | grep -q 'data_fault'; then
  bad "libecx.a contains the test-only fault backend (data_fault.o)"
fi

echo "declared $(wc -l <"$T/declared"), exported $(wc -l <"$T/exported"), soname $soname"
exit $failed
