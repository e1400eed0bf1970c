// mul and mul_grad on CUDA: the shapes and semantics of runtime/ops/mul.cc
// (Out[B, out] = X[B, in] . Y[out, in]^T, Y in nn.Linear layout, X flattened
// after x_num_col_dims), each product one cuBLAS GEMM (runtime/cuda/gemm.h)
// with FP32 accumulation and one rounding on store, as the CPU kernel does.
// No kernels of its own: this file is only the launcher part.
#include "runtime/core/check.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/gemm.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/gemm_shapes.h"

namespace mix {
namespace {


void check_device(const Tensor& t, const ExecEnv& env, const char* what) {
  MIX_CHECK(t.numel() == 0 || t.device() == env.device,
            what << " is on " << t.device().str() << " but the op runs on " << env.device.str());
}

void check_inputs(const char* op, const Tensor& x, const Tensor& y, const ExecEnv& env) {
  MIX_CHECK(x.dtype() == y.dtype(), op << ": input is " << dtype_name(x.dtype()) << " but weight is "
                                       << dtype_name(y.dtype()) << " (amp::rewrite inserts casts)");
  check_device(x, env, "mul: input X");
  check_device(y, env, "mul: weight Y");
}

void mul_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");  // [rows, in] after flattening
  const Tensor y = ctx.in("Y");  // [out, in]
  check_inputs("mul", x, y, ctx.env);
  const int ncol = ctx.attr<int>("x_num_col_dims", 1);
  const MulDims d = mul_dims(x.shape(), y.shape(), ncol);
  Shape out_shape(x.shape().begin(), x.shape().begin() + ncol);
  out_shape.push_back(d.out);
  Tensor& out = ctx.out("Out", out_shape, x.dtype());  // [rows, out]
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  cuda::gemm(dc, false, true, d.rows, d.out, d.in, 1.f, x.raw(), y.raw(), 0.f, out.raw(), x.dtype());
}

// dX[rows, in] = dOut[rows, out] . Y[out, in];  dY[out, in] = dOut^T[out, rows] . X[rows, in].
void mul_grad_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  const Tensor y = ctx.in("Y");
  const Tensor dout = ctx.in("Out@GRAD");
  check_inputs("mul_grad", x, y, ctx.env);
  check_device(dout, ctx.env, "mul_grad: Out@GRAD");
  MIX_CHECK(dout.dtype() == x.dtype(), "mul_grad: Out@GRAD is " << dtype_name(dout.dtype()) << " but X is "
                                                                 << dtype_name(x.dtype()));
  const MulDims d = mul_dims(x.shape(), y.shape(), ctx.attr<int>("x_num_col_dims", 1));
  MIX_CHECK(dout.numel() == d.rows * d.out, "mul_grad: Out@GRAD " << shape_str(dout.shape()) << " is not [" << d.rows
                                                                   << ", " << d.out << "]");
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  if (ctx.wants("X@GRAD")) {
    Tensor& dx = ctx.out("X@GRAD", x.shape(), x.dtype());
    cuda::gemm(dc, false, false, d.rows, d.in, d.out, 1.f, dout.raw(), y.raw(), 0.f, dx.raw(), x.dtype());
  }
  if (ctx.wants("Y@GRAD")) {
    Tensor& dy = ctx.out("Y@GRAD", y.shape(), y.dtype());
    cuda::gemm(dc, true, false, d.out, d.in, d.rows, 1.f, dout.raw(), x.raw(), 0.f, dy.raw(), y.dtype());
  }
}

const bool registered = OpRegistry::instance().add_cuda_kernel("mul", mul_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("mul_grad", mul_grad_cuda);

}  // namespace
}  // namespace mix
