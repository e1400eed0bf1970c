#include "runtime/cuda/context.h"

#include <array>
#include <atomic>
#include <mutex>

#include <spdlog/spdlog.h>

#include "runtime/check.h"

namespace mix::cuda {

namespace {

// More than any node has; a fixed table lets context() read without a lock.
constexpr int kMaxDevices = 64;

std::array<std::atomic<DeviceContext*>, kMaxDevices> g_contexts{};
std::mutex g_create_mu;
std::atomic<bool> g_allow_tf32{false};

}  // namespace

DeviceContext& context(int device) {
  MIX_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index " << device << " is out of range");
  if (DeviceContext* c = g_contexts[device].load(std::memory_order_acquire)) return *c;

  std::lock_guard<std::mutex> lock(g_create_mu);
  if (DeviceContext* c = g_contexts[device].load(std::memory_order_relaxed)) return *c;
  const int count = device_count();
  MIX_CHECK(device < count, "CUDA device " << device << " requested but " << count << " GPU(s) are visible"
                                            << " (check CUDA_VISIBLE_DEVICES)");
  // The streams are made on the current device, so the device is made current first.
  MIX_CUDA_CHECK(cudaSetDevice(device));
  // Never freed: a context lives as long as the process, and destroying its
  // streams from a static destructor would race the CUDA runtime's own teardown.
  auto* c = new DeviceContext{};
  c->device = device;
  g_contexts[device].store(c, std::memory_order_release);
  return *c;
}

DeviceContext& use_device(int device) {
  DeviceContext& c = context(device);
  MIX_CUDA_CHECK(cudaSetDevice(device));
  return c;
}

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
bool allow_tf32() { return g_allow_tf32.load(); }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error for the caller to trip over later
    return 0;
  }
  return n;
}

void log_warning(const std::string& message) { spdlog::warn("{}", message); }

}  // namespace mix::cuda
