#include "runtime/cuda/context.h"

#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "runtime/core/check.h"

namespace mix::cuda {

namespace {

// More than any node has; a fixed table lets context() read without a lock.
constexpr int kMaxDevices = 64;

std::array<std::atomic<DeviceContext*>, kMaxDevices> g_contexts{};
std::mutex g_create_mu;
std::atomic<bool> g_allow_tf32{false};
std::atomic<bool> g_batch_norm_persistent{false};
std::atomic<bool> g_cudnn_benchmark{false};
std::atomic<bool> g_cudnn_graph_conv{false};
std::atomic<bool> g_cublas_1x1_conv{false};
std::atomic<bool> g_tensor_core_attention{true};
std::atomic<bool> g_cudnn_attention{true};
std::atomic<bool> g_large_tensor_paths{false};
std::atomic<double> g_hang_timeout_s{0.0};

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

void set_batch_norm_persistent(bool on) { g_batch_norm_persistent.store(on); }
bool batch_norm_persistent() { return g_batch_norm_persistent.load(); }

void set_cudnn_benchmark(bool on) { g_cudnn_benchmark.store(on); }
bool cudnn_benchmark() { return g_cudnn_benchmark.load(); }

void set_cudnn_graph_conv(bool on) { g_cudnn_graph_conv.store(on); }
bool cudnn_graph_conv() { return g_cudnn_graph_conv.load(); }

void set_cublas_1x1_conv(bool on) { g_cublas_1x1_conv.store(on); }
bool cublas_1x1_conv() { return g_cublas_1x1_conv.load(); }

void set_tensor_core_attention(bool on) { g_tensor_core_attention.store(on); }
bool tensor_core_attention() { return g_tensor_core_attention.load(); }

void set_cudnn_attention(bool on) { g_cudnn_attention.store(on); }
bool cudnn_attention() { return g_cudnn_attention.load(); }

void set_large_tensor_paths(bool on) { g_large_tensor_paths.store(on); }
bool large_tensor_paths() { return g_large_tensor_paths.load(); }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error for the caller to trip over later
    return 0;
  }
  return n;
}

void set_hang_timeout(double seconds) { g_hang_timeout_s.store(seconds > 0 ? seconds : 0.0); }
double hang_timeout() { return g_hang_timeout_s.load(); }

bool wait_for_streams(int device) {
  if (device < 0 || device >= kMaxDevices) return true;
  DeviceContext* c = g_contexts[device].load(std::memory_order_acquire);
  if (!c) return true;
  Event compute_done, comm_done;
  compute_done.record(c->compute.get());
  comm_done.record(c->comm.get());
  return wait_for_events({compute_done.get(), comm_done.get()});
}

bool wait_for_events(std::initializer_list<cudaEvent_t> events) {
  const double limit = hang_timeout();
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    bool passed = true;
    for (cudaEvent_t e : events) passed = passed && cudaEventQuery(e) != cudaErrorNotReady;
    // A failed query is an error of the queued work: the next check reports it.
    if (passed) return true;
    (void)cudaGetLastError();  // "not ready" is not an error for a later check to report
    if (limit > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > limit)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void log_warning(const std::string& message) { spdlog::warn("{}", message); }

}  // namespace mix::cuda
