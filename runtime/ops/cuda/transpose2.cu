// CUDA kernels of transpose2 and transpose2_grad (the inverse permutation): a
// copy over Out's elements, Out[o] = X[plan.src_offset(o)], with the CPU's
// plan (runtime/kernels/transpose_index.h: size-1 dims dropped, dims adjacent
// on both sides merged). Elements are copied as bytes, so every dtype works.
//
// When the innermost merged dim is contiguous in X too (the last dim stays
// last, as in attention's [B, T, H, hd] <-> [B, H, T, hd]), every run of it is
// copied in the widest unit (16, 8, 4 or 2 bytes) that divides the run and
// every other stride (for a permutation each is a multiple of the run) and
// aligns both buffers: the plan is rescaled to count units. Reads and writes
// are then coalesced runs. Otherwise (the last dim moves) the writes stay
// coalesced and the reads are strided; no Transformer op takes that path.
//
// The same copy, as gather_into and scatter_into, moves any strided view the
// plan describes: conv2d's cuBLAS path gathers a strided 1x1 convolution's
// sampled pixels (each a run of channels) and scatters their gradient back.
#include <cstdint>

#include "runtime/kernels/transpose_index.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/transpose2_shapes.h"

namespace mix::cuda {
namespace {

// ---- kernels -------------------------------------------------------------------------

// out[o] = x[plan.src_offset(o)] (a gather) or out[plan.src_offset(o)] =
// x[o] (a scatter), for o in [0, n), in units of E.
template <typename E, bool kScatter>
struct PlannedCopy {
  const E* x;
  E* out;
  fn::TransposePlan plan;
  __device__ void operator()(int64_t o) const {
    if constexpr (kScatter)
      out[plan.src_offset(o)] = x[o];
    else
      out[o] = x[plan.src_offset(o)];
  }
};

// Same-sized unsigned copy units (uint4 for 16 bytes).
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

template <int kBytes, bool kScatter>
void launch_copy(const void* x, void* out, const fn::TransposePlan& plan, int64_t units, cudaStream_t stream) {
  using E = typename Unit<kBytes>::type;
  launch_grid_stride(units, stream, PlannedCopy<E, kScatter>{static_cast<const E*>(x), static_cast<E*>(out), plan});
}

// The copy of `numel` elements of `es` bytes between x and out that `plan`
// maps (gather or scatter: the plan's strides are on the strided side, x for
// a gather, out for a scatter), in the widest unit it allows.
template <bool kScatter>
void planned_copy(const void* x, void* out, fn::TransposePlan plan, int64_t numel, size_t es, cudaStream_t stream,
                  const std::string& op) {
  if (numel == 0) return;
  // The copy unit: elements, or a wider unit covering several of an innermost
  // contiguous run, when every outer stride is whole units too (always so for
  // a permutation: each steps over whole runs).
  size_t unit = es;
  if (plan.inner_contiguous()) {
    const size_t run_bytes = static_cast<size_t>(plan.out_dims[plan.ndim - 1]) * es;
    for (size_t u : {size_t{16}, size_t{8}, size_t{4}, size_t{2}}) {
      if (u <= es) break;
      const auto per = static_cast<int64_t>(u / es);
      bool strides_whole = true;
      for (int k = 0; k < plan.ndim - 1; ++k) strides_whole = strides_whole && plan.src_strides[k] % per == 0;
      if (strides_whole && run_bytes % u == 0 && reinterpret_cast<uintptr_t>(x) % u == 0 &&
          reinterpret_cast<uintptr_t>(out) % u == 0) {
        unit = u;
        break;
      }
    }
  }
  if (unit != es) {
    const auto per = static_cast<int64_t>(unit / es);  // elements per unit
    plan.out_dims[plan.ndim - 1] /= per;
    for (int k = 0; k < plan.ndim - 1; ++k) plan.src_strides[k] /= per;
  }
  const int64_t units = numel * static_cast<int64_t>(es) / static_cast<int64_t>(unit);
  switch (unit) {
    case 1:
      return launch_copy<1, kScatter>(x, out, plan, units, stream);
    case 2:
      return launch_copy<2, kScatter>(x, out, plan, units, stream);
    case 4:
      return launch_copy<4, kScatter>(x, out, plan, units, stream);
    case 8:
      return launch_copy<8, kScatter>(x, out, plan, units, stream);
    case 16:
      return launch_copy<16, kScatter>(x, out, plan, units, stream);
    default:
      MIX_FAIL(op << ": no copy for elements of " << es << " bytes");
  }
}

}  // namespace

void gather_into(const void* x, void* out, const fn::TransposePlan& plan, int64_t numel, size_t elem_bytes,
                 cudaStream_t stream, const std::string& op) {
  planned_copy<false>(x, out, plan, numel, elem_bytes, stream, op);
}

void scatter_into(const void* x, void* out, const fn::TransposePlan& plan, int64_t numel, size_t elem_bytes,
                  cudaStream_t stream, const std::string& op) {
  planned_copy<true>(x, out, plan, numel, elem_bytes, stream, op);
}

void permute_into(const Tensor& x, const std::vector<int64_t>& perm, Tensor& out, cudaStream_t stream,
                  const std::string& op) {
  MIX_CHECK(out.shape() == transpose_rules::permuted(x.shape(), perm) && out.dtype() == x.dtype(),
            op << ": a permuted copy of " << dtype_name(x.dtype()) << shape_str(x.shape()) << " does not fit "
               << dtype_name(out.dtype()) << shape_str(out.shape()));
  const fn::TransposePlan plan = fn::make_transpose_plan(x.shape().data(), perm.data(), x.ndim());
  gather_into(x.raw(), out.raw(), plan, x.numel(), dtype_size(x.dtype()), stream, op);
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
