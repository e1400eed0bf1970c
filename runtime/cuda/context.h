#pragma once
// Per-device CUDA state: the compute stream every kernel of the step runs on,
// the communication stream NCCL runs on, the cuBLAS handle and workspace, and
// the cuDNN handle.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <string>

#include "runtime/cuda/stream.h"

namespace mix::cuda {

struct DeviceContext {
  int device = 0;
  Stream compute;
  Stream comm;
  cublasHandle_t cublas = nullptr;  // bound to `compute`
  void* cublas_workspace = nullptr;
  size_t cublas_workspace_bytes = 0;
  // Bound to `compute`, created on first use (cudnn_handle() in cudnn_util.h).
  // No workspace of its own: each cuDNN call takes one from the device allocator.
  cudnnHandle_t cudnn = nullptr;
};

/// The context of `device`, created (and the device made current) on first use.
DeviceContext& context(int device);
/// Makes `device` current for this thread and returns its context.
DeviceContext& use_device(int device);

/// FP32 GEMMs use TF32 tensor cores only when allowed (--allow-tf32; off by default).
void set_allow_tf32(bool allow);
bool allow_tf32();

/// Number of visible GPUs (0 when there is no driver or device).
int device_count();

/// Logs `message` as a warning through spdlog, for CUDA sources: nvcc cannot
/// compile spdlog's headers, so the .cu files log through this host function.
void log_warning(const std::string& message);

}  // namespace mix::cuda
