#pragma once
// A pointwise convolution as one GEMM per pass (--cublas-1x1-conv on CUDA).
//
// Channels last, a convolution with a 1x1 filter, stride 1, no padding and
// one group (any dilation: a 1x1 window has no gaps) mixes the channels of
// each pixel and nothing else. Its Input [n, h, w, c] is a row-major matrix
// X[m, c] with one row per pixel (m = n h w), its Output a matrix Y[m, oc],
// and its Filter [oc, c, 1, 1] a matrix W[oc, c], so each pass is one plain
// GEMM over those matrices, with no copies:
//   forward          Y  = X  W^T     [m, oc] = [m, c] [c, oc]
//   backward data    dX = dY W       [m, c]  = [m, oc] [oc, c]
//   backward filter  dW = dY^T X     [oc, c] = [oc, m] [m, c]   (summed over every pixel)
// 33 of ResNet-50's 53 convolutions (its bottlenecks' first and last layers,
// and the first downsampling shortcut) have that shape. The numerics are the
// convolution's rules (runtime/ops/cuda/conv2d.cu): FP32 accumulation and one
// rounding on store.
//
// Written once here for both devices: the CPU tests check the formulation
// against the CPU conv2d kernel (tests/unit/test_conv_gemm.cc), and the CUDA
// launcher hands it to cuBLAS (runtime/cuda/gemm.h, whose argument order is
// cpu::sgemm's).
#include <cstdint>

#include "runtime/check.h"
#include "runtime/ops/conv_shapes.h"

namespace mix {

/// Whether every pass of `d` is one GEMM over the pixel matrix (see above).
inline bool conv_is_one_gemm(const ConvDims& d) {
  return d.channels_last && d.kh == 1 && d.kw == 1 && d.stride_h == 1 && d.stride_w == 1 && d.pad_h == 0 &&
         d.pad_w == 0 && d.groups == 1;
}

/// Row-major C[m, n] = op(A) op(B) (beta 0): op(A) is A[m, k], or A[k, m]
/// transposed with trans_a; op(B) is B[k, n], or B[n, k] transposed with
/// trans_b. All three are dense, their leading dimension their row length.
struct ConvGemm {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
};

/// The GEMM of `pass` for a convolution with conv_is_one_gemm(d). As for
/// cuDNN's graph API: `x` is Input (read by forward and backward filter) or
/// Input@GRAD (written by backward data), `w` Filter or Filter@GRAD (written
/// by backward filter), `y` Output (written by forward) or Output@GRAD.
inline ConvGemm conv_gemm(ConvPass pass, const ConvDims& d, void* x, void* w, void* y) {
  const int64_t pixels = d.n * d.h * d.w;
  switch (pass) {
    case ConvPass::forward:
      return {false, true, pixels, d.oc, d.c, x, w, y};
    case ConvPass::backward_data:
      return {false, false, pixels, d.c, d.oc, y, w, x};
    case ConvPass::backward_filter:
      return {true, false, d.oc, d.c, pixels, y, x, w};
  }
  MIX_FAIL("conv_gemm: unknown convolution pass " << static_cast<int64_t>(pass));
}

}  // namespace mix
