#pragma once
// transpose2's index map, shared by the CPU copy loop (runtime/ops/transpose2.cc)
// and a CUDA kernel: Out[o] = X[plan.src_offset(o)], o running over Out in
// row-major order. The plan is built once on the host: size-1 dims are dropped
// and output dims that are also adjacent and in order in X are merged, so
// [B, T, H, hd] -> [B, H, T, hd] is a 4-D map whose innermost run (hd values)
// is contiguous on both sides, and an identity permutation is one run.
//
// The same map describes any strided view of X (make_view_plan): conv2d's
// cuBLAS path gathers a strided convolution's sampled pixels with it, and
// scatters their gradient back (runtime/ops/conv_gemm.h).
#include <cstdint>

#include "runtime/core/half.h"

namespace mix::fn {

inline constexpr int kMaxTransposeDims = 8;

struct TransposePlan {
  int ndim = 0;                                 // after merging; >= 1
  int64_t out_dims[kMaxTransposeDims] = {};     // Out's (merged) dims
  int64_t src_strides[kMaxTransposeDims] = {};  // X's element stride for a step along each of them

  /// X's element offset of Out's element o (row-major over out_dims).
  MIX_HD int64_t src_offset(int64_t o) const {
    int64_t off = 0;
    for (int k = ndim - 1; k >= 0; --k) {
      off += (o % out_dims[k]) * src_strides[k];
      o /= out_dims[k];
    }
    return off;
  }
  /// Whether the innermost dim is contiguous in X too (a run to copy whole).
  MIX_HD bool inner_contiguous() const { return src_strides[ndim - 1] == 1; }
};

/// The plan of Out[i_0, ..., i_{ndim-1}] = X[sum_k i_k strides[k]] (Out
/// row-major over `dims`, strides in elements of X): any strided view of X,
/// copied out dense. Size-1 dims are dropped, and a dim is merged into the one
/// before it when that one steps over exactly it. ndim <= kMaxTransposeDims
/// (the caller's to keep).
inline TransposePlan make_view_plan(const int64_t* dims, const int64_t* strides, int ndim) {
  TransposePlan p;
  for (int k = 0; k < ndim; ++k) {
    const int64_t d = dims[k], st = strides[k];
    if (d == 1) continue;  // a size-1 dim moves nothing
    // The previous output dim steps over exactly this one in X: one dim of the product's size.
    if (p.ndim > 0 && p.src_strides[p.ndim - 1] == d * st) {
      p.out_dims[p.ndim - 1] *= d;
      p.src_strides[p.ndim - 1] = st;
      continue;
    }
    p.out_dims[p.ndim] = d;
    p.src_strides[p.ndim] = st;
    ++p.ndim;
  }
  if (p.ndim == 0) {  // every dim 1 (or none): a single element
    p.ndim = 1;
    p.out_dims[0] = 1;
    p.src_strides[0] = 1;
  }
  return p;
}

/// The plan of Out = X.permute(perm) for X of `ndim` dims (perm a valid
/// permutation, ndim <= kMaxTransposeDims; the caller checks both): the view
/// of X with X's dims and row-major strides taken in perm's order.
inline TransposePlan make_transpose_plan(const int64_t* x_dims, const int64_t* perm, int ndim) {
  int64_t x_strides[kMaxTransposeDims];
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    x_strides[i] = s;
    s *= x_dims[i];
  }
  int64_t dims[kMaxTransposeDims], strides[kMaxTransposeDims];
  for (int k = 0; k < ndim; ++k) {
    dims[k] = x_dims[perm[k]];
    strides[k] = x_strides[perm[k]];
  }
  return make_view_plan(dims, strides, ndim);
}

}  // namespace mix::fn
