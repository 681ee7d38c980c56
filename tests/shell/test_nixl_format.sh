#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# NIXL's formats against the real nixl package: tests/nixl/nixl_blobs.py
# writes agent metadata (real agents, UCX with its default transports and
# with tcp only) and vLLM's descriptor lists (msgspec), then
# test_nixl_format checks src/data/nixl/nixl_format.c against them.
# usage: test_nixl_format.sh TEST_BINARY BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1
. "$here/../nixl/find_python.sh" "$2"
tmp=$(mktemp -d /tmp/ecx-nixl-format.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
timeout 120 "$NIXL_PY" "$here/../nixl/nixl_blobs.py" "$tmp/default.json" 2>"$tmp/log1" ||
  { cat "$tmp/log1" >&2; exit 1; }
UCX_TLS=tcp timeout 120 "$NIXL_PY" "$here/../nixl/nixl_blobs.py" "$tmp/tcp.json" 2>"$tmp/log2" ||
  { cat "$tmp/log2" >&2; exit 1; }
"$bin" "$tmp/default.json" "$tmp/tcp.json"
