#!/usr/bin/env bash
# The GPU check: one command for the day a GPU is lent. It builds with CUDA,
# runs every [cuda] test (each CUDA kernel against its CPU twin, the 1-GPU NCCL
# communicator), trains the MLP for a few hundred steps, ResNet-50 (cuDNN) and
# a Transformer-base-sized language model for a few dozen in FP32 and in AMP on
# the GPU (TF32 off; convolutions on cuDNN's graph API, the default), ResNet-50
# again on the legacy cuDNN calls (--no-cudnn-graph-conv) and with each flag
# that cuts the host's time a step further (--cuda-graph and its end-to-end
# test, --cublas-1x1-conv), ResNet-50 AMP fed from a JPEG folder it writes
# (mixbench make-images) against synthetic input, times resnet-small AMP steps with and without
# overlapped gradient all-reduces, checks that an AMP run with a stuck loss scale stops,
# runs the kernel tests under compute-sanitizer's memcheck in the time left,
# and prints a summary table last. Logs and summary.txt go to --out DIR.
# Budget: --focus compare is sized for one lend of 15 minutes of device time
# (under --deadline 530, below); --focus all, every row, needs far longer.
#
#   scripts/gpu_check.sh [--focus compare|all] [--list-rows] [--out DIR] [--bundle DIR] [--deadline SECONDS]
#                        [--multi-rank-cpu N]
#
# --focus compare: only what issue 41 needs of a short lend, in its order: the
# build and the [cuda] tests; mixtrain's rows that scripts/torch_compare.py has
# a twin of (ResNet-50 batch 64 and 256, the Transformer-base, GPT-2 124M; AMP
# and FP32, then BF16) and those PyTorch rows; the attention variants
# (Transformer-base and GPT-2 AMP with --no-fused-attention, GPT-2 AMP on
# mixtrain's own kernels and on its FP32 ones); the GPT-2 AMP step's op
# profile; memcheck of test_cuda_fused_attention in the time left. Its summary has
# the lines of those runs and the comparison table. --focus all (the default)
# runs everything. --list-rows prints the runs a focus makes, in order, and
# exits: nothing built, run or written. A run --focus leaves out is no failure.
#
# With two or more GPUs it also runs the several-GPU rows (scripts/lib/multi_gpu_rows.sh:
# NCCL allreduce and grad-sync, scaling efficiency, overlap, --cuda-graph on N
# ranks), started through the bundle's Open MPI (deps/openmpi/bin/mpirun) or
# mpirun on PATH; with one GPU those rows say "needs 2+ GPUs". --multi-rank-cpu N
# runs only those rows, on the CPU with N ranks and tiny sizes, with the build in
# MIX_BUILD_DIR (default build/): no GPU, no build; how they are tested here.
#
# --deadline SECONDS: finish, summary written, within SECONDS of the start:
# each step's time limit shrinks to what is left, and a step that would start
# with less than 10 s left is not run (exit 125 in the summary). Give it when
# the machine is lent for a fixed time, so that a slow step costs only itself.
# --bundle DIR builds from a folder written by scripts/gpu_bundle.sh (air-gapped
# GPU nodes: only the driver, a CUDA 13 toolkit, CMake and the CUDA libraries).
# NCCL and cuDNN 9 outside the toolkit: export NCCL_ROOT / CUDNN_ROOT first, or
# have Python's nvidia-nccl-cu13 / nvidia-cudnn-cu13 wheels installed (found here).
#
# On a lent machine with no Open MPI or Debian headers (this project's device
# tool: about 62 MB travel with the checkout, under its 64 MiB; at most 8 files come back),
# lent for 15 minutes of device time, its start included, at most 600 s a command:
#   here:   scripts/gpu_bundle.sh runs/bundle
#   there:  (carry runs/bundle, timeout_s 600; the loop keeps what ran should the call time out)
#           (while sleep 50; do tar czf $OUT/partial.tgz -C /tmp/gc --exclude=build . 2>/dev/null; done) & bg=$!;
#           scripts/gpu_check.sh --focus compare --bundle runs/bundle --out /tmp/gc --deadline 530; rc=$?; kill $bg;
#           rm -f $OUT/partial.tgz; cp /tmp/gc/summary.txt $OUT/; tar czf $OUT/gc.tgz -C /tmp/gc --exclude=build .; exit $rc
#
# A lent GPU's time is short, so nothing may hang or be wasted: the NCCL
# watchdog fires after 60 s (MIX_NCCL_TIMEOUT_S), every test and run has a time
# limit, the build makes only the cuda_checks target, for this GPU's
# architecture, and a failing step still ends in the summary.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/runs/gpu_check"
bundle=""
deadline=""
multi_cpu=""
focus=all
list_rows=""
started=$(date +%s)
prog=gpu_check
source "$root/scripts/lib/args.sh"  # usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/gpu_check.sh [--focus compare|all] [--list-rows] [--out DIR] [--bundle DIR] [--deadline SECONDS] [--multi-rank-cpu N]
The GPU check: builds with CUDA, runs every [cuda] test, trains the MLP, ResNet-50 and a Transformer-base
in FP32 and AMP on the GPU, times overlapped gradient all-reduces, runs memcheck in the time left and prints
a summary table. Logs and summary.txt go to --out DIR. Budget: --focus compare fits one 15-minute lend
(--deadline 530); --focus all needs far longer.
  --focus compare|all    compare: only the build, the [cuda] tests, mixtrain's rows that scripts/torch_compare.py
                         has a twin of and those PyTorch rows (ResNet-50 b64 and b256, Transformer-base, GPT-2;
                         AMP, FP32, BF16), the attention variants, the GPT-2 AMP op profile and memcheck of
                         test_cuda_fused_attention, in that order; the summary has only their lines.
                         all: everything (default)
  --list-rows            print the runs the --focus makes, in order, and exit (nothing built, run or written)
  --out DIR              (default: runs/gpu_check of this checkout)
  --bundle DIR           build from a folder written by scripts/gpu_bundle.sh (default: this checkout)
  --deadline SECONDS     finish, summary written, within SECONDS of the start (default: none)
  --multi-rank-cpu N     only the several-GPU rows, on the CPU with N ranks, tiny sizes, the build in
                         MIX_BUILD_DIR (default: build/ of this checkout); no GPU needed
  MIX_BUILD_DIR          the build folder (default: build/ in the --out DIR)
  MIX_MPIRUN             the launcher of the several-GPU rows (default: the bundle's deps/openmpi/bin/mpirun, else mpirun)
  MIX_CUDA_ARCHS         CUDA architectures to build for (default: GPU 0's compute capability, e.g. 90)
  MIX_CMAKE_ARGS         more cmake configure arguments (default: none)
  MIX_NCCL_TIMEOUT_S     NCCL watchdog, seconds (default 60)
  NCCL_ROOT, CUDNN_ROOT  NCCL and cuDNN 9 outside the toolkit (default: the toolkit's, else Python's nvidia-* wheels)
  MIX_TORCH_PYTHON       the Python whose PyTorch scripts/torch_compare.py runs with (default: python3)
  MIX_TORCH_COMPARE_BUDGET  seconds for the PyTorch rows (default 360; under --deadline, the time left less 60,
                         or less 75 with --focus compare, for the runs after them)
For a machine lent for 15 minutes (at most 600 s a command), from a bundle (scripts/gpu_bundle.sh runs/bundle):
  scripts/gpu_check.sh --focus compare --bundle runs/bundle --out /tmp/gc --deadline 530
(the script's header has the whole command line, which brings the logs back should the call time out)
EOF
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage ;;
    --focus)
      focus="${2:-}"; shift 2 || shift
      [[ "$focus" =~ ^(compare|all)$ ]] || { echo "gpu_check: --focus takes compare or all, got '$focus'" >&2; exit 2; } ;;
    --list-rows) list_rows=1; shift ;;
    --out) out="$2"; shift 2 ;;
    --bundle) bundle="$(cd "$2" && pwd)" || exit 2; shift 2 ;;
    --deadline)
      deadline="$2"; shift 2
      [[ "$deadline" =~ ^[0-9]+$ ]] || { echo "gpu_check: --deadline takes whole seconds, got '$deadline'" >&2; exit 2; } ;;
    --multi-rank-cpu)
      multi_cpu="${2:-}"; shift 2 || shift
      [[ "$multi_cpu" =~ ^[0-9]+$ ]] && [ "$multi_cpu" -ge 2 ] ||
        { echo "gpu_check: --multi-rank-cpu takes a rank count of 2 or more, got '$multi_cpu'" >&2; exit 2; } ;;
    *) echo "gpu_check: unknown argument '$1' (use --focus compare|all, --list-rows, --out DIR, --bundle DIR, --deadline SECONDS, --multi-rank-cpu N; see --help)" >&2; exit 2 ;;
  esac
done
# limit SECONDS COMMAND...: runs COMMAND for at most SECONDS (exit 124 when it
# ran too long), fewer when --deadline leaves fewer (keeping 30 s for the
# summary and a killed command's 10 s grace), and not at all (exit 125) when
# under 10 s would be left.
limit() {
  local seconds="$1"; shift
  if [ -n "$deadline" ]; then
    local left=$(( deadline - ($(date +%s) - started) - 30 ))
    if [ "$left" -lt 10 ]; then
      echo "gpu_check: not run, past --deadline $deadline: $*" | tee -a "$out/deadline.log" >&2
      return 125
    fi
    [ "$left" -lt "$seconds" ] && seconds="$left"
  fi
  timeout -k 10 "$seconds" "$@"
}
# Each step below (step_NAME) starts by naming its runs (runs NAME...: the names
# of their logs and metrics files), so that --list-rows can print them without
# making them and the summary can print the lines of the runs made (ran NAME),
# leaving out those --focus left out.
made=()
runs() {  # NAME...: with --list-rows, prints them and returns 1 (the step stops there)
  if [ -n "$list_rows" ]; then printf '%s\n' "$@"; return 1; fi
  made+=("$@")
}
ran() {  # NAME: whether a step of this check made that run
  local name
  for name in "${made[@]}"; do [ "$name" = "$1" ] && return 0; done
  return 1
}

# NCCL / cuDNN from Python wheels when neither the environment nor the toolkit has them.
wheel_root() {  # header name: the wheel folder that holds include/<header>, or nothing
  local sp
  sp="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)" || return 0
  [ -d "$sp/nvidia" ] || return 0
  find "$sp/nvidia" -path "*/include/$1" 2>/dev/null | head -1 | sed "s|/include/$1\$||"
}
keep_going_ninja() { grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$build/CMakeCache.txt" 2>/dev/null; }
step_build() {
  runs build || return 0
  # The machine first, so that a wrong one fails in seconds, not after the build.
  {
    nvidia-smi || echo "nvidia-smi failed"
    command -v nvcc cmake ninja g++ mpirun || true
    nvcc --version | tail -2
  } >"$out/environment.txt" 2>&1
  if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no GPU visible (see $out/environment.txt)" | tee "$out/summary.txt"
    exit 1
  fi
  # The architecture of GPU 0 (9.0 -> 90), unless MIX_CUDA_ARCHS says otherwise.
  archs="${MIX_CUDA_ARCHS:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')}"
  local toolkit_include lib var header found
  toolkit_include="$(dirname "$(command -v nvcc)")/../include"
  for lib in NCCL:nccl.h CUDNN:cudnn.h; do
    var="${lib%%:*}_ROOT" header="${lib#*:}"
    if [ -z "${!var:-}" ] && [ ! -f "$toolkit_include/$header" ]; then
      found="$(wheel_root "$header")"
      if [ -n "$found" ]; then
        export "$var=$found"
        export LD_LIBRARY_PATH="$found/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "gpu_check: $var=$found (from a Python wheel)" | tee -a "$out/environment.txt"
      fi
    fi
  done

  local src="$root"
  local cmake_args=(-DCMAKE_BUILD_TYPE=Release -DMIX_WITH_CUDA=ON -DMIX_CUDA_WARNINGS_AS_ERRORS=OFF)
  [ -n "$archs" ] && cmake_args+=(-DMIX_CUDA_ARCHS="$archs")
  if [ -n "$bundle" ]; then
    src="$bundle/src"
    cmake_args+=(-DMIX_BUNDLE_DIR="$bundle")
  fi
  if [ -z "$launcher" ] && { [ -z "$bundle" ] || [ ! -f "$bundle/deps/openmpi/include/mpi.h" ]; }; then
    cmake_args+=(-DMIX_WITH_MPI=OFF)  # no Open MPI here or in the bundle: single-process mixtrain, NCCL still used
  fi
  build="${MIX_BUILD_DIR:-$out/build}"
  if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
    cmake_args+=(-G Ninja)
  fi
  t0=$(date +%s)  # the summary counts its seconds from here
  if [ -n "${MIX_GPU_CHECK_PREBUILT:-}" ]; then  # the script's own test (test_gpu_check_rehearsal.sh): no build
    echo "gpu_check: MIX_GPU_CHECK_PREBUILT: the build in $build as it is, nothing configured or built"
    return 0
  fi
  echo "gpu_check: building cuda_checks for sm_${archs:-default} in $build (log: $out/build.log)"
  # Keep going past a failing file: on a lent machine one build that lists every
  # error (another compiler or library version than the development machine's)
  # is worth more than one that stops at the first.
  local keep_going=(-k)
  { limit 600 cmake -S "$src" -B "$build" "${cmake_args[@]}" ${MIX_CMAKE_ARGS:-} &&
    { keep_going_ninja && keep_going=(-k 0); true; } &&
    limit 1200 cmake --build "$build" -j "$(nproc)" --target cuda_checks -- "${keep_going[@]}"; } >"$out/build.log" 2>&1
  local build_rc=$?
  if [ $build_rc -ne 0 ]; then
    tail -30 "$out/build.log"
    local why="failed"
    [ $build_rc -eq 124 ] && why="ran past its time limit"
    [ $build_rc -eq 125 ] && why="was not run, past --deadline"
    echo "gpu_check: the build $why (exit $build_rc) after $(( $(date +%s) - t0 )) s, see build.log" | tee "$out/summary.txt"
    exit 1
  fi
}

step_cuda_tests() {
  runs cuda_tests || return 0
  echo "gpu_check: [cuda] tests but test_cuda_conv_ops (log: $out/cuda_tests.log)"
  # Four at a time: the tests are small next to the GPU, and the CPU twins they
  # compare against take most of their time. test_cuda_conv_ops runs after the
  # ResNet-50 rows of record, below: it now builds cuDNN graph-API plans for
  # every case (runtime-compiled engines may take a second or more each), and
  # however long that takes, it must not leave those rows past --deadline.
  (cd "$build" && limit 300 ctest -L cuda -E test_cuda_conv_ops -j 4 --no-tests=error --output-on-failure \
    --timeout 200) >"$out/cuda_tests.log" 2>&1
  tests_rc=$?
}

train() {  # precision, log name
  limit 180 "$build/mixtrain" --device cuda --precision "$1" --data synthetic --synthetic-size 65536 --batch-size 256 \
    --hidden 1024,1024 --benchmark --benchmark-warmup 20 --steps 300 --eval false \
    --metrics "$out/$2.jsonl" >"$out/$2.log" 2>&1
}
top_ops() {  # log, count: the op types that took the most device time (MIX_PROFILE_OPS), one per line
  awk -v n="$2" '/op time by type/ { on = 1; next } on && /ms\/step/ { print; if (++k >= n) exit }' "$1" 2>/dev/null |
    sed -E 's/^\[rank [^]]*\] \[[a-z]+\] +/    /' || true
}
# With one process, a --cuda-graph run whose recording failed goes on op by op
# (launch/step_runner.cc): its figures are then not of replays, and say so.
not_recorded() {  # log
  if grep -q "could not \(record\|instantiate\)" "$1" 2>/dev/null; then echo " (NOT recorded: ran op by op)"; fi
}
summary_field() {  # file, field
  /usr/bin/env python3 -c "import json,sys
s=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
s=[l for l in s if l.get('summary')]
print(s[-1].get(sys.argv[2], 'n/a') if s else 'n/a')" "$1" "$2" 2>/dev/null || echo n/a
}
# ResNet-50 on 224x224 synthetic images: conv2d, batch_norm and pool2d on cuDNN.
# TF32 stays off, so FP32 is true FP32 and AMP's gain is the tensor cores' (target: >= 3x).
# Both precisions run in both layouts: --data-format auto picks NHWC for AMP
# and NCHW for FP32; the other two runs show what the layout is worth (cuDNN's
# internal conversions for FP16 NCHW). The speed ratio compares AMP (NHWC) with
# the faster FP32 run, whichever its layout. The AMP runs that follow keep
# each residual add and its relu as two ops (--no-fuse-add-relu, which also
# leaves no fused add for a batch norm to join), and each batch norm and its
# relu or residual add + relu (--no-fuse-bn-relu: mixtrain's channels-last
# batch norm without them), to show what fusing them (runtime/passes/fuse_add_relu.h,
# runtime/passes/fuse_bn_relu.h, the defaults) is worth; then every batch norm on
# cuDNN's persistent kernels instead of mixtrain's (--cudnn-bn-persistent
# --no-fuse-bn-relu, against the row before), and timed convolution
# algorithms (--cudnn-benchmark, on the legacy calls), both off by default.
# Batch 256 in both precisions shows the GPU's pace where batch 64 on the
# legacy calls leaves the host setting it, and AMP once more on them there.
train_resnet50() {  # precision, log name, extra flags...
  local precision="$1" name="$2"; shift 2
  limit 180 "$build/mixtrain" --device cuda --precision "$precision" --model resnet50 --data synthetic \
    --synthetic-size 256 --synthetic-classes 1000 --batch-size 64 --benchmark --benchmark-warmup 10 --steps 30 \
    --eval false "$@" --metrics "$out/$name.jsonl" >"$out/$name.log" 2>&1
}
# A Transformer-base-sized GPT (6 layers, d_model 512, 8 heads, 256 tokens, a
# 32768-token vocabulary; 32 sequences = 8192 tokens a step) with AdamW: the
# matmuls on cuBLAS, causal softmax, layer_norm, embeddings and their gradients
# on the kernels of runtime/ops/cuda/. TF32 off (target: AMP >= 2.9x FP32).
# cuDNN's attention (fused_attention's first choice on FP16/BF16) has not run
# on every card: a Transformer or GPT-2 run with it that fails (but not by
# running out of time) runs again with --no-cudnn-attention, on mixtrain's own
# kernels, so that one failure does not cost a short lend its rows. Only a run
# that reached the attention (its log names a cuDNN SDPA plan or the op) runs
# again: one that failed before it would fail again, and each rerun costs a
# start-up. The failed run's log is kept as NAME.cudnn_failed.log and the
# summary says so.
retry_without_cudnn_attention() {  # exit status, runner, precision, log name, extra flags...: the status that counts
  local rc="$1" runner="$2" precision="$3" name="$4"; shift 4
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 125 ] || [ "$precision" = fp32 ] \
     || [[ " $* " == *" --no-cudnn-attention "* || " $* " == *" --no-fused-attention "* \
           || " $* " == *" --no-attention-tensor-cores "* ]] \
     || ! grep -qE "cuDNN SDPA plan built|fused_attention" "$out/$name.log" 2>/dev/null; then
    return "$rc"
  fi
  mv "$out/$name.log" "$out/$name.cudnn_failed.log"
  echo "$name: exit $rc with cuDNN's attention (log $name.cudnn_failed.log); the row is from a rerun with --no-cudnn-attention" \
    | tee -a "$out/attention_retries.txt"
  "$runner" "$precision" "$name" "$@" --no-cudnn-attention
}
train_transformer() {  # precision, log name, extra flags...
  run_transformer "$@"
  retry_without_cudnn_attention $? run_transformer "$@"
}
run_transformer() {  # precision, log name, extra flags...
  local precision="$1" name="$2"; shift 2
  limit 180 "$build/mixtrain" --device cuda --precision "$precision" --model transformer --data synthetic --layers 6 \
    --d-model 512 --heads 8 --context 256 --vocab 32768 --batch-size 32 --optimizer adamw --benchmark \
    --benchmark-warmup 10 --steps 40 --eval false "$@" --metrics "$out/$name.jsonl" >"$out/$name.log" 2>&1
}
# resnet-small (32x32 images) under AMP, gradient all-reduces overlapped with
# backward (the default: c_allreduce_start/wait, NCCL on its own stream) and
# not (--no-overlap: every bucket after backward). One GPU, so NCCL moves no
# bytes: the row checks that the overlapped path costs no step time and runs
# (--no-elide-single-rank-sync: one rank's all-reduces are kept for it).
train_resnet_small() {  # log name, extra flags...
  local name="$1"; shift
  limit 120 "$build/mixtrain" --device cuda --precision amp --model resnet-small --data synthetic \
    --synthetic-size 4096 --batch-size 128 --bucket-mb 0.1 --no-elide-single-rank-sync --benchmark \
    --benchmark-warmup 10 --steps 40 --eval false "$@" \
    --metrics "$out/$name.jsonl" >"$out/$name.log" 2>&1
}
# The host's time to queue a timed step, and the step's time (the summary's
# means): a queue time close to the step time means the host sets the pace
# (launch and dispatch costs, or a wait for the GPU hidden in the step).
queue_and_step_ms() {  # file
  /usr/bin/env python3 -c "import json,sys
s=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
s=[l for l in s if l.get('summary')]
print(f\"{s[-1]['host_queue_ms']:.2f} / {s[-1]['step_ms']:.2f}\")" "$1" 2>/dev/null || echo n/a
}
# The first step's time in seconds (cuDNN's choices or the graph API's plans
# are made there, lazy modules loaded), from the metrics file's step lines.
first_step_s() {  # file
  /usr/bin/env python3 -c "import json,sys
s=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
s=[l for l in s if l.get('step') == 1 and 'step_ms' in l]
print(f\"{s[0]['step_ms'] / 1e3:.1f}\")" "$1" 2>/dev/null || echo n/a
}
# How many shapes the graph API left to the legacy calls, and how many ran nondeterministic engines (warnings in a log).
graph_fallbacks() {  # log
  local none refused nondet
  none=$(grep -c "graph API has no plan" "$1" 2>/dev/null); refused=$(grep -c "graph API refused" "$1" 2>/dev/null)
  nondet=$(grep -c "graph API has no deterministic" "$1" 2>/dev/null)
  echo "${none:-n/a} without a plan, ${refused:-n/a} refused when run, ${nondet:-n/a} nondeterministic"
}
ratio_of() {  # fp32 value, amp value
  /usr/bin/env python3 -c "import sys
try: print(f'{float(sys.argv[2]) / float(sys.argv[1]):.2f}')
except Exception: print('n/a')" "$1" "$2"
}
# GPT-2 small (--model gpt2: 12 x 768, context 1024, vocabulary 50,257 padded
# to 50,304 and masked, tied; 124M parameters), AdamW, batch 8 x 1024 tokens,
# in AMP, BF16 and FP32 (torch_compare.py's gpt2_* rows sit beside these):
# few timed steps, tokens/s and peak memory.
train_gpt2() {  # precision, log name, extra flags...
  run_gpt2 "$@"
  retry_without_cudnn_attention $? run_gpt2 "$@"
}
run_gpt2() {  # precision, log name, extra flags...
  local precision="$1" name="$2"; shift 2
  limit 150 "$build/mixtrain" --device cuda --precision "$precision" --model gpt2 --data synthetic --synthetic-size 64 \
    --batch-size 8 --optimizer adamw --benchmark --benchmark-warmup 5 --steps 15 --eval false "$@" \
    --metrics "$out/$name.jsonl" >"$out/$name.log" 2>&1
}

step_mlp() {
  runs train_fp32 train_amp || return 0
  echo "gpu_check: training the MLP on the GPU (FP32, AMP)"
  train fp32 train_fp32; fp32_rc=$?
  train amp train_amp; amp_rc=$?
}
step_resnet50_of_record() {
  runs resnet50_fp32 resnet50_amp || return 0
  echo "gpu_check: ResNet-50 and the Transformer first, FP32 and AMP in their default layouts; then the checks,"
  echo "gpu_check: then the variants (other layouts, cuDNN options), the op profiles and the overlap (logs: $out/*.log)"
  train_resnet50 fp32 resnet50_fp32 --data-format nchw; r50_fp32_rc=$?
  train_resnet50 amp resnet50_amp --data-format nhwc; r50_amp_rc=$?
}
# The same two ResNet-50 runs with each convolution on the legacy cuDNN calls
# (--no-cudnn-graph-conv) instead of the graph API's plans, built once per
# shape: the legacy calls' host cost set the pace at batch 64 (docs/gpu.md).
step_resnet50_legacy() {
  runs resnet50_fp32_legacy resnet50_amp_legacy || return 0
  train_resnet50 fp32 resnet50_fp32_legacy --data-format nchw --no-cudnn-graph-conv; r50_fp32_legacy_rc=$?
  train_resnet50 amp resnet50_amp_legacy --data-format nhwc --no-cudnn-graph-conv; r50_amp_legacy_rc=$?
}
# And with each step recorded once as a CUDA graph and replayed (--cuda-graph,
# runtime/exec/step_graph.h): one launch a step instead of one call per kernel,
# cuDNN's included. Then (step_cuda_graph_flag) the flag's end-to-end check on
# the GPU: a resnet-small run with evaluations and partial batches between
# replays gives the op-by-op run's losses, loss scales and evaluations exactly.
step_resnet50_cudagraph() {
  runs resnet50_fp32_cudagraph resnet50_amp_cudagraph resnet50_amp_cudagraph_legacy || return 0
  train_resnet50 fp32 resnet50_fp32_cudagraph --data-format nchw --cuda-graph; r50_fp32_cg_rc=$?
  train_resnet50 amp resnet50_amp_cudagraph --data-format nhwc --cuda-graph; r50_amp_cg_rc=$?
  # And recording the legacy cuDNN calls instead of the graph API's plans.
  train_resnet50 amp resnet50_amp_cudagraph_legacy --data-format nhwc --cuda-graph --no-cudnn-graph-conv
  r50_amp_cg_legacy_rc=$?
}
# And each pointwise convolution (1x1: 36 of ResNet-50's 53, 3 of them strided
# shortcuts) as one cuBLAS GEMM a pass (plus a copy of the pixels a strided
# one samples) instead of a cuDNN call (--cublas-1x1-conv, channels last
# only, so in NHWC in both precisions; the other 17 on the graph API); AMP once
# more with the other 17 on the legacy calls. No recording: the host still
# queues every kernel.
step_resnet50_gemm1x1() {
  runs resnet50_fp32_gemm1x1 resnet50_amp_gemm1x1 resnet50_amp_gemm1x1_legacy || return 0
  train_resnet50 fp32 resnet50_fp32_gemm1x1 --data-format nhwc --cublas-1x1-conv; r50_fp32_g11_rc=$?
  train_resnet50 amp resnet50_amp_gemm1x1 --data-format nhwc --cublas-1x1-conv; r50_amp_g11_rc=$?
  train_resnet50 amp resnet50_amp_gemm1x1_legacy --data-format nhwc --cublas-1x1-conv --no-cudnn-graph-conv
  r50_amp_g11_legacy_rc=$?
}
step_conv_tests() {
  runs test_cuda_conv_ops || return 0
  echo "gpu_check: [cuda] test_cuda_conv_ops, every case in each mode (log: $out/cuda_tests.log)"
  (cd "$build" && limit 300 ctest -L cuda -R test_cuda_conv_ops --no-tests=error --output-on-failure \
    --timeout 300) >>"$out/cuda_tests.log" 2>&1
  conv_tests_rc=$?
  [ $conv_tests_rc -eq 0 ] || tests_rc=$conv_tests_rc
}
step_cuda_graph_flag() {
  runs cuda_graph_flag || return 0
  echo "gpu_check: --cuda-graph against op-by-op steps on the GPU (log: $out/cuda_graph_flag.log)"
  MIX_E2E_DEVICE=cuda MIX_BUILD_DIR="$build" MIX_WITH_MPI=OFF limit 120 /usr/bin/env python3 \
    "$root/tests/e2e/test_cuda_graph_flag.py" >"$out/cuda_graph_flag.log" 2>&1
  cg_flag_rc=$?
  cg_flag=$(grep -E "^(PASS|FAIL):" "$out/cuda_graph_flag.log" | tail -1)
}
step_transformer_of_record() {
  runs transformer_fp32 transformer_amp || return 0
  train_transformer fp32 transformer_fp32; tf_fp32_rc=$?
  train_transformer amp transformer_amp; tf_amp_rc=$?
}
# The Transformer AMP step recorded once and replayed too (--cuda-graph).
step_transformer_cudagraph() {
  runs transformer_amp_cudagraph || return 0
  train_transformer amp transformer_amp_cudagraph --cuda-graph; tf_amp_cg_rc=$?
}
# NCCL all-reduce through the device communicator (one rank: NCCL still runs its
# kernels), every dtype checked against exact values; the 64M rows' busbw is 0
# on one GPU by definition, so the figure that matters is the time column.
step_allreduce() {
  runs mixbench || return 0
  echo "gpu_check: mixbench allreduce on the GPU (log: $out/mixbench.log)"
  limit 120 "$build/mixbench" allreduce --device cuda -b 1K -e 64M -f 4 -d half,bfloat16,float -o sum,max -n 10 -w 3 --check \
    --csv "$out/mixbench.csv" >"$out/mixbench.log" 2>&1
  bench_rc=$?
  bench_wrong=$(grep -o "Out of bounds values : [0-9]* [A-Z]*" "$out/mixbench.log" || echo "n/a")
}
# The CUDA scaler op leaves its "stuck at the minimum" error to the trainer,
# after the step (no host wait inside it): a scale pinned at 1e30 overflows
# every FP16 gradient, and after 100 skipped steps the run must stop with it.
step_stuck_scale() {
  runs stuck || return 0
  echo "gpu_check: an AMP run whose loss scale is stuck must stop with the scaler's error (log: $out/stuck.log)"
  limit 60 "$build/mixtrain" --device cuda --precision amp --data synthetic --synthetic-size 4096 --hidden 64 \
    --batch-size 32 --steps 150 --eval false --init-loss-scaling 1e30 --min-loss-scaling 1e30 >"$out/stuck.log" 2>&1
  local stuck_rc=$?
  if [ $stuck_rc -ne 0 ] && [ $stuck_rc -ne 124 ] && grep -q "stuck at the minimum" "$out/stuck.log"; then
    stuck="stopped with the error (exit $stuck_rc)"; stuck_ok=0
  elif [ $stuck_rc -eq 125 ]; then
    stuck="not run, past --deadline (exit 125)"; stuck_ok=1
  else
    stuck="FAIL: exit $stuck_rc without the error"; stuck_ok=1
  fi
}
step_resnet50_variants() {
  runs resnet50_fp32_nhwc resnet50_amp_nchw resnet50_amp_nofuse resnet50_amp_nobnfuse resnet50_amp_bnp \
    resnet50_amp_bench || return 0
  echo "gpu_check: ResNet-50 variants: FP32 in NHWC, AMP in NCHW, unfused add+relu, unfused bn+relu, cuDNN persistent batch_norm, cudnn benchmark"
  train_resnet50 fp32 resnet50_fp32_nhwc --data-format nhwc; r50_fp32_nhwc_rc=$?
  train_resnet50 amp resnet50_amp_nchw --data-format nchw; r50_nchw_rc=$?
  train_resnet50 amp resnet50_amp_nofuse --data-format nhwc --no-fuse-add-relu; r50_nofuse_rc=$?
  train_resnet50 amp resnet50_amp_nobnfuse --data-format nhwc --no-fuse-bn-relu; r50_nobnfuse_rc=$?
  train_resnet50 amp resnet50_amp_bnp --data-format nhwc --cudnn-bn-persistent --no-fuse-bn-relu; r50_bnp_rc=$?
  train_resnet50 amp resnet50_amp_bench --data-format nhwc --cudnn-benchmark --no-cudnn-graph-conv; r50_bench_rc=$?
}
step_resnet50_b256() {
  runs resnet50_amp_b256 resnet50_fp32_b256 || return 0
  echo "gpu_check: ResNet-50 batch 256, AMP and FP32 (logs: $out/resnet50_*_b256.log)"
  train_resnet50 amp resnet50_amp_b256 --data-format nhwc --batch-size 256 --benchmark-warmup 5 --steps 15
  r50_b256_rc=$?
  train_resnet50 fp32 resnet50_fp32_b256 --data-format nchw --batch-size 256 --benchmark-warmup 3 --steps 8
  r50_fp32_b256_rc=$?
}
# Gradient accumulation and clipping: batch 256 as 4 micro-batches of 64
# (grad_accumulate's kernels, two programs a step), clipped to norm 1 (the
# norm and the clip's kernels, runtime/optim/cuda/clip_grad.cu).
step_resnet50_accum() {
  runs resnet50_amp_accum4 || return 0
  echo "gpu_check: ResNet-50 AMP, batch 256 as 4 x 64 accumulated and clipped (log: $out/resnet50_amp_accum4.log)"
  train_resnet50 amp resnet50_amp_accum4 --data-format nhwc --grad-accum-steps 4 --clip-grad-norm 1 \
    --benchmark-warmup 3 --steps 8
  r50_accum_rc=$?
}
step_gpt2() {
  runs gpt2_amp gpt2_fp32 || return 0
  echo "gpu_check: GPT-2 124M, batch 8 x 1024 tokens, AMP and FP32 (logs: $out/gpt2_*.log)"
  train_gpt2 amp gpt2_amp; gpt2_amp_rc=$?
  train_gpt2 fp32 gpt2_fp32; gpt2_fp32_rc=$?
}
# BF16 (--precision bf16: the AMP lists in BF16, no loss scale): every op's
# BF16 kernels in a whole step, after the AMP and FP32 rows of each model.
step_bf16() {
  runs resnet50_bf16 transformer_bf16 gpt2_bf16 || return 0
  echo "gpu_check: BF16: ResNet-50, the Transformer-base and GPT-2 (logs: $out/*_bf16.log)"
  train_resnet50 bf16 resnet50_bf16 --data-format nhwc; r50_bf16_rc=$?
  train_transformer bf16 transformer_bf16; tf_bf16_rc=$?
  train_gpt2 bf16 gpt2_bf16; gpt2_bf16_rc=$?
}
# ResNet-50 AMP fed from JPEGs on disk (--data image-folder: decode, random
# crop, flip on the host's cores, normalised on the GPU) against the synthetic
# AMP row above at the same batch: the share of the GPU's rate the readers
# keep. The folder is made here (mixbench make-images: 500x375, ImageNet's
# typical size) outside --out, which travels back; `mixbench data` gives one
# worker's rate on this CPU and all cores', so the summary can say how many
# workers the GPU's rate needs.
step_jpeg() {
  runs resnet50_amp_jpeg || return 0
  local jpeg_dir="${TMPDIR:-/tmp}/mix_gpu_check_jpeg"
  cores=$(nproc)
  echo "gpu_check: ResNet-50 AMP from a JPEG folder, $cores data workers (logs: $out/jpeg_*.log, $out/resnet50_amp_jpeg.log)"
  limit 120 "$build/mixbench" make-images --out "$jpeg_dir" --train 3200 --val 128 --classes 100 --width 500 \
    --height 375 --workers "$cores" >"$out/jpeg_make.log" 2>&1
  local jpeg_make_rc=$?
  limit 60 "$build/mixbench" data --data-dir "$jpeg_dir" --data-workers 1 --batches 6 >"$out/jpeg_data_1.log" 2>&1
  limit 60 "$build/mixbench" data --data-dir "$jpeg_dir" --data-workers "$cores" --batches 30 \
    >"$out/jpeg_data_all.log" 2>&1
  limit 180 "$build/mixtrain" --device cuda --precision amp --model resnet50 --data image-folder --data-dir "$jpeg_dir" \
    --data-workers "$cores" --data-format nhwc --batch-size 64 --benchmark --benchmark-warmup 10 --steps 30 --eval false \
    --metrics "$out/resnet50_amp_jpeg.jsonl" >"$out/resnet50_amp_jpeg.log" 2>&1
  r50_jpeg_rc=$?
  [ $jpeg_make_rc -eq 0 ] || r50_jpeg_rc=$jpeg_make_rc
}
step_resnet50_b256_variants() {
  runs resnet50_amp_b256_legacy resnet50_amp_b256_gemm1x1 || return 0
  # Where the GPU sets the pace: are the graph API's engines as fast as the legacy calls' algorithms?
  train_resnet50 amp resnet50_amp_b256_legacy --data-format nhwc --batch-size 256 --benchmark-warmup 5 --steps 15 \
    --no-cudnn-graph-conv
  r50_b256_legacy_rc=$?
  # And are cuBLAS's GEMMs as fast as cuDNN's 1x1 kernels?
  train_resnet50 amp resnet50_amp_b256_gemm1x1 --data-format nhwc --batch-size 256 --benchmark-warmup 5 --steps 15 \
    --cublas-1x1-conv
  r50_b256_g11_rc=$?
}
step_transformer_casts() {
  runs transformer_amp_nofold transformer_amp_stored transformer_amp_unfused_bias transformer_amp_unfolded_sums \
    transformer_amp_unfused_add_ln transformer_amp_single_rank_sync || return 0
  # What folding the FP32 casts before softmax and the loss is worth (README,
  # "Folded casts"): the default AMP run above folds them, this one keeps them.
  echo "gpu_check: Transformer AMP with --no-fold-casts (log: $out/transformer_amp_nofold.log)"
  train_transformer amp transformer_amp_nofold --no-fold-casts; tf_nofold_rc=$?
  # And what not storing the loss's FP32 softmax is worth (README, "The loss
  # gradient recomputes the softmax"): this run stores it, as Paddle does.
  echo "gpu_check: Transformer AMP with --store-softmax (log: $out/transformer_amp_stored.log)"
  train_transformer amp transformer_amp_stored --store-softmax; tf_stored_rc=$?
  # And what adding each linear layer's bias in the GEMM's epilogue is worth
  # (docs/design.md, "Fused matmul + bias"): this run keeps the bias adds.
  echo "gpu_check: Transformer AMP with --no-fuse-matmul-bias (log: $out/transformer_amp_unfused_bias.log)"
  train_transformer amp transformer_amp_unfused_bias --no-fuse-matmul-bias; tf_unfused_bias_rc=$?
  # And what adding each residual-stream gradient's two parts in layer_norm_grad
  # is worth (docs/design.md, "Folded gradient sums"): this run keeps the sums.
  echo "gpu_check: Transformer AMP with --no-fold-grad-sums (log: $out/transformer_amp_unfolded_sums.log)"
  train_transformer amp transformer_amp_unfolded_sums --no-fold-grad-sums; tf_unfolded_sums_rc=$?
  # And what normalising each residual sum as it is written is worth
  # (docs/design.md, "Fused add + layer norm"): this run keeps the two ops.
  echo "gpu_check: Transformer AMP with --no-fuse-add-layer-norm (log: $out/transformer_amp_unfused_add_ln.log)"
  train_transformer amp transformer_amp_unfused_add_ln --no-fuse-add-layer-norm; tf_unfused_add_ln_rc=$?
  # And what taking one rank's gradient all-reduces out is worth (docs/design.md,
  # "One rank"): this run packs, reduces over NCCL's one rank and unpacks each bucket.
  echo "gpu_check: Transformer AMP with --no-elide-single-rank-sync (log: $out/transformer_amp_single_rank_sync.log)"
  train_transformer amp transformer_amp_single_rank_sync --no-elide-single-rank-sync; tf_single_rank_sync_rc=$?
}
# And what one fused_attention op is worth against the matmul, causal softmax,
# matmul it replaces (docs/models.md, "Attention"): these runs build the latter,
# the Transformer-base at context 256 and GPT-2 at 1024, where the T x T scores
# the fused op never stores are 16 times as many a sequence. Then what each
# kind of kernel behind the op is worth (docs/design.md "Fused attention"):
# GPT-2 AMP on mixtrain's own kernels (--no-cudnn-attention: the tensor-core
# ones), and on its FP32 kernels (--no-attention-tensor-cores).
step_attention_variants() {
  runs transformer_amp_unfused gpt2_amp_unfused gpt2_amp_own_attention gpt2_amp_fp32_attention || return 0
  echo "gpu_check: Transformer and GPT-2 AMP with --no-fused-attention, GPT-2 AMP with --no-cudnn-attention and with --no-attention-tensor-cores"
  train_transformer amp transformer_amp_unfused --no-fused-attention; tf_unfused_rc=$?
  train_gpt2 amp gpt2_amp_unfused --no-fused-attention; gpt2_amp_unfused_rc=$?
  train_gpt2 amp gpt2_amp_own_attention --no-cudnn-attention; gpt2_amp_own_att_rc=$?
  train_gpt2 amp gpt2_amp_fp32_attention --no-attention-tensor-cores; gpt2_amp_fp32_att_rc=$?
}
# Where an AMP step's time goes: the same AMP runs again, each op timed on the
# GPU (MIX_PROFILE_OPS: an event on the compute stream after each op, read
# after the step). Separate runs, because the profile's own per-op cost would
# lower the images/s and tokens/s above; short ones (the last flags win), to
# keep within the check's budget.
step_profiles() {
  runs resnet50_amp_profile resnet50_amp_host_profile resnet50_amp_legacy_host_profile \
    resnet50_amp_gemm1x1_host_profile transformer_amp_profile || return 0
  echo "gpu_check: the ResNet-50 and Transformer AMP runs again, each op timed (logs: $out/*_profile.log)"
  MIX_PROFILE_OPS=1 train_resnet50 amp resnet50_amp_profile --data-format nhwc --benchmark-warmup 5 --steps 10
  r50_prof_rc=$?
  # And the host's time to queue each op (MIX_PROFILE_OPS=host), for when the
  # host sets the pace ("host queue / step ms" close to each other).
  MIX_PROFILE_OPS=host train_resnet50 amp resnet50_amp_host_profile --data-format nhwc --benchmark-warmup 5 --steps 10
  r50_host_prof_rc=$?
  MIX_PROFILE_OPS=host train_resnet50 amp resnet50_amp_legacy_host_profile --data-format nhwc --no-cudnn-graph-conv \
    --benchmark-warmup 5 --steps 10
  r50_legacy_host_prof_rc=$?
  MIX_PROFILE_OPS=host train_resnet50 amp resnet50_amp_gemm1x1_host_profile --data-format nhwc --cublas-1x1-conv \
    --benchmark-warmup 5 --steps 10
  r50_g11_host_prof_rc=$?
  MIX_PROFILE_OPS=1 train_transformer amp transformer_amp_profile --benchmark-warmup 5 --steps 10; tf_prof_rc=$?
}
# The GPT-2 AMP step the same way, where the GPT-2 rows' time goes.
step_gpt2_profile() {
  runs gpt2_amp_profile || return 0
  echo "gpu_check: GPT-2 AMP again, each op timed (log: $out/gpt2_amp_profile.log)"
  MIX_PROFILE_OPS=1 train_gpt2 amp gpt2_amp_profile --benchmark-warmup 3 --steps 8; gpt2_prof_rc=$?
}
# resnet-small AMP with and without overlapped all-reduce (train_resnet_small).
step_overlap() {
  runs resnet_small_overlap resnet_small_no_overlap || return 0
  echo "gpu_check: resnet-small AMP with and without overlapped all-reduce (logs: $out/resnet_small_*.log)"
  train_resnet_small resnet_small_overlap; rs_ov_rc=$?
  train_resnet_small resnet_small_no_overlap --no-overlap; rs_no_rc=$?
}
# ==== PyTorch on the same card (issue 41) ====================================
# The same models trained by PyTorch, the one this machine's python3 imports
# (MIX_TORCH_PYTHON names another): scripts/torch_compare.py's rows carry the
# names of mixtrain's metrics files above (resnet50_amp, transformer_fp32,
# gpt2_amp, ...; NAME_compile for torch.compile), and the summary puts each
# beside mixtrain's with the ratio and both MFUs (scripts/lib/compare_summary.py,
# scripts/lib/mfu.py). It gets MIX_TORCH_COMPARE_BUDGET seconds (default 360),
# under --deadline at most the time left less what the focus keeps for the
# steps after it (torch_reserve); a row past that says so. Without PyTorch
# every row says why, and nothing fails. --focus all runs every row; another
# focus only those whose mixtrain twins it made (their names, as --rows).
tc_rows='*'
torch_twins() {  # the runs made so far that torch_compare has a row of, and their torch.compile rows, comma separated
  # The compile rows come last in torch_compare's order, so they take only
  # what the eager rows leave of its budget.
  /usr/bin/env python3 "$root/scripts/torch_compare.py" --list | awk '{ print $1 }' |
    grep -Fx -f <(printf '%s\n' "${made[@]}" | sed 'p; s/$/_compile/') | paste -sd, -
}
step_torch_compare() {
  runs torch_compare || return 0
  local torch_python="${MIX_TORCH_PYTHON:-python3}" tc_budget="${MIX_TORCH_COMPARE_BUDGET:-360}" tc_left
  if [ -n "$deadline" ]; then
    tc_left=$(( deadline - ($(date +%s) - started) - 30 - torch_reserve ))
    [ "$tc_left" -lt "$tc_budget" ] && tc_budget=$tc_left
  fi
  tc_gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  [ "$focus" = all ] || tc_rows=$(torch_twins)
  echo "gpu_check: PyTorch on the same models, ${tc_budget} s at most (log: $out/torch_compare.log)"
  if [ "$tc_budget" -ge 20 ]; then
    limit $(( tc_budget + 60 )) "$torch_python" "$root/scripts/torch_compare.py" --rows "$tc_rows" \
      --time-budget "$tc_budget" --compile-budget 150 --gpu-name "$tc_gpu" --out "$out/torch_compare.jsonl" \
      >"$out/torch_compare.log" 2>&1
    tc_rc=$?
  else
    echo "gpu_check: torch_compare not run: ${tc_budget} s left" >"$out/torch_compare.log"; tc_rc=125
  fi
}
# ==== end of PyTorch on the same card =========================================
# ==== several GPUs (scripts/lib/multi_gpu_rows.sh): with 2+ GPUs, N ranks against 1 ====
step_multi_gpu_rows() {
  runs multi_gpu_rows || return 0
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  multi_rows_run cuda "${gpus:-0}" "$build" "$out" "$launcher"
}
# ==== end of the several-GPU rows ====
# Last, in the time left: compute-sanitizer's memcheck over the tests of the
# hand-written kernels. A comparison with the CPU twin misses an out-of-bounds
# read whose stray bytes happen to hold the right values, or a write past the
# end into memory nothing checks; memcheck does not. It works only where the
# machine's runtime lets it (not under gVisor): the row then shows its error.
memcheck() {  # test binary name: "N errors (exit RC)" and the log memcheck_NAME.log
  local sanitizer
  sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null || true)"
  if [ -z "$sanitizer" ]; then echo "no compute-sanitizer on this machine"; return 0; fi
  limit 120 "$sanitizer" --tool memcheck --error-exitcode 99 "$build/tests/$1" >"$out/memcheck_$1.log" 2>&1
  local rc=$? errors
  errors=$(grep -oE "ERROR SUMMARY: [0-9]+ errors?" "$out/memcheck_$1.log" | tail -1 | sed 's/ERROR SUMMARY: //')
  echo "${errors:-no error summary} (exit $rc)"
  [ $rc -ne 99 ]  # only memcheck's own verdict fails the check; a timeout or a missing tool is a row, not a failure
}
step_memcheck_kernels() {
  runs memcheck_test_cuda_ops memcheck_test_cuda_transformer_ops || return 0
  echo "gpu_check: compute-sanitizer memcheck over the kernel tests, in the time left (logs: $out/memcheck_*.log)"
  mc_ops=$(memcheck test_cuda_ops); mc_ops_ok=$?
  mc_tf=$(memcheck test_cuda_transformer_ops); mc_tf_ok=$?
}
step_memcheck_attention() {
  runs memcheck_test_cuda_fused_attention || return 0
  echo "gpu_check: compute-sanitizer memcheck over test_cuda_fused_attention (log: $out/memcheck_test_cuda_fused_attention.log)"
  mc_att=$(memcheck test_cuda_fused_attention); mc_att_ok=$?
}

# Each --focus: its steps, in the order they run, and the seconds that
# torch_compare leaves, under --deadline, to the steps after it.
case "$focus" in
  all)
    steps=(build cuda_tests mlp resnet50_of_record resnet50_legacy resnet50_cudagraph resnet50_gemm1x1 conv_tests
      cuda_graph_flag transformer_of_record transformer_cudagraph allreduce stuck_scale resnet50_variants
      resnet50_b256 resnet50_accum gpt2 bf16 jpeg resnet50_b256_variants transformer_casts attention_variants
      profiles gpt2_profile overlap torch_compare multi_gpu_rows memcheck_kernels memcheck_attention)
    torch_reserve=60 ;;  # memcheck (the several-GPU rows are not budgeted: give such a lend a later --deadline)
  compare)
    # Issue 41's order: the rows mixtrain is compared on (those of record, AMP
    # and FP32, before BF16), PyTorch's twins of them, then what fused
    # attention is worth and where GPT-2's time goes; memcheck of the attention
    # kernels last, in whatever time is left, so that it never takes the
    # PyTorch rows' time (the [cuda] tests have already compared those kernels
    # with their twin).
    steps=(build cuda_tests resnet50_of_record resnet50_b256 transformer_of_record gpt2 bf16 torch_compare
      attention_variants gpt2_profile memcheck_attention)
    torch_reserve=75 ;;  # the four attention variants' runs and the GPT-2 profile
esac
if [ -n "$list_rows" ]; then
  for step in "${steps[@]}"; do "step_$step"; done
  exit 0
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -f "$out"/*.jsonl "$out"/*.log "$out"/mixbench.csv "$out"/summary.txt "$out"/attention_retries.txt  # no stale figures from an earlier run
export PATH="/usr/local/cuda/bin:$PATH"
export MIX_NCCL_TIMEOUT_S="${MIX_NCCL_TIMEOUT_S:-60}"

# ==== several GPUs: the launcher (scripts/lib/multi_gpu_rows.sh has the rows) ====
# The bundle's Open MPI where it has one: its bin/mpirun sets what Open MPI
# needs for the ranks it starts (deps/openmpi/env.sh), and nothing else here
# needs it (a single process of a build linking its libmpi never calls MPI_Init).
source "$root/scripts/lib/multi_gpu_rows.sh"
launcher="${MIX_MPIRUN:-}"
if [ -z "$launcher" ] && [ -n "$bundle" ] && [ -x "$bundle/deps/openmpi/bin/mpirun" ]; then
  launcher="$bundle/deps/openmpi/bin/mpirun"
fi
[ -n "$launcher" ] || launcher="$(command -v mpirun || true)"
if [ -n "$multi_cpu" ]; then
  build="${MIX_BUILD_DIR:-$root/build}"
  for p in mixtrain mixbench mixrun; do
    [ -x "$build/$p" ] || { echo "gpu_check: --multi-rank-cpu needs $build/$p (scripts/build.sh, or MIX_BUILD_DIR)" >&2; exit 2; }
  done
  export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
  t0=$(date +%s)
  multi_rows_run cpu "$multi_cpu" "$build" "$out" "$launcher"
  {
    echo "gpu_check summary, the several-GPU rows on the CPU ($(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s; exit 124: ran past its limit, 125: not run, past --deadline)"
    multi_rows_summary
  } | tee "$out/summary.txt"
  multi_rows_ok
  exit $?
fi
# ==== end of the several-GPU launcher ====

for step in "${steps[@]}"; do "step_$step"; done

# ==== the summary ====
say() {  # run, label, value: one line of the summary, for a run this check made
  if ran "$1"; then printf "  %-36s %s\n" "$2" "$3"; fi
}
say_transformer_variant() {  # run, label, exit status, ratio label: a Transformer AMP variant's
  # tok/s and peak, then the default AMP run's speed over the variant's
  say "$1" "Transformer AMP $2 tok/s" "$(tokens_and_peak "$1" "$3")"
  say "$1" "  $4 speed" "$(ratio_of "$(summary_field "$out/$1.jsonl" tokens_per_s_overall)" "$tf_amp_tps")"
}
say_top_ops() {  # run, title, count, exit status: the run's top op types by time (MIX_PROFILE_OPS) under a heading
  ran "$1" || return 0
  echo "  $2, top $3 (exit $4):"
  top_ops "$out/$1.log" "$3"
}
cudnn_attention_of() {  # run: how many cuDNN SDPA plans its fused_attention built, and cuDNN's first refusal
  local log="$out/$1.log" built refused
  built=$(grep -c "cuDNN SDPA plan built" "$log" 2>/dev/null || true)
  refused=$(grep -m1 -oE "cuDNN (has no plan|refused).*" "$log" 2>/dev/null | cut -c1-200 || true)
  echo "${built:-0} plans built${refused:+; $refused}"
}
tokens_and_peak() {  # run, exit status: "TOKENS/S (exit RC), peak bytes PEAK"
  echo "$(summary_field "$out/$1.jsonl" tokens_per_s_overall) (exit $2), peak bytes $(summary_field "$out/$1.jsonl" peak_bytes)"
}
if ran cuda_tests; then
  passed=$(grep -cE "Test +#[0-9]+: .* Passed" "$out/cuda_tests.log" || true)
  failed=$(grep -cE "\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|\*\*\*Not Run" "$out/cuda_tests.log" || true)
  skipped=$(grep -cE "\*\*\*Skipped| Skipped" "$out/cuda_tests.log" || true)
  # On a GPU machine a skipped [cuda] test means it did not see the GPU: a failure here.
  [ "$skipped" -eq 0 ] && [ "$passed" -gt 0 ] || tests_rc=1
fi
fp32_sps=$(summary_field "$out/train_fp32.jsonl" samples_per_s_overall)
amp_sps=$(summary_field "$out/train_amp.jsonl" samples_per_s_overall)
fp32_peak=$(summary_field "$out/train_fp32.jsonl" peak_bytes)
amp_peak=$(summary_field "$out/train_amp.jsonl" peak_bytes)
ratio=$(ratio_of "$fp32_sps" "$amp_sps")
rs_ov_ms=$(summary_field "$out/resnet_small_overlap.jsonl" step_ms)
rs_no_ms=$(summary_field "$out/resnet_small_no_overlap.jsonl" step_ms)
rs_ratio=$(ratio_of "$rs_ov_ms" "$rs_no_ms")
r50_fp32_ips=$(summary_field "$out/resnet50_fp32.jsonl" samples_per_s_overall)
r50_fp32_nhwc_ips=$(summary_field "$out/resnet50_fp32_nhwc.jsonl" samples_per_s_overall)
r50_amp_ips=$(summary_field "$out/resnet50_amp.jsonl" samples_per_s_overall)
r50_nchw_ips=$(summary_field "$out/resnet50_amp_nchw.jsonl" samples_per_s_overall)
r50_bnp_ips=$(summary_field "$out/resnet50_amp_bnp.jsonl" samples_per_s_overall)
r50_b256_ips=$(summary_field "$out/resnet50_amp_b256.jsonl" samples_per_s_overall)
r50_accum_ips=$(summary_field "$out/resnet50_amp_accum4.jsonl" samples_per_s_overall)
r50_fp32_legacy_ips=$(summary_field "$out/resnet50_fp32_legacy.jsonl" samples_per_s_overall)
r50_amp_legacy_ips=$(summary_field "$out/resnet50_amp_legacy.jsonl" samples_per_s_overall)
r50_legacy_ratio=$(ratio_of "$r50_fp32_legacy_ips" "$r50_amp_legacy_ips")
r50_amp_legacy_queue=$(queue_and_step_ms "$out/resnet50_amp_legacy.jsonl")
r50_first_steps="$(first_step_s "$out/resnet50_amp_legacy.jsonl") / $(first_step_s "$out/resnet50_amp.jsonl")"
r50_fp32_cg_ips=$(summary_field "$out/resnet50_fp32_cudagraph.jsonl" samples_per_s_overall)
r50_amp_cg_ips=$(summary_field "$out/resnet50_amp_cudagraph.jsonl" samples_per_s_overall)
r50_amp_cg_queue=$(queue_and_step_ms "$out/resnet50_amp_cudagraph.jsonl")
r50_amp_cg_legacy_ips=$(summary_field "$out/resnet50_amp_cudagraph_legacy.jsonl" samples_per_s_overall)
r50_fp32_cg_note=$(not_recorded "$out/resnet50_fp32_cudagraph.log")
r50_amp_cg_note=$(not_recorded "$out/resnet50_amp_cudagraph.log")
r50_amp_cg_legacy_note=$(not_recorded "$out/resnet50_amp_cudagraph_legacy.log")
tf_amp_cg_note=$(not_recorded "$out/transformer_amp_cudagraph.log")
r50_fp32_g11_ips=$(summary_field "$out/resnet50_fp32_gemm1x1.jsonl" samples_per_s_overall)
r50_amp_g11_ips=$(summary_field "$out/resnet50_amp_gemm1x1.jsonl" samples_per_s_overall)
r50_amp_g11_queue=$(queue_and_step_ms "$out/resnet50_amp_gemm1x1.jsonl")
r50_amp_g11_legacy_ips=$(summary_field "$out/resnet50_amp_gemm1x1_legacy.jsonl" samples_per_s_overall)
r50_b256_g11_ips=$(summary_field "$out/resnet50_amp_b256_gemm1x1.jsonl" samples_per_s_overall)
# A recording that failed names the call CUDA refused: the first such line, in the summary itself.
cg_error=$(grep -h -o "could not \(record\|instantiate\).*" "$out"/resnet50_*cudagraph*.log \
  "$out"/transformer_amp_cudagraph.log 2>/dev/null | head -1 | cut -c1-200)
r50_graph_fallbacks="FP32: $(graph_fallbacks "$out/resnet50_fp32.log"); AMP: $(graph_fallbacks "$out/resnet50_amp.log")"
r50_fp32_b256_ips=$(summary_field "$out/resnet50_fp32_b256.jsonl" samples_per_s_overall)
r50_b256_ratio=$(ratio_of "$r50_fp32_b256_ips" "$r50_b256_ips")
r50_b256_queue=$(queue_and_step_ms "$out/resnet50_amp_b256.jsonl")
r50_b256_legacy_ips=$(summary_field "$out/resnet50_amp_b256_legacy.jsonl" samples_per_s_overall)
r50_bench_ips=$(summary_field "$out/resnet50_amp_bench.jsonl" samples_per_s_overall)
r50_nofuse_ips=$(summary_field "$out/resnet50_amp_nofuse.jsonl" samples_per_s_overall)
r50_nobnfuse_ips=$(summary_field "$out/resnet50_amp_nobnfuse.jsonl" samples_per_s_overall)
# The target compares AMP with FP32 at its best: the fastest FP32 batch-64 run
# of any layout and mode (graph API, legacy calls, CUDA graph, cuBLAS 1x1).
r50_jpeg_ips=$(summary_field "$out/resnet50_amp_jpeg.jsonl" samples_per_s_overall)
jpeg_one=$(grep -o '"images_per_s_per_worker":[0-9.]*' "$out/jpeg_data_1.log" 2>/dev/null | cut -d: -f2)
jpeg_all=$(grep -o '"images_per_s":[0-9.]*' "$out/jpeg_data_all.log" 2>/dev/null | cut -d: -f2)
# The JPEG run's share of the synthetic rate, and the workers at one worker's rate that the synthetic rate needs.
jpeg_share=$(/usr/bin/env python3 -c "import sys, math
j, s, one = (float(a) if a.replace('.', '', 1).isdigit() else None for a in sys.argv[1:4])
share = f'{100 * j / s:.0f}% of synthetic' if j and s else 'n/a'
need = f'{math.ceil(s / one)} workers at {one:.0f} images/s each' if s and one else 'n/a'
print(f'{share}; the synthetic rate needs {need}')" "${r50_jpeg_ips:-x}" "${r50_amp_ips:-x}" "${jpeg_one:-x}" \
  2>/dev/null || echo n/a)
r50_fp32_best=$(/usr/bin/env python3 -c "import sys
v=[float(a) for a in sys.argv[1:] if a.replace('.', '', 1).isdigit()]
print(max(v) if v else 'n/a')" "$r50_fp32_ips" "$r50_fp32_nhwc_ips" "$r50_fp32_legacy_ips" "$r50_fp32_cg_ips" \
  "$r50_fp32_g11_ips" 2>/dev/null || echo n/a)
r50_cg_ratio=$(ratio_of "$r50_fp32_best" "$r50_amp_cg_ips")
r50_g11_ratio=$(ratio_of "$r50_fp32_best" "$r50_amp_g11_ips")
r50_fp32_peak=$(summary_field "$out/resnet50_fp32.jsonl" peak_bytes)
r50_amp_peak=$(summary_field "$out/resnet50_amp.jsonl" peak_bytes)
r50_ratio=$(ratio_of "$r50_fp32_best" "$r50_amp_ips")
r50_amp_queue=$(queue_and_step_ms "$out/resnet50_amp.jsonl")
tf_fp32_tps=$(summary_field "$out/transformer_fp32.jsonl" tokens_per_s_overall)
tf_amp_tps=$(summary_field "$out/transformer_amp.jsonl" tokens_per_s_overall)
tf_bf16_tps=$(summary_field "$out/transformer_bf16.jsonl" tokens_per_s_overall)
r50_bf16_ips=$(summary_field "$out/resnet50_bf16.jsonl" samples_per_s_overall)
tf_unfused_tps=$(summary_field "$out/transformer_amp_unfused.jsonl" tokens_per_s_overall)
tf_fp32_peak=$(summary_field "$out/transformer_fp32.jsonl" peak_bytes)
tf_amp_peak=$(summary_field "$out/transformer_amp.jsonl" peak_bytes)
tf_ratio=$(ratio_of "$tf_fp32_tps" "$tf_amp_tps")
tf_amp_queue=$(queue_and_step_ms "$out/transformer_amp.jsonl")
tf_amp_cg_tps=$(summary_field "$out/transformer_amp_cudagraph.jsonl" tokens_per_s_overall)
tf_amp_cg_queue=$(queue_and_step_ms "$out/transformer_amp_cudagraph.jsonl")
tf_att_ratio=$(ratio_of "$tf_unfused_tps" "$tf_amp_tps")
gpt2_amp_tps=$(summary_field "$out/gpt2_amp.jsonl" tokens_per_s_overall)
gpt2_att_ratio=$(ratio_of "$(summary_field "$out/gpt2_amp_unfused.jsonl" tokens_per_s_overall)" "$gpt2_amp_tps")
gpt2_own_att_tps=$(summary_field "$out/gpt2_amp_own_attention.jsonl" tokens_per_s_overall)
gpt2_cudnn_ratio=$(ratio_of "$gpt2_own_att_tps" "$gpt2_amp_tps")
gpt2_tc_ratio=$(ratio_of "$(summary_field "$out/gpt2_amp_fp32_attention.jsonl" tokens_per_s_overall)" "$gpt2_own_att_tps")
secs=$(( $(date +%s) - t0 ))
{
  # A run --focus left out has no exit status: nounset would stop here at its
  # line's arguments, which say then leaves out.
  set +u
  echo "gpu_check summary ($(date -u +%FT%TZ), ${secs} s; exit 124: ran past its limit, 125: not run, past --deadline)"
  conv_note=""
  [ "$conv_tests_rc" = 125 ] && conv_note=" (test_cuda_conv_ops not run: past --deadline)"
  [ "$conv_tests_rc" = 124 ] && conv_note=" (test_cuda_conv_ops ran past its time limit)"
  ran test_cuda_conv_ops || conv_note=" (test_cuda_conv_ops not in --focus $focus)"
  say cuda_tests "[cuda] tests" "$passed passed, $failed failed, $skipped skipped$conv_note"
  say train_fp32 "MLP 784-1024-1024-10 FP32 samples/s" "$fp32_sps (exit $fp32_rc)"
  say train_amp "MLP 784-1024-1024-10 AMP samples/s" "$amp_sps (exit $amp_rc)"
  say train_amp "AMP / FP32 speed" "$ratio"
  say train_amp "peak device bytes FP32 / AMP" "$fp32_peak / $amp_peak"
  say resnet50_fp32 "ResNet-50 b64 FP32 images/s NCHW" "$r50_fp32_ips (exit $r50_fp32_rc)"
  say resnet50_fp32_nhwc "ResNet-50 b64 FP32 images/s NHWC" "$r50_fp32_nhwc_ips (exit $r50_fp32_nhwc_rc)"
  say resnet50_amp "ResNet-50 b64 AMP images/s NHWC" "$r50_amp_ips (exit $r50_amp_rc)"
  say resnet50_amp_nchw "ResNet-50 b64 AMP images/s NCHW" "$r50_nchw_ips (exit $r50_nchw_rc)"
  say resnet50_amp "  graph conv shapes on legacy calls" "$r50_graph_fallbacks"
  say resnet50_fp32_legacy "ResNet-50 FP32 NCHW, legacy cuDNN" "$r50_fp32_legacy_ips (exit $r50_fp32_legacy_rc)"
  say resnet50_amp_legacy "ResNet-50 AMP NHWC, legacy cuDNN" "$r50_amp_legacy_ips (exit $r50_amp_legacy_rc)"
  say resnet50_amp_legacy "  legacy AMP / FP32; AMP queue/step" "$r50_legacy_ratio; $r50_amp_legacy_queue"
  say resnet50_amp_legacy "  AMP first step s, legacy / graph" "$r50_first_steps"
  say resnet50_fp32_cudagraph "ResNet-50 FP32 NCHW, cuda graph" "$r50_fp32_cg_ips (exit $r50_fp32_cg_rc)$r50_fp32_cg_note"
  say resnet50_amp_cudagraph "ResNet-50 AMP NHWC, cuda graph" "$r50_amp_cg_ips (exit $r50_amp_cg_rc)$r50_amp_cg_note"
  say resnet50_amp_cudagraph_legacy "  AMP, cuda graph, legacy cuDNN" \
    "$r50_amp_cg_legacy_ips (exit $r50_amp_cg_legacy_rc)$r50_amp_cg_legacy_note"
  say resnet50_amp_cudagraph "  first recording error" "${cg_error:-none}"
  say resnet50_amp_cudagraph "  cuda graph AMP / best FP32 (>= 3)" "$r50_cg_ratio$r50_amp_cg_note"
  say resnet50_amp_cudagraph "  cuda graph AMP queue / step ms" "$r50_amp_cg_queue"
  say cuda_graph_flag "  --cuda-graph = op by op (e2e)" "${cg_flag:-no verdict} (exit $cg_flag_rc)"
  say resnet50_fp32_gemm1x1 "ResNet-50 FP32 NHWC, cuBLAS 1x1 conv" "$r50_fp32_g11_ips (exit $r50_fp32_g11_rc)"
  say resnet50_amp_gemm1x1 "ResNet-50 AMP NHWC, cuBLAS 1x1 conv" "$r50_amp_g11_ips (exit $r50_amp_g11_rc)"
  say resnet50_amp_gemm1x1_legacy "  AMP, cuBLAS 1x1, legacy cuDNN" "$r50_amp_g11_legacy_ips (exit $r50_amp_g11_legacy_rc)"
  say resnet50_amp_gemm1x1 "  cuBLAS 1x1 AMP / best FP32 (>= 3)" "$r50_g11_ratio"
  say resnet50_amp_gemm1x1 "  cuBLAS 1x1 AMP queue / step ms" "$r50_amp_g11_queue"
  say resnet50_amp_nofuse "ResNet-50 AMP NHWC, no-fuse-add-relu" "$r50_nofuse_ips (exit $r50_nofuse_rc)"
  say resnet50_amp_nobnfuse "ResNet-50 AMP NHWC, no-fuse-bn-relu" "$r50_nobnfuse_ips (exit $r50_nobnfuse_rc)"
  say resnet50_amp_bnp "  same, cuDNN persistent BN" "$r50_bnp_ips (exit $r50_bnp_rc)"
  say resnet50_amp_bench "ResNet-50 AMP NHWC, cudnn benchmark" "$r50_bench_ips (exit $r50_bench_rc)"
  say resnet50_amp_b256 "ResNet-50 b256 AMP NHWC images/s" "$r50_b256_ips (exit $r50_b256_rc)"
  say resnet50_fp32_b256 "ResNet-50 b256 FP32 NCHW images/s" "$r50_fp32_b256_ips (exit $r50_fp32_b256_rc)"
  say resnet50_amp_accum4 "ResNet-50 AMP 4x64 accum+clip img/s" "$r50_accum_ips (exit $r50_accum_rc)"
  # grad_norm's cost (every step computes it): its share of the profiled AMP step.
  say resnet50_amp_profile "grad_global_norm in the AMP profile" \
    "$(grep -o "grad_global_norm *[0-9.]* ms/step *[0-9.]*%" "$out/resnet50_amp_profile.log" 2>/dev/null | tr -s ' ' || echo n/a)"
  say resnet50_amp_jpeg "ResNet-50 b64 AMP from JPEGs images/s" "$r50_jpeg_ips (exit $r50_jpeg_rc, $cores data workers)"
  say resnet50_amp_jpeg "  JPEG / synthetic; workers needed" "$jpeg_share"
  say resnet50_amp_jpeg "  mixbench data 1 / $cores workers img/s" "${jpeg_one:-n/a} / ${jpeg_all:-n/a}"
  say resnet50_fp32_b256 "ResNet-50 b256 AMP / FP32" "$r50_b256_ratio"
  say resnet50_amp_b256 "ResNet-50 b256 AMP host queue / step" "$r50_b256_queue"
  say resnet50_amp_b256_legacy "ResNet-50 b256 AMP, legacy cuDNN" "$r50_b256_legacy_ips (exit $r50_b256_legacy_rc)"
  say resnet50_amp_b256_gemm1x1 "ResNet-50 b256 AMP, cuBLAS 1x1 conv" "$r50_b256_g11_ips (exit $r50_b256_g11_rc)"
  say resnet50_amp "ResNet-50 AMP / best FP32 (>= 3)" "$r50_ratio"
  say resnet50_amp "ResNet-50 peak bytes FP32 / AMP" "$r50_fp32_peak / $r50_amp_peak"
  say resnet50_amp "ResNet-50 AMP host queue / step ms" "$r50_amp_queue"
  say transformer_fp32 "Transformer-base FP32 tokens/s" "$tf_fp32_tps (exit $tf_fp32_rc)"
  say transformer_amp "Transformer-base AMP tokens/s" "$tf_amp_tps (exit $tf_amp_rc)"
  say transformer_bf16 "Transformer-base BF16 tokens/s" "$tf_bf16_tps (exit $tf_bf16_rc)"
  say resnet50_bf16 "ResNet-50 b64 BF16 NHWC images/s" "$r50_bf16_ips (exit $r50_bf16_rc)"
  for gpt2_row in amp bf16 fp32; do
    gpt2_rc_var="gpt2_${gpt2_row}_rc"
    say "gpt2_$gpt2_row" "GPT-2 124M b8x1024 ${gpt2_row^^} tokens/s" "$(tokens_and_peak "gpt2_$gpt2_row" "${!gpt2_rc_var}")"
  done
  say transformer_amp "Transformer AMP attention on cuDNN" "$(cudnn_attention_of transformer_amp)"
  say gpt2_amp "GPT-2 AMP attention on cuDNN" "$(cudnn_attention_of gpt2_amp)"
  if [ -s "$out/attention_retries.txt" ]; then
    echo "  runs again on the own attention kernels after failing with cuDNN's:"
    sed 's/^/    /' "$out/attention_retries.txt"
  fi
  say transformer_amp "Transformer AMP / FP32 (>= 2.9)" "$tf_ratio"
  say transformer_amp_nofold "Transformer AMP no-fold-casts tok/s" "$(tokens_and_peak transformer_amp_nofold "$tf_nofold_rc")"
  say transformer_amp_stored "Transformer AMP store-softmax tok/s" "$(tokens_and_peak transformer_amp_stored "$tf_stored_rc")"
  say_transformer_variant transformer_amp_unfused_bias "unfused bias" "$tf_unfused_bias_rc" "fused / unfused bias"
  say_transformer_variant transformer_amp_unfolded_sums "unfolded grad sums" "$tf_unfolded_sums_rc" \
    "folded / unfolded sums"
  say_transformer_variant transformer_amp_unfused_add_ln "unfused add + LN" "$tf_unfused_add_ln_rc" \
    "fused / unfused add + LN"
  say_transformer_variant transformer_amp_single_rank_sync "one rank's sync kept" "$tf_single_rank_sync_rc" \
    "elided / kept one rank's sync"
  say transformer_amp_unfused "Transformer AMP unfused attn tok/s" "$(tokens_and_peak transformer_amp_unfused "$tf_unfused_rc")"
  say transformer_amp_unfused "  fused / unfused attention speed" "$tf_att_ratio"
  say gpt2_amp_unfused "GPT-2 AMP unfused attn tok/s" "$(tokens_and_peak gpt2_amp_unfused "$gpt2_amp_unfused_rc")"
  say gpt2_amp_unfused "  fused / unfused attention speed" "$gpt2_att_ratio"
  say gpt2_amp_own_attention "GPT-2 AMP own-kernel attn tok/s" \
    "$(tokens_and_peak gpt2_amp_own_attention "${gpt2_amp_own_att_rc-}")"
  say gpt2_amp_own_attention "  cuDNN / own attn kernels" "$gpt2_cudnn_ratio"
  say gpt2_amp_fp32_attention "GPT-2 AMP FP32-kernel attn tok/s" \
    "$(tokens_and_peak gpt2_amp_fp32_attention "$gpt2_amp_fp32_att_rc")"
  say gpt2_amp_fp32_attention "  tensor-core / FP32 attn kernels" "$gpt2_tc_ratio"
  say transformer_amp "Transformer peak bytes FP32 / AMP" "$tf_fp32_peak / $tf_amp_peak"
  say transformer_amp "Transformer AMP host queue / step ms" "$tf_amp_queue"
  say transformer_amp_cudagraph "Transformer AMP, cuda graph tok/s" \
    "$tf_amp_cg_tps (exit $tf_amp_cg_rc), queue / step ms $tf_amp_cg_queue$tf_amp_cg_note"
  say resnet_small_overlap "resnet-small AMP ms/step overlap" "$rs_ov_ms (exit $rs_ov_rc)"
  say resnet_small_no_overlap "resnet-small AMP ms/step no-overlap" "$rs_no_ms (exit $rs_no_rc)"
  say resnet_small_no_overlap "no-overlap / overlap step time" "$rs_ratio"
  say mixbench "mixbench allreduce --check (NCCL)" "$bench_wrong (exit $bench_rc)"
  say stuck "AMP loss scale stuck at the minimum" "$stuck"
  say memcheck_test_cuda_ops "memcheck test_cuda_ops" "$mc_ops"
  say memcheck_test_cuda_transformer_ops "memcheck test_cuda_transformer_ops" "$mc_tf"
  say memcheck_test_cuda_fused_attention "memcheck test_cuda_fused_attention" "$mc_att"
  say_top_ops resnet50_amp_profile "ResNet-50 AMP NHWC, GPU time by op type" 10 "$r50_prof_rc"
  say_top_ops resnet50_amp_host_profile "ResNet-50 AMP NHWC, host time to queue by op type" 10 "$r50_host_prof_rc"
  say_top_ops resnet50_amp_legacy_host_profile "same with --no-cudnn-graph-conv (legacy calls)" 5 \
    "$r50_legacy_host_prof_rc"
  say_top_ops resnet50_amp_gemm1x1_host_profile "same with --cublas-1x1-conv" 5 "$r50_g11_host_prof_rc"
  say_top_ops transformer_amp_profile "Transformer-base AMP, GPU time by op type" 10 "$tf_prof_rc"
  say_top_ops gpt2_amp_profile "GPT-2 124M AMP, GPU time by op type" 10 "$gpt2_prof_rc"
  # ==== PyTorch on the same card (issue 41): each row beside mixtrain's, the ratio, both MFUs ====
  if ran torch_compare; then
    /usr/bin/env python3 "$root/scripts/lib/compare_summary.py" --out "$out" --rows "$tc_rows" --gpu-name "$tc_gpu" \
      --torch-exit "$tc_rc" || echo "  mixtrain against PyTorch: scripts/lib/compare_summary.py failed"
  fi
  # ==== several GPUs: their summary lines ====
  if ran multi_gpu_rows; then multi_rows_summary; fi
  # ==== end of the several-GPU summary ====
} | tee "$out/summary.txt"
# passed STATUS...: every exit status given is 0, or empty: its run left out by --focus.
passed() {
  local rc
  for rc; do [ "${rc:-0}" -eq 0 ] || return 1; done
}
passed "${tests_rc-}" "${fp32_rc-}" "${amp_rc-}" "${r50_fp32_rc-}" "${r50_amp_rc-}" "${r50_jpeg_rc-}" \
  "${r50_nchw_rc-}" "${r50_fp32_nhwc_rc-}" "${r50_bnp_rc-}" "${r50_bench_rc-}" "${r50_nofuse_rc-}" \
  "${r50_nobnfuse_rc-}" "${r50_b256_rc-}" "${r50_fp32_b256_rc-}" "${r50_fp32_legacy_rc-}" "${r50_amp_legacy_rc-}" \
  "${r50_b256_legacy_rc-}" "${r50_fp32_cg_rc-}" "${r50_amp_cg_rc-}" "${r50_amp_cg_legacy_rc-}" "${r50_fp32_g11_rc-}" \
  "${r50_amp_g11_rc-}" "${r50_amp_g11_legacy_rc-}" "${r50_b256_g11_rc-}" "${cg_flag_rc-}" "${gpt2_amp_rc-}" \
  "${gpt2_bf16_rc-}" "${gpt2_fp32_rc-}" "${gpt2_amp_unfused_rc-}" "${gpt2_amp_own_att_rc-}" "${gpt2_amp_fp32_att_rc-}" "${tf_fp32_rc-}" "${tf_amp_rc-}" \
  "${tf_amp_cg_rc-}" "${tf_nofold_rc-}" "${tf_stored_rc-}" "${tf_unfused_bias_rc-}" "${tf_unfolded_sums_rc-}" "${tf_unfused_add_ln_rc-}" "${tf_single_rank_sync_rc-}" "${tf_unfused_rc-}" "${rs_ov_rc-}" "${rs_no_rc-}" \
  "${bench_rc-}" "${stuck_ok-}" "${mc_ops_ok-}" "${mc_tf_ok-}" "${mc_att_ok-}" &&
  multi_rows_ok
