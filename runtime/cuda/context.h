#pragma once
// Per-device CUDA state: the compute stream every kernel of the step runs on,
// the communication stream NCCL runs on, the cuBLAS handle and workspace, and
// the cuDNN handle.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <initializer_list>
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
  // cuBLASLt (GEMMs with a bias epilogue, runtime/cuda/gemm.h), created on first
  // use; its calls share the cuBLAS workspace, on the same stream.
  cublasLtHandle_t cublaslt = nullptr;
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

/// Training batch_norm uses cuDNN's SPATIAL_PERSISTENT kernels only when asked
/// (--cudnn-bn-persistent; off by default, as in Paddle and TensorFlow).
void set_batch_norm_persistent(bool on);
bool batch_norm_persistent();

/// conv2d times cuDNN's candidate algorithms on the first call for a shape and
/// keeps the fastest, instead of taking the heuristics' first choice
/// (--cudnn-benchmark, PyTorch's cudnn.benchmark; off by default).
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();

/// conv2d runs cuDNN's graph API with an execution plan cached per shape
/// (runtime/cuda/cudnn_conv_graph.h) instead of the legacy calls, whose host
/// cost set the pace of ResNet-50 on the GPU check. Off here, so that a program or
/// test gets the legacy calls unless it asks; mixtrain asks unless told
/// --no-cudnn-graph-conv or --cudnn-benchmark (whose timings are the legacy
/// calls'; under the graph API it would have no effect).
void set_cudnn_graph_conv(bool on);
bool cudnn_graph_conv();

/// conv2d runs its pointwise channels-last convolutions (1x1, no padding, one
/// group, any stride: runtime/ops/conv_gemm.h) as one cuBLAS GEMM per pass
/// instead of cuDNN, which the host queues far faster (--cublas-1x1-conv; off
/// by default: beside the graph API it added nothing to ResNet-50 AMP on the
/// GPU check, though it sped up FP32 channels last; docs/gpu.md). Ahead of
/// --cudnn-graph-conv.
void set_cublas_1x1_conv(bool on);
bool cublas_1x1_conv();

/// fused_attention runs its tensor-core kernels where they apply
/// (runtime/ops/cuda/fused_attention_tensor_cores.cuh: FP16/BF16, head_dim 32,
/// 64, 96 or 128, sm_80 on), which round P and dS to the input dtype before
/// their products; off (--no-attention-tensor-cores), always its FP32 kernels,
/// whose rounding points are the CPU twin's. On by default.
void set_tensor_core_attention(bool on);
bool tensor_core_attention();

/// fused_attention tries cuDNN's scaled dot-product attention first
/// (runtime/cuda/cudnn_attention_graph.h), where it applies, before its own
/// kernels; off (--no-cudnn-attention), only its own kernels. cuDNN's engines
/// are tensor-core ones, so tensor_core_attention() off turns them off too.
/// On by default.
void set_cudnn_attention(bool on);
bool cudnn_attention();

/// For tests: the code paths meant for tensors past 32-bit limits run at every
/// size (split's copies row by row, otherwise only for rows over 2 GiB;
/// broadcasts with 64-bit indices, otherwise only past 2^32 elements), so
/// [cuda] tests reach them without tensors of many GiB. Off by default.
void set_large_tensor_paths(bool on);
bool large_tensor_paths();

/// Number of visible GPUs (0 when there is no driver or device).
int device_count();

/// The longest a host wait for this process's queued GPU work may take before
/// it counts as a hang (a collective waiting for a dead peer): the NCCL
/// communicator sets it from MIX_NCCL_TIMEOUT_S; 0, the default, waits without limit.
void set_hang_timeout(double seconds);
double hang_timeout();

/// Waits, polling, until the work queued so far on the compute and
/// communication streams of `device` (the current device) has run. False when
/// that takes longer than hang_timeout(): the work then stays queued. True at
/// once for a device whose context was never made (nothing can be queued).
bool wait_for_streams(int device);
/// Waits, polling, until the device has passed every one of `events` (recorded
/// already); false when that takes longer than hang_timeout().
bool wait_for_events(std::initializer_list<cudaEvent_t> events);

/// Logs `message` as a warning through spdlog, for CUDA sources: nvcc cannot
/// compile spdlog's headers, so the .cu files log through this host function.
void log_warning(const std::string& message);

}  // namespace mix::cuda
