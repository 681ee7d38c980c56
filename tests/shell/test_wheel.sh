#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make wheel-test (issue 24): the self-contained binary wheel on a machine that
# has none of ecx's libraries.
#   tests/shell/test_wheel.sh BUILD_DIR
# 1. scripts/wheel.sh BUILD_DIR/wheel: sdist, wheel, auditwheel repair; prints
#    `auditwheel show`, the wheel's tag and size and every library inside.
# 2. A fresh venv, BUILD_DIR/wheel/venv, with that wheel (and pytest, numpy).
# 3. In a private mount namespace (unshare --mount, so root) the system's copy
#    of every library the wheel carries (and of msgpack-c) and UCX's module
#    directory are covered by an empty file / directory, then, from the venv:
#    every ELF file of the installed package resolves its libraries (ldd) only
#    inside the package or among the manylinux policy's system libraries;
#    `ecx --help`; a ucx transfer that loads UCX's modules from the wheel
#    (cma, ib and rdmacm; with the host's rdma-core hidden too, only cma);
#    `ecx serve --data nixl` with its helper ecx-nixl-agent running on the
#    wheel's libraries; python/tests (pytest); `python -m ecx demo`. Then, in
#    a namespace where ecx's own libraries are hidden and where a python with
#    the real nixl package exists (tests/nixl/find_python.sh, the venv make
#    unit builds), tests/shell/test_nixl_serve.sh and test_nixl_peer_ucx.sh
#    (its agent on the nixl wheel's UCX) on the wheel's CLI.
# 4. The sdist on a machine without the -dev packages (pkg-config finds
#    nothing): pip stops with the message naming the Debian packages.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

if [ "${1:-}" = --hidden ]; then
  # ---- inside a mount namespace: $2 what to run (checks, nixl), $3 the wheel
  # dir, $4 the venv, $5 the build dir --------------------------------------
  what=$2 w=$3 venv=$4 build=$5
  fails=0
  fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
  pass() { echo "ok: $*"; }
  : >"$w/empty"
  mkdir -p "$w/emptydir"
  while IFS= read -r f; do
    if [ -d "$f" ]; then mount --bind "$w/emptydir" "$f"; else mount --bind "$w/empty" "$f"; fi
  done <"$w/hide-$what.txt"
  if [ "$what" = nixl ]; then
    # A real nixl agent against the wheel's `ecx serve --data nixl` (needs the
    # venv tests/nixl/venv.sh builds, which make unit makes; else said and skipped).
    # Then the same two ways and back with the wheel's agent on the nixl wheel's UCX.
    for t in test_nixl_serve test_nixl_peer_ucx; do
      rc=0
      bash "$here/$t.sh" "$venv/bin/ecx" "$build" >"$w/$t.out" 2>&1 || rc=$?
      case $rc in
        0) pass "$t.sh on the wheel's CLI, ecx's libraries hidden";;
        77) echo "SKIPPED: $t.sh: $(tail -1 "$w/$t.out")"; exit 0;;
        *) fail "$t.sh on the wheel's CLI: $(tail -15 "$w/$t.out")"; exit 1;;
      esac
    done
    exit 0
  fi
  # The hiding works: the system's loader finds no libzmq, python3-zmq fails.
  if /usr/bin/python3 -c 'import ctypes; ctypes.CDLL("libzmq.so.5")' 2>/dev/null ||
     /usr/bin/python3 -c 'import ctypes; ctypes.CDLL("libucp.so.0")' 2>/dev/null; then
    echo "FAIL: the system's libzmq / libucp still load: nothing is hidden"; exit 1
  fi
  pass "the system's copies are hidden ($(wc -l <"$w/hide-checks.txt") files and directories)"

  py=$venv/bin/python
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
  # Every ELF file of the package: each library ldd resolves is inside the
  # package, or a system library the wheel's manylinux policy allows.
  tag=$(basename "$(ls "$w"/wheelhouse/ecx-*.whl)" .whl); tag=${tag##*-}; tag=${tag%%.*}
  allowed=$("$w/tools/bin/python" - "$tag" <<'EOF'
import importlib.resources, json, sys
tag = sys.argv[1].rsplit("_", 1)[0] if not sys.argv[1].startswith("manylinux_") else \
      "_".join(sys.argv[1].split("_")[:3])
pols = json.loads((importlib.resources.files("auditwheel.policy") / "manylinux-policy.json").read_text())
pol = [p for p in pols if p["name"] == tag or tag in p["aliases"]]
if not pol:
    sys.exit(f"no manylinux policy {tag!r}")
print(" ".join(pol[0]["lib_whitelist"]))
EOF
) || { echo "FAIL: the policy's library list: $allowed"; exit 1; }
  # rdma-core, which the ib and rdmacm modules may take from the host: its
  # libraries and what they link.
  rdma="libibverbs.so.1 librdmacm.so.1 libmlx5.so.1 $(xargs ldd <"$w/rdma.txt" |
    awk '$2 == "=>" { print $1 }' | sort -u | tr '\n' ' ')"
  n=0 before=$fails
  while IFS= read -r -d '' f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
    n=$((n + 1))
    out=$(ldd "$f" 2>&1) || { fail "ldd $f: $out"; continue; }
    while read -r lib arrow path _; do
      [ "$arrow" = "=>" ] || continue
      [ "$path" = not ] && { fail "${f#"$site"/}: $lib not found"; continue; }
      case "$path" in
        "$site"/ecx/* | "$site"/ecx.libs/*) ;;
        *) case " $allowed " in
             *" $lib "*) ;;
             *) case "${f#"$site"/}: $rdma " in  # the host's rdma-core (scripts/wheel.sh)
                  ecx.libs/ucx/libuct_ib.*" $lib "* | ecx.libs/ucx/libuct_rdmacm.*" $lib "*) ;;
                  *) fail "${f#"$site"/}: $lib => $path";;
                esac;;
           esac;;
      esac
    done <<<"$out"
  done < <(find "$site/ecx" "$site/ecx.libs" -type f -print0)
  [ "$n" -ge 5 ] || fail "only $n ELF files in the package"
  [ $fails -eq "$before" ] && pass "ldd: $n ELF files resolve inside the package, to the policy's libraries ($allowed) or, UCX's ib and rdmacm modules, to rdma-core"

  # The CLI from the venv's script.
  "$venv/bin/ecx" --help >"$w/help.out" 2>&1 && grep -q "usage: ecx" "$w/help.out" \
    && pass "ecx --help" || fail "ecx --help: $(head -5 "$w/help.out")"

  # A ucx transfer; UCX's modules come from the wheel (the system's directory is
  # empty): all of them with the host's rdma-core, only cma without it (hidden
  # in a nested namespace), and the transfer works either way.
  cat >"$w/ucx_check.py" <<'EOF'
import ecx, os, sys
site, want = sys.argv[1], sys.argv[2].split(",")


def maps_of(pid):
    return [l.split()[-1] for l in open(f"/proc/{pid}/maps").read().splitlines() if "/" in l]


def agents():  # this process's ecx-ucx-agent children: UCX runs there, not here
    out = []
    for d in os.listdir("/proc"):
        try:
            if not d.isdigit():
                continue
            ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid() and os.readlink(f"/proc/{d}/exe") == f"{site}/ecx/ecx-ucx-agent":
                out.append(d)
        except OSError:
            pass
    return out


with ecx.Context("producer", listen="127.0.0.1:0", data="ucx") as p, \
     ecx.Context("consumer", data="ucx") as c:
    data = os.urandom(366 * 8192)  # whole 8 KiB blocks: the default, protocol version 2
    p.save("w1", data)
    ann = p.announce("w1")
    for _ in range(500):
        r = c.fetch("w1", ann)
        if r.state != "pending":
            break
        c.poll(10)
    assert r.state == "ready", r
    assert c.read("w1") == data
    helpers = agents()
    assert len(helpers) == 2, helpers  # the producer's and the consumer's
    maps = [m for h in helpers for m in maps_of(h)]
assert not [m for m in maps_of("self") if os.path.basename(m).startswith("libuc")], "UCX in the engine"
mods = {m for m in maps if "/ucx/libuct_" in m}
assert mods == {f"{site}/ecx.libs/ucx/libuct_{m}.so.0.0.0" for m in want}, mods
ucx = {m for m in maps if os.path.basename(m).startswith("libuc")}
assert all(m.startswith(site + "/ecx.libs/") for m in ucx), ucx
print("ucx transfer ok; its ecx-ucx-agent helpers run UCX from",
      " ".join(sorted({os.path.basename(m) for m in ucx})))
EOF
  if "$py" "$w/ucx_check.py" "$site" cma,ib,rdmacm >"$w/ucx.out" 2>&1; then
    pass "with rdma-core: $(tail -1 "$w/ucx.out")"
  else fail "ucx from the wheel, with rdma-core: $(tail -5 "$w/ucx.out")"; fi
  if unshare --mount bash -c 'while IFS= read -r f; do mount --bind "$1/empty" "$f"; done <"$1/rdma.txt"
       exec "$2" "$1/ucx_check.py" "$3" cma' _ "$w" "$py" "$site" >"$w/ucx-nordma.out" 2>&1; then
    pass "without rdma-core: $(tail -1 "$w/ucx-nordma.out")"
  else fail "ucx from the wheel, without rdma-core: $(tail -5 "$w/ucx-nordma.out")"; fi

  # ecx serve --data nixl starts its helper, ecx-nixl-agent from the package,
  # which runs on the wheel's UCX.
  mkdir -p "$w/items" && head -c $((12 * 8192)) /dev/urandom >"$w/items/item"
  rm -f "$w/ann.json"
  "$venv/bin/ecx" serve --data nixl --preload "$w/items" --listen 127.0.0.1:0 \
    --announce-out "$w/ann.json" >"$w/serve.log" 2>&1 &
  spid=$!
  for _ in $(seq 100); do [ -s "$w/ann.json" ] && break; kill -0 $spid 2>/dev/null || break; sleep 0.1; done
  helper=$(pgrep -P $spid -x ecx-nixl-agent || true)
  if [ -s "$w/ann.json" ] && grep -q '"item"' "$w/ann.json" && [ -n "$helper" ] &&
     [ "$(readlink "/proc/$helper/exe")" = "$site/ecx/ecx-nixl-agent" ] &&
     grep -q "$site/ecx.libs/libucp-" "/proc/$helper/maps"; then
    pass "ecx serve --data nixl: helper $site/ecx/ecx-nixl-agent runs on the wheel's UCX"
  else
    fail "ecx serve --data nixl and its helper: $(tail -5 "$w/serve.log")"
  fi
  kill $spid 2>/dev/null; wait $spid 2>/dev/null || true

  # The package's tests, as make pytest runs them, but against the wheel.
  (cd "$root/python/tests" && timeout 900 "$py" -m pytest -q -p no:cacheprovider .) \
    && pass "python/tests" || fail "python/tests"
  timeout 600 "$py" -m ecx demo >"$w/demo.out" 2>&1 && pass "python -m ecx demo" \
    || fail "python -m ecx demo: $(tail -20 "$w/demo.out")"
  tail -12 "$w/demo.out"

  [ $fails -eq 0 ] || { echo "wheel-test: $fails failed"; exit 1; }
  exit 0
fi

# ---- outside: build, repair, install -----------------------------------------
[ $# -eq 1 ] || { echo "usage: tests/shell/test_wheel.sh BUILD_DIR" >&2; exit 2; }
mkdir -p "$1"
build=$(cd "$1" && pwd)
w=$build/wheel
[ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null ||
  { echo "wheel-test: needs root and unshare (util-linux) to hide the system's libraries" >&2; exit 1; }

bash "$root/scripts/wheel.sh" "$w" /usr/bin/python3
whl=$(ls "$w"/wheelhouse/ecx-*.whl)
PATH=$w/tools/bin:$PATH auditwheel show "$whl"
echo "== wheel: $(basename "$whl"), $(stat -c %s "$whl") bytes"
echo "== libraries inside:"
"$w/tools/bin/python" - "$whl" <<'EOF'
import sys, zipfile
for i in zipfile.ZipFile(sys.argv[1]).infolist():
    if ".so" in i.filename:
        print(f"  {i.filename}  {i.file_size}")
EOF

venv=$w/venv
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check pytest numpy
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$whl"

# What to hide: for the checks, the system's file of every library the wheel
# carries (its name there without auditwheel's -HASH); for them and for the
# nixl test, the C libraries ecx links and UCX's modules (only those there: the
# nixl agent's side is the system's python, whose ctypes needs libffi, which the
# wheel carries too, for gnutls).
libdir=$(pkg-config --variable=libdir libzmq)
{
  for l in libzmq libsodium libucp libuct libucs libucm libjansson libmsgpackc libxxhash libmicrohttpd; do
    for f in "$libdir/$l".so.*; do [ -e "$f" ] && realpath "$f"; done
  done
  echo "$libdir/ucx"
} | sort -u >"$w/hide-nixl.txt"
{
  cat "$w/hide-nixl.txt"
  for n in $("$w/tools/bin/python" -c 'import re, sys, zipfile
for f in zipfile.ZipFile(sys.argv[1]).namelist():
    if re.fullmatch(r"ecx\.libs/[^/]+\.so[.0-9]*", f):
        print(re.sub(r"-[0-9a-f]{8}\.", ".", f.split("/")[1], count=1))' "$whl"); do
    [ -e "$libdir/$n" ] || { echo "wheel-test: no $libdir/$n to hide" >&2; exit 1; }
    realpath "$libdir/$n"
  done
} | sort -u >"$w/hide-checks.txt"
for l in libibverbs.so.1 librdmacm.so.1 libmlx5.so.1; do realpath "$libdir/$l"; done >"$w/rdma.txt"

failed=0
unshare --mount --propagation private bash "$0" --hidden checks "$w" "$venv" "$build" || failed=1
unshare --mount --propagation private bash "$0" --hidden nixl "$w" "$venv" "$build" || failed=1

# The sdist where no -dev package is found: one message naming them, before any compiler.
sdist=$(ls "$w"/dist/ecx-*.tar.gz)
mkdir -p "$w/nopc"
if PKG_CONFIG_LIBDIR=$w/nopc PKG_CONFIG_PATH= "$venv/bin/python" -m pip wheel --no-deps \
     --disable-pip-version-check -w "$w/nopc" "$sdist" >"$w/nopc.log" 2>&1; then
  echo "FAIL: the sdist built without any -dev package"; exit 1
fi
# (UCX is optional: not found, ECX_WITH_UCX is off, so it is not among them.)
for p in libzmq3-dev libmsgpack-dev libsodium-dev libjansson-dev libxxhash-dev libmicrohttpd-dev; do
  grep -q "  $p (pkg-config: " "$w/nopc.log" || { echo "FAIL: sdist without -dev packages: no '$p' in:"; tail -30 "$w/nopc.log"; exit 1; }
done
if grep -qE "error: .*\.h: No such file|fatal error:" "$w/nopc.log"; then
  echo "FAIL: the sdist without -dev packages reached the compiler"; exit 1
fi
echo "ok: the sdist without -dev packages stops naming them:"
grep -A9 "C libraries missing" "$w/nopc.log" | head -10
[ $failed -eq 0 ] || { echo "wheel-test: FAILED (above)"; exit 1; }
echo "wheel-test: PASS ($(basename "$whl"), $(stat -c %s "$whl") bytes)"
