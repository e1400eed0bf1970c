#!/usr/bin/env bash
# The GPU check, for the day a GPU is lent: build with CUDA, run every [cuda]
# test, and write logs and a summary into --out DIR. (The CUDA backend proper is
# the next milestone; this grows with it and must stay under 8 minutes on one GPU.)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/runs/gpu_check"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    *) echo "gpu_check: unknown argument $1 (use --out DIR)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
build="${MIX_BUILD_DIR:-$root/build-gpu}"
export PATH="/usr/local/cuda/bin:$PATH"
{
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMIX_WITH_CUDA=ON ${MIX_CMAKE_ARGS:-} &&
  cmake --build "$build" -j "$(nproc)"
} >"$out/build.log" 2>&1 || { echo "gpu_check: build failed, see $out/build.log"; exit 1; }
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
(cd "$build" && ctest -L unit -R cuda --output-on-failure) >"$out/cuda_tests.log" 2>&1
rc=$?
passed=$(grep -c "Passed" "$out/cuda_tests.log" || true)
failed=$(grep -cE "\*\*\*Failed|Exception" "$out/cuda_tests.log" || true)
skipped=$(grep -c "Skipped" "$out/cuda_tests.log" || true)
{
  echo "gpu_check summary"
  echo "  [cuda] tests: $passed passed, $failed failed, $skipped skipped"
} | tee "$out/summary.txt"
exit $rc
