#!/usr/bin/env bash
# Installs, idempotently, every Debian package the build, the tests and the
# default run need. Safe to run again: it installs only what is missing.
set -euo pipefail
prog=setup.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"  # usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/setup.sh
Installs, idempotently, every Debian package the build, the tests and the default run need: only what
is missing, with apt-get (through sudo when not root). Safe to run again.
EOF

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
  python3-pil python3-torchvision     # image-folder tests: JPEGs written, transforms checked against torchvision
  python3-matplotlib                  # the plots of scripts/bandwidth.sh and scripts/plot_metrics.py
  munge                               # Slurm's authentication, for tests/cluster/test_slurm.py's own cluster
  slurmctld slurmd                    # that one-node cluster's controller and node daemons
  slurm-client                        # sbatch, srun, scontrol, scancel for it and for scripts/slurm/
  slurm-wlm-basic-plugins             # srun --mpi=pmix/pmi2 (mpi_pmix.so), proctrack/linuxproc, task/none
  libpmix2                            # the PMIx library that srun --mpi=pmix and Open MPI's ranks share
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
