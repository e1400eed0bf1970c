#pragma once
// A pointwise convolution as one GEMM per pass (--cublas-1x1-conv on CUDA).
//
// Channels last, a convolution with a 1x1 filter, no padding and one group
// (any dilation: a 1x1 window has no gaps) mixes the channels of each pixel it
// samples and nothing else. With stride 1 it samples every pixel: its Input
// [n, h, w, c] is a row-major matrix X[m, c] with one row per pixel
// (m = n h w), its Output a matrix Y[m, oc], and its Filter [oc, c, 1, 1] a
// matrix W[oc, c], so each pass is one plain GEMM over those matrices, with
// no copies:
//   forward          Y  = X  W^T     [m, oc] = [m, c] [c, oc]
//   backward data    dX = dY W       [m, c]  = [m, oc] [oc, c]
//   backward filter  dW = dY^T X     [oc, c] = [oc, m] [m, c]   (summed over every pixel)
// With a stride it samples pixel (i sh, j sw) for output (i, j); X is then
// the matrix of the sampled pixels (m = n oh ow), which is a strided view of
// Input (sampled_pixels below). The forward and backward-filter passes gather
// it into scratch before their GEMM; backward data writes it to scratch and
// scatters it into an Input@GRAD zeroed first (the pixels not sampled get no
// gradient).
// All 36 of ResNet-50's 1x1 convolutions have that shape: its bottlenecks'
// first and last layers and the first stage's shortcut (stride 1), and the
// other three shortcuts (stride 2). The numerics are the convolution's rules
// (runtime/ops/cuda/conv2d.cu): FP32 accumulation and one rounding on store;
// the copies move bits.
//
// Written once here for both devices: the CPU tests check the formulation
// against the CPU conv2d kernel (tests/unit/test_conv_gemm.cc), and the CUDA
// launcher hands it to cuBLAS (runtime/cuda/gemm.h, whose argument order is
// cpu::sgemm's) and the gather and scatter copies (cuda::gather_into and
// scatter_into, whose CPU twins the tests run).
#include <cstdint>

#include "runtime/core/check.h"
#include "runtime/kernels/transpose_index.h"
#include "runtime/ops/conv_shapes.h"

namespace mix {

/// Whether every pass of `d` is one GEMM over the matrix of sampled pixels (see above).
inline bool conv_runs_as_gemm(const ConvDims& d) {
  return d.channels_last && d.kh == 1 && d.kw == 1 && d.pad_h == 0 && d.pad_w == 0 && d.groups == 1;
}

/// Whether that matrix is Input itself (stride 1), or a strided view of it
/// that the GEMMs reach through a gather or scatter copy.
inline bool conv_samples_every_pixel(const ConvDims& d) { return d.stride_h == 1 && d.stride_w == 1; }

/// The sampled pixels of a convolution with conv_runs_as_gemm(d), as a view
/// of Input [n, h, w, c]: a dense [n, oh, ow, c] (the GEMMs' pixel matrix)
/// whose element (b, i, j, k) is Input's (b, i sh, j sw, k). Gather it to
/// copy the view out, scatter it to write a dense one into Input's places.
inline fn::TransposePlan sampled_pixels(const ConvDims& d) {
  const int64_t dims[4] = {d.n, d.oh, d.ow, d.c};
  const int64_t strides[4] = {d.h * d.w * d.c, d.stride_h * d.w * d.c, d.stride_w * d.c, 1};
  return fn::make_view_plan(dims, strides, 4);
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

/// The GEMM of `pass` for a convolution with conv_runs_as_gemm(d). As for
/// cuDNN's graph API: `x` is the matrix of sampled pixels of Input (read by
/// forward and backward filter) or of Input@GRAD (written by backward data),
/// which with stride 1 are Input and Input@GRAD themselves; `w` Filter or
/// Filter@GRAD (written by backward filter), `y` Output (written by forward)
/// or Output@GRAD.
inline ConvGemm conv_gemm(ConvPass pass, const ConvDims& d, void* x, void* w, void* y) {
  const int64_t pixels = d.n * d.oh * d.ow;
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
