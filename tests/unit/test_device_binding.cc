// The host-side checks of the CUDA backend's collectives, which need no GPU:
// the device-binding table checks (more ranks than GPUs on a host, two ranks on
// one GPU) on made-up tables of several hosts, and the MIX_NCCL_TIMEOUT_S
// parser. They run wherever the build has CUDA; a build without CUDA exits 77
// (CTest: skipped), since there is nothing of this to test there.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/consistency.h"
#include "runtime/core/check.h"

#ifdef MIX_HAVE_CUDA
#include "collective/device_binding.h"
#include "collective/nccl_communicator.h"

namespace {

using mix::collective::check_gpu_bindings;
using mix::collective::CollectiveError;
using mix::collective::GpuBinding;

// `per_host` ranks on each of `hosts`, every host with `gpus` GPUs, every rank
// bound to the GPU of its local rank (bus ids 0000:<local>:00.0).
std::vector<GpuBinding> table(int hosts, int per_host, int gpus) {
  std::vector<GpuBinding> t;
  for (int h = 0; h < hosts; ++h) {
    for (int l = 0; l < per_host; ++l) {
      GpuBinding b;
      b.rank = static_cast<int>(t.size());
      b.local_rank = l;
      b.local_size = per_host;
      b.visible_gpus = gpus;
      b.host = "node" + std::to_string(h);
      b.visible_devices = "unset";
      b.driver_version = 13000;  // CUDA 13.0
      if (l < gpus) {
        b.device = l;
        b.pci_bus_id = "0000:" + std::to_string(10 + l) + ":00.0";
      }
      t.push_back(b);
    }
  }
  return t;
}

std::string message_of(const std::vector<GpuBinding>& t) {
  try {
    check_gpu_bindings(t);
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a valid binding passes: one rank per GPU on every host", "[binding]") {
  CHECK_NOTHROW(check_gpu_bindings(table(1, 1, 1)));
  CHECK_NOTHROW(check_gpu_bindings(table(2, 8, 8)));
  CHECK_NOTHROW(check_gpu_bindings(table(3, 2, 4)));  // fewer ranks than GPUs is fine
  // The same bus ids on different hosts are different GPUs.
  CHECK_NOTHROW(check_gpu_bindings(table(4, 4, 4)));
}

TEST_CASE("more local ranks than visible GPUs names the host, the counts and CUDA_VISIBLE_DEVICES", "[binding]") {
  auto t = table(2, 4, 4);
  for (auto& b : t) {
    if (b.host != "node1") continue;
    b.visible_gpus = 2;
    b.visible_devices = "0,1";
    if (b.local_rank >= 2) {
      b.device = -1;
      b.pci_bus_id.clear();
    }
  }
  const std::string msg = message_of(t);
  CHECK_THAT(msg, Catch::Contains("4 ranks on host node1 but only 2 GPUs visible (CUDA_VISIBLE_DEVICES=0,1)"));
  CHECK_THAT(msg, Catch::Contains("rank 6"));  // the first rank of node1 without a GPU (local rank 2)

  // No GPU at all: the CUDA error is part of the message.
  auto none = table(1, 2, 0);
  for (auto& b : none) b.cuda_error = "cudaGetDeviceCount: no CUDA-capable device is detected";
  const std::string msg0 = message_of(none);
  CHECK_THAT(msg0, Catch::Contains("2 ranks on host node0 but only 0 GPUs visible (CUDA_VISIBLE_DEVICES=unset)"));
  CHECK_THAT(msg0, Catch::Contains("no CUDA-capable device"));
}

TEST_CASE("pick_device: the local rank's GPU, or the one GPU a rank was given", "[binding]") {
  using mix::collective::pick_device;
  CHECK(pick_device(0, 8) == 0);
  CHECK(pick_device(5, 8) == 5);
  CHECK(pick_device(3, 1) == 0);  // a scheduler gave this rank its own GPU (CUDA_VISIBLE_DEVICES=3, say)
  CHECK(pick_device(0, 1) == 0);
  CHECK(pick_device(2, 2) == -1);  // two visible, neither is local rank 2's
  CHECK(pick_device(0, 0) == -1);
}

TEST_CASE("one GPU per rank by CUDA_VISIBLE_DEVICES passes; the same GPU handed to two ranks is named",
          "[binding]") {
  // Slurm --gpus-per-task=1: every rank sees one GPU, device 0, each a different one.
  auto t = table(2, 4, 4);
  for (auto& b : t) {
    b.visible_gpus = 1;
    b.visible_devices = std::to_string(b.local_rank);
    b.device = mix::collective::pick_device(b.local_rank, b.visible_gpus);
  }
  CHECK_NOTHROW(check_gpu_bindings(t));
  // Two ranks of node0 handed the same GPU.
  t[2].visible_devices = "1";
  t[2].pci_bus_id = t[1].pci_bus_id;
  const std::string msg = message_of(t);
  CHECK_THAT(msg, Catch::Contains("ranks 1 and 2 on host node0 would share GPU 0000:11:00.0"));
  CHECK_THAT(msg, Catch::Contains("each rank a different single GPU"));
}

TEST_CASE("two ranks of one host on one GPU are named, with both CUDA_VISIBLE_DEVICES", "[binding]") {
  // Rank 5 (node1, local rank 1) sees the GPUs in another order, so its device
  // 1 is the GPU rank 4 drives as device 0.
  auto t = table(2, 4, 4);
  t[5].visible_devices = "1,0,2,3";
  t[5].pci_bus_id = t[4].pci_bus_id;
  const std::string msg = message_of(t);
  CHECK_THAT(msg, Catch::Contains("ranks 4 and 5 on host node1 would share GPU 0000:10:00.0"));
  CHECK_THAT(msg, Catch::Contains("CUDA_VISIBLE_DEVICES=1,0,2,3"));
}

TEST_CASE("a driver older than CUDA 12.1 is named with its host and version; unknown or newer ones pass", "[binding]") {
  auto t = table(2, 2, 2);
  t[1].driver_version = mix::collective::kMinDriverVersion;  // exactly 12.1
  t[2].driver_version = 0;                                   // cudaDriverGetVersion failed: not judged here
  CHECK_NOTHROW(check_gpu_bindings(t));
  t[3].driver_version = 12000;
  const std::string msg = message_of(t);
  CHECK_THAT(msg, Catch::Contains("rank 3 on host node1: its NVIDIA driver supports CUDA 12.0"));
  CHECK_THAT(msg, Catch::Contains("driver for CUDA 12.1 or newer"));
  CHECK_THAT(msg, Catch::Contains("update the NVIDIA driver on node1"));
  // A rank without a GPU is reported for that, not for its driver.
  t[3].device = -1;
  t[3].pci_bus_id.clear();
  CHECK_THAT(message_of(t), Catch::Contains("has no GPU of its own"));
}

TEST_CASE("MIX_NCCL_TIMEOUT_S: default 300 s, fractions allowed, huge values clamped, garbage refused", "[binding]") {
  using mix::collective::nccl_timeout_seconds;
  unsetenv("MIX_NCCL_TIMEOUT_S");
  CHECK(nccl_timeout_seconds() == 300.0);
  setenv("MIX_NCCL_TIMEOUT_S", "", 1);
  CHECK(nccl_timeout_seconds() == 300.0);
  setenv("MIX_NCCL_TIMEOUT_S", "2.5", 1);
  CHECK(nccl_timeout_seconds() == 2.5);
  // A deadline of 1e12 s would overflow steady_clock's nanoseconds: "never" is a billion seconds.
  setenv("MIX_NCCL_TIMEOUT_S", "1e12", 1);
  CHECK(nccl_timeout_seconds() == 1e9);
  for (const char* bad : {"0", "-1", "abc", "10s", "inf", "nan"}) {
    INFO(bad);
    setenv("MIX_NCCL_TIMEOUT_S", bad, 1);
    CHECK_THROWS_WITH(nccl_timeout_seconds(), Catch::Contains("MIX_NCCL_TIMEOUT_S=") &&
                                                  Catch::Contains("not a positive number of seconds"));
  }
  unsetenv("MIX_NCCL_TIMEOUT_S");
}

#else  // no CUDA in this build

TEST_CASE("device binding checks", "[binding]") {
  WARN("this build has no CUDA: skipped");
  std::exit(77);
}

#endif
