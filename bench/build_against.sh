# SPDX-License-Identifier: Apache-2.0
# build_against.sh — sourced by the before/after scripts: build_against SRC NAME BEFORE AFTER DIR
# compiles bench/SRC (public API only) against each of two CMake build dirs' libecx.so, into
# DIR/NAME-before and DIR/NAME-after (each with its library's rpath). Returns 1 with a
# message when a build dir has no libecx.so or the compile fails.
build_against() {
  local src=$1 name=$2 dir side here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  for side in before after; do
    dir=$3; [ $side = after ] && dir=$4
    dir=$(cd "$dir" && pwd) || return 1
    [ -e "$dir/libecx.so" ] || { echo "$name: no libecx.so in $dir" >&2; return 1; }
    cc -O2 "$here/$src" -I"$here/../include" -L"$dir" -lecx -Wl,-rpath,"$dir" \
      -o "$5/$name-$side" || return 1
  done
}
