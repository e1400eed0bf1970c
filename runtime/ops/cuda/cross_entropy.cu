// CUDA kernels of softmax_with_cross_entropy (hard labels) and its grad: one
// block per row (softmax_row<kBlock>: class rows are vocabulary-wide), the
// loss from fn::cross_entropy_loss and the gradient from
// fn::softmax_cross_entropy_grad_elem (runtime/kernels/softmax_row.h).
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
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::cuda {
namespace {

using xent::Dims;
using xent::kOp;
using xent::loss_shape_of;

/// Host-side checks of shapes and attributes: the CPU kernel's, from the shared header.
Dims dims_of(const OpContext& ctx, const Tensor& logits, const Tensor& label) {
  xent::check_attrs(ctx.op, logits.shape().size());
  return xent::dims_of(logits, label);
}

/// What a row's label asks for.
enum class LabelKind { valid, ignored, invalid };

template <typename L>
__device__ __forceinline__ LabelKind label_kind(const L* labels, int64_t row, int64_t classes, int64_t ignore,
                                                int64_t& label) {
  label = static_cast<int64_t>(labels[row]);
  if (label == ignore) return LabelKind::ignored;
  return label >= 0 && label < classes ? LabelKind::valid : LabelKind::invalid;
}

// ---- kernels -------------------------------------------------------------------------

template <typename T, typename L>
__global__ void softmax_cross_entropy_rows(const T* x, const L* labels, T* y, T* loss, int64_t rows, int64_t classes,
                                           int64_t ignore) {
  __shared__ float shared[kBlock / kWarp];  // block_reduce's
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * classes;
    T* yr = y + r * classes;
    const RowSoftmax row = softmax_row<kBlock>(xr, yr, classes, shared);
    const float m = row.max, s = row.sum;
    if (threadIdx.x == 0) {
      int64_t label = 0;
      switch (label_kind(labels, r, classes, ignore, label)) {
        case LabelKind::valid:
          loss[r] = from_float<T>(fn::cross_entropy_loss(s, m, to_float(xr[label])));
          break;
        case LabelKind::ignored:
          loss[r] = from_float<T>(0.f);
          break;
        case LabelKind::invalid:
          loss[r] = from_float<T>(NAN);
          break;
      }
    }
  }
}

/// One element of Logits@GRAD: (softmax - onehot) * Loss@GRAD[row].
template <typename T, typename L>
struct CrossEntropyGrad {
  const T* y;
  const L* labels;
  ScalarRef dloss;  // Loss@GRAD, one value per row, any floating dtype
  T* dx;
  int64_t classes, ignore;
  __device__ void operator()(int64_t i) const {
    const int64_t row = i / classes;
    int64_t label = 0;
    switch (label_kind(labels, row, classes, ignore, label)) {
      case LabelKind::valid:
        dx[i] = from_float<T>(
            fn::softmax_cross_entropy_grad_elem(to_float(y[i]), i - row * classes == label, load_as_float(dloss, row)));
        break;
      case LabelKind::ignored:
        dx[i] = from_float<T>(0.f);
        break;
      case LabelKind::invalid:
        dx[i] = from_float<T>(NAN);
        break;
    }
  }
};

// ---- launchers -----------------------------------------------------------------------

/// f(L{}) with L the C++ type of the label dtype.
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
  Tensor& softmax = ctx.out("Softmax", logits.shape(), logits.dtype());
  Tensor& loss = ctx.out("Loss", loss_shape_of(logits.shape()), logits.dtype());
  if (d.rows == 0) return;
  const cudaStream_t stream = compute_stream(ctx);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(d.rows, 65535));
  dispatch_floating(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_label(label.dtype(), [&](auto label_tag) {
      using L = decltype(label_tag);
      softmax_cross_entropy_rows<T, L><<<blocks, kBlock, 0, stream>>>(
          logits.data<T>(), label.data<L>(), softmax.data<T>(), loss.data<T>(), d.rows, d.classes, ignore);
      MIX_CUDA_CHECK(cudaGetLastError());
    });
  });
}

void swce_grad_cuda(OpContext& ctx) {
  const Tensor softmax = ctx.in("Softmax");
  const Tensor label = ctx.in("Label");
  const Tensor dloss = ctx.in("Loss@GRAD");
  check_on_device(ctx, softmax, "Softmax");
  check_on_device(ctx, label, "Label");
  check_on_device(ctx, dloss, "Loss@GRAD");
  const Dims d = dims_of(ctx, softmax, label);
  MIX_CHECK(dloss.numel() == d.rows, kOp << "_grad: Loss@GRAD " << shape_str(dloss.shape())
                                         << " does not hold one value per row (" << d.rows << " rows)");
  MIX_CHECK(is_floating(dloss.dtype()), kOp << "_grad: Loss@GRAD is " << dtype_name(dloss.dtype()));
  const int64_t ignore = ctx.attr<int64_t>("ignore_index", -100);
  Tensor& dx = ctx.out("Logits@GRAD", softmax.shape(), softmax.dtype());
  const cudaStream_t stream = compute_stream(ctx);
  dispatch_floating(softmax.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_label(label.dtype(), [&](auto label_tag) {
      using L = decltype(label_tag);
      launch_grid_stride(softmax.numel(), stream,
                         CrossEntropyGrad<T, L>{softmax.data<T>(), label.data<L>(), scalar_ref(&dloss), dx.data<T>(),
                                                d.classes, ignore});
    });
  });
}

const bool registered = OpRegistry::instance().add_cuda_kernel("softmax_with_cross_entropy", swce_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("softmax_with_cross_entropy_grad", swce_grad_cuda);

}  // namespace
}  // namespace mix::cuda
