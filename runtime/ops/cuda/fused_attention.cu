// CUDA kernels of fused_attention and fused_attention_grad
// (runtime/ops/fused_attention.cc has the op, its CPU twin and the rounding
// points): tiled kernels in the manner of FlashAttention, the [T, S] scores
// never written to memory. The math is runtime/kernels/attention_row.h's, the
// CPU twin's; only the order of the FP32 sums differs.
//
// Which kernels run: cuDNN's scaled dot-product attention first
// (runtime/cuda/cudnn_attention_graph.h: FP16/BF16, head_dim a multiple of 8
// up to 256, sm_80 on, where cuDNN has a plan; off with
// --no-cudnn-attention), then the tensor-core kernels
// (fused_attention_tensor_cores.cu: FP16/BF16, head_dim 32, 64, 96 or 128),
// then these FP32 kernels, which take every problem: FP32 tensors, other head
// dims, GPUs before sm_80, cuda::tensor_core_attention() off
// (--no-attention-tensor-cores, which turns cuDNN's tensor-core engines off
// too). The first two round P and dS to the input dtype before their
// products; these keep the CPU twin's rounding points.
//
// Layout: cuDNN reads either of the op's layouts through strides; the own
// kernels take Q [groups, T, D], K and V [groups, S, D] contiguous (groups =
// batch x heads), so a tokens-first ("bthd") problem reaches them through
// heads-first copies (own_forward, own_backward); D <= kMaxHeadDim. Each warp owns kRowsPerWarp rows (query
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
#include <vector>

#include "runtime/cuda/cudnn_attention_graph.h"
#include "runtime/cuda/cudnn_util.h"
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

// The op's Q, K and V: three tensors, or one packed QKV [B, T, 3, H, D].
struct QkvInputs {
  AttentionDims a;
  DType dtype = DType::f32;
  Shape q_shape;   // Q's, K's and V's (and Out's) own shape
  Tensor q, k, v;  // unpacked
  Tensor packed;   // QKV
};

QkvInputs qkv_inputs(const OpContext& ctx) {
  QkvInputs in;
  std::string what;
  if (attention_rules::packed(ctx.op)) {
    in.packed = ctx.in("QKV");
    check_on_device(ctx, in.packed, "QKV");
    in.a = attention_rules::dims_of_packed(ctx.op, in.packed);
    in.dtype = in.packed.dtype();
    in.q_shape = attention_rules::unpacked_shape(in.packed.shape());
    what = "QKV " + shape_str(in.packed.shape());
  } else {
    in.q = ctx.in("Q"), in.k = ctx.in("K"), in.v = ctx.in("V");
    check_on_device(ctx, in.q, "Q");
    check_on_device(ctx, in.k, "K");
    check_on_device(ctx, in.v, "V");
    in.a = attention_rules::dims_of(ctx.op, in.q, in.k, in.v);
    in.dtype = in.q.dtype();
    in.q_shape = in.q.shape();
    what = attention_rules::describe(in.q.shape(), in.k.shape(), in.v.shape());
  }
  const AttentionDims& a = in.a;
  MIX_CHECK(a.d <= kMaxHeadDim,
            ctx.op.type << ": the CUDA kernels take head_dim up to " << kMaxHeadDim << ", got " << a.d << " (" << what << ")");
  MIX_CHECK(a.groups <= INT32_MAX && (std::max(a.t_q, a.t_k) + kBlockRows - 1) / kBlockRows <= 65535,
            ctx.op.type << ": too many (batch, head) pairs or tokens for one launch: " << what);
  return in;
}

// Where the three parts of a packed tensor ([B, T, 3, H, D]) start: H * D elements apart.
std::array<void*, 3> packed_parts(const Tensor& t, const AttentionDims& a) {
  char* base = static_cast<char*>(t.raw());
  const size_t part = static_cast<size_t>(a.heads * a.d) * dtype_size(t.dtype());
  return {base, base + part, base + 2 * part};
}

// Where cuDNN reads Q, K and V.
std::array<const void*, 3> qkv_pointers(const QkvInputs& in) {
  if (!in.a.packed) return {in.q.raw(), in.k.raw(), in.v.raw()};
  const std::array<void*, 3> p = packed_parts(in.packed, in.a);
  return {p[0], p[1], p[2]};
}

AttentionGraphShape graph_shape(const AttentionDims& a, DType dtype, bool backward) {
  // Heads first, any leading dims: each group is a batch entry of one head.
  const int64_t heads = a.tokens_first ? a.heads : 1;
  return {backward, dtype, a.groups / heads, heads, a.t_q, a.t_k, a.d, a.causal, a.scale, a.tokens_first, a.packed};
}

// The own kernels take heads-first tensors ([groups, tokens, D]): a
// tokens-first problem ([B, T, H, D]) runs on heads-first copies of its
// inputs, into heads-first scratch moved back into its outputs afterwards
// (the transposes the model would otherwise have run around the op); a packed
// one's parts are split out of, and back into, its one tensor the same way.
const std::vector<int64_t> kSwapTokensAndHeads = {0, 2, 1, 3};
const std::vector<int64_t> kUnpack = {2, 0, 3, 1, 4};  // [B, T, 3, H, D] -> [3, B, H, T, D]
const std::vector<int64_t> kPack = {1, 3, 0, 2, 4};    // and back

Tensor heads_first(OpContext& ctx, const AttentionDims& a, const Tensor& t) {
  if (!a.tokens_first) return t;
  Tensor copy = Tensor::empty(attention_rules::swap_tokens_and_heads(t.shape()), t.dtype(), ctx.env.device);
  permute_into(t, kSwapTokensAndHeads, copy, compute_stream(ctx), ctx.op.type);
  return copy;
}

// [3, B, H, T, D] <-> three [B, H, T, D] tensors (device copies on the compute stream).
void copy_thirds(OpContext& ctx, const Tensor& all, const std::array<Tensor, 3>& parts, bool into_parts) {
  const size_t bytes = all.bytes() / 3;
  for (size_t p = 0; p < 3; ++p) {
    char* whole = static_cast<char*>(all.raw()) + p * bytes;
    MIX_CUDA_CHECK(cudaMemcpyAsync(into_parts ? parts[p].raw() : whole, into_parts ? whole : parts[p].raw(), bytes,
                                   cudaMemcpyDeviceToDevice, compute_stream(ctx)));
  }
}

Shape heads_first_part_shape(const Shape& packed) { return {packed[0], packed[3], packed[1], packed[4]}; }

// Q, K and V heads first, for the own kernels.
std::array<Tensor, 3> heads_first_qkv(OpContext& ctx, const QkvInputs& in) {
  const AttentionDims& a = in.a;
  if (!a.packed) return {heads_first(ctx, a, in.q), heads_first(ctx, a, in.k), heads_first(ctx, a, in.v)};
  const Shape& s = in.packed.shape();
  Tensor all = Tensor::empty({3, s[0], s[3], s[1], s[4]}, in.dtype, ctx.env.device);
  permute_into(in.packed, kUnpack, all, compute_stream(ctx), ctx.op.type);
  std::array<Tensor, 3> parts;
  for (Tensor& t : parts) t = Tensor::empty(heads_first_part_shape(s), in.dtype, ctx.env.device);
  copy_thirds(ctx, all, parts, true);
  return parts;
}

// Where the own kernels write output `t`: t itself, or heads-first scratch (move_back copies it into t).
Tensor heads_first_output(OpContext& ctx, const AttentionDims& a, const Tensor& t) {
  if (!a.tokens_first) return t;
  return Tensor::empty(attention_rules::swap_tokens_and_heads(t.shape()), t.dtype(), ctx.env.device);
}

void move_back(OpContext& ctx, const AttentionDims& a, const Tensor& written, Tensor& t) {
  if (a.tokens_first) permute_into(written, kSwapTokensAndHeads, t, compute_stream(ctx), ctx.op.type);
}

// The forward on mixtrain's own kernels: heads-first q, k, v, out.
void own_forward(OpContext& ctx, const AttentionDims& a, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& out, float* lse) {
  const cudaStream_t stream = compute_stream(ctx);
  if (attention_tensor_cores::applies(a, q.dtype(), {q.raw(), k.raw(), v.raw(), out.raw()})) {
    attention_tensor_cores::forward(a, q.dtype(), q.raw(), k.raw(), v.raw(), out.raw(), lse, stream);
    return;
  }
  dispatch_floating(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    with_head_chunks(a.d, [&](auto chunks) {
      launch_tiles(attention_forward<T, decltype(chunks)::value>, grid_of(a, a.t_q), forward_shared_floats(a.d), stream,
                   q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(), lse, a);
    });
  });
}

void fused_attention_cuda(OpContext& ctx) {
  const QkvInputs in = qkv_inputs(ctx);
  const AttentionDims& a = in.a;
  Tensor& out = ctx.out("Out", in.q_shape, in.dtype);
  Tensor lse_tmp;
  Tensor* lse = nullptr;
  if (ctx.wants("LSE")) {
    lse = &ctx.out("LSE", attention_rules::lse_shape(ctx.op, in.q_shape), DType::f32);
  } else {
    lse_tmp = Tensor::empty({a.groups * a.t_q}, DType::f32, ctx.env.device);
    lse = &lse_tmp;
  }
  if (a.groups == 0 || a.t_q == 0) return;
  const AttentionGraphShape shape = graph_shape(a, in.dtype, false);
  const std::array<const void*, 3> qkv = qkv_pointers(in);
  // No keys (S = 0, not causal): the own kernels write the empty rows, as the backward leaves it to them.
  if (a.t_k > 0 && attention_graph_applies(shape, {qkv[0], qkv[1], qkv[2], out.raw(), lse->raw()}) &&
      run_attention_graph_forward(cudnn_handle(use_device(ctx.env.device.index)), ctx.env.device, shape, qkv[0], qkv[1],
                                  qkv[2], out.raw(), lse->data<float>()))
    return;
  const std::array<Tensor, 3> h = heads_first_qkv(ctx, in);
  const Tensor out_heads_first = heads_first_output(ctx, a, out);
  own_forward(ctx, a, h[0], h[1], h[2], out_heads_first, lse->data<float>());
  move_back(ctx, a, out_heads_first, out);
}

// The backward on cuDNN's SDPA, where it applies (false: it did not run):
// dQ, dK and dV at `grads`, written together.
bool run_graph_backward(OpContext& ctx, const QkvInputs& in, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const std::array<void*, 3>& grads) {
  const AttentionDims& a = in.a;
  const AttentionGraphShape shape = graph_shape(a, in.dtype, true);
  if (a.t_q == 0 || a.t_k == 0) return false;  // nothing to attend: the own kernels write the zeros
  const std::array<const void*, 3> qkv = qkv_pointers(in);
  if (!attention_graph_applies(shape, {qkv[0], qkv[1], qkv[2], out.raw(), dout.raw(), lse.raw(), grads[0], grads[1],
                                       grads[2]}))
    return false;
  return run_attention_graph_backward(cudnn_handle(use_device(ctx.env.device.index)), ctx.env.device, shape, qkv[0],
                                      qkv[1], qkv[2], out.raw(), dout.raw(), lse.data<float>(), grads[0], grads[1],
                                      grads[2]);
}

// The backward on mixtrain's own kernels: every tensor heads first; dq (when
// not null) and dk, dv (both or neither) written.
void own_backward(OpContext& ctx, const AttentionDims& a, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor* dq, Tensor* dk, Tensor* dv) {
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
      if (dk != nullptr && a.t_k > 0)  // with no query, the kernel writes zeros
        launch_tiles(attention_grad_kv<T, kChunks>, grid_of(a, a.t_k), grad_kv_shared_floats(a.d), stream, q.data<T>(),
                     k.data<T>(), v.data<T>(), dout.data<T>(), lse.data<float>(), delta.data<float>(), dk->data<T>(),
                     dv->data<T>(), a);
      if (dq != nullptr && a.t_q > 0)
        launch_tiles(attention_grad_q<T, kChunks>, grid_of(a, a.t_q), grad_q_shared_floats(a.d), stream, q.data<T>(),
                     k.data<T>(), v.data<T>(), dout.data<T>(), lse.data<float>(), delta.data<float>(), dq->data<T>(),
                     a);
    });
  });
}

// The packed gradient, QKV@GRAD [B, T, 3, H, D] (scratch when not wanted):
// cuDNN writes its three parts in place, the own kernels into heads-first
// scratch packed afterwards.
void packed_grad(OpContext& ctx, const QkvInputs& in, const Tensor& out, const Tensor& lse, const Tensor& dout) {
  const AttentionDims& a = in.a;
  Tensor dqkv = ctx.wants("QKV@GRAD") ? ctx.out("QKV@GRAD", in.packed.shape(), in.dtype)
                                      : Tensor::empty(in.packed.shape(), in.dtype, ctx.env.device);
  if (a.groups == 0) return;
  if (run_graph_backward(ctx, in, out, lse, dout, packed_parts(dqkv, a))) return;
  const std::array<Tensor, 3> h = heads_first_qkv(ctx, in);
  std::array<Tensor, 3> grads;
  for (Tensor& t : grads) t = Tensor::empty(heads_first_part_shape(in.packed.shape()), in.dtype, ctx.env.device);
  own_backward(ctx, a, h[0], h[1], h[2], heads_first(ctx, a, out), lse, heads_first(ctx, a, dout), &grads[0],
               &grads[1], &grads[2]);
  const Shape& s = in.packed.shape();
  Tensor all = Tensor::empty({3, s[0], s[3], s[1], s[4]}, in.dtype, ctx.env.device);
  copy_thirds(ctx, all, grads, false);
  permute_into(all, kPack, dqkv, compute_stream(ctx), ctx.op.type);
}

void fused_attention_grad_cuda(OpContext& ctx) {
  const QkvInputs in = qkv_inputs(ctx);
  const AttentionDims& a = in.a;
  const Tensor out = ctx.in("Out"), lse = ctx.in("LSE"), dout = ctx.in("Out@GRAD");
  attention_rules::check_grad_inputs(ctx.op, in.q_shape, in.dtype, out, lse, dout);
  check_on_device(ctx, out, "Out");
  check_on_device(ctx, lse, "LSE");
  check_on_device(ctx, dout, "Out@GRAD");
  if (a.packed) return packed_grad(ctx, in, out, lse, dout);
  const Tensor &q = in.q, &k = in.k, &v = in.v;
  const bool want_q = ctx.wants("Q@GRAD"), want_kv = ctx.wants("K@GRAD") || ctx.wants("V@GRAD");
  // The own kernels write dK and dV together: an unwanted one goes to scratch.
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
  if (attention_graph_applies(graph_shape(a, in.dtype, true), {out.raw(), dout.raw(), lse.raw()})) {
    // cuDNN writes dQ, dK and dV together: unwanted ones go to scratch, made
    // only where cuDNN may take the problem.
    Tensor dq_tmp = dq ? *dq : Tensor::empty(q.shape(), q.dtype(), ctx.env.device);
    Tensor dk_all = dk ? *dk : Tensor::empty(k.shape(), k.dtype(), ctx.env.device);
    Tensor dv_all = dv ? *dv : Tensor::empty(v.shape(), v.dtype(), ctx.env.device);
    if (run_graph_backward(ctx, in, out, lse, dout, {dq_tmp.raw(), dk_all.raw(), dv_all.raw()})) return;
  }
  // Heads-first outputs for the own kernels: the gradients themselves, or scratch moved back below.
  Tensor dq_h, dk_h, dv_h;
  if (dq) dq_h = heads_first_output(ctx, a, *dq);
  if (dk) dk_h = heads_first_output(ctx, a, *dk);
  if (dv) dv_h = heads_first_output(ctx, a, *dv);
  const std::array<Tensor, 3> h = heads_first_qkv(ctx, in);
  own_backward(ctx, a, h[0], h[1], h[2], heads_first(ctx, a, out), lse, heads_first(ctx, a, dout),
               dq ? &dq_h : nullptr, dk ? &dk_h : nullptr, dv ? &dv_h : nullptr);
  if (dq) move_back(ctx, a, dq_h, *dq);
  if (dk) move_back(ctx, a, dk_h, *dk);
  if (dv) move_back(ctx, a, dv_h, *dv);
}

const bool registered = OpRegistry::instance().add_cuda_kernel("fused_attention", fused_attention_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("fused_attention_grad", fused_attention_grad_cuda);

}  // namespace
}  // namespace mix::cuda
