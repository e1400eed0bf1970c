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
// The kernel and the choice of unit: transpose_kernels.cuh.
#include <cstdint>

#include "runtime/kernels/transpose_index.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/transpose_kernels.cuh"
#include "runtime/ops/transpose2_shapes.h"

namespace mix::cuda {
namespace {

// The planned copy on the compute stream (transpose_kernels.cuh: its kernel and unit).
template <bool kScatter>
void planned_copy(const void* x, void* out, const fn::TransposePlan& plan, int64_t numel, size_t es,
                  cudaStream_t stream, const std::string& op) {
  planned_copy_in_units<kScatter>(x, out, plan, numel, es, op,
                                  [&](auto copy, int64_t units) { launch_grid_stride(units, stream, copy); });
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
