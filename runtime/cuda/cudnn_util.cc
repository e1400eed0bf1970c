#include "runtime/cuda/cudnn_util.h"

#include <climits>
#include <mutex>

#include "runtime/core/check.h"
#include "runtime/core/library_versions.h"
#include "runtime/cuda/device_allocator.h"  // DeviceGuard

namespace mix::cuda {

namespace {

[[maybe_unused]] const bool registered = register_library_version(
    "cuDNN", std::to_string(CUDNN_MAJOR) + "." + std::to_string(CUDNN_MINOR) + "." + std::to_string(CUDNN_PATCHLEVEL));

std::mutex& handle_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

cudnnHandle_t cudnn_handle(DeviceContext& ctx) {
  std::lock_guard<std::mutex> lock(handle_mutex());
  if (ctx.cudnn) return ctx.cudnn;
  // cuDNN 9's libcudnn.so is a loader for its sub-libraries: a major-version
  // mismatch with the headers would fail later in an unrelated-looking call.
  const size_t runtime_version = cudnnGetVersion();
  MIX_CHECK(runtime_version / 10000 == CUDNN_MAJOR,
            "cuDNN " << runtime_version << " was loaded at run time but mixtrain was built against cuDNN "
                     << CUDNN_MAJOR << "." << CUDNN_MINOR << "." << CUDNN_PATCHLEVEL
                     << " (check LD_LIBRARY_PATH, or rebuild with -DCUDNN_ROOT=DIR)");
  // The handle belongs to the device current at creation.
  DeviceGuard guard(ctx.device);
  cudnnHandle_t h = nullptr;
  MIX_CUDNN_CHECK(cudnnCreate(&h));
  try {
    MIX_CUDNN_CHECK(cudnnSetStream(h, ctx.compute.get()));
  } catch (...) {
    MIX_CUDNN_CHECK_NOTHROW(cudnnDestroy(h));
    throw;
  }
  ctx.cudnn = h;
  return h;
}

cudnnDataType_t cudnn_dtype(DType t, const char* op) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: break;
  }
  MIX_FAIL(op << ": dtype " << dtype_name(t) << " has no cuDNN kernel (expected f32, f16 or bf16)");
}

int cudnn_int(int64_t v, const char* op, const char* what) {
  MIX_CHECK(v >= 0 && v <= INT_MAX,
            op << ": " << what << " = " << v << " does not fit cuDNN's int (split the batch into smaller ones)");
  return static_cast<int>(v);
}

namespace {

cudnnTensorFormat_t format_of(bool channels_last) { return channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW; }

}  // namespace

TensorDescriptor image_tensor(DType t, int64_t n, int64_t c, int64_t h, int64_t w, bool channels_last, const char* op) {
  TensorDescriptor d;
  MIX_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d.get(), format_of(channels_last), cudnn_dtype(t, op),
                                             cudnn_int(n, op, "N"), cudnn_int(c, op, "C"), cudnn_int(h, op, "H"),
                                             cudnn_int(w, op, "W")));
  return d;
}

FilterDescriptor image_filter(DType t, int64_t k, int64_t c, int64_t h, int64_t w, bool channels_last, const char* op) {
  FilterDescriptor d;
  MIX_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d.get(), cudnn_dtype(t, op), format_of(channels_last),
                                             cudnn_int(k, op, "filters"), cudnn_int(c, op, "filter channels"),
                                             cudnn_int(h, op, "filter height"), cudnn_int(w, op, "filter width")));
  return d;
}

bool cudnn_stream_capturing(cudnnHandle_t handle) {
  cudaStream_t stream = nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  return cudnnGetStream(handle, &stream) == CUDNN_STATUS_SUCCESS &&
         cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone;
}

Tensor device_workspace(size_t bytes, Device device) {
  if (bytes == 0) return Tensor{};
  // f32 elements: the allocator hands out blocks aligned far beyond cuDNN's needs.
  return Tensor::empty({static_cast<int64_t>((bytes + 3) / 4)}, DType::f32, device);
}

}  // namespace mix::cuda
