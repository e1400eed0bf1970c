// CUDA kernels of elementwise_add, elementwise_mul and their _grad ops, with
// the [pre, n, post] broadcasting of runtime/ops/broadcast.h: X's element i
// meets Y's element j = (i / post) % n.
//
// The Y gradients (bias gradients) reduce over pre and post in FP32. Columns of
// up to kColumnSumSequentialMax terms get one thread each, adding in the CPU's order
// (p-major, then q), so they are bit-identical to the CPU. Longer columns:
//  - post == 1 (a bias of [rows, n] data, every linear layer): threads run over
//    columns, so a warp reads consecutive addresses, and blocks over chunks of
//    kColumnSumRowsPerChunk rows; a second pass adds each column's chunk sums in order;
//  - otherwise a block per column, threads strided over its pre x post terms
//    (consecutive q are adjacent in memory), then a fixed tree.
// Both are deterministic (no atomics; the partition depends on the shape only),
// and their order of additions differs from the CPU's. The kernels, and which
// of them a shape takes, are in elementwise_kernels.cuh.
#include <cstdint>
#include <cstring>

#include "runtime/kernels/functors.h"
#include "runtime/ops/add_grad_views.h"
#include "runtime/ops/broadcast.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/elementwise_kernels.cuh"
#include "runtime/ops/elementwise_add_shapes.h"

namespace mix::cuda {
namespace {

// ---- launchers -----------------------------------------------------------------------

// out = f(x, y broadcast as `d` says, not the same shape), by the BroadcastMap
// that does the fewest divisions (y_index_kind).
template <typename T, typename F, typename I>
void launch_broadcast_map(const Tensor& x, const Tensor& y, Tensor& out, const BroadcastDims& d, F f,
                          cudaStream_t stream) {
  const auto n = static_cast<I>(d.n), post = static_cast<I>(d.post);
  const auto launch = [&](auto map) { launch_packed<kPackWidth<T>>(x.numel(), stream, map); };
  switch (y_index_kind(d)) {
    case YIndex::rows:
      return launch(BroadcastMap<T, F, I, YIndex::rows>{x.data<T>(), y.data<T>(), out.data<T>(), n, post, f});
    case YIndex::blocks:
      return launch(BroadcastMap<T, F, I, YIndex::blocks>{x.data<T>(), y.data<T>(), out.data<T>(), n, post, f});
    case YIndex::general:
      return launch(BroadcastMap<T, F, I, YIndex::general>{x.data<T>(), y.data<T>(), out.data<T>(), n, post, f});
  }
}

template <typename F>
void broadcast_binary(const OpContext& ctx, const Tensor& x, const Tensor& y, Tensor& out, const BroadcastDims& d,
                      F f) {
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (d.same_shape())  // a residual add: no index arithmetic at all
      launch_packed<kPackWidth<T>>(x.numel(), stream, BinaryMap<T, F>{x.data<T>(), y.data<T>(), out.data<T>(), f});
    else if (x.numel() <= static_cast<int64_t>(UINT32_MAX) && !large_tensor_paths())
      launch_broadcast_map<T, F, uint32_t>(x, y, out, d, f, stream);
    else
      launch_broadcast_map<T, F, int64_t>(x, y, out, d, f, stream);
  });
}

// dy[j] = sum of f(a, b) over column j (b may be null), rounded once to dy's dtype.
template <typename F>
void broadcast_reduce(const OpContext& ctx, const Tensor& a, const Tensor* b, Tensor& dy, const BroadcastDims& d, F f) {
  MIX_CHECK(dy.numel() == d.n, ctx.op.type << ": gradient of " << d.n << " values has shape " << shape_str(dy.shape()));
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(a.dtype(), [&](auto in_tag) {
    using T = decltype(in_tag);
    dispatch_floating(dy.dtype(), [&](auto out_tag) {
      using TOut = decltype(out_tag);
      const T* bp = b ? b->data<T>() : nullptr;
      if (d.n == 0) return;  // nothing to sum into (and a grid of 0 blocks is an error)
      switch (column_sum_path(d)) {
        case ColumnSumPath::sequential:
          launch_grid_stride(d.n, stream, ColumnSumSequential<T, TOut, F>{a.data<T>(), bp, dy.data<TOut>(), d, f});
          return;
        case ColumnSumPath::row_chunks: {
          const auto [chunks, rows_per_chunk] = row_chunks(d.pre, kColumnSumRowsPerChunk, kColumnSumMaxChunks);
          // Scratch released at return: safe, the kernels below run on the compute stream (device_ops.cuh).
          Tensor partial = Tensor::empty({chunks, d.n}, DType::f32, ctx.env.device);
          const dim3 grid(static_cast<unsigned>((d.n + kBlock - 1) / kBlock), static_cast<unsigned>(chunks));
          column_chunk_partials<T, F>
              <<<grid, kBlock, 0, stream>>>(a.data<T>(), bp, partial.data<float>(), d, rows_per_chunk, f);
          MIX_CUDA_CHECK(cudaGetLastError());
          launch_grid_stride(d.n, stream,
                             ChunkColumnSum<float, AddRn, TOut>{partial.data<float>(), dy.data<TOut>(), chunks, d.n});
          return;
        }
        case ColumnSumPath::tree:
          column_sum_tree<T, TOut, F>
              <<<column_sum_tree_blocks(d.n), kBlock, 0, stream>>>(a.data<T>(), bp, dy.data<TOut>(), d, f);
          MIX_CUDA_CHECK(cudaGetLastError());
          return;
      }
    });
  });
}

void add_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");  // by value: Out may replace X's scope entry
  const Tensor y = ctx.in("Y");
  check_on_device(ctx, x, "X");
  check_on_device(ctx, y, "Y");
  const BroadcastDims d = broadcast_dims(x.shape(), y.shape(), ctx.attr<int>("axis", -1), "elementwise_add");
  add_rules::check_dtypes(x.dtype(), y.dtype(), d.same_shape());
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  if (x.dtype() != y.dtype()) {  // a narrower Y of X's shape (checked above), widened on load
    dispatch_floating(y.dtype(), [&](auto tag) {
      using TY = decltype(tag);
      launch_packed<kPackWidth<float, TY>>(
          x.numel(), compute_stream(ctx),
          BinaryMap<float, fn::Add, TY>{x.data<float>(), y.data<TY>(), out.data<float>(), fn::Add{}});
    });
    return;
  }
  broadcast_binary(ctx, x, y, out, d, fn::Add{});
}

void add_grad_cuda(OpContext& ctx) {
  const Tensor dout = ctx.in("Out@GRAD");
  check_on_device(ctx, dout, "Out@GRAD");
  const add_rules::AddGradY y = add_rules::grad_y(ctx, dout);
  const BroadcastDims d = broadcast_dims(dout.shape(), y.shape, ctx.attr<int>("axis", -1), "elementwise_add_grad");
  const cudaStream_t stream = compute_stream(ctx);
  const AddGradLeft left = bind_add_grad_views(ctx, dout, y);  // views: no data touched
  if (left.x) {
    // A copy: this gradient is written in place later on.
    Tensor& dx = ctx.out("X@GRAD", dout.shape(), dout.dtype());
    copy_on_stream(dx.raw(), dout.raw(), dout.bytes(), stream);
  }
  if (left.y) {
    Tensor& dy = ctx.out("Y@GRAD", y.shape, y.dtype);
    if (d.same_shape()) return float_cast(ctx, dout, dy);  // a copy, or dOut rounded once to a narrower Y's dtype
    broadcast_reduce(ctx, dout, nullptr, dy, d, fn::TakeFirst{});
  }
}

void mul_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  const Tensor y = ctx.in("Y");
  check_same_dtype(x, y, "elementwise_mul");
  check_on_device(ctx, x, "X");
  check_on_device(ctx, y, "Y");
  const BroadcastDims d = broadcast_dims(x.shape(), y.shape(), ctx.attr<int>("axis", -1), "elementwise_mul");
  Tensor& out = ctx.out("Out", x.shape(), x.dtype());
  broadcast_binary(ctx, x, y, out, d, fn::Mul{});
}

void mul_grad_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");
  const Tensor y = ctx.in("Y");
  const Tensor dout = ctx.in("Out@GRAD");
  check_same_dtype(x, y, "elementwise_mul_grad");
  MIX_CHECK(
      dout.shape() == x.shape() && dout.dtype() == x.dtype(),
      "elementwise_mul_grad: Out@GRAD " << shape_str(dout.shape()) << " does not match X " << shape_str(x.shape()));
  check_on_device(ctx, x, "X");
  check_on_device(ctx, y, "Y");
  check_on_device(ctx, dout, "Out@GRAD");
  const BroadcastDims d = broadcast_dims(x.shape(), y.shape(), ctx.attr<int>("axis", -1), "elementwise_mul_grad");
  if (ctx.wants("X@GRAD")) {
    Tensor& dx = ctx.out("X@GRAD", x.shape(), x.dtype());
    broadcast_binary(ctx, dout, y, dx, d, fn::Mul{});
  }
  if (ctx.wants("Y@GRAD")) {
    Tensor& dy = ctx.out("Y@GRAD", y.shape(), y.dtype());
    broadcast_reduce(ctx, dout, &x, dy, d, fn::Mul{});
  }
}

const bool registered = OpRegistry::instance().add_cuda_kernel("elementwise_add", add_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("elementwise_add_grad", add_grad_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("elementwise_mul", mul_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("elementwise_mul_grad", mul_grad_cuda);

}  // namespace
}  // namespace mix::cuda
