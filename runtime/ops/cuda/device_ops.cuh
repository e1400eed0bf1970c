#pragma once
// Launch plumbing shared by the CUDA kernels of the ops (runtime/ops/cuda/,
// runtime/optim/cuda/, amp/cuda/): the compute stream, device checks, loads of
// scalars that live in device memory, and the launches of elementwise maps
// (maps.cuh) and deterministic reductions (row_group.cuh, column_sums.cuh),
// which need no CUDA header, so the *_emulated tests run them on the CPU.
// There is no math here: every value is computed by a MIX_HD
// functor or function of runtime/kernels/ (or amp/loss_scaling_math.h), the
// same code the CPU kernels run.
//
// Storage: FP16 and BF16 tensors hold raw 16-bit patterns (half_t, bf16_t);
// kernels widen with half.h's to_float and round on store with from_float<T>,
// exactly where the CPU loops convert.
//
// Reductions never use atomics on floats: a block reduces with a fixed tree
// (block_reduce, row_group.cuh), so a result depends only on the inputs and the launch shape,
// and launch shapes depend only on tensor sizes, never on the GPU model. Their
// FP32 adds are __fadd_rn: nvcc may not contract an explicitly rounded add
// with the product before it into an FMA, so each product term rounds as it
// does on the CPU.
//
// Lifetimes: scratch tensors made in a launcher are released when it returns,
// while its kernels may still run. That is safe because every kernel runs on
// the device's compute stream and the device allocator reuses memory in stream
// order (a later user of the block is queued behind these kernels).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/dtype.h"
#include "runtime/core/half.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/ops/cuda/column_sums.cuh"
#include "runtime/ops/cuda/maps.cuh"
#include "runtime/ops/cuda/row_group.cuh"
#include "runtime/ops/cuda/scalar_ref.cuh"
#include "runtime/ops/cuda/strided_copy.h"

namespace mix::cuda {

/// The compute stream of the op's GPU, that GPU made current (a launch into
/// another device's stream fails): every kernel of the step runs on it.
inline cudaStream_t compute_stream(const OpContext& ctx) {
  MIX_CHECK(ctx.env.device.kind == DeviceKind::cuda,
            ctx.op.type << ": CUDA kernel run for device " << ctx.env.device.str());
  return use_device(ctx.env.device.index).compute.get();
}

/// out = device tensor x permuted by `perm` (out already has the permuted shape
/// and x's dtype), on `stream`: transpose2's copy (runtime/ops/cuda/transpose2.cu),
/// also used by conv2d to lay filters out for channels-last cuDNN. `op` names
/// the caller in errors.
void permute_into(const Tensor& x, const std::vector<int64_t>& perm, Tensor& out, cudaStream_t stream,
                  const std::string& op);

/// Inputs must already be on the op's GPU: a host pointer handed to a kernel is
/// an illegal address reported at some later sync, far from its cause.
inline void check_on_device(const OpContext& ctx, const Tensor& t, const std::string& slot) {
  MIX_CHECK(t.numel() == 0 || t.device() == ctx.env.device,
            ctx.op.type << ": input " << slot << " is on " << t.device().str() << ", expected " << ctx.env.device.str()
                        << " (copy it with Tensor::to)");
}

/// The host-side dtype switch: f(T{}) with T = float, half_t or bf16_t.
template <typename F>
void dispatch_floating(DType t, F&& f) {
  cpu::dispatch_floating(t, static_cast<F&&>(f));
}

/// Device copy of `bytes` on the compute stream (dst may equal src: then nothing).
inline void copy_on_stream(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || dst == src) return;
  MIX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

// ---- scalars that live in device memory (ScalarRef: scalar_ref.cuh) --------------------

inline ScalarRef scalar_ref(const Tensor* t) { return t ? ScalarRef{t->raw(), t->dtype()} : ScalarRef{}; }

/// out = x converted to out's floating dtype (same number of elements), on the compute stream.
inline void float_cast(const OpContext& ctx, const Tensor& x, Tensor& out) {
  MIX_CHECK(x.numel() == out.numel() && is_floating(x.dtype()) && is_floating(out.dtype()),
            ctx.op.type << ": cannot convert " << dtype_name(x.dtype()) << shape_str(x.shape()) << " to "
                        << dtype_name(out.dtype()) << shape_str(out.shape()));
  const cudaStream_t stream = compute_stream(ctx);
  if (x.dtype() == out.dtype()) return copy_on_stream(out.raw(), x.raw(), x.bytes(), stream);
  dispatch_floating(x.dtype(), [&](auto in_tag) {
    using From = decltype(in_tag);
    dispatch_floating(out.dtype(), [&](auto out_tag) {
      using To = decltype(out_tag);
      launch_packed<kPackWidth<From, To>>(x.numel(), stream, FloatCast<From, To>{x.data<From>(), out.data<To>()});
    });
  });
}

/// Runs a unary functor over a floating tensor (out: x's shape and dtype), as cpu::unary_tensor.
template <typename Op>
void unary_tensor(const OpContext& ctx, const Tensor& x, Tensor& out, Op op) {
  MIX_CHECK(x.dtype() == out.dtype() && x.numel() == out.numel(), ctx.op.type << ": mismatched input and output");
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_packed<kPackWidth<T>>(x.numel(), stream, UnaryMap<T, Op>{x.data<T>(), out.data<T>(), op});
  });
}

/// out = op(a, b) elementwise, all of one dtype and size, as cpu::binary_tensor.
template <typename Op>
void binary_tensor(const OpContext& ctx, const Tensor& a, const Tensor& b, Tensor& out, Op op) {
  MIX_CHECK(a.dtype() == b.dtype() && a.numel() == b.numel(),
            ctx.op.type << ": mismatched inputs " << dtype_name(a.dtype()) << shape_str(a.shape()) << " and "
                        << dtype_name(b.dtype()) << shape_str(b.shape()));
  MIX_CHECK(out.dtype() == a.dtype() && out.numel() == a.numel(), ctx.op.type << ": mismatched output");
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_packed<kPackWidth<T>>(a.numel(), stream, BinaryMap<T, Op>{a.data<T>(), b.data<T>(), out.data<T>(), op});
  });
}

}  // namespace mix::cuda
