// The CUDA device backend: registers itself with the runtime from a static
// initialiser, so Tensor, allocator_for and copy_bytes reach the GPUs without
// any #ifdef in their callers.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/device_backend.h"
#include "runtime/core/library_versions.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_graph.h"
#include "runtime/cuda/device_allocator.h"
#include "runtime/cuda/stream.h"

namespace mix::cuda {

namespace {

// MIX_PROFILE_OPS on a GPU: a timing event recorded on the compute stream
// per mark, the events reused run after run; collect() waits for the device
// (bounded by the hang timeout) and reads the elapsed times between them.
class CudaOpTimer final : public OpTimer {
 public:
  explicit CudaOpTimer(int device) : device_(device) {}

  void start() override {
    used_ = 0;
    mark();
  }

  void mark() override {
    DeviceContext& c = use_device(device_);
    if (used_ == events_.size()) events_.emplace_back(/*timing=*/true);
    events_[used_++].record(c.compute.get());
  }

  std::vector<double> collect() override {
    std::vector<double> secs;
    if (used_ == 0) return secs;
    use_device(device_);  // wait_for_streams records its events on the current device
    MIX_CHECK(wait_for_streams(device_), "MIX_PROFILE_OPS: the GPU's queued work did not finish within "
                                             << hang_timeout() << " s (MIX_NCCL_TIMEOUT_S); a peer may have died");
    for (size_t k = 1; k < used_; ++k) secs.push_back(1e-3 * events_[k].elapsed_ms_since(events_[k - 1]));
    used_ = 0;
    return secs;
  }

 private:
  int device_;
  std::vector<Event> events_;
  size_t used_ = 0;
};

// Uploads of input batches: a stream of the device's own beside the compute
// stream (copy engines run while kernels do), and an event per fence.
class CudaHostToDeviceQueue final : public HostToDeviceQueue {
 public:
  CudaHostToDeviceQueue(int device, int fences) : device_(device), compute_(use_device(device).compute.get()) {
    MIX_CHECK(fences > 0, "a host-to-device queue needs at least one fence, not " << fences);
    fences_.resize(static_cast<size_t>(fences));
  }
  ~CudaHostToDeviceQueue() override { drain(); }

  void wait_for_compute() override {
    DeviceGuard guard(device_);
    compute_done_.record(compute_);
    compute_done_.wait(stream_.get());
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard guard(device_);
    MIX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_.get()));
  }

  void record(int k) override {
    DeviceGuard guard(device_);
    fence(k).record(stream_.get());
  }

  void compute_waits(int k) override {
    DeviceGuard guard(device_);
    fence(k).wait(compute_);
  }

  void host_waits(int k) override {
    // Bounded like every host wait: copies queued after wait_for_compute()
    // wait for compute work, which may wait for a dead peer's collective.
    MIX_CHECK(wait_for_events({fence(k).get()}), "an input batch upload to GPU "
                                                     << device_ << " did not finish within " << hang_timeout()
                                                     << " s (MIX_NCCL_TIMEOUT_S); a peer may have died");
    MIX_CUDA_CHECK(cudaGetLastError());
  }

  void drain() noexcept override {
    // Bounded too: a destructor that waited forever behind stuck compute work
    // would keep an erroring rank from exiting. Past the limit the copies are
    // left queued; the process is on its way out with an error by then.
    try {
      DeviceGuard guard(device_);
      Event done;
      done.record(stream_.get());
      if (!wait_for_events({done.get()}))
        log_warning("input batch uploads to GPU " + std::to_string(device_) + " still queued after " +
                    std::to_string(hang_timeout()) + " s; not waiting for them");
    } catch (const std::exception& e) {
      log_warning(std::string("waiting for input batch uploads: ") + e.what());
    }
  }

 private:
  Event& fence(int k) {
    MIX_CHECK(k >= 0 && k < static_cast<int>(fences_.size()),
              "fence " << k << " of a host-to-device queue with " << fences_.size());
    return fences_[static_cast<size_t>(k)];
  }

  int device_;
  cudaStream_t compute_;
  Stream stream_;  // made on device_: use_device() above made it current
  Event compute_done_;
  std::vector<Event> fences_;
};

class CudaBackend final : public DeviceBackend {
 public:
  int device_count() override { return cuda::device_count(); }

  Allocator& allocator(int index) override {
    std::call_once(once_, [this] {
      const int n = cuda::device_count();
      for (int i = 0; i < n; ++i) allocators_.push_back(std::make_unique<CudaCachingAllocator>(i));
    });
    MIX_CHECK(index >= 0 && index < static_cast<int>(allocators_.size()),
              "CUDA device " << index << " requested but " << allocators_.size()
                             << " GPU(s) are visible (check CUDA_VISIBLE_DEVICES)");
    return *allocators_[index];
  }

  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    if (bytes == 0) return;
    // The copy runs on the compute stream of the device written to (or read
    // from, for a device -> host copy), so it is ordered after the kernels
    // queued there that produce or consume the bytes.
    const int dev = dst_device.kind == DeviceKind::cuda ? dst_device.index : src_device.index;
    DeviceGuard guard(dev);
    DeviceContext& c = context(dev);
    if (dst_device.kind == DeviceKind::cuda && src_device.kind == DeviceKind::cuda &&
        dst_device.index != src_device.index) {
      // Another GPU's bytes: they are final once its compute stream drains
      // (the copy is synchronous for the host anyway).
      context(src_device.index).compute.synchronize();
    }
    MIX_CUDA_CHECK(cudaSetDevice(dev));  // creating a context above may have switched devices
    // cudaMemcpyDefault: unified addressing tells host from device pointers
    // (and does peer copies between GPUs).
    MIX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c.compute.get()));
    c.compute.synchronize();
  }

  void zero(void* dst, size_t bytes, int index) override {
    if (bytes == 0) return;
    DeviceGuard guard(index);
    DeviceContext& c = context(index);
    MIX_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, c.compute.get()));
  }

  void synchronize(int index) override {
    DeviceGuard guard(index);
    // Every stream of the device: compute, communication, and any other.
    MIX_CUDA_CHECK(cudaDeviceSynchronize());
  }

  void set_options(const DeviceOptions& o) override {
    cuda::set_allow_tf32(o.allow_tf32);
    cuda::set_batch_norm_persistent(o.batch_norm_persistent);
    cuda::set_cudnn_benchmark(o.cudnn_benchmark);
    cuda::set_cudnn_graph_conv(o.cudnn_graph_conv);
    cuda::set_cublas_1x1_conv(o.cublas_1x1_conv);
    cuda::set_tensor_core_attention(o.attention_tensor_cores);
    cuda::set_cudnn_attention(o.attention_cudnn);
  }

  std::unique_ptr<OpTimer> make_op_timer(int index) override { return std::make_unique<CudaOpTimer>(index); }

  std::unique_ptr<DeviceGraph> make_graph(int index) override {
    auto& allocator = static_cast<CudaCachingAllocator&>(this->allocator(index));
    return make_cuda_graph(index, allocator);
  }

  std::unique_ptr<HostToDeviceQueue> make_host_to_device_queue(int index, int fences) override {
    DeviceGuard guard(index);
    return std::make_unique<CudaHostToDeviceQueue>(index, fences);
  }

  Allocator* pinned_host_allocator(int index) override {
    std::call_once(pinned_once_, [this] {
      for (int i = 0; i < cuda::device_count(); ++i) pinned_.push_back(std::make_unique<PinnedHostAllocator>(i));
    });
    MIX_CHECK(index >= 0 && index < static_cast<int>(pinned_.size()),
              "pinned memory for CUDA device " << index << " requested but " << pinned_.size()
                                               << " GPU(s) are visible (check CUDA_VISIBLE_DEVICES)");
    return pinned_[index].get();
  }

 private:
  std::once_flag once_, pinned_once_;
  std::vector<std::unique_ptr<CudaCachingAllocator>> allocators_;
  std::vector<std::unique_ptr<PinnedHostAllocator>> pinned_;
};

// Never destroyed: tensors in static storage may free device memory after
// this file's statics would have been destroyed, and freeing GPU memory from
// static destructors races the CUDA runtime's own teardown.
CudaBackend& instance() {
  static auto* backend = new CudaBackend;
  return *backend;
}

// Registration touches no CUDA API: a process without a GPU or driver loads fine.
[[maybe_unused]] const bool registered = [] {
  register_device_backend(DeviceKind::cuda, &instance());
  register_library_version("CUDA", std::to_string(CUDART_VERSION / 1000) + "." +
                                       std::to_string(CUDART_VERSION % 1000 / 10));
  return true;
}();

}  // namespace

}  // namespace mix::cuda
