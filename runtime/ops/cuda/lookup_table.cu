// CUDA kernels of lookup_table (embedding rows) and lookup_table_grad.
//
// Forward: one warp per id, copying W's row with the widest vector loads the
// row's size and the buffers' alignment allow (16 bytes for D % 8 == 0 in FP16,
// D % 4 == 0 in FP32): a plain copy, identical to the CPU's. The padding row
// reads as zeros (fn::lookup_is_padding).
//
// Out-of-range ids: the CPU kernel reports them, naming the id and where it
// sits; here the ids are on the GPU, and checking them first would cost a
// device-to-host copy and a stream sync inside every step. So, as
// softmax_with_cross_entropy does with bad labels (cross_entropy.cu), the
// kernel never reads outside W: an id outside [0, V) gets a row of NaN in Out
// and sends no gradient. The loss turns NaN, so an AMP step is skipped and an
// FP32 run shows a NaN loss rather than training on another row; run a step
// with --device cpu to get the error that names the id.
//
// Grad, deterministic (no float atomics): W@GRAD = 0, then every id's rows of
// Out@GRAD summed in FP32 in position order and rounded once to W's dtype.
//   1. keys[i] = Ids[i], or V for ids that take no gradient (padding, out of
//      range); vals[i] = i;
//   2. cub::DeviceRadixSort::SortPairs (stable, over just the bits V needs),
//      so equal ids sit together with their positions ascending;
//   3. one block per run of equal ids, its threads over the D columns, adds
//      the run's rows in position order: the same FP32 additions in the same
//      order as the CPU's loop (fn::lookup_grad_row_add), hence bit-identical
//      to the CPU, and identical run to run.
// With input Accumulate (the gradient's other part), step 0 writes every row
// as that part plus 0 instead of zeros, and step 3 adds it to each run's sum,
// both through fn::add_grad_part, as the CPU does.
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>
#include <limits>

#include "runtime/kernels/functors.h"
#include "runtime/kernels/lookup_row.h"
#include "runtime/ops/accumulate_input.h"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/cuda/lookup_table_kernels.cuh"
#include "runtime/ops/lookup_table_shapes.h"

namespace mix::cuda {
namespace {

// ---- launchers -----------------------------------------------------------------------

// f(L{}) with L the C++ type of the id dtype (checked to be i64 or i32).
template <typename F>
void dispatch_ids(DType t, F&& f) {
  if (t == DType::i64) return f(int64_t{});
  return f(int32_t{});
}

template <typename T, typename L, typename V>
void launch_lookup_rows(const Tensor& w, const Tensor& ids, Tensor& out, int64_t padding_idx, cudaStream_t stream) {
  const int64_t n = ids.numel();
  lookup_rows<T, L, V><<<lookup_row_blocks(n), kBlock, 0, stream>>>(w.data<T>(), ids.data<L>(), out.data<T>(), n,
                                                                    w.dim(0), w.dim(1), padding_idx);
  MIX_CUDA_CHECK(cudaGetLastError());
}

void lookup_table_cuda(OpContext& ctx) {
  const Tensor w = ctx.in("W");
  const Tensor ids = ctx.in("Ids");
  lookup_rules::check_table("lookup_table", w);
  lookup_rules::check_id_dtype("lookup_table", ids);
  const int64_t v = w.dim(0), d = w.dim(1);
  const int64_t padding_idx = ctx.attr<int64_t>("padding_idx", -1);
  lookup_rules::check_padding_idx("lookup_table", padding_idx, v);
  check_on_device(ctx, w, "W");
  check_on_device(ctx, ids, "Ids");
  Tensor& out = ctx.out("Out", lookup_rules::out_shape(ids.shape(), d), w.dtype());
  if (ids.numel() == 0 || d == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  const int unit = lookup_copy_unit(static_cast<size_t>(d) * dtype_size(w.dtype()), w.raw(), out.raw());
  dispatch_floating(w.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_ids(ids.dtype(), [&](auto id_tag) {
      using L = decltype(id_tag);
      with_copy_unit(static_cast<size_t>(unit), [&](auto unit_tag) {
        launch_lookup_rows<T, L, typename decltype(unit_tag)::type>(w, ids, out, padding_idx, stream);
      });
    });
  });
}

// Bits that hold every key 0..max (at least 1): the radix sort skips the rest.
int key_bits(uint64_t max) {
  int bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) <= max) ++bits;
  return bits;
}

void lookup_table_grad_cuda(OpContext& ctx) {
  if (!ctx.wants("W@GRAD")) return;
  const Tensor w = ctx.in("W");  // for its shape and dtype only
  const Tensor ids = ctx.in("Ids");
  const Tensor dout = ctx.in("Out@GRAD");
  lookup_rules::check_table("lookup_table_grad", w);
  lookup_rules::check_id_dtype("lookup_table_grad", ids);
  lookup_rules::check_grad_input(w, ids, dout);
  check_on_device(ctx, ids, "Ids");
  check_on_device(ctx, dout, "Out@GRAD");
  const int64_t v = w.dim(0), d = w.dim(1), n = ids.numel();
  const int64_t padding_idx = ctx.attr<int64_t>("padding_idx", -1);
  // 32-bit keys (V is the "no gradient" key) and positions.
  MIX_CHECK(v < std::numeric_limits<uint32_t>::max() && n <= std::numeric_limits<int32_t>::max(),
            "lookup_table_grad: the CUDA kernel handles tables of < 2^32 - 1 rows and < 2^31 ids, got W "
                << shape_str(w.shape()) << " and Ids " << shape_str(ids.shape()));
  const Tensor* other_in = grad_part::accumulate(ctx, "W@GRAD", w.shape(), w.dtype(), true);
  const Tensor other = other_in ? *other_in : Tensor();  // by value: W@GRAD may replace scope entries
  if (other_in) check_on_device(ctx, other, "Accumulate");
  Tensor& dw = ctx.out("W@GRAD", w.shape(), w.dtype());
  const cudaStream_t stream = compute_stream(ctx);
  // Rows no id names (and the padding row) stay 0, or the other part plus 0; on the compute stream.
  if (!other_in) {
    dw.fill_zero();
  } else if (dw.numel() > 0) {
    widening::dispatch(other.dtype(), dw.dtype(), [&](auto other_tag, auto w_tag) {
      using TA = decltype(other_tag);
      using T = decltype(w_tag);
      launch_grid_stride(dw.numel(), stream, OtherPartOnly<T, TA>{other.data<TA>(), dw.data<T>()});
    });
  }
  if (n == 0 || d == 0) return;
  const Device dev = ctx.env.device;

  // 1. keys and positions; 2. sorted by key (stable: positions stay ascending within a key).
  Tensor keys_in = Tensor::empty({n}, DType::i32, dev), keys = Tensor::empty({n}, DType::i32, dev);
  Tensor pos_in = Tensor::empty({n}, DType::i32, dev), pos = Tensor::empty({n}, DType::i32, dev);
  auto* keys_in_p = static_cast<uint32_t*>(keys_in.raw());
  auto* keys_p = static_cast<uint32_t*>(keys.raw());
  dispatch_ids(ids.dtype(), [&](auto id_tag) {
    using L = decltype(id_tag);
    launch_grid_stride(n, stream, GradKeys<L>{ids.data<L>(), keys_in_p, pos_in.data<int32_t>(), v, padding_idx});
  });
  const int end_bit = key_bits(static_cast<uint64_t>(v));
  const int items = static_cast<int>(n);
  size_t temp_bytes = 0;
  MIX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in_p, keys_p, pos_in.data<int32_t>(),
                                                 pos.data<int32_t>(), items, 0, end_bit, stream));
  Tensor temp = Tensor::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, DType::u8, dev);
  MIX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, keys_in_p, keys_p, pos_in.data<int32_t>(),
                                                 pos.data<int32_t>(), items, 0, end_bit, stream));

  // 3. one block per run of equal ids.
  const int threads = grad_run_threads(d);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(n, 65535));
  // Without Accumulate the other part's type is T's, never read.
  widening::dispatch(other_in ? other.dtype() : w.dtype(), w.dtype(), [&](auto other_tag, auto w_tag) {
    using TA = decltype(other_tag);
    using T = decltype(w_tag);
    lookup_grad_runs<T, TA><<<blocks, threads, 0, stream>>>(keys_p, pos.data<int32_t>(), dout.data<T>(),
                                                            other_in ? other.data<TA>() : nullptr, dw.data<T>(), n,
                                                            static_cast<uint32_t>(v), d);
    MIX_CUDA_CHECK(cudaGetLastError());
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("lookup_table", lookup_table_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("lookup_table_grad", lookup_table_grad_cuda);

}  // namespace
}  // namespace mix::cuda
