#pragma once
// Devices other than the host plug in here. The CUDA backend (runtime/cuda/)
// registers itself from a static initialiser, so the runtime and its callers
// never #ifdef on CUDA: a CPU-only build simply has no backend for cuda.
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/core/check.h"
#include "runtime/core/device.h"

namespace mix {

/// Choices a device backend makes between speed and precision or
/// reproducibility; every one off by default.
struct DeviceOptions {
  bool allow_tf32 = false;             // FP32 GEMMs and convolutions may use TF32 tensor cores (--allow-tf32)
  bool batch_norm_persistent = false;  // training batch_norm on cuDNN's persistent kernels (--cudnn-bn-persistent)
  bool cudnn_benchmark = false;        // time cuDNN's convolution algorithms once per shape (--cudnn-benchmark)
  bool cudnn_graph_conv = false;       // convolutions on cuDNN's graph API, plans cached (mixtrain: on unless
                                       // --no-cudnn-graph-conv or --cudnn-benchmark)
  bool cublas_1x1_conv = false;        // pointwise channels-last convolutions as cuBLAS GEMMs (--cublas-1x1-conv)
  bool attention_tensor_cores = true;  // fused_attention's FP16/BF16 tensor-core kernels where they apply
                                       // (--no-attention-tensor-cores: its FP32 kernels only)
  bool attention_cudnn = true;         // fused_attention tries cuDNN's SDPA first where it applies
                                       // (--no-cudnn-attention: its own kernels only)
};

/// Times ops by the device's own clock, for MIX_PROFILE_OPS on a device whose
/// kernels run asynchronously (host time would only count their launches).
/// The executor starts the timer before the first op and marks the device's
/// queue after each op; collect() then gives each op's device time.
class OpTimer {
 public:
  virtual ~OpTimer() = default;
  /// Forgets earlier marks (of a run that failed, say) and marks the start.
  virtual void start() = 0;
  /// Marks the point of the device's compute queue after everything queued so far.
  virtual void mark() = 0;
  /// Waits for the last mark; returns the seconds between consecutive marks
  /// since start(), in order (one per mark).
  virtual std::vector<double> collect() = 0;
};

/// Host-to-device copies on a queue of their own (a CUDA stream beside the
/// compute stream), so that the next input batch uploads while the device
/// computes the current step (data::BatchFeeder). Fences 0 .. fences-1 mark
/// points in the queue; the compute stream and the host wait on them.
class HostToDeviceQueue {
 public:
  virtual ~HostToDeviceQueue() = default;
  /// The copies queued from now on start only after the work queued so far on
  /// the device's compute stream, which may still read the memory they overwrite.
  virtual void wait_for_compute() = 0;
  /// Queues a copy of `bytes` from page-locked host memory (pinned_host_allocator)
  /// to device memory and returns at once: `src` must stay unchanged until a
  /// fence recorded after the copy has been passed.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  /// Sets fence `k` to the end of the copies queued so far.
  virtual void record(int k) = 0;
  /// The compute stream's work queued from now on waits (on the device, not
  /// the host) for fence `k`.
  virtual void compute_waits(int k) = 0;
  /// The host waits until the device has passed fence `k`.
  virtual void host_waits(int k) = 0;
  /// The host waits for every copy queued, at most the device's hang timeout;
  /// for destructors (never throws).
  virtual void drain() noexcept = 0;
};

/// A recording that failed (DeviceGraph::record): the device refused to
/// record some call, or to instantiate what was recorded, or the work itself
/// threw while being queued (its message then follows). Nothing was recorded
/// and none of the device work ran, so the caller may queue the same work op
/// by op instead; the host code that ran (caches it filled, collectives it
/// started: collective::forget_started) is the caller's to account for.
class RecordingError : public Error {
 public:
  using Error::Error;
};

/// A recording of the work queued on a device's compute stream (and the
/// streams ordered onto it), replayed with one call: a CUDA graph. A training
/// step of hundreds of kernels then costs the host one launch instead of one
/// call per kernel (--cuda-graph, runtime/exec/step_graph.h).
///
/// A recording holds addresses, not variables: each replay reads and writes
/// exactly the memory the recorded work did. Memory allocated while recording
/// comes from a pool of the recording's own, which nothing else is handed
/// while the recording lives, so no later allocation can take memory a replay
/// writes; memory allocated before it must stay allocated (and in place) for
/// as long as it is replayed.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  /// Records what `queue_work` queues (nothing runs on the device), replacing
  /// any earlier recording. On failure (a call that recording forbids, such as
  /// a host wait for the device) throws RecordingError saying why; nothing was
  /// recorded, none of the device work ran, and the device is left as before.
  virtual void record(const std::function<void()>& queue_work) = 0;
  /// Queues a copy of `bytes` (device or page-locked host memory to device
  /// memory), ordered before the next replay.
  virtual void copy_in(void* dst, const void* src, size_t bytes) = 0;
  /// Queues the recorded work once more.
  virtual void replay() = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual int device_count() = 0;
  /// The caching allocator of device `index`.
  virtual Allocator& allocator(int index) = 0;
  /// Copies `bytes` between any two of host and this backend's devices. Returns
  /// when the copy is complete as seen from the host (ordered after the work
  /// already queued on the device's compute stream).
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = 0;
  /// Fills with zero bytes on the device's compute stream.
  virtual void zero(void* dst, size_t bytes, int index) = 0;
  /// Waits for all work queued on the device.
  virtual void synchronize(int index) = 0;
  /// Page-locked host memory for device `index` to read and write by DMA
  /// without a staging copy (input batches); nullptr when the backend has none.
  /// Its tensors are host tensors (device cpu). Safe to use from any thread.
  virtual Allocator* pinned_host_allocator(int index) {
    (void)index;
    return nullptr;
  }
  /// A queue for host-to-device copies that overlap device `index`'s compute,
  /// with `fences` fences.
  virtual std::unique_ptr<HostToDeviceQueue> make_host_to_device_queue(int index, int fences) = 0;
  /// The backend's speed and precision choices (mixtrain's GPU flags).
  virtual void set_options(const DeviceOptions& options) { (void)options; }
  /// A timer of device `index`'s compute queue; nullptr when host time is the device's time.
  virtual std::unique_ptr<OpTimer> make_op_timer(int index) {
    (void)index;
    return nullptr;
  }
  /// An empty recording of device `index`'s compute stream; nullptr when the
  /// backend cannot record (then every step is queued op by op).
  virtual std::unique_ptr<DeviceGraph> make_graph(int index) {
    (void)index;
    return nullptr;
  }
};

/// Registers the backend of a device kind (not cpu); later registrations replace earlier ones.
void register_device_backend(DeviceKind kind, DeviceBackend* backend);
/// The backend of `kind`, or nullptr when this build or machine has none.
DeviceBackend* device_backend(DeviceKind kind);
/// The backend of `kind`; throws a mix::Error saying the build has no such device.
DeviceBackend& require_device_backend(DeviceKind kind);

/// The process-wide allocator of a device: the host's, or its backend's.
Allocator& allocator_for(Device d);

/// memcpy that works between host and any registered device.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

}  // namespace mix
