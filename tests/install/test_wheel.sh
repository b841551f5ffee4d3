#!/usr/bin/env bash
# Builds the Python wheel from the checkout (pip wheel --no-build-isolation: the system's setuptools and wheel,
# nothing downloaded; CMake reuses BUILD_DIR), installs it into a fresh virtual environment and checks that
# `import flashgen` finds the bundled library with no environment variable and that the `flashgen` entry point
# runs the bundled CLI, all reporting one version. Exits 77 (skipped) without python3 -m venv/pip/setuptools/wheel.
#   test_wheel.sh BUILD_DIR WORK_DIR
set -euo pipefail

build_dir=$(cd "$1" && pwd)
work=$2
source_tree=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build_dir/CMakeCache.txt")

say() { printf '==> %s\n' "$*"; }
fail() { printf 'test_wheel.sh: FAILED: %s\n' "$*" >&2; exit 1; }

python=
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import setuptools, wheel, venv, pip' 2> /dev/null; then python=$candidate; break; fi
done
if [[ -z $python ]]; then
  echo "test_wheel.sh: skipped: no python3 with setuptools, wheel, venv and pip (Debian: python3-setuptools python3-wheel python3-venv python3-pip)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"

say "pip wheel --no-build-isolation ./python ($python, CMake build folder $build_dir)"
FLASHGEN_CMAKE_BUILD_DIR=$build_dir "$python" -m pip wheel --no-build-isolation --no-deps --no-index \
  -w "$work/dist" "$source_tree/python" > "$work/wheel.log" 2>&1 || { cat "$work/wheel.log"; fail "pip wheel"; }
wheel=$(find "$work/dist" -name "flashgen-${version}-py3-none-linux_*.whl")
[[ -n $wheel ]] || fail "no flashgen-${version}-py3-none-linux_*.whl in $work/dist: $(ls "$work/dist")"
contents=$("$python" -m zipfile -l "$wheel")
for member in flashgen/lib/libflashgen.so.${version%.*} flashgen/bin/flashgen flashgen/torch/__init__.py flashgen/torch/_ops.py; do
  grep -q " *$member " <<< "$contents" || fail "$member is not in $(basename "$wheel")"
done

say "installing $(basename "$wheel") into a fresh virtual environment"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --no-deps --no-index "$wheel" > "$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "pip install"; }

# From an empty folder with no FLASHGEN_LIBRARY: the library must come from the installed package.
mkdir -p "$work/elsewhere"
printed=$(cd "$work/elsewhere" && env -u FLASHGEN_LIBRARY -u LD_LIBRARY_PATH -u PYTHONPATH "$work/venv/bin/python" -c '
import flashgen, os
print(flashgen.version(), flashgen.__version__, os.path.realpath(flashgen.library_path()))') ||
  fail "import flashgen in the virtual environment"
read -r library_version package_version library <<< "$printed"
[[ $library_version == "$version" && $package_version == "$version" ]] ||
  fail "versions: library $library_version, package $package_version, CMake $version"
[[ $library == "$work/venv/"*"/flashgen/lib/libflashgen.so.${version%.*}" ]] || fail "loaded $library, not the bundled library"

printed=$(cd "$work/elsewhere" && env -u LD_LIBRARY_PATH "$work/venv/bin/flashgen" --version) || fail "the flashgen entry point"
[[ $printed == "flashgen $version" ]] || fail "flashgen --version printed '$printed'"
say "wheel test passed ($(basename "$wheel"))"
