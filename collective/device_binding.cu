// Device binding: local rank -> GPU, with the two mistakes that otherwise end
// in a hang or a crash deep inside NCCL (more ranks than GPUs on a host, two
// ranks on one GPU) caught at start, with a message, on every rank at once.
#include "collective/device_binding.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "collective/consistency.h"
#include "runtime/core/check.h"
#include "runtime/cuda/cuda_check.h"

namespace mix::collective {

namespace {

// The fixed-size record every rank contributes to the all-gather.
struct Record {
  int32_t rank, local_rank, local_size, visible_gpus, device, driver_version;
  char host[256];
  char pci_bus_id[32];
  char visible_devices[256];
  char cuda_error[160];
};

template <size_t N>
void put(char (&dst)[N], const std::string& s) {
  const size_t n = std::min(s.size(), N - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

template <size_t N>
std::string get(const char (&src)[N]) {
  return std::string(src, strnlen(src, N));
}

std::string host_name() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "unknown-host";
  return host;
}

// "12.4" for cudaDriverGetVersion's 12040.
std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string list_ranks(const std::vector<int>& ranks) {
  std::ostringstream o;
  for (size_t i = 0; i < ranks.size(); ++i) o << (i ? ", " : "") << ranks[i];
  return o.str();
}

}  // namespace

int pick_device(int local_rank, int visible_gpus) {
  if (local_rank >= 0 && local_rank < visible_gpus) return local_rank;
  if (visible_gpus == 1) return 0;
  return -1;
}

GpuBinding local_gpu_binding(const Communicator& bootstrap) {
  GpuBinding b;
  b.rank = bootstrap.rank();
  b.local_rank = bootstrap.local_rank();
  b.local_size = bootstrap.local_size();
  b.host = host_name();
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  b.visible_devices = cvd ? (*cvd ? std::string(cvd) : std::string("\"\" (empty: no GPU)")) : std::string("unset");
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
    b.cuda_error = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  }
  b.visible_gpus = n;
  b.device = pick_device(b.local_rank, n);
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) {
    b.driver_version = driver;
  } else {
    (void)cudaGetLastError();  // unknown: left to the first launch to report
  }
  if (b.device >= 0) {
    char pci[32] = {0};
    const cudaError_t pe = cudaDeviceGetPCIBusId(pci, static_cast<int>(sizeof(pci)), b.device);
    if (pe == cudaSuccess) {
      b.pci_bus_id = pci;
    } else {
      (void)cudaGetLastError();
      b.cuda_error = std::string("cudaDeviceGetPCIBusId: ") + cudaGetErrorString(pe);
    }
  }
  return b;
}

void check_gpu_bindings(const std::vector<GpuBinding>& table) {
  // 1. No more ranks on a host than GPUs visible to them. The first rank (in
  //    rank order) whose local rank has no GPU names its host.
  for (const GpuBinding& b : table) {
    if (b.device >= 0) continue;
    std::vector<int> on_host;
    for (const GpuBinding& o : table)
      if (o.host == b.host) on_host.push_back(o.rank);
    const int ranks_here = std::max<int>(b.local_size, static_cast<int>(on_host.size()));
    std::ostringstream msg;
    msg << ranks_here << (ranks_here == 1 ? " rank" : " ranks") << " on host " << b.host << " but only "
        << b.visible_gpus << (b.visible_gpus == 1 ? " GPU" : " GPUs") << " visible (CUDA_VISIBLE_DEVICES="
        << b.visible_devices << ")";
    if (!b.cuda_error.empty()) msg << " [" << b.cuda_error << "]";
    msg << ": rank " << b.rank << " (local rank " << b.local_rank << " of ranks " << list_ranks(on_host) << " on "
        << b.host << ") has no GPU of its own; ";
    if (b.visible_gpus == 0) {
      msg << "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES on " << b.host
          << ", or train with --device cpu";
    } else {
      msg << "start at most " << b.visible_gpus << " ranks per host (mixrun -n, mpirun --map-by ppr:"
          << b.visible_gpus << ":node), or make more GPUs visible";
    }
    throw CollectiveError(msg.str());
  }
  // 2. No GPU driven by two ranks of one host. A PCI bus id is unique within a
  //    host only, so hosts are compared separately. NCCL itself refuses this
  //    ("Duplicate GPU detected"), but later and less plainly.
  std::map<std::pair<std::string, std::string>, const GpuBinding*> owner;  // (host, pci) -> first rank
  for (const GpuBinding& b : table) {
    if (b.pci_bus_id.empty()) continue;
    auto [it, fresh] = owner.emplace(std::make_pair(b.host, b.pci_bus_id), &b);
    if (fresh) continue;
    const GpuBinding& a = *it->second;
    std::ostringstream msg;
    msg << "ranks " << a.rank << " and " << b.rank << " on host " << b.host << " would share GPU " << b.pci_bus_id
        << " (rank " << a.rank << ": device " << a.device << " of CUDA_VISIBLE_DEVICES=" << a.visible_devices
        << "; rank " << b.rank << ": device " << b.device << " of CUDA_VISIBLE_DEVICES=" << b.visible_devices
        << "): every rank needs a GPU of its own; give all ranks of a host the same CUDA_VISIBLE_DEVICES (each "
           "picks the GPU of its local rank) or each rank a different single GPU, or start at most one rank per GPU";
    throw CollectiveError(msg.str());
  }
  // 3. A driver new enough for the kernels' arguments (kMinDriverVersion).
  for (const GpuBinding& b : table) {
    if (b.device < 0 || b.driver_version <= 0 || b.driver_version >= kMinDriverVersion) continue;
    std::ostringstream msg;
    msg << "rank " << b.rank << " on host " << b.host << ": its NVIDIA driver supports CUDA "
        << cuda_version_text(b.driver_version) << ", but mixtrain's multi-tensor kernels (optimizer, unscale and "
        << "weight-cast updates of many tensors at once) pass up to 32 KiB of kernel arguments, which needs a "
           "driver for CUDA "
        << cuda_version_text(kMinDriverVersion) << " or newer (R530 or later); update the NVIDIA driver on " << b.host
        << ", or train with --device cpu";
    throw CollectiveError(msg.str());
  }
}

int bind_local_gpu(Communicator& bootstrap, std::vector<GpuBinding>* table) {
  const GpuBinding mine = local_gpu_binding(bootstrap);
  Record rec{};
  rec.rank = mine.rank;
  rec.local_rank = mine.local_rank;
  rec.local_size = mine.local_size;
  rec.visible_gpus = mine.visible_gpus;
  rec.device = mine.device;
  rec.driver_version = mine.driver_version;
  put(rec.host, mine.host);
  put(rec.pci_bus_id, mine.pci_bus_id);
  put(rec.visible_devices, mine.visible_devices);
  put(rec.cuda_error, mine.cuda_error);

  const int world = bootstrap.world_size();
  std::vector<Record> all(static_cast<size_t>(world));
  bootstrap.all_gather(&rec, all.data(), sizeof(Record));

  std::vector<GpuBinding> gathered;
  gathered.reserve(all.size());
  for (const Record& r : all) {
    GpuBinding b;
    b.rank = r.rank;
    b.local_rank = r.local_rank;
    b.local_size = r.local_size;
    b.visible_gpus = r.visible_gpus;
    b.device = r.device;
    b.driver_version = r.driver_version;
    b.host = get(r.host);
    b.pci_bus_id = get(r.pci_bus_id);
    b.visible_devices = get(r.visible_devices);
    b.cuda_error = get(r.cuda_error);
    gathered.push_back(std::move(b));
  }
  check_gpu_bindings(gathered);
  // The checks passed on every rank, so this rank's device is in range.
  MIX_CUDA_CHECK(cudaSetDevice(mine.device));
  if (table) *table = std::move(gathered);
  return mine.device;
}

int bind_local_gpu(Communicator& bootstrap) { return bind_local_gpu(bootstrap, nullptr); }

namespace {
// The CUDA backend provides the device binder: callers reach it through
// collective::bind_device() without an #ifdef.
struct RegisterBinder {
  RegisterBinder() {
    int (*binder)(Communicator&) = &bind_local_gpu;
    register_device_binder(binder);
  }
};
[[maybe_unused]] const RegisterBinder g_register_binder;
}  // namespace

}  // namespace mix::collective
