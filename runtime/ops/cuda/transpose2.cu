// CUDA kernels of transpose2 and transpose2_grad (the inverse permutation): a
// copy over Out's elements, Out[o] = X[plan.src_offset(o)], with the CPU's
// plan (runtime/kernels/transpose_index.h: size-1 dims dropped, dims adjacent
// on both sides merged). Elements are copied as bytes, so every dtype works.
//
// When the innermost merged dim is contiguous in X too (the last dim stays
// last, as in attention's [B, T, H, hd] <-> [B, H, T, hd]), every run of it is
// copied in the widest unit (16, 8, 4 or 2 bytes) that divides the run and
// aligns both buffers: the plan is rescaled to count units (every other
// stride of X is a multiple of the run, so of the unit). Reads and writes are
// then coalesced runs. Otherwise (the last dim moves) the writes stay
// coalesced and the reads are strided; no Transformer op takes that path.
#include <cstdint>

#include "runtime/kernels/transpose_index.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/transpose2_shapes.h"

namespace mix::cuda {
namespace {

// ---- kernels -------------------------------------------------------------------------

/// out[o] = x[plan.src_offset(o)] for o in [0, n), in units of E.
template <typename E>
struct TransposeCopy {
  const E* x;
  E* out;
  fn::TransposePlan plan;
  __device__ void operator()(int64_t o) const { out[o] = x[plan.src_offset(o)]; }
};

/// Same-sized unsigned copy units (uint4 for 16 bytes).
template <int kBytes>
struct Unit;
template <>
struct Unit<1> {
  using type = uint8_t;
};
template <>
struct Unit<2> {
  using type = uint16_t;
};
template <>
struct Unit<4> {
  using type = uint32_t;
};
template <>
struct Unit<8> {
  using type = uint2;
};
template <>
struct Unit<16> {
  using type = uint4;
};

// ---- launchers -----------------------------------------------------------------------

template <int kBytes>
void launch_copy(const void* x, void* out, const fn::TransposePlan& plan, int64_t units, cudaStream_t stream) {
  using E = typename Unit<kBytes>::type;
  launch_grid_stride(units, stream, TransposeCopy<E>{static_cast<const E*>(x), static_cast<E*>(out), plan});
}

}  // namespace

void permute_into(const Tensor& x, const std::vector<int64_t>& perm, Tensor& out, cudaStream_t stream,
                  const std::string& op) {
  MIX_CHECK(out.shape() == transpose_rules::permuted(x.shape(), perm) && out.dtype() == x.dtype(),
            op << ": a permuted copy of " << dtype_name(x.dtype()) << shape_str(x.shape()) << " does not fit "
               << dtype_name(out.dtype()) << shape_str(out.shape()));
  const int64_t numel = x.numel();
  if (numel == 0) return;
  const size_t es = dtype_size(x.dtype());
  fn::TransposePlan plan = fn::make_transpose_plan(x.shape().data(), perm.data(), x.ndim());
  // The copy unit: elements, or a wider unit covering several of an innermost contiguous run.
  size_t unit = es;
  if (plan.inner_contiguous()) {
    const size_t run_bytes = static_cast<size_t>(plan.out_dims[plan.ndim - 1]) * es;
    for (size_t u : {size_t{16}, size_t{8}, size_t{4}, size_t{2}}) {
      if (u <= es) break;
      if (run_bytes % u == 0 && reinterpret_cast<uintptr_t>(x.raw()) % u == 0 &&
          reinterpret_cast<uintptr_t>(out.raw()) % u == 0) {
        unit = u;
        break;
      }
    }
  }
  if (unit != es) {
    const auto per = static_cast<int64_t>(unit / es);  // elements per unit
    plan.out_dims[plan.ndim - 1] /= per;
    for (int k = 0; k < plan.ndim - 1; ++k) plan.src_strides[k] /= per;  // multiples of the run (see the top)
  }
  const int64_t units = numel * static_cast<int64_t>(es) / static_cast<int64_t>(unit);
  switch (unit) {
    case 1:
      return launch_copy<1>(x.raw(), out.raw(), plan, units, stream);
    case 2:
      return launch_copy<2>(x.raw(), out.raw(), plan, units, stream);
    case 4:
      return launch_copy<4>(x.raw(), out.raw(), plan, units, stream);
    case 8:
      return launch_copy<8>(x.raw(), out.raw(), plan, units, stream);
    case 16:
      return launch_copy<16>(x.raw(), out.raw(), plan, units, stream);
    default:
      MIX_FAIL(op << ": no copy for elements of " << es << " bytes");
  }
}

namespace {

void transpose2_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");  // by value: Out may replace X's scope entry
  check_on_device(ctx, x, "X");
  const transpose_rules::Perm perm = transpose_rules::perm_attr(ctx.op, x.shape().size());
  Tensor& out = ctx.out("Out", transpose_rules::permuted(x.shape(), perm), x.dtype());
  permute_into(x, perm, out, compute_stream(ctx), ctx.op.type);
  if (ctx.wants("XShape")) ctx.out("XShape", transpose_rules::xshape_of(x.shape()), x.dtype());
}

void transpose2_grad_cuda(OpContext& ctx) {
  const Tensor dout = ctx.in("Out@GRAD");
  check_on_device(ctx, dout, "Out@GRAD");
  const transpose_rules::Perm inv = transpose_rules::inverse(transpose_rules::perm_attr(ctx.op, dout.shape().size()));
  Tensor& dx = ctx.out("X@GRAD", transpose_rules::permuted(dout.shape(), inv), dout.dtype());
  permute_into(dout, inv, dx, compute_stream(ctx), ctx.op.type);
}

const bool registered = OpRegistry::instance().add_cuda_kernel("transpose2", transpose2_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("transpose2_grad", transpose2_grad_cuda);

}  // namespace
}  // namespace mix::cuda
