#!/usr/bin/env bash
# scripts/gpu_check.sh --focus compare, rehearsed without a GPU: the script
# runs only on a lent GPU, where an error of its own (an unbound variable
# under set -u, a bad test, a summary line that throws) would cost the lend.
# A stand-in nvidia-smi names one H100; MIX_GPU_CHECK_PREBUILT uses this
# build (MIX_BUILD_DIR) as it is. Every [cuda] test then skips, every
# mixtrain run fails at start-up (no GPU), PyTorch's rows say why they did
# not run, and the script must still go through every step of the focus, in
# order, and write its whole summary:
#   - no shell error from gpu_check.sh or scripts/lib/ in its output or logs;
#   - each row of --list-rows announced or logged, each of the focus's
#     summary lines present, with n/a where a run gave no figure; the
#     [cuda] step found this build's tests (all skipped, none failed);
#   - the failed runs counted as such: exit status 1, not 0;
#   - the attention rows not run twice: a run that failed before reaching
#     fused_attention is not rerun with --no-cudnn-attention;
#   - the comparison table with every PyTorch row the focus asks for, the
#     torch.compile rows of the twins included.
# Then --focus all the same way: no error of its own, through to its summary,
# the several-GPU rows saying they need 2 GPUs.
# Exits 77 where this build has no mixtrain.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${MIX_BUILD_DIR:-$root/build}"
[ -x "$build/mixtrain" ] || { echo "SKIP: $build/mixtrain is not built"; exit 77; }
tmp="$(mktemp -d "${TMPDIR:-/tmp}/mix_gpu_check_rehearsal.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

mkdir "$tmp/bin"
cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
# A stand-in for one H100: what gpu_check.sh asks nvidia-smi.
case "$*" in
  "") echo "nvidia-smi stand-in: one NVIDIA H100 80GB HBM3" ;;
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-stand-in)" ;;
  *compute_cap*) echo "9.0" ;;
  *name*) echo "NVIDIA H100 80GB HBM3" ;;
  *) echo "nvidia-smi stand-in: no answer for: $*" >&2; exit 1 ;;
esac
EOF
chmod +x "$tmp/bin/nvidia-smi"

# The build as gpu_check sees it: its programs and tests, but a folder of its
# own, so that the [cuda] step's ctest does not write into the Testing/ of a
# ctest that may be running this test in the same build.
mkdir "$tmp/build"
cp "$build/CTestTestfile.cmake" "$tmp/build/"
ln -s "$build/tests" "$tmp/build/tests"
for f in "$build"/*; do
  if [ -f "$f" ] && [ -x "$f" ]; then ln -s "$f" "$tmp/build/"; fi
done

torch_python=/usr/bin/python3
[ -x "$torch_python" ] || torch_python=python3
# Runs gpu_check.sh --focus FOCUS into OUT under --deadline SECONDS, its output
# in LOG, and checks what every focus must do here: no shell or Python error
# of the script's own, exit 1 (every run failed without a GPU, and the script
# must say so), a summary, and no step cut by the deadline.
rehearse() {  # focus, out, deadline, log
  local focus="$1" dir="$2" deadline="$3" log="$4" rc t0
  t0=$(date +%s)
  PATH="$tmp/bin:$PATH" MIX_GPU_CHECK_PREBUILT=1 MIX_BUILD_DIR="$tmp/build" MIX_TORCH_PYTHON="$torch_python" \
    "$root/scripts/gpu_check.sh" --focus "$focus" --out "$dir" --deadline "$deadline" >"$log" 2>&1
  rc=$?
  echo "gpu_check --focus $focus: exit $rc after $(( $(date +%s) - t0 )) s"
  if grep -rnE "(gpu_check\.sh|/lib/[a-z_]+\.(sh|py)|compare_summary\.py): line [0-9]+:|unbound variable|syntax error|Traceback \(most recent call last\)" \
       "$log" "$dir"/*.log "$dir"/*.txt 2>/dev/null | grep -v "cudnn_failed"; then
    fail "--focus $focus: a shell or Python error of the script's own (above)"
  fi
  [ "$rc" -eq 1 ] || fail "--focus $focus: exit $rc, not 1"
  [ -s "$dir/summary.txt" ] || { cat "$log"; fail "--focus $focus: no summary.txt"; return; }
  grep -q "exit 125" "$dir/summary.txt" && fail "--focus $focus: a step was cut by --deadline $deadline"
  return 0
}

out="$tmp/gc"
rehearse compare "$out" 500 "$tmp/run.log"

# Every step of the focus ran (announced, or left a log).
while read -r row; do
  case "$row" in
    build) grep -q "MIX_GPU_CHECK_PREBUILT" "$tmp/run.log" || fail "the build step did not take the prebuilt build" ;;
    cuda_tests) [ -s "$out/cuda_tests.log" ] || fail "no cuda_tests.log" ;;
    torch_compare) [ -s "$out/torch_compare.jsonl" ] || fail "no torch_compare.jsonl" ;;
    memcheck_*) grep -q "memcheck test_cuda_fused_attention" "$out/summary.txt" || fail "no memcheck line" ;;
    *) [ -s "$out/$row.log" ] || fail "row $row left no log" ;;
  esac
done < <(PATH="$tmp/bin:$PATH" "$root/scripts/gpu_check.sh" --focus compare --list-rows)

for line in "[cuda] tests" "ResNet-50 b64 AMP images/s" "ResNet-50 b256 FP32 NCHW images/s" "Transformer-base AMP tokens/s" \
            "GPT-2 124M b8x1024 AMP tokens/s" "GPT-2 124M b8x1024 BF16 tokens/s" "GPT-2 AMP own-kernel attn tok/s" \
            "mixtrain against PyTorch" "model FLOPs"; do
  grep -qF "$line" "$out/summary.txt" || fail "the summary has no line \"$line\""
done
# The [cuda] step found this build's tests (skipped here: no GPU), test_cuda_conv_ops left for later.
grep -qE "^  \[cuda\] tests +[0-9]+ passed, 0 failed, [1-9][0-9]* skipped \(test_cuda_conv_ops" "$out/summary.txt" ||
  fail "the [cuda] tests line: $(grep -F "[cuda] tests" "$out/summary.txt")"
grep -q "GPT-2 124M b8x1024 AMP tokens/s *n/a (exit 1)" "$out/summary.txt" ||
  fail "GPT-2 AMP's failed run not shown as n/a (exit 1)"
[ ! -e "$out/attention_retries.txt" ] ||
  { cat "$out/attention_retries.txt"; fail "runs that never reached fused_attention were run again without cuDNN"; }

# The comparison table: the eager twins of the runs made, then their torch.compile rows.
for row in resnet50_amp resnet50_fp32 gpt2_amp gpt2_bf16 gpt2_amp_compile resnet50_amp_compile transformer_bf16_compile; do
  grep -qE "^  $row +[0-9]+ " "$out/summary.txt" || fail "the comparison table has no row $row"
done
grep -q "^  every PyTorch row skipped" "$out/summary.txt" || fail "the PyTorch rows' one reason is not said"

# --focus all, every row (a longer lend's check), the same way: through to its
# summary without an error of its own, the several-GPU rows saying they need 2.
all="$tmp/gc_all"
rehearse all "$all" 800 "$tmp/run_all.log"
for line in "MLP" "ResNet-50 AMP scaling efficiency         needs 2+ GPUs (1 visible)" "memcheck test_cuda_ops" \
            "mixtrain against PyTorch"; do
  grep -qF "$line" "$all/summary.txt" || fail "--focus all: the summary has no line \"$line\""
done

if [ "$failures" -gt 0 ]; then
  echo "--- gpu_check output"; cat "$tmp/run.log"
  echo "FAIL: $failures problem(s)"
  exit 1
fi
echo "PASS: gpu_check --focus compare and --focus all rehearsed without a GPU"
