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
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/transpose_index.h"
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

// n elements of E (an unsigned type of the element size) from `from` to
// `to`, spaced `stride` apart on the strided side: the source when gathering,
// the destination when scattering (the other side is dense).
template <typename E, bool kScatter>
void copy_strided(const unsigned char* from, unsigned char* to, int64_t n, int64_t stride) {
  const E* f = reinterpret_cast<const E*>(from);
  E* t = reinterpret_cast<E*>(to);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (kScatter)
      t[i * stride] = f[i];
    else
      t[i] = f[i * stride];
  }
}

// gather_cpu (src strided, dst dense) or scatter_cpu (src dense, dst
// strided): walks the dense side in order with an odometer over the plan's
// outer dims; an innermost run contiguous on both sides is one memcpy.
template <bool kScatter>
void copy_runs(const unsigned char* src, unsigned char* dst, const fn::TransposePlan& plan, int64_t numel, size_t es) {
  if (numel == 0) return;
  const int last = plan.ndim - 1;
  const int64_t run = plan.out_dims[last], run_stride = plan.src_strides[last];
  int64_t idx[fn::kMaxTransposeDims] = {};
  int64_t off = 0;  // the strided side's element offset of the current run's start
  for (int64_t o = 0; o < numel; o += run) {
    const unsigned char* from = src + static_cast<size_t>(kScatter ? o : off) * es;
    unsigned char* to = dst + static_cast<size_t>(kScatter ? off : o) * es;
    if (run_stride == 1) {
      std::memcpy(to, from, static_cast<size_t>(run) * es);
    } else {
      switch (es) {
        case 1:
          copy_strided<uint8_t, kScatter>(from, to, run, run_stride);
          break;
        case 2:
          copy_strided<uint16_t, kScatter>(from, to, run, run_stride);
          break;
        case 4:
          copy_strided<uint32_t, kScatter>(from, to, run, run_stride);
          break;
        case 8:
          copy_strided<uint64_t, kScatter>(from, to, run, run_stride);
          break;
        default:
          MIX_FAIL("strided copy: no copy for elements of " << es << " bytes");
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
  gather_cpu(x.raw(), out.raw(), plan, numel, dtype_size(x.dtype()));
}

void transpose_rules::gather_cpu(const void* x, void* out, const fn::TransposePlan& plan, int64_t numel,
                                 size_t elem_bytes) {
  copy_runs<false>(static_cast<const unsigned char*>(x), static_cast<unsigned char*>(out), plan, numel, elem_bytes);
}

void transpose_rules::scatter_cpu(const void* x, void* out, const fn::TransposePlan& plan, int64_t numel,
                                  size_t elem_bytes) {
  copy_runs<true>(static_cast<const unsigned char*>(x), static_cast<unsigned char*>(out), plan, numel, elem_bytes);
}

}  // namespace mix
