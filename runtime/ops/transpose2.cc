// transpose2: Out = X with its dims permuted, Out.shape[k] = X.shape[axis[k]]
// (PyTorch's x.permute(axis)), as a real contiguous copy: attention turns
// [B, T, H, hd] into [B, H, T, hd] and back every step, and the batched
// matmuls after it want contiguous operands.
//   input   X, any dtype (elements are copied as bytes: f32, f16, bf16, i32, i64, u8)
//   attr    axis (vector<int64_t>, required): a permutation of 0..ndim-1
//   outputs Out; XShape (optional) as Paddle declares it, [0] + X.shape in X's
//           dtype, holding no data: nothing here reads it (the grad needs only
//           axis), it exists so Paddle-shaped programs load unchanged
// The copy walks Out contiguously with an odometer over the merged dims of
// runtime/kernels/transpose_index.h (size-1 dims dropped, dims adjacent on both
// sides merged); when the last dim stays last, each innermost run is one memcpy.
//
// Grad (transpose2_grad): input Out@GRAD, attr axis (copied);
// X@GRAD = Out@GRAD transposed by the inverse permutation.
#include <cstring>
#include <string>
#include <vector>

#include "runtime/check.h"
#include "runtime/kernels/transpose_index.h"
#include "runtime/op_registry.h"
#include "runtime/ops/transpose2_shapes.h"

namespace mix {
namespace {

using transpose_rules::inverse;
using transpose_rules::Perm;
using transpose_rules::perm_attr;
using transpose_rules::permuted;

void infer_transpose2(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  const Perm perm = perm_attr(op, x.shape.size());
  declare_var(p, op.out("Out"), permuted(x.shape, perm), x.dtype);
  if (!op.out_or_empty("XShape").empty())
    declare_var(p, op.out("XShape"), transpose_rules::xshape_of(x.shape), x.dtype);
}

/// Elements of E (an unsigned type of the element size): n of them, `stride` apart in src.
template <typename E>
void gather_strided(const unsigned char* src, unsigned char* dst, int64_t n, int64_t stride) {
  const E* s = reinterpret_cast<const E*>(src);
  E* d = reinterpret_cast<E*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = s[i * stride];
}

void transpose2_cpu(OpContext& ctx) {
  const Tensor& x = ctx.in("X");
  const Perm perm = perm_attr(ctx.op, x.shape().size());
  Tensor& out = ctx.out("Out", permuted(x.shape(), perm), x.dtype());
  transpose_rules::permute_into_cpu(x, perm, out);
  if (ctx.wants("XShape")) ctx.out("XShape", transpose_rules::xshape_of(x.shape()), x.dtype());
}

void transpose2_grad_cpu(OpContext& ctx) {
  const Tensor& dout = ctx.in("Out@GRAD");
  const Perm inv = inverse(perm_attr(ctx.op, dout.shape().size()));
  Tensor& dx = ctx.out("X@GRAD", permuted(dout.shape(), inv), dout.dtype());
  transpose_rules::permute_into_cpu(dout, inv, dx);
}

std::vector<OpDesc> transpose2_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dx = g.grad_for_input(fwd.in("X"));
  if (dx.empty()) return {};
  return {
      make_op("transpose2_grad", {{"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}}, {{"X@GRAD", {dx}}}, fwd.attrs)};
}

MIX_REGISTER_OP("transpose2", OpInfo{infer_transpose2, transpose2_cpu, {}, transpose2_grad_maker});
MIX_REGISTER_OP("transpose2_grad", OpInfo{{}, transpose2_grad_cpu, {}, {}});

}  // namespace

void transpose_rules::permute_into_cpu(const Tensor& x, const Perm& perm, Tensor& out) {
  MIX_CHECK(out.shape() == permuted(x.shape(), perm) && out.dtype() == x.dtype(),
            "a permuted copy of " << dtype_name(x.dtype()) << shape_str(x.shape()) << " does not fit "
                                  << dtype_name(out.dtype()) << shape_str(out.shape()));
  const int64_t numel = x.numel();
  if (numel == 0) return;
  const fn::TransposePlan plan = fn::make_transpose_plan(x.shape().data(), perm.data(), x.ndim());
  const size_t es = dtype_size(x.dtype());
  const auto* src = static_cast<const unsigned char*>(x.raw());
  auto* dst = static_cast<unsigned char*>(out.raw());
  const int last = plan.ndim - 1;
  const int64_t run = plan.out_dims[last], run_stride = plan.src_strides[last];
  int64_t idx[fn::kMaxTransposeDims] = {};
  int64_t off = 0;  // X's element offset of the current run's start
  for (int64_t o = 0; o < numel; o += run) {
    unsigned char* d = dst + static_cast<size_t>(o) * es;
    const unsigned char* s = src + static_cast<size_t>(off) * es;
    if (run_stride == 1) {
      std::memcpy(d, s, static_cast<size_t>(run) * es);
    } else {
      switch (es) {
        case 1:
          gather_strided<uint8_t>(s, d, run, run_stride);
          break;
        case 2:
          gather_strided<uint16_t>(s, d, run, run_stride);
          break;
        case 4:
          gather_strided<uint32_t>(s, d, run, run_stride);
          break;
        case 8:
          gather_strided<uint64_t>(s, d, run, run_stride);
          break;
        default:
          MIX_FAIL("transpose2: no copy for elements of " << es << " bytes");
      }
    }
    // Advance the odometer over the outer dims (the last one is the run).
    for (int k = last - 1; k >= 0; --k) {
      off += plan.src_strides[k];
      if (++idx[k] < plan.out_dims[k]) break;
      off -= plan.src_strides[k] * plan.out_dims[k];
      idx[k] = 0;
    }
  }
}

}  // namespace mix
