#pragma once
// The kernels of softmax_with_cross_entropy and its grad (cross_entropy.cu's
// header gives what they compute: the padding after valid_classes, ignored
// and out-of-range labels, the softmax stored or recomputed from RowStats).
// Like row_group.cuh they need no CUDA header, so
// tests/unit/test_softmax_kernels_emulated.cc runs this same source on the CPU.
#include <cmath>
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/kernels/softmax_row.h"
#include "runtime/ops/cuda/row_group.cuh"
#include "runtime/ops/cuda/scalar_ref.cuh"
#include "runtime/ops/cuda/softmax_kernels.cuh"

namespace mix::cuda {

// What a row's label asks for.
enum class LabelKind { valid, ignored, invalid };

template <typename L>
__device__ __forceinline__ LabelKind label_kind(const L* labels, int64_t row, int64_t classes, int64_t ignore,
                                                int64_t& label) {
  label = static_cast<int64_t>(labels[row]);
  if (label == ignore) return LabelKind::ignored;
  return label >= 0 && label < classes ? LabelKind::valid : LabelKind::invalid;
}

// ---- kernels -------------------------------------------------------------------------

// y (the Softmax) and stats (RowStats: max, sum per row) may each be null.
template <typename X, typename Y, typename L>
__global__ void softmax_cross_entropy_rows(const X* x, const L* labels, Y* y, float* stats, Y* loss, int64_t rows,
                                           int64_t classes, int64_t valid, int64_t ignore) {
  __shared__ float shared[kBlock / kWarp];  // block_reduce's
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const X* xr = x + r * classes;
    Y* yr = y != nullptr ? y + r * classes : nullptr;
    const RowSoftmax row = softmax_row<kBlock>(xr, yr, valid, shared);
    if (yr != nullptr)  // the padding takes no probability
      for (int64_t i = valid + threadIdx.x; i < classes; i += kBlock) yr[i] = from_float<Y>(0.f);
    const float m = row.max, s = row.sum;
    if (threadIdx.x == 0) {
      if (stats != nullptr) {
        stats[2 * r] = m;
        stats[2 * r + 1] = s;
      }
      int64_t label = 0;
      switch (label_kind(labels, r, valid, ignore, label)) {
        case LabelKind::valid:
          loss[r] = from_float<Y>(fn::cross_entropy_loss(s, m, to_float(xr[label])));
          break;
        case LabelKind::ignored:
          loss[r] = from_float<Y>(0.f);
          break;
        case LabelKind::invalid:
          loss[r] = from_float<Y>(NAN);
          break;
      }
    }
  }
}

// The softmax a grad row reads: the stored Softmax (Y), or, where the
// forward stored none, recomputed from Logits (X) and RowStats as the forward
// would have stored it (fn::softmax_as_stored): the same bits either way.
template <typename Y, typename X>
struct SoftmaxSource {
  const Y* softmax;    // null: recompute
  const X* logits;     // recomputing: Logits
  const float* stats;  // recomputing: RowStats
  struct Row {
    const Y* y;
    const X* x;
    fn::SoftmaxNormalize f;
    __device__ float operator()(int64_t i) const {
      return y != nullptr ? to_float(y[i]) : fn::softmax_as_stored<Y>(f, to_float(x[i]));
    }
  };
  __device__ Row row(int64_t r, int64_t classes) const {
    if (softmax != nullptr) return {softmax + r * classes, nullptr, {}};
    return {nullptr, logits + r * classes, fn::softmax_normalizer(stats[2 * r], stats[2 * r + 1])};
  }
};

// Logits@GRAD = (softmax - onehot) * Loss@GRAD[row], a row per
// RowGroup<kThreads>: the label and Loss@GRAD (`dloss`, any floating dtype)
// are read once per row, and no thread divides by the row length.
template <typename Y, typename DX, typename L, int kThreads>
__global__ void softmax_cross_entropy_grad_rows(SoftmaxSource<Y, DX> src, const L* labels, ScalarRef dloss, DX* dx,
                                                int64_t rows, int64_t classes, int64_t valid, int64_t ignore) {
  using G = RowGroup<kThreads>;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    DX* dxr = dx + r * classes;
    int64_t label = 0;
    switch (label_kind(labels, r, valid, ignore, label)) {
      case LabelKind::valid: {
        const float d = load_as_float(dloss, r);
        const auto y = src.row(r, classes);
        for (int64_t i = G::tid(); i < classes; i += kThreads)  // the padding's logits do not reach the loss
          dxr[i] = from_float<DX>(i < valid ? fn::softmax_cross_entropy_grad_elem(y(i), i == label, d) : 0.f);
        break;
      }
      case LabelKind::ignored:
        for (int64_t i = G::tid(); i < classes; i += kThreads) dxr[i] = from_float<DX>(0.f);
        break;
      case LabelKind::invalid:
        for (int64_t i = G::tid(); i < classes; i += kThreads) dxr[i] = from_float<DX>(NAN);
        break;
    }
  }
}

}  // namespace mix::cuda
