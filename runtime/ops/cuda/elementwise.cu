// CUDA kernels of elementwise_add, elementwise_mul and their _grad ops, with
// the [pre, n, post] broadcasting of runtime/ops/broadcast.h: X's element i
// meets Y's element j = (i / post) % n.
//
// The Y gradients (bias gradients) reduce over pre and post in FP32. Columns of
// up to kSequentialMax terms get one thread each, adding in the CPU's order
// (p-major, then q), so they are bit-identical to the CPU. Longer columns:
//  - post == 1 (a bias of [rows, n] data, every linear layer): threads run over
//    columns, so a warp reads consecutive addresses, and blocks over chunks of
//    kRowsPerChunk rows; a second pass adds each column's chunk sums in order;
//  - otherwise a block per column, threads strided over its pre x post terms
//    (consecutive q are adjacent in memory), then a fixed tree.
// Both are deterministic (no atomics; the partition depends on the shape only),
// and their order of additions differs from the CPU's.
#include <cstdint>
#include <cstring>

#include "runtime/kernels/functors.h"
#include "runtime/ops/add_grad_views.h"
#include "runtime/ops/broadcast.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/elementwise_add_shapes.h"

namespace mix::cuda {
namespace {

// Longest column (pre * post terms) reduced by a single thread.
constexpr int64_t kSequentialMax = 1024;
// post == 1 columns: rows per chunk (before the cap on the number of chunks).
constexpr int64_t kRowsPerChunk = 64;
constexpr int64_t kMaxChunks = 1024;

// ---- kernels -------------------------------------------------------------------------

// Which Y element X's element i meets, j = (i / post) % n, computed with only
// the divisions the shape needs (a same-shape Y needs none: BinaryMap). An integer division is a sequence of
// instructions on the GPU, not one (a 64-bit one is several times longer than
// a 32-bit one), and at two per element an FP16 add spent more time on index
// arithmetic than on moving its bytes; hence the cases, and 32-bit indices
// wherever every index fits.
enum class YIndex {
  rows,     // post == 1, a bias on rows: j = i % n
  blocks,   // pre == 1, Y on X's leading dims: j = i / post
  general,  // j = (i / post) % n
};

// out[p, j, q] = f(x[p, j, q], y[j]); out may alias x. I: the index type
// (uint32_t where X's elements number at most 2^32 - 1, else int64_t).
//
// In packs of V (launch_packed): a bias on rows whose length n is a multiple
// of V meets V consecutive Y elements, read as a pack too; otherwise, when
// post is a multiple of V, the V elements share one Y element.
template <typename T, typename F, typename I, YIndex kY>
struct BroadcastMap {
  const T* x;
  const T* y;
  T* out;
  I n, post;
  F f;
  __device__ I y_index(int64_t i64) const {
    const I i = static_cast<I>(i64);
    if constexpr (kY == YIndex::rows)
      return i % n;
    else if constexpr (kY == YIndex::blocks)
      return i / post;
    else
      return i / post % n;
  }
  __device__ void operator()(int64_t i) const { out[i] = from_float<T>(f(to_float(x[i]), to_float(y[y_index(i)]))); }
  template <int V>
  __device__ void pack(int64_t i) const {
    const Pack<T, V> xs = load_pack<V>(x, i);
    Pack<T, V> r;
    if constexpr (kY == YIndex::rows) {
      const Pack<T, V> ys = load_pack<V>(y, y_index(i));
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[k] = from_float<T>(f(to_float(xs.v[k]), to_float(ys.v[k])));
    } else {
      const float yj = to_float(y[y_index(i)]);
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[k] = from_float<T>(f(to_float(xs.v[k]), yj));
    }
    store_pack<V>(out, i, r);
  }
  bool packable(int v) const {
    if (!pack_aligned(x, v) || !pack_aligned(out, v)) return false;
    if constexpr (kY == YIndex::rows)
      return n % static_cast<I>(v) == 0 && pack_aligned(y, v);
    else
      return post % static_cast<I>(v) == 0;
  }
};

// The term f(a, b) of column j at (p, q); b may be null (f(a, 0)), as broadcast_reduce.
template <typename T, typename F>
__device__ __forceinline__ float column_term(const T* a, const T* b, const BroadcastDims& d, F f, int64_t j, int64_t p,
                                             int64_t q) {
  const int64_t idx = (p * d.n + j) * d.post + q;
  return f(to_float(a[idx]), b ? to_float(b[idx]) : 0.f);
}

// acc[j] = sum over p, q of f(a, b), one thread per column, in the CPU's order.
template <typename T, typename TOut, typename F>
struct ColumnSumSequential {
  const T* a;
  const T* b;
  TOut* out;
  BroadcastDims d;
  F f;
  __device__ void operator()(int64_t j) const {
    float acc = 0.f;
    for (int64_t p = 0; p < d.pre; ++p)
      for (int64_t q = 0; q < d.post; ++q) acc = __fadd_rn(acc, column_term(a, b, d, f, j, p, q));
    out[j] = from_float<TOut>(acc);
  }
};

// The same sum, one block per column: thread-strided partial sums, then a tree.
template <typename T, typename TOut, typename F>
__global__ void column_sum_tree(const T* a, const T* b, TOut* out, BroadcastDims d, F f) {
  __shared__ float shared[kBlock];
  const int64_t m = d.pre * d.post;
  for (int64_t j = blockIdx.x; j < d.n; j += gridDim.x) {
    float acc = 0.f;
    for (int64_t k = threadIdx.x; k < m; k += kBlock)
      acc = __fadd_rn(acc, column_term(a, b, d, f, j, k / d.post, k % d.post));
    acc = block_reduce(acc, shared, AddRn{});
    if (threadIdx.x == 0) out[j] = from_float<TOut>(acc);
  }
}

// post == 1, the first pass of a row-chunked column sum (device_ops.cuh):
// partial[c, j] = the sum of column j over chunk c's rows (blockIdx.y = c) in
// row order; one thread per column (blockIdx.x tiles them).
template <typename T, typename F>
__global__ void column_chunk_partials(const T* a, const T* b, float* partial, BroadcastDims d, int64_t rows_per_chunk,
                                      F f) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (j >= d.n) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < d.pre ? begin + rows_per_chunk : d.pre;
  float acc = 0.f;
  for (int64_t p = begin; p < end; ++p) acc = __fadd_rn(acc, column_term(a, b, d, f, j, p, 0));
  partial[static_cast<int64_t>(blockIdx.y) * d.n + j] = acc;
}

// ---- launchers -----------------------------------------------------------------------

// out = f(x, y broadcast as `d` says, not the same shape), by the BroadcastMap
// that does the fewest divisions.
template <typename T, typename F, typename I>
void launch_broadcast_map(const Tensor& x, const Tensor& y, Tensor& out, const BroadcastDims& d, F f,
                          cudaStream_t stream) {
  const auto n = static_cast<I>(d.n), post = static_cast<I>(d.post);
  const auto launch = [&](auto map) { launch_packed<kPackWidth<T>>(x.numel(), stream, map); };
  if (d.post == 1)
    launch(BroadcastMap<T, F, I, YIndex::rows>{x.data<T>(), y.data<T>(), out.data<T>(), n, post, f});
  else if (d.pre == 1)
    launch(BroadcastMap<T, F, I, YIndex::blocks>{x.data<T>(), y.data<T>(), out.data<T>(), n, post, f});
  else
    launch(BroadcastMap<T, F, I, YIndex::general>{x.data<T>(), y.data<T>(), out.data<T>(), n, post, f});
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
      if (d.pre * d.post <= kSequentialMax) {
        launch_grid_stride(d.n, stream, ColumnSumSequential<T, TOut, F>{a.data<T>(), bp, dy.data<TOut>(), d, f});
      } else if (d.post == 1) {
        const auto [chunks, rows_per_chunk] = row_chunks(d.pre, kRowsPerChunk, kMaxChunks);
        // Scratch released at return: safe, the kernels below run on the compute stream (device_ops.cuh).
        Tensor partial = Tensor::empty({chunks, d.n}, DType::f32, ctx.env.device);
        const dim3 grid(static_cast<unsigned>((d.n + kBlock - 1) / kBlock), static_cast<unsigned>(chunks));
        column_chunk_partials<T, F>
            <<<grid, kBlock, 0, stream>>>(a.data<T>(), bp, partial.data<float>(), d, rows_per_chunk, f);
        MIX_CUDA_CHECK(cudaGetLastError());
        launch_grid_stride(d.n, stream,
                           ChunkColumnSum<float, AddRn, TOut>{partial.data<float>(), dy.data<TOut>(), chunks, d.n});
      } else {
        const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(d.n, 65535));
        column_sum_tree<T, TOut, F><<<blocks, kBlock, 0, stream>>>(a.data<T>(), bp, dy.data<TOut>(), d, f);
        MIX_CUDA_CHECK(cudaGetLastError());
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
