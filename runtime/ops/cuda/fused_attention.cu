// CUDA kernels of fused_attention and fused_attention_grad
// (runtime/ops/fused_attention.cc has the op, its CPU twin and the rounding
// points): tiled kernels in the manner of FlashAttention, the [T, S] scores
// never written to memory. The math is runtime/kernels/attention_row.h's, the
// CPU twin's; only the order of the FP32 sums differs.
//
// These FP32 kernels run every problem the tensor-core kernels
// (fused_attention_tensor_cores.cu) do not take: FP32 tensors, other head
// dims, GPUs before sm_80, cuda::tensor_core_attention() off.
//
// Why not cuDNN's fused attention (its SDPA engines through the graph API
// that the convolutions use, runtime/cuda/cudnn_conv_graph.cc): through the
// backend API the forward is a graph of some twenty operations (two matmuls,
// the scale, the causal mask as index generation, compare and select, the
// max and sum reductions, exp, log) and the backward twice that, and cuDNN
// runs it only when the graph matches its SDPA pattern exactly; whether it
// does can only be seen on a GPU (cuDNN 9.19's single SDPA operation,
// CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, takes no causal mask). These
// kernels and the tensor-core ones are the paths that are tested
// against the CPU twin; cuDNN's engine, where faster, is to come behind the
// same op, as the convolutions' graph plans came behind their legacy calls.
//
// Layout: Q [groups, T, D], K and V [groups, S, D] contiguous (groups =
// batch x heads); D <= kMaxHeadDim. Each warp owns kRowsPerWarp rows (query
// rows, or key rows in the dK/dV kernel) and each lane kChunks of their D
// values (columns lane, lane + 32, ...); the other side of the product comes
// in tiles of 32 rows through shared memory, one row per lane, so that a
// lane computes a whole dot product (shared rows padded to D + 1 floats:
// lane l reads row l, no two lanes in one bank).
//
//  - forward: a block per (group, tile of kBlockRows queries), online
//    softmax over key tiles: a row's running max and sum of exp(s - max),
//    its output sum rescaled when the max grows (fn::attention_rescale);
//    then Out = sum / sum_exp and LSE = max + log(sum_exp).
//  - backward, deterministic (no atomics; each gradient element is summed by
//    one thread in a fixed order): delta_i = dO_i . O_i a warp per row; dK and
//    dV a block per (group, tile of kBlockRows keys) over query tiles; dQ a
//    block per (group, tile of kBlockRows queries) over key tiles. Each
//    recomputes p = exp(s - lse) from Q, K and LSE.
// Causal tiles stop at the last key their last query sees (dK/dV: start at
// the first query that sees their first key), so masked tiles cost nothing.
//
// The kernels are in fused_attention_kernels.cuh, which
// tests/unit/test_attention_fp32_kernels_emulated.cc also runs on the CPU;
// this file launches them.
#include <algorithm>
#include <cstdint>

#include "runtime/kernels/attention_row.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/fused_attention_kernels.cuh"
#include "runtime/ops/cuda/fused_attention_tensor_cores.cuh"
#include "runtime/ops/fused_attention_shapes.h"

namespace mix::cuda {
namespace {

__device__ float* dynamic_shared_floats() {
  extern __shared__ float shared[];
  return shared;
}

// ---- launchers -----------------------------------------------------------------------------

dim3 grid_of(const AttentionDims& a, int64_t rows) {
  return dim3(static_cast<unsigned>(a.groups), static_cast<unsigned>((rows + kBlockRows - 1) / kBlockRows));
}

// Launches `kernel` with `floats` of dynamic shared memory, raising the
// kernel's limit first when that is above the default 48 KiB.
template <typename Kernel, typename... Args>
void launch_tiles(Kernel kernel, dim3 grid, int64_t floats, cudaStream_t stream, Args... args) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (bytes > 48 * 1024)
    MIX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  kernel<<<grid, kThreads, bytes, stream>>>(args...);
  MIX_CUDA_CHECK(cudaGetLastError());
}

AttentionDims checked_dims(const OpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_on_device(ctx, q, "Q");
  check_on_device(ctx, k, "K");
  check_on_device(ctx, v, "V");
  const AttentionDims a = attention_rules::dims_of(ctx.op, q, k, v);
  MIX_CHECK(a.d <= kMaxHeadDim, ctx.op.type << ": the CUDA kernels take head_dim up to " << kMaxHeadDim << ", got "
                                            << a.d << " (" << attention_rules::describe(q.shape(), k.shape(), v.shape())
                                            << ")");
  MIX_CHECK(a.groups <= INT32_MAX && (std::max(a.t_q, a.t_k) + kBlockRows - 1) / kBlockRows <= 65535,
            ctx.op.type << ": too many (batch, head) pairs or tokens for one launch: "
                        << attention_rules::describe(q.shape(), k.shape(), v.shape()));
  return a;
}

void fused_attention_cuda(OpContext& ctx) {
  const Tensor q = ctx.in("Q"), k = ctx.in("K"), v = ctx.in("V");
  const AttentionDims a = checked_dims(ctx, q, k, v);
  Tensor& out = ctx.out("Out", q.shape(), q.dtype());
  Tensor lse_tmp;
  Tensor* lse = nullptr;
  if (ctx.wants("LSE")) {
    lse = &ctx.out("LSE", attention_rules::lse_shape(q.shape()), DType::f32);
  } else {
    lse_tmp = Tensor::empty({a.groups * a.t_q}, DType::f32, ctx.env.device);
    lse = &lse_tmp;
  }
  if (a.groups == 0 || a.t_q == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  if (attention_tensor_cores::applies(a, q.dtype(), {q.raw(), k.raw(), v.raw(), out.raw()})) {
    attention_tensor_cores::forward(a, q.dtype(), q.raw(), k.raw(), v.raw(), out.raw(), lse->data<float>(), stream);
    return;
  }
  const int64_t floats = kBlockRows * a.d + kTile * (a.d + 1) + kTile * a.d;
  dispatch_floating(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    with_head_chunks(a.d, [&](auto chunks) {
      launch_tiles(attention_forward<T, decltype(chunks)::value>, grid_of(a, a.t_q), floats, stream, q.data<T>(),
                   k.data<T>(), v.data<T>(), out.data<T>(), lse->data<float>(), a);
    });
  });
}

void fused_attention_grad_cuda(OpContext& ctx) {
  const Tensor q = ctx.in("Q"), k = ctx.in("K"), v = ctx.in("V");
  const Tensor out = ctx.in("Out"), lse = ctx.in("LSE"), dout = ctx.in("Out@GRAD");
  const AttentionDims a = checked_dims(ctx, q, k, v);
  attention_rules::check_grad_inputs(ctx.op, q, out, lse, dout);
  check_on_device(ctx, out, "Out");
  check_on_device(ctx, lse, "LSE");
  check_on_device(ctx, dout, "Out@GRAD");
  const bool want_q = ctx.wants("Q@GRAD"), want_kv = ctx.wants("K@GRAD") || ctx.wants("V@GRAD");
  // The kernels write dK and dV together: an unwanted one goes to scratch.
  Tensor dk_tmp, dv_tmp;
  Tensor* dq = want_q ? &ctx.out("Q@GRAD", q.shape(), q.dtype()) : nullptr;
  Tensor* dk = nullptr;
  Tensor* dv = nullptr;
  if (want_kv) {
    if (ctx.wants("K@GRAD")) {
      dk = &ctx.out("K@GRAD", k.shape(), k.dtype());
    } else {
      dk_tmp = Tensor::empty(k.shape(), k.dtype(), ctx.env.device);
      dk = &dk_tmp;
    }
    if (ctx.wants("V@GRAD")) {
      dv = &ctx.out("V@GRAD", v.shape(), v.dtype());
    } else {
      dv_tmp = Tensor::empty(v.shape(), v.dtype(), ctx.env.device);
      dv = &dv_tmp;
    }
  }
  if (a.groups == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  const int64_t rows = a.groups * a.t_q;
  Tensor delta = Tensor::empty({std::max<int64_t>(rows, 1)}, DType::f32, ctx.env.device);
  const bool tensor_cores =
      attention_tensor_cores::applies(a, q.dtype(),
                                      {q.raw(), k.raw(), v.raw(), dout.raw(), dq ? dq->raw() : nullptr,
                                       dk ? dk->raw() : nullptr, dv ? dv->raw() : nullptr});
  dispatch_floating(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (rows > 0) {
      const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>((rows + kWarps - 1) / kWarps, 1, 65535));
      attention_delta<T>
          <<<blocks, kThreads, 0, stream>>>(out.data<T>(), dout.data<T>(), delta.data<float>(), rows, a.d);
      MIX_CUDA_CHECK(cudaGetLastError());
    }
    if (tensor_cores) {
      attention_tensor_cores::grad(a, q.dtype(), q.raw(), k.raw(), v.raw(), dout.raw(), lse.data<float>(),
                                   delta.data<float>(), dq ? dq->raw() : nullptr, dk ? dk->raw() : nullptr,
                                   dv ? dv->raw() : nullptr, stream);
      return;
    }
    with_head_chunks(a.d, [&](auto chunks) {
      constexpr int kChunks = decltype(chunks)::value;
      const int64_t padded = a.d + 1;
      if (want_kv && a.t_k > 0)  // with no query, the kernel writes zeros
        launch_tiles(attention_grad_kv<T, kChunks>, grid_of(a, a.t_k),
                     2 * kBlockRows * a.d + 2 * kTile * padded + 2 * kTile, stream, q.data<T>(), k.data<T>(),
                     v.data<T>(), dout.data<T>(), lse.data<float>(), delta.data<float>(), dk->data<T>(), dv->data<T>(),
                     a);
      if (want_q && a.t_q > 0)
        launch_tiles(attention_grad_q<T, kChunks>, grid_of(a, a.t_q), 2 * kBlockRows * a.d + 2 * kTile * padded, stream,
                     q.data<T>(), k.data<T>(), v.data<T>(), dout.data<T>(), lse.data<float>(), delta.data<float>(),
                     dq->data<T>(), a);
    });
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("fused_attention", fused_attention_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("fused_attention_grad", fused_attention_grad_cuda);

}  // namespace
}  // namespace mix::cuda
