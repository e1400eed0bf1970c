#!/usr/bin/env bash
# Configures and builds mixtrain into build/ (or $MIX_BUILD_DIR). CUDA sources
# are compiled when nvcc is found (MIX_WITH_CUDA=AUTO), even with no GPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MIX_BUILD_DIR:-$root/build}"
if [ -z "${CMAKE_CUDA_COMPILER:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release ${MIX_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)"
