// CUDA kernels of softmax_with_cross_entropy (hard labels) and its grad. The
// forward gives each row a block (softmax_row<kBlock>: class rows are
// vocabulary-wide) and takes the loss from fn::cross_entropy_loss; the grad
// gives each row a RowGroup (a warp for rows of up to 1024 classes, else a
// block), which reads the row's label and Loss@GRAD once and writes
// fn::softmax_cross_entropy_grad_elem along the row
// (runtime/kernels/softmax_row.h). Attr out_dtype "f32" (runtime/ops/
// widening.h): FP16/BF16 Logits, FP32 Softmax and Loss, and Logits@GRAD in
// Logits' dtype, as in the CPU kernels. Attr valid_classes V: the row's
// softmax runs over its first V columns, the padding after them gets Softmax
// 0 and gradient 0, and a label must be below V, as on the CPU.
//
// Without a stored Softmax (runtime/passes/recompute_softmax.h) the forward writes
// RowStats and the grad recomputes each softmax value from Logits and its
// row's stats (SoftmaxSource), as the CPU kernels do.
//
// The kernels are in cross_entropy_kernels.cuh, which the emulated test runs
// on the CPU; this file holds the launchers.
//
// Labels live on the GPU, so they cannot be validated before the kernel
// without a host round trip inside the step. Rows whose label equals
// ignore_index get loss 0 and gradient 0, as on the CPU; a label outside
// [0, C) that is not ignore_index, which the CPU kernel reports as an error
// naming the row, makes that row's loss and gradient NaN here: the step's
// gradients turn non-finite, so an AMP step is skipped and an FP32 run shows
// a NaN loss, instead of training on a wrong label. Run one step on the CPU
// (--device cpu) to get the error that names the row.
#include <cstdint>

#include "runtime/kernels/softmax_row.h"
#include "runtime/ops/cross_entropy_shapes.h"
#include "runtime/ops/cuda/cross_entropy_kernels.cuh"
#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/widening.h"

namespace mix::cuda {
namespace {

using xent::Dims;
using xent::kOp;
using xent::loss_shape_of;

// Host-side checks of shapes and attributes: the CPU kernel's, from the shared header.
Dims dims_of(const OpContext& ctx, const Tensor& logits, const Tensor& label) {
  xent::check_attrs(ctx.op, logits.shape().size());
  return xent::dims_of(ctx.op, logits, label);
}

// ---- launchers -----------------------------------------------------------------------

// f(L{}) with L the C++ type of the label dtype.
template <typename F>
void dispatch_label(DType t, F&& f) {
  if (t == DType::i64) return f(int64_t{});
  return f(int32_t{});
}

void swce_cuda(OpContext& ctx) {
  const Tensor logits = ctx.in("Logits");
  const Tensor label = ctx.in("Label");
  check_on_device(ctx, logits, "Logits");
  check_on_device(ctx, label, "Label");
  const Dims d = dims_of(ctx, logits, label);
  const int64_t ignore = ctx.attr<int64_t>("ignore_index", -100);
  const DType out = widening::out_dtype(ctx.op, logits.dtype());
  Tensor* softmax = ctx.wants("Softmax") ? &ctx.out("Softmax", logits.shape(), out) : nullptr;
  float* stats = ctx.wants("RowStats")
                     ? ctx.out("RowStats", xent::row_stats_shape(logits.shape()), DType::f32).data<float>()
                     : nullptr;
  Tensor& loss = ctx.out("Loss", loss_shape_of(logits.shape()), out);
  if (d.rows == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(d.rows, 65535));
  widening::dispatch(logits.dtype(), out, [&](auto x_tag, auto y_tag) {
    using X = decltype(x_tag);
    using Y = decltype(y_tag);
    dispatch_label(label.dtype(), [&](auto label_tag) {
      using L = decltype(label_tag);
      softmax_cross_entropy_rows<X, Y, L><<<blocks, kBlock, 0, stream>>>(logits.data<X>(), label.data<L>(),
                                                                         softmax ? softmax->data<Y>() : nullptr, stats,
                                                                         loss.data<Y>(), d.rows, d.classes, d.valid,
                                                                         ignore);
      MIX_CUDA_CHECK(cudaGetLastError());
    });
  });
}

void swce_grad_cuda(OpContext& ctx) {
  const xent::GradSource src = xent::grad_source(ctx);
  const Tensor label = ctx.in("Label");
  const Tensor dloss = ctx.in("Loss@GRAD");
  check_on_device(ctx, src.values, src.recompute ? "Logits" : "Softmax");
  if (src.recompute) check_on_device(ctx, src.row_stats, "RowStats");
  check_on_device(ctx, label, "Label");
  check_on_device(ctx, dloss, "Loss@GRAD");
  const Dims d = dims_of(ctx, src.values, label);
  MIX_CHECK(dloss.numel() == d.rows, kOp << "_grad: Loss@GRAD " << shape_str(dloss.shape())
                                         << " does not hold one value per row (" << d.rows << " rows)");
  MIX_CHECK(is_floating(dloss.dtype()), kOp << "_grad: Loss@GRAD is " << dtype_name(dloss.dtype()));
  const int64_t ignore = ctx.attr<int64_t>("ignore_index", -100);
  Tensor& dx = ctx.out("Logits@GRAD", src.values.shape(), src.dx_dtype);
  if (d.rows == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  widening::dispatch(dx.dtype(), src.softmax_dtype, [&](auto dx_tag, auto y_tag) {
    using DX = decltype(dx_tag);
    using Y = decltype(y_tag);
    const SoftmaxSource<Y, DX> from =
        src.recompute ? SoftmaxSource<Y, DX>{nullptr, src.values.data<DX>(), src.row_stats.data<float>()}
                      : SoftmaxSource<Y, DX>{src.values.data<Y>(), nullptr, nullptr};
    dispatch_label(label.dtype(), [&](auto label_tag) {
      using L = decltype(label_tag);
      with_row_group(d.classes, [&](auto threads) {
        constexpr int kThreads = decltype(threads)::value;
        softmax_cross_entropy_grad_rows<Y, DX, L, kThreads><<<row_group_blocks<kThreads>(d.rows), kBlock, 0, stream>>>(
            from, label.data<L>(), scalar_ref(&dloss), dx.data<DX>(), d.rows, d.classes, d.valid, ignore);
        MIX_CUDA_CHECK(cudaGetLastError());
      });
    });
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("softmax_with_cross_entropy", swce_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("softmax_with_cross_entropy_grad", swce_grad_cuda);

}  // namespace
}  // namespace mix::cuda
