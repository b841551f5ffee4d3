#!/usr/bin/env bash
# Installs what a fresh Debian 12 / Ubuntu machine with the CUDA toolkit lacks (compiler, CMake, nlohmann-json,
# SQLite, Catch2), then configures and builds flashgen (Release) into ./build. Safe to run again.
#   FLASHGEN_BUILD_DIR   build folder (default: build)
#   FLASHGEN_CMAKE_ARGS  extra arguments for the CMake configure step, e.g. "-DFLASHGEN_BUILD_TESTS=OFF"
#   CUDA_HOME            CUDA toolkit (default: /usr/local/cuda)
set -euo pipefail

say() { printf '==> %s\n' "$*"; }
die() { printf 'setup.sh: error: %s\n' "$*" >&2; exit 1; }

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_dir=${FLASHGEN_BUILD_DIR:-build}
read -r -a extra_cmake_args <<< "${FLASHGEN_CMAKE_ARGS:-}"

# 1. System packages, installed only when missing.
packages=(cmake g++ make nlohmann-json3-dev libsqlite3-dev catch2)
if command -v dpkg-query > /dev/null; then
  missing=()
  for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2> /dev/null | grep -q 'install ok installed'; then
      missing+=("$package")
    fi
  done
  if ((${#missing[@]} == 0)); then
    say "packages: all present (${packages[*]})"
  else
    if [[ $(id -u) -eq 0 ]]; then
      as_root=()
    elif command -v sudo > /dev/null; then
      as_root=(sudo)
    else
      die "missing packages (${missing[*]}) and not root, with no sudo to install them"
    fi
    say "installing missing packages: ${missing[*]}"
    "${as_root[@]}" apt-get update
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  fi
else
  say "no dpkg here: not installing packages; make sure these are present: ${packages[*]}"
fi

# 2. The CUDA toolkit (NVRTC and cuda.h; no GPU or driver is needed to build).
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -f $cuda_home/include/cuda.h || ! -f $cuda_home/include/nvrtc.h ]]; then
  die "no CUDA toolkit at '$cuda_home' (cuda.h and nvrtc.h not found): install the CUDA toolkit or set CUDA_HOME"
fi
export CUDA_HOME=$cuda_home
say "CUDA toolkit: $CUDA_HOME"

# 3. Configure and build.
say "configuring $build_dir (Release${FLASHGEN_CMAKE_ARGS:+; $FLASHGEN_CMAKE_ARGS})"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "${extra_cmake_args[@]}"
say "building $build_dir with $(nproc) jobs"
cmake --build "$build_dir" -j"$(nproc)"
say "built $build_dir/flashgen"
