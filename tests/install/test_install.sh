#!/usr/bin/env bash
# Installs a built flashgen into a scratch prefix (cmake --install) and into a Debian package (cpack -G DEB,
# unpacked with dpkg-deb into a scratch root), then builds tests/install/consumer against each with CMake's
# find_package and the C program with pkg-config, and runs them and the installed CLI (no GPU needed).
#   test_install.sh BUILD_DIR WORK_DIR
set -euo pipefail

build_dir=$(cd "$1" && pwd)
work=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build_dir/CMakeCache.txt")
rm -rf "$work" && mkdir -p "$work"

say() { printf '==> %s\n' "$*"; }
fail() { printf 'test_install.sh: FAILED: %s\n' "$*" >&2; exit 1; }

# The installed CLI finds its library through its RPATH ($ORIGIN/../lib), with no LD_LIBRARY_PATH.
check_cli() {
  local cli=$1
  local printed
  printed=$(env -u LD_LIBRARY_PATH "$cli" --version) || fail "$cli --version did not run"
  [[ $printed == "flashgen $version" ]] || fail "$cli --version printed '$printed', expected 'flashgen $version'"
  # ldd's output is read whole before matching: with pipefail, `ldd | grep -q` fails whenever grep exits at its
  # match before ldd has written the rest (SIGPIPE).
  local linked
  linked=$(ldd "$cli" | grep libflashgen.so || true)
  [[ $linked == *" => $(dirname "$(dirname "$cli")")/"* ]] ||
    fail "$cli does not load the libflashgen beside it: ${linked:-ldd lists no libflashgen}"
}

# Builds and runs the consumer against the flashgen installed under $1 (the C program must print the version).
check_consumer() {
  local prefix=$1 name=$2
  cmake -S "$here/consumer" -B "$work/consumer-$name" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
    > "$work/consumer-$name.log" || { cat "$work/consumer-$name.log"; fail "configuring the consumer ($name)"; }
  cmake --build "$work/consumer-$name" -j2 >> "$work/consumer-$name.log" 2>&1 ||
    { cat "$work/consumer-$name.log"; fail "building the consumer ($name)"; }
  local printed
  printed=$("$work/consumer-$name/consumer_c") || fail "consumer_c ($name) failed"
  [[ $printed == "$version" ]] || fail "consumer_c ($name) printed '$printed', expected '$version'"
  "$work/consumer-$name/consumer_cpp" > /dev/null || fail "consumer_cpp ($name)"
  say "consumer built with find_package(flashgen) against $name ran"

  local pc_dir
  pc_dir=$(dirname "$(find "$prefix" -name flashgen.pc | head -1)")
  [[ $(PKG_CONFIG_PATH=$pc_dir pkg-config --modversion flashgen) == "$version" ]] || fail "pkg-config version ($name)"
  # shellcheck disable=SC2046  # pkg-config's output is meant to be split into arguments
  cc -o "$work/consumer-pc-$name" "$here/consumer/consumer.c" $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs flashgen) ||
    fail "compiling with pkg-config ($name)"
  printed=$(LD_LIBRARY_PATH=$(PKG_CONFIG_PATH=$pc_dir pkg-config --variable=libdir flashgen) "$work/consumer-pc-$name") ||
    fail "the pkg-config consumer ($name) failed"
  [[ $printed == "$version" ]] || fail "the pkg-config consumer ($name) printed '$printed', expected '$version'"
  say "consumer built with pkg-config against $name ran"
}

say "cmake --install $build_dir --prefix $work/prefix"
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }
soname=$(objdump -p "$work/prefix/lib/libflashgen.so" | sed -n 's/^ *SONAME *//p')
[[ $soname == "libflashgen.so.${version%.*}" ]] || fail "SONAME is '$soname', expected libflashgen.so.${version%.*}"
[[ -f $work/prefix/include/flashgen/flashgen.h && -f $work/prefix/include/flashgen/dispatch/dispatch.hpp ]] ||
  fail "headers missing from the prefix"
check_cli "$work/prefix/bin/flashgen"
check_consumer "$work/prefix" prefix

say "cpack -G DEB"
(cd "$work" && cpack -G DEB --config "$build_dir/CPackConfig.cmake" > "$work/cpack.log") || { cat "$work/cpack.log"; fail "cpack"; }
deb=$(find "$work" -maxdepth 1 -name "flashgen_${version}_*.deb")
[[ -n $deb ]] || fail "no flashgen_${version}_*.deb made"
[[ $(dpkg-deb -f "$deb" Package) == flashgen && $(dpkg-deb -f "$deb" Version) == "$version" ]] ||
  fail "the package's control fields: $(dpkg-deb -f "$deb")"
dpkg-deb -x "$deb" "$work/root"
check_cli "$work/root/usr/bin/flashgen"
check_consumer "$work/root/usr" deb
say "install test passed ($(basename "$deb"))"
