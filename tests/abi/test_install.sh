#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_install — what `make install` puts on a machine is usable on its own:
# `cmake --install` of this build tree into a temporary DESTDIR, then
# tests/abi/install_smoke.c built with only <ecx.h> and `pkg-config ecx` (no
# path into the source or build tree), against the shared library and
# against the static one, and run. When the CLI links libecx.so (CLI_SHARED
# 1), the installed `ecx` must need its SONAME (libecx.so.ECX_ABI_VERSION) and find it by its RPATH,
# and its `serve --data nixl` / `--data ucx` must find the installed
# ecx-nixl-agent / ecx-ucx-agent (a build without them installs neither).
# Then `make install` itself, as the README has it, into a fresh build dir
# and a DESTDIR: it installs the same files and builds only what it installs
# (no test or bench program in that build dir).
# usage: test_install.sh BUILD_DIR SMOKE_C CC CLI_SHARED(0|1) [SOURCE_DIR]
set -euo pipefail
BUILD=$1 SMOKE=$2 CC=$3 CLI_SHARED=$4 SRC=${5:-}
. "$(dirname "$0")/../shell/lib.sh"  # $T, bad, built, finish
private_shm  # the smoke program's regions go to $SHM
STAGE=$T/stage
# loads_installed_lib BINARY: ldd resolves its SONAME to the installed file.
loads_installed_lib() {
  local got
  got=$(ldd "$1" | awk -v n="$SONAME" '$1 == n { print $3 }')
  [ -n "$got" ] && [ "$(realpath "$got")" = "$(realpath "$LIBDIR/$SONAME")" ]
}

DESTDIR=$STAGE cmake --install "$BUILD" >"$T/install.log" ||
  { cat "$T/install.log" >&2; echo "FAIL: cmake --install" >&2; exit 1; }

# Where things went depends on the configured prefix and GNUInstallDirs.
pc=$(find "$STAGE" -name ecx.pc -path '*/pkgconfig/*' | head -1)
hdr=$(find "$STAGE" -name ecx.h | head -1)
so=$(find "$STAGE" -name 'libecx.so.*' -type f | head -1)
[ -n "$pc" ] && [ -n "$hdr" ] && [ -n "$so" ] || { echo "FAIL: ecx.pc, ecx.h or libecx.so.* not installed:" >&2; cat "$T/install.log" >&2; exit 1; }
LIBDIR=$(dirname "$so")
# The SONAME's number is the installed header's ECX_ABI_VERSION.
SONAME=libecx.so.$(sed -nE 's/^#define ECX_ABI_VERSION ([0-9]+)$/\1/p' "$hdr")
for f in libecx.so $SONAME libecx.a; do
  [ -e "$LIBDIR/$f" ] || bad "$LIBDIR/$f not installed"
done
[ "$(readlink "$LIBDIR/libecx.so")" = "$SONAME" ] || bad "libecx.so does not link to $SONAME"

# pkg-config reads the staged ecx.pc with nothing else set, as the README
# says (its prefix is relative to where it lies); and the same with the
# sysroot set, as for other staged packages.
export PKG_CONFIG_PATH=$(dirname "$pc")
[ "$(pkg-config --modversion ecx)" = "$(sed -nE 's/^#define ECX_VERSION_STRING "(.*)"/\1/p' "$hdr")" ] ||
  bad "ecx.pc version $(pkg-config --modversion ecx) differs from the installed ecx.h"
cflags=$(pkg-config --cflags ecx) libs=$(pkg-config --libs ecx)
echo "pkg-config --cflags --libs ecx: $cflags $libs"
case " $cflags $libs " in *" -I$STAGE"*" -L$STAGE"*) ;; *) bad "pkg-config flags do not point into the install: $cflags $libs" ;; esac
[ "$(PKG_CONFIG_SYSROOT_DIR=$STAGE pkg-config --cflags --libs ecx)" = "$(pkg-config --cflags --libs ecx)" ] ||
  bad "with PKG_CONFIG_SYSROOT_DIR the flags differ: $(PKG_CONFIG_SYSROOT_DIR=$STAGE pkg-config --cflags --libs ecx)"
# ecx.h includes only the C library's headers: no include path of a dependency.
for w in $cflags; do
  case $w in
    -I"$STAGE"*) ;;
    -I* | -isystem* | -idirafter* | /*) bad "pkg-config --cflags ecx adds $w (another package's include path)" ;;
  esac
done

# Strict user flags: the public header must compile cleanly in user code.
WARN=(-std=c11 -Wall -Wextra -Wpedantic -Werror)

# Shared: needs libecx.so.2, runs against the installed copy.
if $CC "${WARN[@]}" -o "$T/smoke" "$SMOKE" $cflags $libs 2>"$T/cc.log"; then
  readelf -d "$T/smoke" | grep NEEDED | grep -qF "[$SONAME]" || bad "smoke does not need $SONAME"
  LD_LIBRARY_PATH=$LIBDIR loads_installed_lib "$T/smoke" || bad "smoke does not load the installed $SONAME"
  LD_LIBRARY_PATH=$LIBDIR timeout 30 "$T/smoke" || bad "install_smoke (shared) failed"
else
  cat "$T/cc.log" >&2; bad "install_smoke does not build against the installed shared library"
fi

# Static: -lecx taken as libecx.a (-l:libecx.a), the deps from Requires.private.
# Debian's libzmq.pc lists a bare "libprotokit.a" in its static libs; if the
# plain --static line does not link, retry with only its options.
slibs=$(pkg-config --static --libs ecx | sed -E 's/(^| )-lecx( |$)/\1-l:libecx.a\2/')
if ! $CC "${WARN[@]}" -o "$T/smoke_static" "$SMOKE" $cflags $slibs 2>"$T/cc_static.log"; then
  slibs=$(for w in $slibs; do case $w in -*) printf '%s ' "$w" ;; esac; done)
  echo "note: pkg-config --static --libs ecx does not link as is ($(grep -m1 -iE 'error|cannot' "$T/cc_static.log" || true)); retrying with: $slibs"
  $CC "${WARN[@]}" -o "$T/smoke_static" "$SMOKE" $cflags $slibs 2>"$T/cc_static.log" ||
    { cat "$T/cc_static.log" >&2; bad "install_smoke does not build against the installed static library"; }
fi
if [ -x "$T/smoke_static" ]; then
  if readelf -d "$T/smoke_static" | grep -q 'NEEDED.*libecx'; then bad "smoke_static needs libecx.so"; fi
  timeout 30 "$T/smoke_static" >/dev/null || bad "install_smoke (static) failed"
fi

# A C++ user can include the header too (extern "C").
if command -v c++ >/dev/null; then
  echo '#include <ecx.h>
int main() { return ecx_version() == nullptr; }' >"$T/cxx.cc"
  c++ -std=c++11 -Wall -Wextra -Werror -fsyntax-only $cflags "$T/cxx.cc" || bad "ecx.h does not compile as C++"
fi

# The installed CLI.
cli=$(find "$STAGE" -path '*/bin/ecx' -type f | head -1)
if [ -z "$cli" ]; then
  bad "bin/ecx not installed"
elif [ "$CLI_SHARED" = 1 ]; then
  readelf -d "$cli" | grep NEEDED | grep -qF "[$SONAME]" || bad "installed ecx does not need $SONAME"
  # Found by its RPATH ($ORIGIN/../lib...), with no LD_LIBRARY_PATH.
  (unset LD_LIBRARY_PATH; loads_installed_lib "$cli") ||
    bad "installed ecx does not load the installed $SONAME: $(ldd "$cli" | grep libecx || echo 'not found')"
  env -u LD_LIBRARY_PATH "$cli" --help >/dev/null 2>&1 || bad "installed ecx --help failed"
else
  echo "note: the CLI is not linked against libecx.so yet (CLI_SHARED=0); its check is skipped"
fi

# The NIXL agent process's program, where the installed library looks for it
# (LIBEXECDIR/ecx, relative to LIBDIR; docs/NIXL.md §5): an installed
# `ecx serve --data nixl` starts it, with no ECX_NIXL_AGENT and no build tree.
agent=$(find "$STAGE" -path '*/libexec/ecx/ecx-nixl-agent' -type f | head -1)
if ! built nixl; then
  [ -z "$agent" ] || bad "ecx-nixl-agent installed by a build without the nixl path"
elif [ -z "$agent" ] || [ ! -x "$agent" ]; then
  bad "libexec/ecx/ecx-nixl-agent not installed"
elif [ -n "$cli" ] && [ "$CLI_SHARED" = 1 ]; then
  env -u LD_LIBRARY_PATH -u ECX_NIXL_AGENT "$cli" serve --data nixl --listen 127.0.0.1:0 \
    --block-bytes 64Ki >"$T/nixl.log" 2>&1 &
  spid=$!
  for _ in $(seq 100); do grep -q "offers the whole region" "$T/nixl.log" && break; sleep 0.1; done
  grep -q "offers the whole region" "$T/nixl.log" ||
    bad "installed ecx serve --data nixl did not start its NIXL agent process: $(head -c 400 "$T/nixl.log")"
  kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
fi

# The ucx path's UCX process (src/data/ucx/ucx_proc.h), found the same way: an
# installed `ecx serve --data ucx` starts only once it runs.
uagent=$(find "$STAGE" -path '*/libexec/ecx/ecx-ucx-agent' -type f | head -1)
if ! built ucx; then
  [ -z "$uagent" ] || bad "ecx-ucx-agent installed by a build without the ucx path"
elif [ -z "$uagent" ] || [ ! -x "$uagent" ]; then
  bad "libexec/ecx/ecx-ucx-agent not installed"
elif [ -n "$cli" ] && [ "$CLI_SHARED" = 1 ]; then
  env -u LD_LIBRARY_PATH -u ECX_UCX_AGENT "$cli" serve --data ucx --listen 127.0.0.1:0 \
    --block-bytes 64Ki --synthetic 1:64Ki --announce-out "$T/ucx.json" >"$T/ucx.log" 2>&1 &
  spid=$!
  for _ in $(seq 100); do [ -s "$T/ucx.json" ] && break; sleep 0.1; done
  [ -s "$T/ucx.json" ] ||
    bad "installed ecx serve --data ucx did not start its UCX process: $(head -c 400 "$T/ucx.log")"
  kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
fi

# `make install` into a fresh build dir: the same files, and nothing built that it does not
# install.
if [ -n "$SRC" ]; then
  # configured as this tree is: a build without UCX or NIXL installs no agent
  opts=
  built ucx || opts="$opts -DECX_WITH_UCX=OFF"
  built nixl || opts="$opts -DECX_WITH_NIXL=OFF"
  if make -C "$SRC" install BUILD="$T/mbuild" DESTDIR="$T/mstage" CMAKE_ARGS="$opts" >"$T/make.log" 2>&1; then
    (cd "$STAGE" && find . -type f | sort) >"$T/files.cmake"
    (cd "$T/mstage" && find . -type f | sort) >"$T/files.make"
    cmp -s "$T/files.cmake" "$T/files.make" ||
      bad "make install installs other files than cmake --install: $(diff "$T/files.cmake" "$T/files.make" | head -5 | tr '\n' ' ')"
    extra=$(find "$T/mbuild" -maxdepth 1 -type f -executable \( -name 'test_*' -o -name 'bench_*' -o -name 'fuzz_*' -o -name '*_peer' -o -name startup \) | head -3)
    [ -z "$extra" ] || bad "make install built what it does not install: $extra"
    [ -x "$T/mbuild/ecx" ] || bad "make install did not build the CLI"
    echo "make install: $(wc -l <"$T/files.make") files, as cmake --install; built $(find "$T/mbuild" -maxdepth 1 -type f -executable | wc -l) executable files"
  else
    tail -20 "$T/make.log" >&2; bad "make install failed"
  fi
fi

[ "$failed" = 0 ] && echo "install: ok ($LIBDIR)"
finish
