// matmul and matmul_grad on CUDA: the shapes and semantics of
// runtime/ops/matmul.cc (Paddle's matmul: transpose_X / transpose_Y of the last
// two dims, alpha, leading batch dims, or a 2-D Y shared by the whole batch),
// the products as cuBLAS GEMMs (runtime/cuda/gemm.h) with FP32 accumulation and
// one rounding to the output dtype on store, as the CPU kernel does.
//
// Batches map to strided-batched GEMMs. A shared Y under an untransposed X is
// one GEMM over the folded batch (batch * M rows), forward and backward, so its
// gradient's sum over the batch happens inside the GEMM's FP32 accumulation.
// A shared Y under a transposed X cannot be folded (X^T's batch entries are not
// one strided matrix): its gradient is summed by one GEMM per batch entry into
// an FP32 buffer (beta = 1), rounded once at the end, again as the CPU does.
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/core/check.h"
#include "runtime/core/half.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/gemm.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/gemm_shapes.h"

namespace mix {
namespace {

// ---- kernels -------------------------------------------------------------------------------

// dst[i] = round(src[i]) to f16 / bf16 (the one rounding of an FP32-accumulated
// gradient): cast's map (maps.cuh), in packs.
void store_f32_as(const float* src, void* dst, DType dtype, int64_t n, cudaStream_t stream) {
  MIX_CHECK(dtype == DType::f16 || dtype == DType::bf16, "matmul: cannot round FP32 sums to " << dtype_name(dtype));
  cuda::dispatch_floating(dtype, [&](auto tag) {
    using T = decltype(tag);
    cuda::launch_packed<cuda::kPackWidth<float, T>>(n, stream, cuda::FloatCast<float, T>{src, static_cast<T*>(dst)});
  });
}

// ---- launchers -----------------------------------------------------------------------------


struct Attrs {
  bool tx, ty;
  float alpha;
};
Attrs attrs_of(const OpContext& ctx) {
  return {ctx.attr<bool>("transpose_X", false), ctx.attr<bool>("transpose_Y", false),
          static_cast<float>(ctx.attr<double>("alpha", 1.0))};
}

void check_device(const Tensor& t, const ExecEnv& env, const char* what) {
  MIX_CHECK(t.numel() == 0 || t.device() == env.device,
            what << " is on " << t.device().str() << " but the op runs on " << env.device.str());
}

void check_runtime(const Tensor& x, const Tensor& y, const ExecEnv& env) {
  MIX_CHECK(x.dtype() == y.dtype(),
            "matmul: X is " << dtype_name(x.dtype()) << " but Y is " << dtype_name(y.dtype()));
  check_device(x, env, "matmul: X");
  check_device(y, env, "matmul: Y");
}

// Byte offset of batch entry i of an operand `stride` elements apart.
size_t offset(int64_t i, int64_t stride, size_t esize) { return static_cast<size_t>(i * stride) * esize; }

// The GEMM layout of a (possibly folded) batch: `count` products of `rows` rows each.
struct Layout {
  int64_t count, rows;
  int64_t sx, sy, sg;  // element strides of X, Y, Out (and their gradients) between batch entries
};
Layout layout_of(const MatmulDims& d, const Attrs& a) {
  // A shared Y under an untransposed X: the batch is just more rows of one GEMM.
  const bool fold = d.y_shared && !a.tx;
  return {fold ? 1 : d.count, fold ? d.count * d.m : d.m, d.m * d.k, d.y_shared ? 0 : d.k * d.n, d.m * d.n};
}

void matmul_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");  // [..., M, K] ([..., K, M] with transpose_X)
  const Tensor y = ctx.in("Y");  // [..., K, N] ([..., N, K] with transpose_Y), or 2-D shared
  check_runtime(x, y, ctx.env);
  const Attrs a = attrs_of(ctx);
  const MatmulDims d = matmul_dims(x.shape(), y.shape(), a.tx, a.ty);
  Tensor& out = ctx.out("Out", d.out(), x.dtype());  // [..., M, N]
  const Layout l = layout_of(d, a);
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  cuda::gemm(dc, a.tx, a.ty, l.rows, d.n, d.k, a.alpha, x.raw(), y.raw(), 0.f, out.raw(), x.dtype(),
             {l.count, l.sx, l.sy, l.sg});
}

void matmul_grad_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  const Tensor y = ctx.in("Y");
  const Tensor dout = ctx.in("Out@GRAD");  // [..., M, N]
  check_runtime(x, y, ctx.env);
  check_device(dout, ctx.env, "matmul_grad: Out@GRAD");
  const Attrs a = attrs_of(ctx);
  const MatmulDims d = matmul_dims(x.shape(), y.shape(), a.tx, a.ty);
  MIX_CHECK(dout.shape() == d.out(), "matmul_grad: Out@GRAD " << shape_str(dout.shape()) << " does not match Out "
                                                              << shape_str(d.out()));
  MIX_CHECK(dout.dtype() == x.dtype(), "matmul_grad: Out@GRAD is " << dtype_name(dout.dtype()) << " but X is "
                                                                    << dtype_name(x.dtype()));
  const DType dt = x.dtype();
  const Layout l = layout_of(d, a);
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  const void* g = dout.raw();

  if (ctx.wants("X@GRAD")) {
    Tensor& dx = ctx.out("X@GRAD", x.shape(), dt);
    if (!a.tx)  // dX[M, K] = dOut . op(Y)^T
      cuda::gemm(dc, false, !a.ty, l.rows, d.k, d.n, a.alpha, g, y.raw(), 0.f, dx.raw(), dt,
                 {l.count, l.sg, l.sy, l.sx});
    else  // dX[K, M] = op(Y) . dOut^T
      cuda::gemm(dc, a.ty, true, d.k, d.m, d.n, a.alpha, y.raw(), g, 0.f, dx.raw(), dt, {l.count, l.sy, l.sg, l.sx});
  }
  if (ctx.wants("Y@GRAD")) {
    Tensor& dy = ctx.out("Y@GRAD", y.shape(), dt);
    // dY[K, N] = op(X)^T . dOut, or with transpose_Y dY[N, K] = dOut^T . op(X).
    const bool tA = !a.ty ? !a.tx : true, tB = !a.ty ? false : a.tx;
    const int64_t dm = !a.ty ? d.k : d.n, dn = !a.ty ? d.n : d.k;
    const void* A = !a.ty ? x.raw() : g;
    const void* B = !a.ty ? g : x.raw();
    const int64_t sA = !a.ty ? l.sx : l.sg, sB = !a.ty ? l.sg : l.sx;
    if (d.y_shared && l.count == 0) {  // an empty batch: the sum of no gradients
      MIX_CUDA_CHECK(cudaMemsetAsync(dy.raw(), 0, dy.bytes(), dc.compute.get()));
    } else if (!(d.y_shared && l.count > 1)) {
      cuda::gemm(dc, tA, tB, dm, dn, l.rows, a.alpha, A, B, 0.f, dy.raw(), dt, {l.count, sA, sB, dm * dn});
    } else {
      // Shared Y under a transposed X: dY = sum over the batch, in FP32, rounded once.
      Tensor acc;  // FP32 sums for an f16 / bf16 dY (stream-ordered: freed after the cast is queued)
      void* sums = dy.raw();
      if (dt != DType::f32) {
        acc = Tensor::empty(y.shape(), DType::f32, ctx.env.device);
        sums = acc.raw();
      }
      const size_t esize = dtype_size(dt);
      for (int64_t i = 0; i < l.count; ++i)
        cuda::gemm_mixed(dc, tA, tB, dm, dn, l.rows, a.alpha, static_cast<const char*>(A) + offset(i, sA, esize),
                         static_cast<const char*>(B) + offset(i, sB, esize), i == 0 ? 0.f : 1.f, sums, dt,
                         DType::f32);
      if (dt != DType::f32) store_f32_as(static_cast<const float*>(sums), dy.raw(), dt, dy.numel(), dc.compute.get());
    }
  }
}

const bool registered = OpRegistry::instance().add_cuda_kernel("matmul", matmul_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("matmul_grad", matmul_grad_cuda);

}  // namespace
}  // namespace mix
