#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_curve — the opt-in CURVE control plane with real `ecx serve` / `ecx
# get` processes: keygen files and modes; an allowed consumer fetches
# byte-exact; a consumer outside the allow-list, one with the wrong server
# key and a plaintext one all fall back at once (HANDSHAKE, exit 3: the
# producer hangs up in the handshake), not after the ack timeout or, on
# version 2 (the defaults, used here), the 60 s per-item wait, and the
# producer counts the refusals; without an allow-list any consumer with the
# server key gets in; bad key files and option misuse exit 1 / 2; no key is
# ever printed.
# usage: test_curve.sh PATH_TO_ECX
set -u
ECX=$1
. "$(dirname "$0")/lib.sh"
private_shm
key_of() { grep -v '^#' "$1"; }

# keygen: two files, the secret 0600, never overwritten.

for k in p a b q; do expect 0 "wrote .*/$k.key" "keygen $k" -- "$ECX" keygen "$T/$k"; done
check "secret key mode 0600" '[ "$(stat -c %a "$T/p.key")" = 600 ]'
check "public key is 40 characters" '[ "$(key_of "$T/p.pub" | tr -d "\n" | wc -c)" = 40 ]'
check "public key matches the secret" '[ "$($PY -c "import zmq,sys; print(zmq.curve_public(sys.argv[1].encode()).decode())" "$(key_of "$T/p.key")")" = "$(key_of "$T/p.pub")" ]'
before=$(cat "$T/p.key")
expect 1 "not overwriting" "keygen refuses to overwrite" -- "$ECX" keygen "$T/p"
check "existing key untouched" '[ "$(cat "$T/p.key")" = "$before" ]'
expect 2 "OUT_PREFIX" "keygen without a prefix" -- "$ECX" keygen
expect 0 "" "keygen --help" -- "$ECX" keygen --help
check "keygen --help says what it writes" 'grep -q "OUT_PREFIX.key" "$T/cmd.stdout"'

# A producer with an allow-list holding a's key only.
{ echo "# consumers allowed in"; key_of "$T/a.pub"; echo; } >"$T/allow"
MPORT=$(free_port)
"$ECX" serve --listen 127.0.0.1:0 --synthetic 3:204800 --announce-out "$T/ann.json" \
  --metrics "127.0.0.1:$MPORT" --curve-secret "$T/p.key" --curve-allow "$T/allow" 2>"$T/serve.log" &
pids+=($!)
wait_file "$T/ann.json" || { echo "FAIL: serve did not start" >&2; cat "$T/serve.log" >&2; exit 1; }
mkdir -p "$T/o1" "$T/o2" "$T/o3" "$T/o4" "$T/o5"
expect 0 "3 fetched" "allowed consumer fetches" -- "$ECX" get --params "$T/ann.json" --out "$T/o1" \
  --verify-synthetic --curve-server-key "$T/p.pub" --curve-secret "$T/a.key"
check "3 files fetched" '[ "$(ls "$T/o1" | wc -l)" = 3 ]'
t0=$(date +%s)
expect 3 "HANDSHAKE" "consumer outside the allow-list falls back" -- "$ECX" get --params "$T/ann.json" \
  --out "$T/o2" --curve-server-key "$T/p.pub" --curve-secret "$T/b.key"
check "refusal is prompt (<= 5 s, not the 60 s per-item wait)" '[ $(( $(date +%s) - t0 )) -le 5 ]'
check "refused consumer wrote nothing" '[ -z "$(ls "$T/o2")" ]'
expect 3 "HANDSHAKE" "ephemeral key not in the allow-list falls back" -- "$ECX" get --params "$T/ann.json" \
  --out "$T/o2" --curve-server-key "$T/p.pub"
expect 3 "HANDSHAKE" "wrong server key falls back" -- "$ECX" get --params "$T/ann.json" \
  --out "$T/o3" --curve-server-key "$T/q.pub" --curve-secret "$T/a.key"
expect 3 "HANDSHAKE" "plaintext consumer gets nothing" -- "$ECX" get --params "$T/ann.json" \
  --out "$T/o4"
check "plaintext consumer wrote nothing" '[ -z "$(ls "$T/o4")" ]'
metrics=$(metrics_of "$MPORT")
fails=$(printf '%s\n' "$metrics" | awk '$1 == "ecx_producer_auth_failures_total" {print $2}')
check "refused handshakes counted (got '$fails')" '[ -n "$fails" ] && [ "$fails" -ge 2 ]'
check "grants only for the allowed consumer" 'printf "%s\n" "$metrics" | grep -qx "ecx_producer_grants_total 3"'
check "serve says CURVE is on" 'grep -q "control plane encrypted (CURVE), clients checked" "$T/serve.log"'

# Without an allow-list: any consumer with the server key, even with a fresh key.
"$ECX" serve --listen 127.0.0.1:0 --synthetic 1:98304 --announce-out "$T/ann2.json" \
  --curve-secret "$T/p.key" 2>"$T/serve2.log" &
pids+=($!)
wait_file "$T/ann2.json" || { echo "FAIL: serve 2 did not start" >&2; cat "$T/serve2.log" >&2; exit 1; }
expect 0 "1 fetched" "any consumer with the server key" -- "$ECX" get --params "$T/ann2.json" --out "$T/o5" \
  --verify-synthetic --curve-server-key "$T/p.pub"
expect 3 "HANDSHAKE" "wrong server key, no allow-list" -- "$ECX" get --params "$T/ann2.json" --out "$T/o5" \
  --curve-server-key "$T/q.pub"

# Bad files and options.
echo "not-a-key" >"$T/bad.key"
{ key_of "$T/a.pub"; key_of "$T/b.pub"; } >"$T/two.key"
: >"$T/empty"
expect 1 "cannot read" "missing secret file" -- "$ECX" serve --listen 127.0.0.1:0 --curve-secret "$T/nope.key"
expect 1 "line 1 is not a Z85" "malformed secret file" -- "$ECX" serve --listen 127.0.0.1:0 --curve-secret "$T/bad.key"
check "malformed key not echoed" '! grep -q "not-a-key" "$T/cmd.stderr"'
expect 1 "exactly one key" "two keys in a key file" -- "$ECX" serve --listen 127.0.0.1:0 --curve-secret "$T/two.key"
expect 1 "holds no key" "empty allow file" -- "$ECX" serve --listen 127.0.0.1:0 --curve-secret "$T/p.key" --curve-allow "$T/empty"
expect 1 "line 1 is not a Z85" "malformed allow file" -- "$ECX" serve --listen 127.0.0.1:0 --curve-secret "$T/p.key" --curve-allow "$T/bad.key"
expect 2 "needs --curve-secret" "allow-list without a secret" -- "$ECX" serve --listen 127.0.0.1:0 --curve-allow "$T/allow"
expect 2 "needs --curve-server-key" "get --curve-secret alone" -- "$ECX" get --params "$T/ann.json" --out "$T/o5" --curve-secret "$T/a.key"
expect 1 "not a Z85" "get with a malformed server key" -- "$ECX" get --params "$T/ann.json" --out "$T/o5" --curve-server-key "$T/bad.key"
expect 0 "" "serve --help" -- "$ECX" serve --help
check "serve --help documents --curve-allow" 'grep -q -- "--curve-allow FILE" "$T/cmd.stdout"'
expect 0 "" "get --help" -- "$ECX" get --help
check "get --help documents --curve-server-key" 'grep -q -- "--curve-server-key FILE" "$T/cmd.stdout"'

# No secret key in any log.
for k in p a b; do
  sec=$(key_of "$T/$k.key")
  check "secret $k never logged" '! grep -qF -- "$sec" "$T"/*.log "$T/cmd.stderr" "$T/cmd.stdout"'
done

finish
