#pragma once
// cuDNN plumbing shared by the conv2d, batch_norm and pool2d launchers
// (runtime/ops/cuda/): the per-device handle, the dtype mapping, move-only
// RAII descriptors, int-range checks and device workspaces.
//
// Layout: a descriptor is NCHW or NHWC, the layout of the tensor itself (the
// op's data_format / data_layout, runtime/ops/data_format.h). Its dims are
// always given as n, c, h, w; the format says in which order they lie in memory.
// With NCHW FP16 data cuDNN transposes internally to NHWC for its tensor-core
// kernels; channels-last models hand it NHWC and skip those transposes.
//
// These descriptors serve cuDNN's legacy (descriptor) API, which cuDNN 9
// marks deprecated in favour of the graph API but still ships and supports:
// pool2d and batch_norm run on it, and conv2d when the graph API has no plan
// for a shape or is turned off (--no-cudnn-graph-conv, --cudnn-benchmark).
// Convolutions run on the graph API by default (runtime/cuda/cudnn_conv_graph.h).
#include <cudnn.h>

#include <cstddef>
#include <cstdint>

#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/tensor.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cudnn_check.h"

namespace mix::cuda {

/// The cuDNN handle of `ctx`, created on first use and bound to ctx.compute;
/// never destroyed, like the context. Throws when the cuDNN library loaded at
/// run time has another major version than the headers mixtrain was built with.
cudnnHandle_t cudnn_handle(DeviceContext& ctx);

/// CUDNN_DATA_FLOAT / HALF / BFLOAT16; throws naming `op` for other dtypes.
cudnnDataType_t cudnn_dtype(DType t, const char* op);

/// `v` as the int cuDNN's legacy API takes; throws naming `op` and `what` when it does not fit.
int cudnn_int(int64_t v, const char* op, const char* what);

/// alpha = 1, beta = 0 ("write the result, do not blend"): float scalars, as
/// cuDNN wants for FP32, FP16 and BF16 data alike.
inline constexpr float kCudnnOne = 1.f;
inline constexpr float kCudnnZero = 0.f;

/// A move-only owner of one cuDNN descriptor; Traits supplies the handle type,
/// create (throwing) and destroy (never throwing).
template <typename Traits>
class CudnnDescriptor {
 public:
  using Handle = typename Traits::Handle;
  CudnnDescriptor() { Traits::create(&h_); }
  ~CudnnDescriptor() { reset(); }
  CudnnDescriptor(CudnnDescriptor&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  CudnnDescriptor& operator=(CudnnDescriptor&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = o.h_;
      o.h_ = nullptr;
    }
    return *this;
  }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;
  Handle get() const { return h_; }

 private:
  void reset() noexcept {
    if (h_) Traits::destroy(h_);
    h_ = nullptr;
  }
  Handle h_ = nullptr;
};

struct TensorDescriptorTraits {
  using Handle = cudnnTensorDescriptor_t;
  static void create(Handle* h) { MIX_CUDNN_CHECK(cudnnCreateTensorDescriptor(h)); }
  static void destroy(Handle h) noexcept { MIX_CUDNN_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(h)); }
};
struct FilterDescriptorTraits {
  using Handle = cudnnFilterDescriptor_t;
  static void create(Handle* h) { MIX_CUDNN_CHECK(cudnnCreateFilterDescriptor(h)); }
  static void destroy(Handle h) noexcept { MIX_CUDNN_CHECK_NOTHROW(cudnnDestroyFilterDescriptor(h)); }
};
struct ConvolutionDescriptorTraits {
  using Handle = cudnnConvolutionDescriptor_t;
  static void create(Handle* h) { MIX_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(h)); }
  static void destroy(Handle h) noexcept { MIX_CUDNN_CHECK_NOTHROW(cudnnDestroyConvolutionDescriptor(h)); }
};
struct PoolingDescriptorTraits {
  using Handle = cudnnPoolingDescriptor_t;
  static void create(Handle* h) { MIX_CUDNN_CHECK(cudnnCreatePoolingDescriptor(h)); }
  static void destroy(Handle h) noexcept { MIX_CUDNN_CHECK_NOTHROW(cudnnDestroyPoolingDescriptor(h)); }
};

using TensorDescriptor = CudnnDescriptor<TensorDescriptorTraits>;
using FilterDescriptor = CudnnDescriptor<FilterDescriptorTraits>;
using ConvolutionDescriptor = CudnnDescriptor<ConvolutionDescriptorTraits>;
using PoolingDescriptor = CudnnDescriptor<PoolingDescriptorTraits>;

/// A dense tensor descriptor of dims [n, c, h, w] in dtype t, stored NCHW, or
/// NHWC when channels_last.
TensorDescriptor image_tensor(DType t, int64_t n, int64_t c, int64_t h, int64_t w, bool channels_last, const char* op);
/// A dense filter descriptor of dims [k, c, h, w] (output channels first) in
/// dtype t, stored [k, c, h, w], or [k, h, w, c] when channels_last.
FilterDescriptor image_filter(DType t, int64_t k, int64_t c, int64_t h, int64_t w, bool channels_last, const char* op);

/// Whether `handle`'s stream is recording a CUDA graph: a refused cuDNN call
/// then says nothing about the plan (an invalidated capture refuses every
/// call, whatever spoiled it), so callers keep the plan for op-by-op steps.
bool cudnn_stream_capturing(cudnnHandle_t handle);

/// At least `bytes` of scratch on `device`, from the caching device allocator
/// (so the allocator's peak counts it); an undefined tensor (raw() == nullptr)
/// for 0 bytes. Released when the tensor goes: safe while cuDNN still runs on
/// the compute stream, because the allocator reuses memory in stream order.
Tensor device_workspace(size_t bytes, Device device);

}  // namespace mix::cuda
