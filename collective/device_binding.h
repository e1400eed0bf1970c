#pragma once
// Device binding: every rank drives the GPU whose index is its local rank
// (docs/design.md, "Data parallelism"), or, when it sees exactly one GPU, that one:
// schedulers that give each rank a GPU of its own (Slurm --gpus-per-task=1,
// Kubernetes) set a different CUDA_VISIBLE_DEVICES per rank, and two ranks
// handed the same GPU are caught by the bus-id check below. Built with CUDA only (device_binding.cu, in
// mix_cuda); callers normally reach bind_local_gpu through
// collective::bind_device(), which it registers itself with.
#include <string>
#include <vector>

#include "collective/communicator.h"

namespace mix::collective {

/// What one rank sees of its GPUs, as all-gathered by bind_local_gpu.
struct GpuBinding {
  int rank = 0;
  int local_rank = 0;
  int local_size = 1;
  int visible_gpus = 0;         ///< cudaGetDeviceCount (0 when it failed)
  int device = -1;              ///< the GPU index picked (pick_device), -1 when none
  std::string host;             ///< gethostname
  std::string pci_bus_id;       ///< cudaDeviceGetPCIBusId of `device` ("" when none)
  std::string visible_devices;  ///< CUDA_VISIBLE_DEVICES, or "unset"
  std::string cuda_error;       ///< why cudaGetDeviceCount or cudaDeviceGetPCIBusId failed, if one did
  int driver_version = 0;       ///< cudaDriverGetVersion: 1000 major + 10 minor (12040: CUDA 12.4); 0 unknown
};

/// The oldest driver mixtrain's kernels run on, as cudaDriverGetVersion
/// reports it: CUDA 12.1 (R530). The multi-tensor kernels (optimizers,
/// unscale, weight casts) carry their tensor tables in up to 32 KiB of kernel
/// parameters, which older drivers refuse at launch. A build with a 12.1+
/// toolkit runs on a 12.0 driver otherwise (CUDA's minor-version
/// compatibility), so only this check says so before the first step.
inline constexpr int kMinDriverVersion = 12010;

/// Checks a gathered table (one entry per rank, rank order) and throws
/// CollectiveError (collective/consistency.h) when more ranks share a host
/// than that host's ranks see GPUs ("N ranks on host H but only G GPUs visible
/// (CUDA_VISIBLE_DEVICES=...)"), when two ranks of one host would drive the
/// same GPU (same PCI bus id; the message names both ranks), or when a rank's
/// driver is older than kMinDriverVersion (the message names the rank, its
/// host and both versions). Every rank checks
/// the same table, so every rank throws the same error together. Pure host
/// code: tested without a GPU.
void check_gpu_bindings(const std::vector<GpuBinding>& table);

/// The GPU a rank drives: its local rank when it sees that many GPUs, else GPU 0
/// when it sees exactly one (its own, by the scheduler's CUDA_VISIBLE_DEVICES),
/// else -1 (none: check_gpu_bindings says why).
int pick_device(int local_rank, int visible_gpus);

/// What this rank sees (no communication).
GpuBinding local_gpu_binding(const Communicator& bootstrap);

/// Collective over `bootstrap`: all-gathers every rank's GpuBinding, checks the
/// table (check_gpu_bindings), makes the GPU current and returns its index
/// (pick_device). The whole table lands in *table when it is not null.
int bind_local_gpu(Communicator& bootstrap, std::vector<GpuBinding>* table);
/// bind_local_gpu without the table (the DeviceBinder of communicator.h).
int bind_local_gpu(Communicator& bootstrap);

}  // namespace mix::collective
