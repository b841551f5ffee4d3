#!/usr/bin/env bash
# Installs what is missing and builds (scripts/setup.sh), runs the whole test suite (the Catch2 cases, the
# templates on their own, the installed tree, the Debian package and the wheel), the Python package's tests
# (python/tests with pytest, installed with apt when missing; the torch and GPU parts skip without them), then
# builds again with AddressSanitizer + UndefinedBehaviorSanitizer (Debug) and runs the CPU tests under them.
#   FLASHGEN_BUILD_DIR       Release build folder (default: build)
#   FLASHGEN_ASAN_BUILD_DIR  sanitizer build folder (default: build-asan)
#   FLASHGEN_CMAKE_ARGS      extra CMake configure arguments for both builds
set -euo pipefail

say() { printf '==> %s\n' "$*"; }

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_dir=${FLASHGEN_BUILD_DIR:-build}
asan_dir=${FLASHGEN_ASAN_BUILD_DIR:-build-asan}
read -r -a extra_cmake_args <<< "${FLASHGEN_CMAKE_ARGS:-}"

scripts/setup.sh

# What only the tests need: pytest (the default python3's if it has one, else Debian's, for /usr/bin/python3),
# pkg-config (the install test), Debian's setuptools, wheel, venv and pip (the wheel test), and munge and Slurm's
# daemons and client (the Slurm test's one-node cluster).
python=python3
python3 -c 'import pytest' 2> /dev/null || python=/usr/bin/python3
test_packages=()
"$python" -c 'import pytest' 2> /dev/null || test_packages+=(python3-pytest)
command -v pkg-config > /dev/null || test_packages+=(pkg-config)
/usr/bin/python3 -c 'import setuptools, wheel, venv, pip, ensurepip' 2> /dev/null ||
  test_packages+=(python3-setuptools python3-wheel python3-venv python3-pip)
if [[ $(id -u) -eq 0 ]]; then  # the Slurm test runs slurmd, which needs root, and skips without it
  command -v munged > /dev/null || test_packages+=(munge)
  command -v slurmctld > /dev/null || test_packages+=(slurmctld)
  command -v slurmd > /dev/null || test_packages+=(slurmd)
  command -v sbatch > /dev/null || test_packages+=(slurm-client)
fi
if ((${#test_packages[@]} > 0)); then
  if [[ $(id -u) -eq 0 ]]; then as_root=(); elif command -v sudo > /dev/null; then as_root=(sudo); else
    printf 'test.sh: error: %s missing and there is neither root nor sudo to install them\n' "${test_packages[*]}" >&2
    exit 1
  fi
  say "installing what the tests need: ${test_packages[*]}"
  "${as_root[@]}" apt-get update
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${test_packages[@]}"
fi

say "tests: ctest --test-dir $build_dir ([gpu] cases skip when there is no GPU)"
ctest --test-dir "$build_dir" --output-on-failure

say "Python tests: $python -m pytest python/tests (libflashgen from $build_dir; torch and GPU parts skip without them)"
FLASHGEN_LIBRARY="$(cd "$build_dir" && pwd)/libflashgen.so" FLASHGEN_CACHE_DIR="$(cd "$build_dir" && pwd)/test-cache" \
  "$python" -m pytest python/tests -rs -p no:cacheprovider

say "configuring $asan_dir (Debug, FLASHGEN_SANITIZE=ON)"
cmake -S . -B "$asan_dir" -DCMAKE_BUILD_TYPE=Debug -DFLASHGEN_SANITIZE=ON \
  "-DFLASHGEN_TEST_CACHE_DIR=$(cd "$build_dir" && pwd)/test-cache" "${extra_cmake_args[@]}"
say "building $asan_dir with $(nproc) jobs"
cmake --build "$asan_dir" -j"$(nproc)"
say "CPU tests under AddressSanitizer, LeakSanitizer and UBSan"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$asan_dir" -R '^cpu$' --output-on-failure
say "all tests passed"
