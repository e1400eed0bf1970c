// [cuda] The cuDNN kernels of conv2d, batch_norm and pool2d against their CPU
// twins: each op runs as a one-op Program through the Executor on the CPU and
// on cuda:0 with the same random inputs, in FP32, FP16 and BF16 (pooling:
// FP32 and FP16). Both results are compared with one reference computed here
// in double from the same (already rounded) inputs, each within the error
// bound of how it computes;
// a bound on CPU - GPU alone would hide a lost term behind the CPU's own error.
// Whole ResNet training steps on the GPU are in test_cuda_train_step.cc.
//
// The bounds (abs + rel·|ref|; the reason for each is stated where it is used):
//  - sums of K terms in FP32 in any order: (K + 2)·u·sum|terms| (u = 2^-24),
//    never relative to |result|, which cancellation can make arbitrarily small;
//  - an FP16 output adds half an FP16 ulp of the value (2^-11·|ref|, and 2^-25
//    where it is subnormal); a BF16 output half a BF16 ulp (2^-8·|ref|);
//  - convolutions: cuDNN may pick Winograd or FFT algorithms, which transform
//    tiles of the inputs first; their error scales with the magnitude of the
//    transformed tiles, not with each output's own terms, so those
//    comparisons also allow a fraction of the largest sum|terms| in the same
//    output plane (2^-14 in FP32, 2^-10 in FP16 where cuDNN may keep the
//    transformed tiles in FP16, 2^-7 in BF16).
// TF32 stays off (its 10-bit mantissa would need FP16-like bounds), except in
// the one test case of --allow-tf32, which has such bounds.
// Every case runs channels first (NCHW) and channels last (data_format /
// data_layout NHWC, ResNet's default on CUDA): NHWC inputs are permuted copies
// of the NCHW ones and NHWC results are permuted back before the comparisons,
// so one reference and one set of bounds serve both layouts.
// batch_norm also runs with fuse_with_relu (runtime/passes/fuse_bn_relu.h). Channels
// last, batch_norm runs mixtrain's own kernels (batch_norm_channels_last.cu),
// except without a fused relu under the persistent switch (cuDNN's
// persistent kernels); NCHW runs cuDNN.
// The runner and the comparisons: tests/unit/cuda_compare.h.
//
// MIX_CUDA_OPS_VERBOSE=1 prints how close each comparison came to its bound.
// Without a GPU (or in a build without CUDA) the test exits 77, which CTest
// reports as skipped, never as passed.
#include <catch2/catch.hpp>

#include "tests/unit/require_gpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "runtime/core/allocator.h"
#include "runtime/core/device_backend.h"
#include "runtime/core/random.h"
#include "runtime/core/tensor.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "runtime/kernels/functors.h"
#include "runtime/kernels/transpose_index.h"
#include "runtime/ops/data_format.h"
#include "runtime/ops/transpose2_shapes.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"

#ifdef MIX_HAVE_CUDA
#include "runtime/cuda/context.h"
#include "runtime/cuda/cudnn_conv_graph.h"
#include "runtime/cuda/device_allocator.h"
#include "runtime/cuda/gemm.h"
#endif

using namespace mix;
using namespace mix::testing;

namespace {

// Pooling's cases: its max-pool inputs are distinct in FP16 but not all in
// BF16 (k/64 for |k| up to 297 needs 9 significant bits), and a tie may route
// a gradient to another maximum (pool2d.cu).
const DType kPoolTypes[] = {DType::f32, DType::f16};

// conv2d's and batch_norm's cases take every float dtype, BF16 included (AMP
// accepts it): one run of the test case per dtype (Catch2 GENERATE), so a
// dtype cuDNN turns down fails in its own run and leaves the others' results.
#define EACH_FLOAT_TYPE() GENERATE(DType::f32, DType::f16, DType::bf16)

void disable_tf32() {
#ifdef MIX_HAVE_CUDA
  mix::cuda::set_allow_tf32(false);
#endif
}

// One of the CUDA backend's switches (cuda::set_batch_norm_persistent,
// cuda::set_cudnn_benchmark, cuda::set_cudnn_graph_conv,
// cuda::set_cublas_1x1_conv) set for the life of a test, then off again.
using Switch = void (*)(bool);
#ifdef MIX_HAVE_CUDA
const Switch kBatchNormPersistent = mix::cuda::set_batch_norm_persistent;
const Switch kCudnnBenchmark = mix::cuda::set_cudnn_benchmark;
const Switch kCudnnGraphConv = mix::cuda::set_cudnn_graph_conv;
const Switch kCublas1x1Conv = mix::cuda::set_cublas_1x1_conv;
const Switch kAllowTf32 = mix::cuda::set_allow_tf32;
#else
const Switch kBatchNormPersistent = nullptr, kCudnnBenchmark = nullptr, kCudnnGraphConv = nullptr,
             kCublas1x1Conv = nullptr, kAllowTf32 = nullptr;
#endif

// Convolution passes run on cuDNN's graph API so far (cuda::conv_graph_runs).
uint64_t graph_api_passes() {
#ifdef MIX_HAVE_CUDA
  return mix::cuda::conv_graph_runs();
#else
  return 0;
#endif
}

// How conv2d picks and runs cuDNN's algorithms: the legacy calls with the
// heuristics' choice, the same timed (--cudnn-benchmark), or the graph API's
// cached plans (--cudnn-graph-conv); or the pointwise channels-last cases as
// cuBLAS GEMMs (--cublas-1x1-conv; the others on the legacy calls). The same
// bounds hold for any algorithm, a GEMM's included.
enum class ConvMode { heuristic, benchmark, graph, gemm };
const char* mode_name(ConvMode m) {
  switch (m) {
    case ConvMode::heuristic:
      return "";
    case ConvMode::benchmark:
      return " benchmark";
    case ConvMode::graph:
      return " graph API";
    case ConvMode::gemm:
      return " cuBLAS 1x1";
  }
  return "?";
}

// While it lives, GPU 0's allocator holds no cache and may not take one byte
// more from the driver than it holds now (CudaCachingAllocator::set_limit).
class NoMoreDeviceMemory {
 public:
#ifdef MIX_HAVE_CUDA
  NoMoreDeviceMemory() : alloc_(dynamic_cast<mix::cuda::CudaCachingAllocator&>(allocator_for(kGpu))) {
    alloc_.empty_cache();
    before_ = alloc_.limit();
    alloc_.set_limit(alloc_.reserved_bytes());
  }
  ~NoMoreDeviceMemory() { alloc_.set_limit(before_); }

 private:
  mix::cuda::CudaCachingAllocator& alloc_;
  size_t before_ = 0;
#endif
};

class ScopedSwitch {
 public:
  ScopedSwitch(Switch set, bool on) : set_(set) {
    if (set_) set_(on);
  }
  ~ScopedSwitch() {
    if (set_) set_(false);
  }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  Switch set_;
};

std::string mode_name(bool persistent) { return persistent ? " persistent" : ""; }

// ---- layouts ------------------------------------------------------------------------------

const bool kLayouts[] = {false, true};  // channels first, channels last

std::string layout_name(bool channels_last) { return channels_last ? " NHWC" : " NCHW"; }

// t as the op reads it: itself, or a channels-last copy.
Tensor in_layout(const Tensor& t, bool channels_last) { return channels_last ? layout::channels_last_copy(t) : t; }

// The op's layout attr (`attr`: data_format, or batch_norm's data_layout) added to `attrs`.
std::map<std::string, Attr> with_layout(std::map<std::string, Attr> attrs, const char* attr, bool channels_last) {
  attrs[attr] = std::string(channels_last ? "NHWC" : "NCHW");
  return attrs;
}

// Both devices' image results `names` back to channels first, for the references.
void results_channels_first(Both& b, bool channels_last, const std::vector<std::string>& names) {
  if (!channels_last) return;
  for (auto* side : {&b.cpu, &b.gpu})
    for (const std::string& n : names) (*side)[n] = layout::channels_first_copy(side->at(n));
}

// ---- comparisons --------------------------------------------------------------------------

// Both devices' results against one reference, each within allowed(i).
void expect_both_within(const Both& b, const std::string& name, const std::vector<double>& ref,
                        const std::function<double(int64_t)>& allowed, const std::string& what) {
  expect_within(b.cpu.at(name), ref, allowed, what + " (CPU)");
  expect_within(b.gpu.at(name), ref, allowed, what + " (GPU)");
}

// ---- conv2d -------------------------------------------------------------------------------

struct ConvCfg {
  const char* name;
  int64_t n, c, h, w, oc, kh, kw, stride, pad, dil, groups;
  int64_t oh() const { return (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - dil * (kw - 1) - 1) / stride + 1; }
};

const ConvCfg kConvCases[] = {
    {"3x3 pad 1", 2, 8, 10, 10, 16, 3, 3, 1, 1, 1, 1},
    {"3x3 stride 2", 2, 8, 11, 11, 16, 3, 3, 2, 1, 1, 1},
    {"1x1", 2, 16, 7, 9, 8, 1, 1, 1, 0, 1, 1},
    {"1x1 stride 2", 2, 8, 10, 10, 16, 1, 1, 2, 0, 1, 1},
    // Under --cublas-1x1-conv channels last, the sampled pixels are gathered
    // and scattered element by element here (5 channels: no wider copy unit),
    // and the last row and column are sampled.
    {"1x1 stride 2, odd channels and extents", 2, 5, 9, 7, 6, 1, 1, 2, 0, 1, 1},
    // Pointwise with odd extents (cuBLAS GEMMs under --cublas-1x1-conv,
    // channels last): a swapped m, n or k changes a shape.
    {"1x1 odd channels", 3, 5, 7, 6, 11, 1, 1, 1, 0, 1, 1},
    {"1x1 dilation 2", 2, 12, 5, 3, 6, 1, 1, 1, 0, 2, 1},
    {"1x1 padding 1 (not one GEMM)", 2, 8, 5, 5, 8, 1, 1, 1, 1, 1, 1},
    {"3x3 dilation 2", 2, 4, 12, 12, 8, 3, 3, 1, 2, 2, 1},
    {"3x3 groups 4", 2, 8, 9, 9, 12, 3, 3, 1, 1, 1, 4},
    // One channel per group: channels last, the filter is used without a permute.
    {"3x3 depthwise", 2, 8, 9, 9, 8, 3, 3, 1, 1, 1, 8},
    {"7x7 stride 2 pad 3 (stem)", 2, 3, 20, 20, 8, 7, 7, 2, 3, 1, 1},
    {"3x3 64 channels (tensor-core sizes)", 4, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1},
    // Rectangular filters on non-square inputs: a kh/kw or h/w mix-up (in a
    // descriptor, or in the NHWC filter permute) cannot pass these.
    {"1x7 on 9x12", 2, 8, 9, 12, 16, 1, 7, 1, 0, 1, 1},
    {"3x1 stride 2 pad 1 on 11x7", 2, 8, 11, 7, 16, 3, 1, 2, 1, 1, 1},
};

std::map<std::string, Attr> conv_attrs(const ConvCfg& k) {
  return {{"strides", std::vector<int64_t>{k.stride, k.stride}},
          {"paddings", std::vector<int64_t>{k.pad, k.pad}},
          {"dilations", std::vector<int64_t>{k.dil, k.dil}},
          {"groups", k.groups}};
}

// A sum computed in double: its value, sum|terms| and number of terms per element.
struct SumRef {
  std::vector<double> value, abs_sum;
  std::vector<int64_t> terms;
  explicit SumRef(int64_t n)
      : value(static_cast<size_t>(n), 0.0), abs_sum(static_cast<size_t>(n), 0.0), terms(static_cast<size_t>(n), 0) {}
  void add(int64_t i, double term) {
    const size_t k = static_cast<size_t>(i);
    value[k] += term;
    abs_sum[k] += std::fabs(term);
    ++terms[k];
  }
  // FP32 accumulation of the terms in any order, each product rounded once.
  double acc_err(int64_t i) const {
    const size_t k = static_cast<size_t>(i);
    return static_cast<double>(terms[k] + 2) * kU * abs_sum[k];
  }
  // The largest sum|terms| of each group of `plane` consecutive elements.
  std::vector<double> plane_max(int64_t plane) const {
    std::vector<double> m(abs_sum.size() / static_cast<size_t>(plane), 0.0);
    for (size_t i = 0; i < abs_sum.size(); ++i)
      m[i / static_cast<size_t>(plane)] = std::max(m[i / static_cast<size_t>(plane)], abs_sum[i]);
    return m;
  }
};

// Output, Input@GRAD and Filter@GRAD of the convolution, from the definition.
struct ConvRef {
  SumRef out, dx, dw;
};
ConvRef conv_reference(const ConvCfg& k, const std::vector<float>& x, const std::vector<float>& f,
                       const std::vector<float>& dy) {
  const int64_t oh = k.oh(), ow = k.ow(), cg = k.c / k.groups, ocg = k.oc / k.groups;
  ConvRef r{SumRef(k.n * k.oc * oh * ow), SumRef(k.n * k.c * k.h * k.w), SumRef(k.oc * cg * k.kh * k.kw)};
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t o = 0; o < k.oc; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xx = 0; xx < ow; ++xx) {
          const int64_t g = o / ocg, oi = ((n * k.oc + o) * oh + y) * ow + xx;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < k.kh; ++i)
              for (int64_t j = 0; j < k.kw; ++j) {
                const int64_t iy = y * k.stride - k.pad + i * k.dil, ix = xx * k.stride - k.pad + j * k.dil;
                if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
                const int64_t xi = ((n * k.c + g * cg + ci) * k.h + iy) * k.w + ix;
                const int64_t fi = ((o * cg + ci) * k.kh + i) * k.kw + j;
                const double xv = x[static_cast<size_t>(xi)], fv = f[static_cast<size_t>(fi)],
                             dv = dy[static_cast<size_t>(oi)];
                r.out.add(oi, xv * fv);
                r.dx.add(xi, dv * fv);
                r.dw.add(fi, dv * xv);
              }
        }
  return r;
}

// The bound of one convolution result (see the top of the file): accumulation,
// transformed algorithms (a fraction of the plane's largest sum|terms|), FP16 store.
std::function<double(int64_t)> conv_bound(const SumRef& r, int64_t plane, DType t) {
  // FP32: Winograd/FFT transforms in FP32 (2^-14 of the plane's largest sum|terms|).
  // FP16: cuDNN may keep the transformed tiles (or split-K partial sums) in FP16: 2^-10.
  // BF16: the same with BF16's 3 fewer mantissa bits: 2^-7.
  const double transform = t == DType::f16 ? 0x1p-10 : t == DType::bf16 ? 0x1p-7 : 0x1p-14;
  auto maxima = std::make_shared<std::vector<double>>(r.plane_max(plane));
  return [&r, plane, t, transform, maxima](int64_t i) {
    return r.acc_err(i) + transform * (*maxima)[static_cast<size_t>(i / plane)] +
           store_err(t, r.value[static_cast<size_t>(i)]);
  };
}

// An FP32 convolution under --allow-tf32: the tensor cores read each operand
// with TF32's 10 explicit mantissa bits, rounded or truncated (the libraries
// do either), so each is off by up to 2^-10 of itself and each product by
// up to 2^-9 (+2^-20) of |term|; sums are FP32 (acc_err). Winograd or FFT
// tiles multiplied in TF32 err by a like fraction of the transformed tiles:
// 2^-9 of the plane's largest sum|terms|, two of TF32's truncation units as
// the FP16 bound's 2^-10 is two of FP16's rounding units. Not calibrated on a
// GPU yet: MIX_CUDA_OPS_VERBOSE=1 prints how close each result came.
std::function<double(int64_t)> tf32_conv_bound(const SumRef& r, int64_t plane) {
  auto maxima = std::make_shared<std::vector<double>>(r.plane_max(plane));
  return [&r, plane, maxima](int64_t i) {
    const size_t k = static_cast<size_t>(i);
    return r.acc_err(i) + (0x1p-9 + 0x1p-20) * r.abs_sum[k] + 0x1p-9 * (*maxima)[k / static_cast<size_t>(plane)];
  };
}

// The CPU (im2col + SGEMM, FP32 accumulation, one rounding on store): no transforms.
std::function<double(int64_t)> gemm_bound(const SumRef& r, DType t) {
  return [&r, t](int64_t i) { return r.acc_err(i) + store_err(t, r.value[static_cast<size_t>(i)]); };
}

// One convolution case on both devices: inputs drawn from three seeds on
// from `seed`, the reference in double, the forward and both gradients (the
// results back in channels-first order).
struct ConvRun {
  ConvRef ref;
  Both fwd, bwd;
};
ConvRun run_conv_case(const ConvCfg& k, DType dt, bool last, uint64_t& seed) {
  const Tensor x = to_dtype(uniform_tensor({k.n, k.c, k.h, k.w}, seed++), dt);
  const Tensor f = to_dtype(uniform_tensor({k.oc, k.c / k.groups, k.kh, k.kw}, seed++, -0.5f, 0.5f), dt);
  const Tensor dy = to_dtype(uniform_tensor({k.n, k.oc, k.oh(), k.ow()}, seed++), dt);
  ConvRun r{conv_reference(k, x.to_floats(), f.to_floats(), dy.to_floats()), {}, {}};
  const auto attrs = with_layout(conv_attrs(k), "data_format", last);
  r.fwd = run_both({make_op("conv2d", {{"Input", {"x"}}, {"Filter", {"w"}}}, {{"Output", {"y"}}}, attrs),
                    {{"x", in_layout(x, last)}, {"w", f}}},
                   {"y"});
  results_channels_first(r.fwd, last, {"y"});
  r.bwd = run_both({make_op("conv2d_grad", {{"Input", {"x"}}, {"Filter", {"w"}}, {"Output@GRAD", {"dy"}}},
                            {{"Input@GRAD", {"dx"}}, {"Filter@GRAD", {"dw"}}}, attrs),
                    {{"x", in_layout(x, last)}, {"w", f}, {"dy", in_layout(dy, last)}}},
                   {"dx", "dw"});
  results_channels_first(r.bwd, last, {"dx"});
  return r;
}

}  // namespace

TEST_CASE("conv2d and conv2d_grad on cuDNN match the CPU and a double reference", "[cuda][conv2d]") {
  require_gpu();
  const DType dt = EACH_FLOAT_TYPE();
  disable_tf32();
  const ConvMode mode = GENERATE(ConvMode::heuristic, ConvMode::benchmark, ConvMode::graph, ConvMode::gemm);
  const ScopedSwitch timed(kCudnnBenchmark, mode == ConvMode::benchmark);
  const ScopedSwitch graph(kCudnnGraphConv, mode == ConvMode::graph);
  const ScopedSwitch gemm(kCublas1x1Conv, mode == ConvMode::gemm);
  uint64_t seed = 100;
  // The graph API falls back to the legacy calls, which meet the same bounds,
  // for a shape it has no plan for: count the passes it ran itself.
  uint64_t graph_passes = 0, passes = 0;
  for (const ConvCfg& k : kConvCases) {
    for (bool last : kLayouts) {
      const std::string what = std::string("conv2d ") + k.name + " " + dname(dt) + layout_name(last) + mode_name(mode);
      INFO(what);
      const uint64_t graph_passes_before = graph_api_passes();
      const ConvRun run = run_conv_case(k, dt, last, seed);
      const ConvRef& ref = run.ref;
      const Both &fwd = run.fwd, &bwd = run.bwd;
      const int64_t out_plane = k.oh() * k.ow(), in_plane = k.h * k.w;
      expect_within(fwd.cpu.at("y"), ref.out.value, gemm_bound(ref.out, dt), what + " forward (CPU)");
      expect_within(fwd.gpu.at("y"), ref.out.value, conv_bound(ref.out, out_plane, dt), what + " forward (GPU)");
      expect_within(bwd.cpu.at("dx"), ref.dx.value, gemm_bound(ref.dx, dt), what + " Input@GRAD (CPU)");
      expect_within(bwd.gpu.at("dx"), ref.dx.value, conv_bound(ref.dx, in_plane, dt), what + " Input@GRAD (GPU)");
      // dFilter sums over the whole batch: its "plane" is the whole tensor.
      const int64_t dw_all = static_cast<int64_t>(ref.dw.value.size());
      expect_within(bwd.cpu.at("dw"), ref.dw.value, gemm_bound(ref.dw, dt), what + " Filter@GRAD (CPU)");
      expect_within(bwd.gpu.at("dw"), ref.dw.value, conv_bound(ref.dw, dw_all, dt), what + " Filter@GRAD (GPU)");
      const uint64_t on_graph = graph_api_passes() - graph_passes_before;
      graph_passes += on_graph;
      passes += 3;
      // The shape --cudnn-graph-conv is for (ResNet-50 AMP's 3x3 layers:
      // FP16, channels last, tensor-core channel counts) must run all three
      // passes on the graph API; other shapes may fall back.
      if (on_real_gpu() && mode == ConvMode::graph && dt == DType::f16 && last && k.c % 8 == 0 && k.oc % 8 == 0 &&
          k.kh == 3 && k.kw == 3 && k.groups == 1 && k.dil == 1)
        CHECK(on_graph == 3);
    }
  }
  if (mode == ConvMode::graph) {
    std::printf("conv2d %s graph API: %llu of %llu passes on the graph API, the rest on the legacy calls\n",
                dname(dt).c_str(), static_cast<unsigned long long>(graph_passes),
                static_cast<unsigned long long>(passes));
    if (on_real_gpu()) CHECK(graph_passes > 0);
  } else {
    CHECK(graph_passes == 0);  // the flag off: the legacy calls (or cuBLAS) only
  }
}

TEST_CASE("conv2d_grad on cuDNN with only the filter gradient (the first layer)", "[cuda][conv2d]") {
  require_gpu();
  const DType dt = EACH_FLOAT_TYPE();
  disable_tf32();
  // The stem under --cudnn-graph-conv takes this path too.
  const ConvMode mode = GENERATE(ConvMode::heuristic, ConvMode::graph);
  const ScopedSwitch graph(kCudnnGraphConv, mode == ConvMode::graph);
  const ConvCfg k = kConvCases[0];
  for (bool last : kLayouts) {
    const uint64_t graph_passes_before = graph_api_passes();
    const Tensor x = to_dtype(uniform_tensor({k.n, k.c, k.h, k.w}, 7), dt);
    const Tensor f = to_dtype(uniform_tensor({k.oc, k.c, k.kh, k.kw}, 8, -0.5f, 0.5f), dt);
    const Tensor dy = to_dtype(uniform_tensor({k.n, k.oc, k.oh(), k.ow()}, 9), dt);
    const ConvRef ref = conv_reference(k, x.to_floats(), f.to_floats(), dy.to_floats());
    const Both b = run_both({make_op("conv2d_grad", {{"Input", {"x"}}, {"Filter", {"w"}}, {"Output@GRAD", {"dy"}}},
                                     {{"Filter@GRAD", {"dw"}}}, with_layout(conv_attrs(k), "data_format", last)),
                             {{"x", in_layout(x, last)}, {"w", f}, {"dy", in_layout(dy, last)}}},
                            {"dw"});
    expect_within(b.gpu.at("dw"), ref.dw.value, conv_bound(ref.dw, static_cast<int64_t>(ref.dw.value.size()), dt),
                  "conv2d_grad filter only " + dname(dt) + layout_name(last) + mode_name(mode));
    // Case 0 is an FP16 channels-last 3x3 shape the graph API runs (the test above).
    if (on_real_gpu() && mode == ConvMode::graph && dt == DType::f16 && last)
      CHECK(graph_api_passes() - graph_passes_before == 1);
  }
}

// --allow-tf32 (off by default, and off for every other case here): FP32
// convolutions may take TF32 tensor-core algorithms (CUDNN_TENSOR_OP_MATH;
// the graph API's engines with TF32 notes; cuBLAS's FAST_TF32 compute type
// for pointwise ones). Whichever runs, the results stay within TF32's bound.
// How far they came from the strict bound is printed: whether the libraries
// took TF32 at all is theirs to choose, so it is reported, not required.
TEST_CASE("conv2d and conv2d_grad in FP32 under --allow-tf32 stay within TF32's bounds", "[cuda][conv2d][tf32]") {
  require_gpu();
  const ConvMode mode = GENERATE(ConvMode::heuristic, ConvMode::graph, ConvMode::gemm);
  const ScopedSwitch tf32(kAllowTf32, true);
  const ScopedSwitch graph(kCudnnGraphConv, mode == ConvMode::graph);
  const ScopedSwitch gemm(kCublas1x1Conv, mode == ConvMode::gemm);
  // The largest |GPU - reference| / strict bound over all results: above 1,
  // some pass ran in TF32 (or the strict bound is too tight for it).
  double worst_strict = 0;
  uint64_t seed = 300;
  for (const char* name :
       {"3x3 pad 1", "1x1", "1x1 stride 2", "7x7 stride 2 pad 3 (stem)", "3x3 64 channels (tensor-core sizes)"}) {
    const ConvCfg* found = nullptr;
    for (const ConvCfg& c : kConvCases)
      if (std::string(c.name) == name) found = &c;
    REQUIRE(found);
    const ConvCfg& k = *found;
    for (bool last : kLayouts) {
      const std::string what = std::string("conv2d ") + k.name + " f32 TF32" + layout_name(last) + mode_name(mode);
      INFO(what);
      const ConvRun run = run_conv_case(k, DType::f32, last, seed);
      const ConvRef& ref = run.ref;
      const Both &fwd = run.fwd, &bwd = run.bwd;
      const int64_t dw_all = static_cast<int64_t>(ref.dw.value.size());
      const std::tuple<const Tensor*, const SumRef*, int64_t, const char*> results[] = {
          {&fwd.gpu.at("y"), &ref.out, k.oh() * k.ow(), " forward"},
          {&bwd.gpu.at("dx"), &ref.dx, k.h * k.w, " Input@GRAD"},
          {&bwd.gpu.at("dw"), &ref.dw, dw_all, " Filter@GRAD"}};
      for (const auto& [gpu, r, plane, pass] : results) {
        expect_within(*gpu, r->value, tf32_conv_bound(*r, plane), what + pass + " (GPU)");
        const std::vector<float> got = gpu->to_floats();
        const auto strict = conv_bound(*r, plane, DType::f32);
        for (size_t i = 0; i < got.size(); ++i)
          worst_strict = std::max(worst_strict, std::fabs(got[i] - r->value[i]) / strict(static_cast<int64_t>(i)));
      }
      // The CPU has no TF32: its results stay within the strict FP32 bound.
      expect_within(fwd.cpu.at("y"), ref.out.value, gemm_bound(ref.out, DType::f32), what + " forward (CPU)");
    }
  }
  std::printf("conv2d f32 under --allow-tf32%s: largest error %.3g x the strict FP32 bound (above 1: TF32 ran)\n",
              mode_name(mode), worst_strict);
}

// The bounds above would pass whichever library ran; this checks that
// --cublas-1x1-conv really hands the pointwise case to cuBLAS, as the GEMMs
// written out here (runtime/ops/conv_gemm.h's formulation, restated): the
// same cuBLAS call gives the same bits. With a stride, the sampled pixels are
// gathered and scattered here by the CPU twins of the GPU's copies.
TEST_CASE(
    "cuBLAS 1x1 conv (--cublas-1x1-conv): a pointwise channels-last conv2d and its gradients are cuBLAS GEMMs, bit for "
    "bit",
    "[cuda][gpu_only][conv2d]") {
  require_gpu();
  disable_tf32();
#ifdef MIX_HAVE_CUDA
  const DType dt = EACH_FLOAT_TYPE();
  const ScopedSwitch gemm(kCublas1x1Conv, true);
  struct Case {
    int64_t n, h, w, c, oc, stride;
  };
  for (const Case k : {Case{3, 7, 6, 5, 11, 1}, Case{2, 9, 7, 8, 6, 2}}) {
    const int64_t oh = (k.h - 1) / k.stride + 1, ow = (k.w - 1) / k.stride + 1, pixels = k.n * oh * ow;
    const Tensor x = to_dtype(uniform_tensor({k.n, k.h, k.w, k.c}, 61), dt);
    const Tensor f = to_dtype(uniform_tensor({k.oc, k.c, 1, 1}, 62, -0.5f, 0.5f), dt);
    const Tensor dy = to_dtype(uniform_tensor({k.n, oh, ow, k.oc}, 63), dt);
    const auto attrs =
        with_layout(conv_attrs({"1x1", k.n, k.c, k.h, k.w, k.oc, 1, 1, k.stride, 0, 1, 1}), "data_format", true);
    const auto fwd = run_on(
        {make_op("conv2d", {{"Input", {"x"}}, {"Filter", {"w"}}}, {{"Output", {"y"}}}, attrs), {{"x", x}, {"w", f}}},
        kGpu, {"y"});
    // Input@GRAD fed nonzero, so the op writes over it in place (OpContext::out)
    // and a strided one must zero the pixels it does not sample itself: fresh
    // device memory is often zero already.
    const Tensor dx_before = to_dtype(uniform_tensor(x.shape(), 64), dt);
    const auto bwd = run_on({make_op("conv2d_grad", {{"Input", {"x"}}, {"Filter", {"w"}}, {"Output@GRAD", {"dy"}}},
                                     {{"Input@GRAD", {"dx"}}, {"Filter@GRAD", {"dw"}}}, attrs),
                             {{"x", x}, {"w", f}, {"dy", dy}, {"dx", dx_before}}},
                            kGpu, {"dx", "dw"});

    // The GEMMs' pixel matrix: x itself, or its sampled pixels (a [n, oh, ow, c] view).
    const int64_t view_dims[4] = {k.n, oh, ow, k.c};
    const int64_t view_strides[4] = {k.h * k.w * k.c, k.stride * k.w * k.c, k.stride * k.c, 1};
    const fn::TransposePlan view = fn::make_view_plan(view_dims, view_strides, 4);
    Tensor sampled = Tensor::empty({k.n, oh, ow, k.c}, dt);
    transpose_rules::gather_cpu(x.raw(), sampled.raw(), view, sampled.numel(), dtype_size(dt));
    const Tensor gx = sampled.to(kGpu), gf = f.to(kGpu), gdy = dy.to(kGpu);
    Tensor y = Tensor::empty({k.n, oh, ow, k.oc}, dt, kGpu), dxs = Tensor::empty(sampled.shape(), dt, kGpu),
           dw = Tensor::empty(f.shape(), dt, kGpu);
    cuda::DeviceContext& dc = cuda::use_device(kGpu.index);
    cuda::gemm(dc, false, true, pixels, k.oc, k.c, 1.f, gx.raw(), gf.raw(), 0.f, y.raw(), dt);      // Y = X W^T
    cuda::gemm(dc, false, false, pixels, k.c, k.oc, 1.f, gdy.raw(), gf.raw(), 0.f, dxs.raw(), dt);  // dX = dY W
    cuda::gemm(dc, true, false, k.oc, k.c, pixels, 1.f, gdy.raw(), gx.raw(), 0.f, dw.raw(), dt);    // dW = dY^T X
    Tensor dx = Tensor::zeros(x.shape(), dt);  // the pixels a stride skips get no gradient
    const Tensor dxs_host = dxs.to(cpu_device());
    transpose_rules::scatter_cpu(dxs_host.raw(), dx.raw(), view, dxs_host.numel(), dtype_size(dt));
    const std::string what = "1x1 stride " + std::to_string(k.stride) + " NHWC " + dname(dt);
    expect_identical(fwd.at("y"), y.to(cpu_device()), what + " forward");
    expect_identical(bwd.at("dx"), dx, what + " Input@GRAD");
    expect_identical(bwd.at("dw"), dw.to(cpu_device()), what + " Filter@GRAD");
  }
#endif
}

TEST_CASE("conv2d on cuDNN with no memory left for a workspace falls back to an algorithm that needs none",
          "[cuda][gpu_only][conv2d]") {
  require_gpu();
  disable_tf32();
  const ConvMode mode = GENERATE(ConvMode::heuristic, ConvMode::benchmark, ConvMode::graph);
  const ScopedSwitch timed(kCudnnBenchmark, mode == ConvMode::benchmark);
  const ScopedSwitch graph(kCudnnGraphConv, mode == ConvMode::graph);
  // A shape of its own, so that no algorithm or plan is cached for it yet (the
  // caches are per process); the same bounds as above hold for whichever runs.
  const ConvCfg k =
      mode == ConvMode::benchmark ? ConvCfg{"3x3 no workspace, benchmark", 3, 8, 13, 11, 24, 3, 3, 1, 1, 1, 1}
      : mode == ConvMode::graph   ? ConvCfg{"3x3 no workspace, graph API", 3, 8, 12, 13, 24, 3, 3, 1, 1, 1, 1}
                                  : ConvCfg{"3x3 no workspace", 3, 8, 11, 13, 24, 3, 3, 1, 1, 1, 1};
  const std::string what = std::string("conv2d ") + k.name;
  const Tensor x = uniform_tensor({k.n, k.c, k.h, k.w}, 41);
  const Tensor f = uniform_tensor({k.oc, k.c, k.kh, k.kw}, 42, -0.5f, 0.5f);
  const Tensor dy = uniform_tensor({k.n, k.oc, k.oh(), k.ow()}, 43);
  const ConvRef ref = conv_reference(k, x.to_floats(), f.to_floats(), dy.to_floats());

  Program p;
  for (auto& [name, t] : {std::pair<const char*, const Tensor&>{"x", x}, {"w", f}, {"dy", dy}})
    p.add_var(var_desc(name, t.shape(), t.dtype()));
  p.append_op(make_op("conv2d", {{"Input", {"x"}}, {"Filter", {"w"}}}, {{"Output", {"y"}}}, conv_attrs(k)));
  p.append_op(make_op("conv2d_grad", {{"Input", {"x"}}, {"Filter", {"w"}}, {"Output@GRAD", {"dy"}}},
                      {{"Input@GRAD", {"dx"}}, {"Filter@GRAD", {"dw"}}}, conv_attrs(k)));
  // Inputs and outputs on the GPU before the limit (the ops write into
  // outputs that already have their shape), so the only memory the ops ask
  // for is the algorithms' workspaces.
  Scope scope;
  scope.set("x", x.to(kGpu));
  scope.set("w", f.to(kGpu));
  scope.set("dy", dy.to(kGpu));
  scope.set("y", Tensor::empty({k.n, k.oc, k.oh(), k.ow()}, DType::f32, kGpu));
  scope.set("dx", Tensor::empty(x.shape(), DType::f32, kGpu));
  scope.set("dw", Tensor::empty(f.shape(), DType::f32, kGpu));
  ExecEnv env;
  env.device = kGpu;
  const std::set<std::string> keep = {"x", "w", "dy", "y", "dx", "dw"};
  // First with memory to spare: cuDNN's choices for this shape are cached.
  Executor(p, keep).run(scope, env);
  // Then with none for any workspace: a cached choice that needs one is made
  // again among the algorithms that need none. Whether cuDNN's first choices
  // needed a workspace depends on the GPU; the log says how many were skipped.
  std::ostringstream log;
  const auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  try {
    [[maybe_unused]] const NoMoreDeviceMemory none_left;
    Executor(p, keep).run(scope, env);
  } catch (...) {
    spdlog::default_logger()->sinks().pop_back();
    throw;
  }
  spdlog::default_logger()->sinks().pop_back();
  size_t skipped = 0;
  for (size_t at = log.str().find("skipping cuDNN"); at != std::string::npos;
       at = log.str().find("skipping cuDNN", at + 1))
    ++skipped;
  WARN(what << ": " << skipped << " cuDNN algorithm(s) skipped for want of workspace memory");
  const int64_t out_plane = k.oh() * k.ow(), in_plane = k.h * k.w;
  expect_within(scope.get("y").to(cpu_device()), ref.out.value, conv_bound(ref.out, out_plane, DType::f32),
                what + " forward");
  expect_within(scope.get("dx").to(cpu_device()), ref.dx.value, conv_bound(ref.dx, in_plane, DType::f32),
                what + " Input@GRAD");
  expect_within(scope.get("dw").to(cpu_device()), ref.dw.value,
                conv_bound(ref.dw, static_cast<int64_t>(ref.dw.value.size()), DType::f32), what + " Filter@GRAD");
}

// ---- batch_norm ---------------------------------------------------------------------------

namespace {

struct BnInputs {
  Tensor x, scale, bias, mean, var, tracked;
};

BnInputs bn_inputs(const Shape& s, DType dt, uint64_t seed) {
  const int64_t c = s[1];
  // X off-centre (mean ~0.5) as real activations are; FP16 X holds exactly the values the reference uses.
  return {to_dtype(uniform_tensor(s, seed, -2.f, 3.f), dt),
          uniform_tensor({c}, seed + 1, 0.5f, 1.5f),
          uniform_tensor({c}, seed + 2),
          uniform_tensor({c}, seed + 3),
          uniform_tensor({c}, seed + 4, 0.5f, 2.f),
          mix::testing::i64_tensor({}, {7})};
}

// Per-channel statistics of X in double: mean, biased variance, E[x^2], mean |x|.
struct BnStats {
  std::vector<double> mean, var, sq, abs_mean;
  int64_t m = 0, spatial = 0;
};
BnStats bn_stats(const Tensor& x) {
  const Shape& s = x.shape();
  const int64_t n = s[0], c = s[1];
  BnStats st;
  st.spatial = 1;
  for (size_t i = 2; i < s.size(); ++i) st.spatial *= s[i];
  st.m = n * st.spatial;
  const std::vector<float> v = x.to_floats();
  st.mean.assign(static_cast<size_t>(c), 0.0);
  st.var = st.sq = st.abs_mean = st.mean;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < st.spatial; ++i) {
        const double e = v[static_cast<size_t>((b * c + ch) * st.spatial + i)];
        st.mean[static_cast<size_t>(ch)] += e;
        st.sq[static_cast<size_t>(ch)] += e * e;
        st.abs_mean[static_cast<size_t>(ch)] += std::fabs(e);
      }
  for (size_t ch = 0; ch < st.mean.size(); ++ch) {
    st.mean[ch] /= static_cast<double>(st.m);
    st.sq[ch] /= static_cast<double>(st.m);
    st.abs_mean[ch] /= static_cast<double>(st.m);
  }
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < st.spatial; ++i) {
        const double e = v[static_cast<size_t>((b * c + ch) * st.spatial + i)] - st.mean[static_cast<size_t>(ch)];
        st.var[static_cast<size_t>(ch)] += e * e;
      }
  for (double& q : st.var) q /= static_cast<double>(st.m);
  return st;
}

int64_t channel_of(int64_t i, int64_t c, int64_t spatial) { return (i / spatial) % c; }

// X's shapes of the batch_norm cases. Channels last with fuse_with_relu
// (mixtrain's kernels; their split: runtime/kernels/bn_channel_sums.h):
// [8, 72, 9, 9] reads 16-byte packs (9 groups of 8 FP16 channels, 18 of 4
// FP32, in one partly idle tile) over 3 or 6 chunks of rows; [2, 512, 3, 3] packs
// over 2 or 4 full tiles of 32 groups; [8, 6, 11, 11] one channel a thread
// over 2 chunks; the first two shapes one channel a thread in one chunk.
const Shape kBnShapes[] = {{4, 6, 5, 7}, {16, 5}, {8, 72, 9, 9}, {2, 512, 3, 3}, {8, 6, 11, 11}};

// fuse_with_relu's cases (runtime/passes/fuse_bn_relu.h): channels last they run
// mixtrain's own kernels (batch_norm_channels_last.cu), NCHW cuDNN and a
// separate relu; Fusion::none runs the own kernels too channels last. The bounds hold with relu applied to the
// reference, since |relu(a) - relu(b)| <= |a - b|. The forward's also take a residual Z added before the relu: Y =
// relu(round(batch_norm(X)) + Z), whose bound adds the second rounding's (the first is batch_norm's own store).
enum class Fusion { none, relu, residual_relu };
std::string fused_name(Fusion f) {
  return f == Fusion::none ? "" : f == Fusion::relu ? " fuse_with_relu" : " fuse_with_relu + Z";
}
std::string fused_name(bool fused) { return fused_name(fused ? Fusion::relu : Fusion::none); }
double relu_if(bool fused, double v) { return fused && !(v > 0) ? 0.0 : v; }
// The forward op's fusion: attr and, for a residual, Z ("z": `z`, in the op's layout) among its feeds.
void apply_fusion(OneOp& op, Fusion f, const Tensor& z, bool channels_last) {
  if (f == Fusion::none) return;
  op.op.attrs["fuse_with_relu"] = true;
  if (f != Fusion::residual_relu) return;
  op.op.inputs["Z"] = {"z"};
  op.feeds.push_back({"z", in_layout(z, channels_last)});
}
// Y's reference from the value before relu (and Z), and the error bound
// `pre_bound` of that value (its own store included) widened for the residual's
// add, rounded once more on store.
double fused_ref(Fusion f, double pre, double z) {
  return f == Fusion::residual_relu ? relu_if(true, pre + z) : relu_if(f == Fusion::relu, pre);
}
double fused_bound(Fusion f, DType dt, double pre_bound, double pre, double z) {  // pre: the value before relu
  return f == Fusion::residual_relu ? pre_bound + store_err(dt, pre + z) : pre_bound;
}

constexpr float kEps = 1e-5f;
constexpr float kMomentum = 0.9f;  // Paddle's convention: running = 0.9 running + 0.1 batch

OpDesc bn_op(const std::string& mean_out, const std::string& var_out, bool channels_last) {
  return make_op("batch_norm",
                 {{"X", {"x"}},
                  {"Scale", {"scale"}},
                  {"Bias", {"bias"}},
                  {"Mean", {"mean"}},
                  {"Variance", {"var"}},
                  {"NumBatchesTracked", {"tracked"}}},
                 {{"Y", {"y"}},
                  {"MeanOut", {mean_out}},
                  {"VarianceOut", {var_out}},
                  {"SavedMean", {"saved_mean"}},
                  {"SavedVariance", {"saved_inv_std"}},
                  {"NumBatchesTrackedOut", {"tracked"}}},
                 with_layout({{"momentum", static_cast<double>(kMomentum)}, {"epsilon", static_cast<double>(kEps)}},
                             "data_layout", channels_last));
}

// The forward's feeds, X in the op's layout.
std::vector<std::pair<std::string, Tensor>> bn_feeds(const BnInputs& in, bool channels_last) {
  return {{"x", in_layout(in.x, channels_last)},
          {"scale", in.scale},
          {"bias", in.bias},
          {"mean", in.mean},
          {"var", in.var},
          {"tracked", in.tracked}};
}

}  // namespace

TEST_CASE("batch_norm training forward on cuDNN matches the CPU and a double reference", "[cuda][batch_norm]") {
  require_gpu();
  const DType dt = EACH_FLOAT_TYPE();
  const bool persistent = GENERATE(false, true);
  const Fusion fusion = GENERATE(Fusion::none, Fusion::relu, Fusion::residual_relu);
  const ScopedSwitch mode(kBatchNormPersistent, persistent);  // same bounds: they allow any order of FP32 sums
  for (const Shape& s : kBnShapes) {
    // MeanOut/VarianceOut as the running statistics themselves (ResNet) and as other variables.
    for (bool in_place : {true, false})
      for (bool last : kLayouts) {
        const std::string what = "batch_norm " + mix::shape_str(s) + " " + dname(dt) + (in_place ? " in place" : "") +
                                 layout_name(last) + mode_name(persistent) + fused_name(fusion);
        INFO(what);
        const BnInputs in = bn_inputs(s, dt, 40);
        const std::string mean_out = in_place ? "mean" : "mean_out", var_out = in_place ? "var" : "var_out";
        OneOp op{bn_op(mean_out, var_out, last), bn_feeds(in, last)};
        const Tensor z = to_dtype(uniform_tensor(s, 45, -2.f, 2.f), dt);
        apply_fusion(op, fusion, z, last);
        const std::vector<float> zv = z.to_floats();
        Both b = run_both(op, {"y", mean_out, var_out, "saved_mean", "saved_inv_std", "tracked"});
        results_channels_first(b, last, {"y"});

        const BnStats st = bn_stats(in.x);
        const int64_t c = s[1], m = st.m;
        const std::vector<float> xv = in.x.to_floats(), scale = in.scale.to_floats(), bias = in.bias.to_floats(),
                                 rmean = in.mean.to_floats(), rvar = in.var.to_floats();
        std::vector<double> inv(static_cast<size_t>(c)), mean_ref(inv.size()), var_ref(inv.size());
        std::vector<double> tol_mean(inv.size()), tol_var(inv.size()), tol_inv(inv.size());
        const double mom = kMomentum, unbias = static_cast<double>(m) / static_cast<double>(m - 1);
        for (size_t ch = 0; ch < inv.size(); ++ch) {
          inv[ch] = 1.0 / std::sqrt(st.var[ch] + static_cast<double>(kEps));
          mean_ref[ch] = mom * rmean[ch] + (1 - mom) * st.mean[ch];
          var_ref[ch] = mom * rvar[ch] + (1 - mom) * st.var[ch] * unbias;
          // The mean: m values summed in FP32 in some order, then divided by m.
          tol_mean[ch] = static_cast<double>(m + 2) * kU * st.abs_mean[ch];
          // The variance as E[x^2] - mean^2 or in two passes / Welford: either
          // within 2(m + 2)·u·E[x^2] (the squares are summed like the mean);
          // doubled for the CPU's double sums being rounded to float only once.
          tol_var[ch] = 4.0 * static_cast<double>(m + 4) * kU * st.sq[ch];
          // 1/sqrt(v + eps): its derivative inv^3 / 2 times the variance's error,
          // plus a few ulps of rsqrt (CUDA's rsqrtf is within 2 ulp).
          tol_inv[ch] = 0.5 * inv[ch] * inv[ch] * inv[ch] * tol_var[ch] + 4 * kU * inv[ch];
        }
        expect_both_within(
            b, "saved_mean", st.mean, [&](int64_t ch) { return tol_mean[static_cast<size_t>(ch)]; },
            what + " SavedMean");
        expect_both_within(
            b, "saved_inv_std", inv, [&](int64_t ch) { return tol_inv[static_cast<size_t>(ch)]; },
            what + " SavedVariance (1/std)");
        // The running statistics: the batch statistics' error times (1 - momentum),
        // plus the update's own roundings (a few ulps of its two terms).
        expect_both_within(
            b, mean_out, mean_ref,
            [&](int64_t ch) {
              const size_t k = static_cast<size_t>(ch);
              return (1 - mom) * tol_mean[k] + 4 * kU * (std::fabs(mom * rmean[k]) + std::fabs((1 - mom) * st.mean[k]));
            },
            what + " MeanOut");
        expect_both_within(
            b, var_out, var_ref,
            [&](int64_t ch) {
              const size_t k = static_cast<size_t>(ch);
              return (1 - mom) * unbias * tol_var[k] +
                     4 * kU * (std::fabs(mom * rvar[k]) + (1 - mom) * st.var[k] * unbias);
            },
            what + " VarianceOut (unbiased batch variance)");
        // Y = (x - mean)·inv·scale + bias: the statistics' errors carried through,
        // a few roundings of the affine map, and FP16's store.
        std::vector<double> y_ref(xv.size()), y_pre(xv.size());  // y_pre: before relu
        for (size_t i = 0; i < xv.size(); ++i) {
          const size_t ch = static_cast<size_t>(channel_of(static_cast<int64_t>(i), c, st.spatial));
          y_pre[i] = (xv[i] - st.mean[ch]) * inv[ch] * scale[ch] + bias[ch];
          y_ref[i] = fused_ref(fusion, y_pre[i], zv[i]);
        }
        expect_both_within(
            b, "y", y_ref,
            [&](int64_t i) {
              const size_t k = static_cast<size_t>(i), ch = static_cast<size_t>(channel_of(i, c, st.spatial));
              const double centred = std::fabs(xv[k] - st.mean[ch]);
              const double pre_bound = std::fabs(scale[ch]) * (inv[ch] * tol_mean[ch] + centred * tol_inv[ch]) +
                                       6 * kU * (centred * inv[ch] * std::fabs(scale[ch]) + std::fabs(bias[ch])) +
                                       store_err(dt, y_pre[k]);
              return fused_bound(fusion, dt, pre_bound, y_pre[k], zv[k]);
            },
            what + " Y");
        // The counter: one integer increment, exact.
        for (const auto* side : {&b.cpu, &b.gpu}) CHECK(side->at("tracked").data<int64_t>()[0] == 8);
      }
  }
}

TEST_CASE("batch_norm evaluation forward on cuDNN uses the running statistics", "[cuda][batch_norm]") {
  require_gpu();
  const DType dt = EACH_FLOAT_TYPE();
  const Fusion fusion = GENERATE(Fusion::none, Fusion::relu, Fusion::residual_relu);
  // --cudnn-bn-persistent sends channels-last batch norms without a fused relu
  // to cuDNN's NHWC inference call; 16 channels take the own kernels' packed
  // path (8 FP16 channels a load), as every batch norm of an AMP ResNet does.
  const bool persistent = GENERATE(false, true);
  const ScopedSwitch mode(kBatchNormPersistent, persistent);
  const Shape s = GENERATE(Shape{3, 5, 4, 6}, Shape{2, 16, 3, 5});
  for (bool via_attr : {false, true})  // ExecEnv::training false, or attr is_test
    for (bool last : kLayouts) {
      const std::string what = "batch_norm eval " + mix::shape_str(s) + " " + dname(dt) +
                               (via_attr ? " (is_test)" : " (env)") + layout_name(last) + mode_name(persistent) +
                               fused_name(fusion);
      INFO(what);
      const BnInputs in = bn_inputs(s, dt, 60);
      OneOp op{bn_op("mean", "var", last), bn_feeds(in, last)};
      if (via_attr) op.op.attrs["is_test"] = true;
      const Tensor z = to_dtype(uniform_tensor(s, 65, -2.f, 2.f), dt);
      apply_fusion(op, fusion, z, last);
      const std::vector<float> zv = z.to_floats();
      op.training = via_attr;  // is_test alone must switch a training run to evaluation
      Both b = run_both(op, {"y", "mean", "var", "tracked"});
      results_channels_first(b, last, {"y"});
      const std::vector<float> xv = in.x.to_floats(), scale = in.scale.to_floats(), bias = in.bias.to_floats(),
                               rmean = in.mean.to_floats(), rvar = in.var.to_floats();
      const int64_t c = s[1], spatial = s[2] * s[3];
      std::vector<double> y_ref(xv.size()), y_pre(xv.size());  // y_pre: before relu
      for (size_t i = 0; i < xv.size(); ++i) {
        const size_t ch = static_cast<size_t>(channel_of(static_cast<int64_t>(i), c, spatial));
        y_pre[i] = (xv[i] - rmean[ch]) / std::sqrt(static_cast<double>(rvar[ch]) + kEps) * scale[ch] + bias[ch];
        y_ref[i] = fused_ref(fusion, y_pre[i], zv[i]);
      }
      // No reductions: 1/sqrt within a few ulps and a few roundings of the affine map, then FP16's store.
      expect_both_within(
          b, "y", y_ref,
          [&](int64_t i) {
            const size_t k = static_cast<size_t>(i), ch = static_cast<size_t>(channel_of(i, c, spatial));
            const double k_scale = std::fabs(scale[ch]) / std::sqrt(static_cast<double>(rvar[ch]) + kEps);
            const double pre_bound =
                10 * kU * (std::fabs(xv[k] - rmean[ch]) * k_scale + std::fabs(bias[ch])) + store_err(dt, y_pre[k]);
            return fused_bound(fusion, dt, pre_bound, y_pre[k], zv[k]);
          },
          what + " Y");
      // Evaluation updates nothing: the running statistics and the counter come back bit for bit.
      for (const auto* side : {&b.cpu, &b.gpu}) {
        CHECK(side->at("mean").to_floats() == rmean);
        CHECK(side->at("var").to_floats() == rvar);
        CHECK(side->at("tracked").data<int64_t>()[0] == 7);
      }
    }
}

TEST_CASE("batch_norm_grad on cuDNN matches the CPU and a double reference", "[cuda][batch_norm]") {
  require_gpu();
  const DType dt = EACH_FLOAT_TYPE();
  const bool persistent = GENERATE(false, true);
  const bool fused = GENERATE(false, true);
  const ScopedSwitch mode(kBatchNormPersistent, persistent);  // same bounds: they allow any order of FP32 sums
  for (const Shape& s : kBnShapes) {
    for (bool last : kLayouts) {
      const std::string what = "batch_norm_grad " + mix::shape_str(s) + " " + dname(dt) + layout_name(last) +
                               mode_name(persistent) + fused_name(fused);
      INFO(what);
      const BnInputs in = bn_inputs(s, dt, 80);
      Tensor dy = to_dtype(uniform_tensor(s, 85), dt);
      const BnStats st = bn_stats(in.x);
      const int64_t c = s[1], m = st.m;
      // The forward's saved statistics, as FP32 values both devices read.
      std::vector<float> saved_mean(static_cast<size_t>(c)), saved_inv(static_cast<size_t>(c));
      for (size_t ch = 0; ch < saved_mean.size(); ++ch) {
        saved_mean[ch] = static_cast<float>(st.mean[ch]);
        saved_inv[ch] = static_cast<float>(1.0 / std::sqrt(st.var[ch] + static_cast<double>(kEps)));
      }
      // fuse_with_relu: Y@GRAD is relu's output gradient, and relu's mask
      // comes from X (own kernels, the CPU) or from Y (NCHW on cuDNN). Y is
      // the forward's, computed here with the CPU's functor. Where the value
      // before relu is within 1e-5 of 0, the GPU's rounding (an FMA) may put
      // it on the other side: dy is 0 there, so the mask cannot matter.
      const std::vector<float> xv = in.x.to_floats(), scale = in.scale.to_floats(), bias = in.bias.to_floats();
      std::vector<float> dy_raw = dy.to_floats(), dyv = dy_raw, y_fwd(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) {
        const size_t ch = static_cast<size_t>(channel_of(static_cast<int64_t>(i), c, st.spatial));
        y_fwd[i] = fn::BnNormalizeAct{{saved_mean[ch], saved_inv[ch] * scale[ch], bias[ch]}, true}(xv[i]);
        const double before_relu = (xv[i] - static_cast<double>(saved_mean[ch])) * saved_inv[ch] * scale[ch] + bias[ch];
        if (!fused) continue;
        if (std::fabs(before_relu) <= 1e-5) dy_raw[i] = 0.f;
        if (before_relu < 0 || std::fabs(before_relu) <= 1e-5) dyv[i] = 0.f;
      }
      if (fused) dy = to_dtype(Tensor::from_floats(s, dy_raw), dt);  // exact: dy_raw holds dy's values
      OneOp op{
          make_op("batch_norm_grad",
                  {{"X", {"x"}},
                   {"Scale", {"scale"}},
                   {"SavedMean", {"saved_mean"}},
                   {"SavedVariance", {"saved_inv_std"}},
                   {"Y@GRAD", {"dy"}}},
                  {{"X@GRAD", {"dx"}}, {"Scale@GRAD", {"dscale"}}, {"Bias@GRAD", {"dbias"}}},
                  with_layout({{"momentum", static_cast<double>(kMomentum)}, {"epsilon", static_cast<double>(kEps)}},
                              "data_layout", last)),
          {{"x", in_layout(in.x, last)},
           {"scale", in.scale},
           {"saved_mean", Tensor::from_floats({c}, saved_mean)},
           {"saved_inv_std", Tensor::from_floats({c}, saved_inv)},
           {"dy", in_layout(dy, last)}}};
      if (fused) {
        op.op.inputs["Bias"] = {"bias"};
        op.op.inputs["Y"] = {"y"};
        op.op.attrs["fuse_with_relu"] = true;
        op.feeds.push_back({"bias", in.bias});
        op.feeds.push_back({"y", in_layout(to_dtype(Tensor::from_floats(s, y_fwd), dt), last)});
      }
      Both b = run_both(op, {"dx", "dscale", "dbias"});
      results_channels_first(b, last, {"dx"});
      if (fused) {  // not vacuous: the mask blocked some gradients and passed others
        CHECK(std::count(dyv.begin(), dyv.end(), 0.f) > 0);
        CHECK(std::count(dyv.begin(), dyv.end(), 0.f) < static_cast<long>(dyv.size()));
      }

      std::vector<double> xhat(xv.size()), sum_dy(static_cast<size_t>(c), 0.0), sum_dy_xhat(sum_dy), abs_dy(sum_dy),
          abs_dy_xhat(sum_dy);
      for (size_t i = 0; i < xv.size(); ++i) {
        const size_t ch = static_cast<size_t>(channel_of(static_cast<int64_t>(i), c, st.spatial));
        xhat[i] = (xv[i] - static_cast<double>(saved_mean[ch])) * saved_inv[ch];
        sum_dy[ch] += dyv[i];
        sum_dy_xhat[ch] += dyv[i] * xhat[i];
        abs_dy[ch] += std::fabs(dyv[i]);
        abs_dy_xhat[ch] += std::fabs(dyv[i] * xhat[i]);
      }
      // The parameter gradients: sums of m terms in FP32 (xhat itself a few roundings: +4).
      expect_both_within(
          b, "dbias", sum_dy,
          [&](int64_t ch) { return static_cast<double>(m + 2) * kU * abs_dy[static_cast<size_t>(ch)]; },
          what + " Bias@GRAD");
      expect_both_within(
          b, "dscale", sum_dy_xhat,
          [&](int64_t ch) { return static_cast<double>(m + 6) * kU * abs_dy_xhat[static_cast<size_t>(ch)]; },
          what + " Scale@GRAD");
      // dX = k (dy - mean(dy) - xhat·mean(dy·xhat)), k = scale·inv: the two means'
      // errors (sums of m terms over m) carried through, a few roundings of the
      // combination, then FP16's store. Never relative to |dX|: the bracket cancels.
      std::vector<double> dx_ref(xv.size());
      auto parts = [&](size_t i) {
        const size_t ch = static_cast<size_t>(channel_of(static_cast<int64_t>(i), c, st.spatial));
        const double md = sum_dy[ch] / static_cast<double>(m), mdx = sum_dy_xhat[ch] / static_cast<double>(m);
        return std::make_tuple(ch, md, mdx, static_cast<double>(scale[ch]) * saved_inv[ch]);
      };
      for (size_t i = 0; i < xv.size(); ++i) {
        const auto [ch, md, mdx, k] = parts(i);
        dx_ref[i] = k * (dyv[i] - md - xhat[i] * mdx);
      }
      expect_both_within(
          b, "dx", dx_ref,
          [&](int64_t i) {
            const size_t e = static_cast<size_t>(i);
            const auto [ch, md, mdx, k] = parts(e);
            const double mean_err = static_cast<double>(m + 2) * kU * abs_dy[ch] / static_cast<double>(m);
            const double mean_x_err = static_cast<double>(m + 6) * kU * abs_dy_xhat[ch] / static_cast<double>(m);
            return std::fabs(k) * (mean_err + std::fabs(xhat[e]) * mean_x_err +
                                   8 * kU * (std::fabs(dyv[e]) + std::fabs(md) + std::fabs(xhat[e] * mdx))) +
                   store_err(dt, dx_ref[e]);
          },
          what + " X@GRAD");
    }
  }
}

// ---- pool2d -------------------------------------------------------------------------------

namespace {

struct PoolCfg {
  const char* name;
  bool is_max, exclusive, global;
  int64_t k, stride, pad;
};

const PoolCfg kPoolCases[] = {
    {"max 3x3 stride 2 pad 1 (ResNet stem)", true, true, false, 3, 2, 1},
    {"max 2x2 stride 2", true, true, false, 2, 2, 0},
    {"avg 3x3 stride 1 pad 1 exclusive", false, true, false, 3, 1, 1},
    {"avg 3x3 stride 2 pad 1 inclusive", false, false, false, 3, 2, 1},
    {"avg 2x2 stride 2", false, true, false, 2, 2, 0},
    {"global avg (ResNet head)", false, true, true, 0, 1, 0},
    {"global max", true, true, true, 0, 1, 0},
};

std::map<std::string, Attr> pool_attrs(const PoolCfg& p) {
  std::map<std::string, Attr> a{{"pooling_type", std::string(p.is_max ? "max" : "avg")},
                                {"exclusive", p.exclusive},
                                {"global_pooling", p.global}};
  if (!p.global) {
    a["ksize"] = std::vector<int64_t>{p.k, p.k};
    a["strides"] = std::vector<int64_t>{p.stride, p.stride};
    a["paddings"] = std::vector<int64_t>{p.pad, p.pad};
  }
  return a;
}

// Distinct values k/64 (exact in FP16) in random order: no max-pool window holds a tie.
Tensor distinct_tensor(const Shape& shape, uint64_t seed) {
  const int64_t n = mix::shape_numel(shape);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i - n / 2) / 64.f;
  mix::Rng rng = mix::Rng::for_stream(seed, 3);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(rng.uniform() * static_cast<double>(i + 1)) % (i + 1)]);
  return Tensor::from_floats(shape, v);
}

// Forward and backward of pooling from the definition.
struct PoolRef {
  SumRef out, dx;
};
PoolRef pool_reference(const PoolCfg& p, const Shape& s, const std::vector<float>& x, const std::vector<float>& dy) {
  const int64_t nc = s[0] * s[1], h = s[2], w = s[3];
  const int64_t kh = p.global ? h : p.k, kw = p.global ? w : p.k, st = p.global ? 1 : p.stride,
                pad = p.global ? 0 : p.pad;
  const int64_t oh = (h + 2 * pad - kh) / st + 1, ow = (w + 2 * pad - kw) / st + 1;
  PoolRef r{SumRef(nc * oh * ow), SumRef(nc * h * w)};
  for (int64_t q = 0; q < nc; ++q)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        const int64_t oi = (q * oh + oy) * ow + ox;
        const int64_t y0 = std::max<int64_t>(oy * st - pad, 0), y1 = std::min(oy * st - pad + kh, h);
        const int64_t x0 = std::max<int64_t>(ox * st - pad, 0), x1 = std::min(ox * st - pad + kw, w);
        const double g = dy[static_cast<size_t>(oi)];
        if (p.is_max) {
          int64_t best = -1;
          for (int64_t y = y0; y < y1; ++y)
            for (int64_t xx = x0; xx < x1; ++xx) {
              const int64_t i = (q * h + y) * w + xx;
              if (best < 0 || x[static_cast<size_t>(i)] > x[static_cast<size_t>(best)]) best = i;
            }
          r.out.add(oi, x[static_cast<size_t>(best)]);
          r.dx.add(best, g);
        } else {
          const double count = p.exclusive ? static_cast<double>((y1 - y0) * (x1 - x0)) : static_cast<double>(kh * kw);
          for (int64_t y = y0; y < y1; ++y)
            for (int64_t xx = x0; xx < x1; ++xx) {
              const int64_t i = (q * h + y) * w + xx;
              r.out.add(oi, x[static_cast<size_t>(i)] / count);
              r.dx.add(i, g / count);
            }
        }
      }
  return r;
}

}  // namespace

TEST_CASE("pool2d and pool2d_grad on cuDNN match the CPU and a double reference", "[cuda][pool2d]") {
  require_gpu();
  const Shape s{2, 3, 9, 11};
  for (const PoolCfg& p : kPoolCases) {
    for (DType dt : kPoolTypes)
      for (bool last : kLayouts) {
        const std::string what = std::string("pool2d ") + p.name + " " + dname(dt) + layout_name(last);
        INFO(what);
        const auto attrs = with_layout(pool_attrs(p), "data_format", last);
        const Tensor x = to_dtype(p.is_max ? distinct_tensor(s, 21) : uniform_tensor(s, 21), dt);
        Both fwd =
            run_both({make_op("pool2d", {{"X", {"x"}}}, {{"Out", {"y"}}}, attrs), {{"x", in_layout(x, last)}}}, {"y"});
        results_channels_first(fwd, last, {"y"});
        const Shape out_shape = fwd.cpu.at("y").shape();
        const Tensor dy = to_dtype(uniform_tensor(out_shape, 22), dt);
        const PoolRef ref = pool_reference(p, s, x.to_floats(), dy.to_floats());
        if (p.is_max) {
          // A selection: nothing rounds, so the maxima come back exactly.
          expect_both_within(
              fwd, "y", ref.out.value, [](int64_t) { return 0.0; }, what + " forward");
        } else {
          // The window's sum in FP32 over its count: (count + 2)·u·sum|x/count|, then FP16's store.
          expect_both_within(
              fwd, "y", ref.out.value,
              [&](int64_t i) { return ref.out.acc_err(i) + store_err(dt, ref.out.value[static_cast<size_t>(i)]); },
              what + " forward");
        }
        Both bwd = run_both({make_op("pool2d_grad", {{"X", {"x"}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dx"}}}, attrs),
                             {{"x", in_layout(x, last)}, {"dy", in_layout(dy, last)}}},
                            {"dx"});
        results_channels_first(bwd, last, {"dx"});
        // Each input adds the shares of the windows that route to it (overlapping
        // windows: a few terms) in FP32, then FP16's store.
        expect_both_within(
            bwd, "dx", ref.dx.value,
            [&](int64_t i) { return ref.dx.acc_err(i) + store_err(dt, ref.dx.value[static_cast<size_t>(i)]); },
            what + " X@GRAD");
      }
  }
}
