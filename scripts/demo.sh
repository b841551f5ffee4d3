#!/usr/bin/env bash
# The main job: installs what is missing, builds, then runs `flashgen demo` (runs and times the default
# problem on the GPU; without a GPU compiles the default kernels and says that timing needs one).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
build_dir=${FLASHGEN_BUILD_DIR:-build}
printf '==> %s/flashgen demo\n' "$build_dir"
exec "$build_dir/flashgen" demo "$@"
