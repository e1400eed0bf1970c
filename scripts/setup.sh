#!/usr/bin/env bash
# Installs, idempotently, every Debian package the build, the tests and the
# default run need, and where nvcc is, cuDNN's frontend headers (below). Safe
# to run again: it installs only what is missing.
set -euo pipefail
prog=setup.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"  # usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/setup.sh [--tests]
Installs, idempotently, every Debian package the build, the tests and the default run need: only what
is missing, with apt-get (through sudo when not root); where nvcc is, also cuDNN's frontend headers
(the nvidia-cudnn-frontend wheel, pinned) into $CUDNN_FRONTEND_DIR (default /opt/cudnn-frontend).
Safe to run again.
  --tests   also what only the tests use (scripts/test.sh passes it): a recent PyTorch from PyPI,
            pinned, in a virtual environment of its own, $MIX_TORCH2_DIR (default /opt/mixtrain-torch2;
            several GB), on which tests/e2e/test_torch_compare_torch2.py runs
            scripts/torch_compare.py's PyTorch 2.x paths (torch.compile, torch.amp.GradScaler,
            fused AdamW). Debian's python3-torch is older. Without network that test skips.
EOF
with_tests=0
for arg in "$@"; do
  case "$arg" in
    --tests) with_tests=1 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done

packages=(
  build-essential cmake pkg-config
  libopenmpi-dev openmpi-bin          # MPI communicator, mpirun
  libspdlog-dev libfmt-dev            # logging
  catch2                              # unit tests (Catch2 2.x)
  libcli11-dev                        # command lines
  nlohmann-json3-dev                  # safetensors headers, metrics
  libopenblas-dev                     # SGEMM of the CPU backend
  zlib1g-dev                          # Fashion-MNIST .gz files
  libjpeg62-turbo-dev                 # JPEG decoding of the image readers (libjpeg-turbo)
  libpng-dev                          # PNG decoding of the image readers
  dataset-fashion-mnist               # the default data set
  fortunes                            # English text for the Transformer language model
  python3-numpy python3-torch         # reference values and parity tests (/usr/bin/python3)
  python3-venv                        # the tests' own PyTorch 2.x environment (setup.sh --tests)
  python3-dev                         # Python.h, which torch.compile's CPU kernels include (the same tests)
  python3-pil python3-torchvision     # image-folder tests: JPEGs written, transforms checked against torchvision
  python3-matplotlib                  # the plots of scripts/bandwidth.sh and scripts/plot_metrics.py
  munge                               # Slurm's authentication, for tests/cluster/test_slurm.py's own cluster
  slurmctld slurmd                    # that one-node cluster's controller and node daemons
  slurm-client                        # sbatch, srun, scontrol, scancel for it and for scripts/slurm/
  slurm-wlm-basic-plugins             # srun --mpi=pmix/pmi2 (mpi_pmix.so), proctrack/linuxproc, task/none
  libpmix2                            # the PMIx library that srun --mpi=pmix and Open MPI's ranks share
)

install_debian_packages() {
  local missing=() p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all ${#packages[@]} packages present"
    return
  fi
  echo "setup: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# cuDNN's frontend (NVIDIA's header-only C++ API for cuDNN's graphs), whose
# SDPA node runs fused_attention on cuDNN's flash-attention engines
# (runtime/cuda/cudnn_attention_graph.cc). Only a CUDA build uses it, so only
# where nvcc is: its headers come from the nvidia-cudnn-frontend wheel on PyPI
# (no Debian package has them), pinned, into CUDNN_FRONTEND_DIR. Without them
# (no network) the CUDA build leaves that path out and says so; nothing fails.
CUDNN_FRONTEND_VERSION=1.32.0
CUDNN_FRONTEND_DIR=${CUDNN_FRONTEND_DIR:-/opt/cudnn-frontend}
install_cudnn_frontend() {
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  local stamp="$CUDNN_FRONTEND_DIR/VERSION"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$CUDNN_FRONTEND_VERSION" ] \
     && [ -f "$CUDNN_FRONTEND_DIR/include/cudnn_frontend.h" ]; then
    echo "setup: cuDNN frontend $CUDNN_FRONTEND_VERSION present in $CUDNN_FRONTEND_DIR"
    return
  fi
  local py tmp
  py=$(command -v python3 || true)
  tmp=$(mktemp -d)
  # The wheel's headers are the same for every Python and platform tag; pin one.
  if [ -n "$py" ] && "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
       --implementation cp --platform manylinux_2_28_x86_64 -d "$tmp" \
       "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION" >"$tmp/pip.log" 2>&1; then
    "$py" - "$tmp" "$CUDNN_FRONTEND_DIR" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
staging = os.path.join(tmp, "out")
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.startswith("include/") or "LICENSE" in os.path.basename(m)]
    z.extractall(staging, members)
os.makedirs(dest, exist_ok=True)
shutil.rmtree(os.path.join(dest, "include"), ignore_errors=True)
shutil.copytree(os.path.join(staging, "include"), os.path.join(dest, "include"))
for m in members:
    if "LICENSE" in os.path.basename(m):
        shutil.copy(os.path.join(staging, m), os.path.join(dest, "LICENSE.txt"))
PY
    echo "$CUDNN_FRONTEND_VERSION" >"$stamp"
    echo "setup: cuDNN frontend $CUDNN_FRONTEND_VERSION headers in $CUDNN_FRONTEND_DIR/include"
  else
    echo "setup: WARNING: could not download nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION" \
         "($(tail -1 "$tmp/pip.log" 2>/dev/null)); the CUDA build will run fused_attention on its own kernels only"
  fi
  rm -rf "$tmp"
}

# A recent PyTorch for the tests alone: the GPU check runs scripts/torch_compare.py with the GPU
# machine's PyTorch, a 2.x, whose paths (torch.compile in a child process, torch.amp.GradScaler,
# fused AdamW, the per-op TF32 settings) Debian's python3-torch cannot reach. PyPI's wheel is the
# CUDA build (it runs on the CPU too); pinned, with numpy, so a new release cannot change the test
# under us. It is built beside the folder and moved in only once complete, so a failed download
# (no network) leaves the folder as it was; a folder that setup.sh did not make is never touched.
TORCH2_VERSION=2.15.0
TORCH2_NUMPY_VERSION=2.4.6
MIX_TORCH2_DIR=${MIX_TORCH2_DIR:-/opt/mixtrain-torch2}
install_torch2() {
  local stamp="$MIX_TORCH2_DIR/MIXTRAIN_TORCH_VERSION" partial="$MIX_TORCH2_DIR.partial" py log
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$TORCH2_VERSION" ] && [ -x "$MIX_TORCH2_DIR/bin/python" ]; then
    echo "setup: PyTorch $TORCH2_VERSION for the tests present in $MIX_TORCH2_DIR"
    return
  fi
  if [ -e "$MIX_TORCH2_DIR" ] && [ ! -f "$stamp" ]; then
    echo "setup: WARNING: $MIX_TORCH2_DIR exists but was not made by setup.sh; left alone, so" \
         "tests/e2e/test_torch_compare_torch2.py may skip (MIX_TORCH2_DIR names another folder)"
    return
  fi
  py=$(command -v python3 || true)
  log=$(mktemp)
  rm -rf "$partial"
  if [ -n "$py" ] && "$py" -m venv "$partial" >"$log" 2>&1 \
     && "$partial/bin/python" -m pip install -q --no-input --no-cache-dir --retries 1 --timeout 60 \
          "torch==$TORCH2_VERSION" "numpy==$TORCH2_NUMPY_VERSION" >>"$log" 2>&1; then
    echo "$TORCH2_VERSION" >"$partial/MIXTRAIN_TORCH_VERSION"
    rm -rf "$MIX_TORCH2_DIR"  # an older one of setup.sh's (checked above)
    mv "$partial" "$MIX_TORCH2_DIR"
    echo "setup: PyTorch $TORCH2_VERSION for the tests installed in $MIX_TORCH2_DIR"
  else
    echo "setup: WARNING: could not install PyTorch $TORCH2_VERSION in $MIX_TORCH2_DIR" \
         "($(tail -1 "$log" 2>/dev/null)); tests/e2e/test_torch_compare_torch2.py will skip," \
         "or run on the older one left there"
    rm -rf "$partial"
  fi
  rm -f "$log"
}

install_debian_packages
install_cudnn_frontend
[ "$with_tests" -eq 0 ] || install_torch2
