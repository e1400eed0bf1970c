#pragma once
// Copies between a dense buffer and a strided view of another, on the GPU:
// transpose2's copy (runtime/ops/cuda/transpose2.cu) with the plan handed in.
// permute_into (device_ops.cuh) gathers a permutation with it; conv2d's cuBLAS
// path gathers a strided 1x1 convolution's sampled pixels and scatters their
// gradient back (runtime/ops/conv_gemm.h). A plain header, so that tests can
// call them. CPU twins: transpose_rules::gather_cpu and scatter_cpu
// (runtime/ops/transpose2_shapes.h).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/kernels/transpose_index.h"

namespace mix::cuda {

/// out[o] = x[plan.src_offset(o)] for o in [0, numel) (numel = the product of
/// the plan's dims), over raw device buffers of elements of `elem_bytes`, on
/// `stream`. `op` names the caller in errors.
void gather_into(const void* x, void* out, const fn::TransposePlan& plan, int64_t numel, size_t elem_bytes,
                 cudaStream_t stream, const std::string& op);

/// out[plan.src_offset(o)] = x[o] for o in [0, numel); nothing else of out is written.
void scatter_into(const void* x, void* out, const fn::TransposePlan& plan, int64_t numel, size_t elem_bytes,
                  cudaStream_t stream, const std::string& op);

}  // namespace mix::cuda
