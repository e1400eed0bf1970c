#!/usr/bin/env bash
# Configures and builds mixtrain into build/ (or $MIX_BUILD_DIR). CUDA sources
# are compiled when nvcc is found (MIX_WITH_CUDA=AUTO), even with no GPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=build.sh
source "$root/scripts/lib/args.sh"  # usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/build.sh
Configures (CMake, Release) and builds mixtrain. CUDA sources are compiled when nvcc is found
(MIX_WITH_CUDA=AUTO), even with no GPU; /usr/local/cuda/bin is tried when nvcc is not on PATH.
  MIX_BUILD_DIR         the build folder (default: build/ of this checkout)
  MIX_CMAKE_ARGS        more cmake configure arguments, e.g. -DMIX_WITH_CUDA=OFF (default: none)
  CMAKE_CUDA_COMPILER   when set, /usr/local/cuda/bin is not added to PATH (default: unset)
EOF
build="${MIX_BUILD_DIR:-$root/build}"
if [ -z "${CMAKE_CUDA_COMPILER:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release ${MIX_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)"
