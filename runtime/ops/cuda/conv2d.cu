// conv2d and conv2d_grad on CUDA: the slots, attributes and shapes of
// runtime/ops/conv2d.cc (conv_dims in runtime/ops/conv_shapes.h), each
// product one cuDNN call (or one cuBLAS GEMM, below); groups and dilation go
// through the convolution descriptor.
//
// Each pass takes the first of three paths that applies:
//   1. --cublas-1x1-conv (off by default): a pointwise channels-last
//      convolution as one cuBLAS GEMM (below);
//   2. cuDNN's graph API with a plan cached per shape
//      (runtime/cuda/cudnn_conv_graph.h): mixtrain's default, unless
//      --no-cudnn-graph-conv or --cudnn-benchmark;
//   3. the legacy cudnnConvolution* calls, whose algorithm choice the rest of
//      this comment describes: where the graph API has no plan for a shape, or
//      is off.
//
// Layout: Input and Output are described in the op's data_format. Channels
// last (NHWC), the layout cuDNN's FP16 tensor-core kernels read directly,
// cuDNN also wants the filter channels last ([oc, kh, kw, c/groups]), while
// the parameter keeps PyTorch's [oc, c/groups, kh, kw] (checkpoints do not
// depend on the layout): the launcher permutes the filter into scratch before
// the forward and backward-data passes, and the filter gradient back after
// the backward-filter pass. Filters are small next to the activations. A 1x1
// filter (two thirds of ResNet-50's convolutions) or a depthwise one (one
// channel per group) has the same bytes in both orders and is not copied.
//
// Numerics, chosen to match the CPU kernel (FP32 accumulation, one rounding on store):
//   f16 / bf16: compute type FLOAT (FP32 accumulation) and tensor-op math.
//   f32:        CUDNN_FMA_MATH, so FP32 stays true FP32 as the GEMMs do; with
//               --allow-tf32 (cuda::allow_tf32()) tensor-op math may use TF32.
//               TENSOR_OP_MATH_ALLOW_CONVERSION (rounding inputs to FP16) is never used.
//
// Algorithms: cuDNN's heuristics (cudnnGet*Algorithm_v7) rank the candidates;
// the first that has the allowed math type and a workspace within
// kWorkspaceLimit, and that cuDNN does not refuse (any status but success)
// when run, wins. Heuristics, not timed search (Find*), so every rank and every run picks
// the same algorithm for the same shapes (unless memory runs short, below).
// The backward passes prefer
// deterministic algorithms (no atomic adds into dX or dW), as the project's own
// reductions are (runtime/ops/cuda/device_ops.cuh). Where cuDNN has none for a
// shape (odd channel counts such as the 3-channel stem can lack one in NHWC
// FP16), a nondeterministic one runs, with a warning, rather than the job
// failing: it costs run-to-run reproducibility in the last bits, not rank
// agreement, because every rank then takes the same all-reduced gradient.
//
// --cudnn-benchmark (cuda::cudnn_benchmark, PyTorch's cudnn.benchmark) times
// the viable candidates instead, once per shape on the first step, and keeps
// the fastest (deterministic ones still first for the backward passes). The
// timing differs from run to run, so the choice, and the last bits, may too;
// ranks may even choose differently, which costs them nothing: each applies
// the same all-reduced gradient.
// The choice is cached per (device, pass, dtype, TF32 setting, shapes,
// attributes, layout), with the cuDNN descriptors it runs with: a step
// makes no descriptors (~15 cuDNN calls a pass before) and hands cuDNN the
// same descriptor objects every time.
//
// Workspaces come from the caching device allocator (cuda::device_workspace),
// so the allocator's peak counts them. A candidate whose workspace the device
// cannot give (mix::OutOfMemoryError) is skipped, with a warning, for the next
// one in the ranking (which may need less, or not), as PyTorch does: a slower
// algorithm beats a failed step when the model nearly fills the GPU. A cached
// choice whose workspace stops fitting is chosen again the same way. Then the
// choice depends on the memory free at that moment, and may differ between
// ranks and runs, and a backward pass may even fall back to a nondeterministic
// algorithm (the warning says why); ranks still agree, as above.
//
// The graph API (cuda::cudnn_graph_conv, path 2) keeps the numerics rules
// above in the plans it accepts, and falls back to the legacy calls below
// for a shape it has no plan for.
//
// --cublas-1x1-conv (cuda::cublas_1x1_conv) runs each pass of a pointwise
// channels-last convolution (1x1, no padding, one group, any stride) as one
// cuBLAS GEMM over the [pixels, channels] matrix instead (runtime/ops/
// conv_gemm.h; with a stride, of the sampled pixels, gathered or scattered by
// transpose2's copy): no descriptors, algorithm choice or workspace of
// cuDNN's, so the host queues it in a GEMM's time (and a copy's);
// cuda::gemm keeps the numerics rules above (FP32 accumulation, no TF32
// unless allowed). It goes first; other shapes take the graph API or the
// legacy calls as before.
//
// No kernels of its own: this file is only the launcher part.
#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cudnn_conv_graph.h"
#include "runtime/cuda/cudnn_util.h"
#include "runtime/cuda/gemm.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ops/conv_gemm.h"
#include "runtime/ops/conv_shapes.h"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix {
namespace {

// Largest workspace an algorithm may ask for: a fixed limit (not a share of
// the free memory) so that, memory permitting, the choice does not depend on
// what else is allocated; algorithms wanting more (large FFT tilings) are skipped.
constexpr size_t kWorkspaceLimit = size_t{512} << 20;

using Pass = ConvPass;  // one list of passes for the legacy calls, the graph API and cuBLAS

// The math type a convolution of `t` starts from: FMA for strict FP32.
cudnnMathType_t base_math(DType t) {
  if (t != DType::f32) return CUDNN_TENSOR_OP_MATH;
  return cuda::allow_tf32() ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

// May an algorithm that cuDNN reports with math type `m` run for data of `t`?
bool math_allowed(DType t, cudnnMathType_t m) {
  if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;  // rounds the inputs to FP16 first
  return t != DType::f32 || cuda::allow_tf32() || m == CUDNN_FMA_MATH;
}

struct Descriptors {
  cuda::TensorDescriptor x, y;  // Input [n, c, h, w], Output [n, oc, oh, ow], in the op's layout
  cuda::FilterDescriptor w;     // Filter [oc, c / groups, kh, kw], channels last with the data
  cuda::ConvolutionDescriptor conv;
};

Descriptors make_descriptors(const ConvDims& d, DType t, const char* op) {
  const bool last = d.channels_last;
  Descriptors s{cuda::image_tensor(t, d.n, d.c, d.h, d.w, last, op),
                cuda::image_tensor(t, d.n, d.oc, d.oh, d.ow, last, op),
                cuda::image_filter(t, d.oc, d.c_per_group(), d.kh, d.kw, last, op), cuda::ConvolutionDescriptor{}};
  // Cross-correlation (PyTorch's and Paddle's "convolution"), FP32 accumulation for every data type.
  MIX_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      s.conv.get(), cuda::cudnn_int(d.pad_h, op, "padding"), cuda::cudnn_int(d.pad_w, op, "padding"),
      cuda::cudnn_int(d.stride_h, op, "stride"), cuda::cudnn_int(d.stride_w, op, "stride"),
      cuda::cudnn_int(d.dil_h, op, "dilation"), cuda::cudnn_int(d.dil_w, op, "dilation"), CUDNN_CROSS_CORRELATION,
      CUDNN_DATA_FLOAT));
  MIX_CUDNN_CHECK(cudnnSetConvolutionGroupCount(s.conv.get(), cuda::cudnn_int(d.groups, op, "groups")));
  MIX_CUDNN_CHECK(cudnnSetConvolutionMathType(s.conv.get(), base_math(t)));
  // conv_dims decides the output size on every device; cuDNN must agree with it.
  int n = 0, c = 0, h = 0, w = 0;
  MIX_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(s.conv.get(), s.x.get(), s.w.get(), &n, &c, &h, &w));
  MIX_CHECK(n == d.n && c == d.oc && h == d.oh && w == d.ow,
            op << ": cuDNN computes an output of [" << n << ", " << c << ", " << h << ", " << w << "], conv_dims "
               << shape_str(d.out_shape_nchw()));
  return s;
}

struct Algo {
  int algo = 0;  // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
  bool deterministic = true;
};

using AlgoKey = std::array<int64_t, 20>;

AlgoKey algo_key(int device, Pass pass, DType t, const ConvDims& d) {
  // clang-format off
  return {device, static_cast<int64_t>(pass), static_cast<int64_t>(t), cuda::allow_tf32() ? 1 : 0,
          d.n, d.c, d.h, d.w, d.oc, d.kh, d.kw,
          d.stride_h, d.stride_w, d.pad_h, d.pad_w, d.dil_h, d.dil_w, d.groups,
          d.channels_last ? 1 : 0, cuda::cudnn_benchmark() ? 1 : 0};
  // clang-format on
}

// A pass's choice for one shape, and the descriptors it runs with: made
// once per shape (the convolution's math type set to the algorithm's), so
// that a legacy call costs the host no descriptor set-up and cuDNN sees the
// same descriptor objects every step. Never changed once cached.
struct Choice {
  Algo algo;
  std::shared_ptr<const Descriptors> descriptors;
};

std::mutex g_algo_mu;
// Never destroyed, like the device contexts (runtime/cuda/context.cc): the
// cached descriptors would otherwise be handed back to cuDNN from a static
// destructor, in an order against the libraries' own teardown that nothing fixes.
std::map<AlgoKey, Choice>& g_choices = *new std::map<AlgoKey, Choice>;

// One row of cuDNN's ranking (its workspace is asked again under the math type we allow).
struct Candidate {
  int algo;
  cudnnStatus_t status;
  cudnnDeterminism_t determinism;
  cudnnMathType_t math;
};

template <typename Perf>
std::vector<Candidate> to_candidates(const Perf* perf, int count) {
  std::vector<Candidate> c;
  for (int i = 0; i < count; ++i)
    c.push_back({static_cast<int>(perf[i].algo), perf[i].status, perf[i].determinism, perf[i].mathType});
  return c;
}

// cuDNN's heuristic ranking for `pass`, fastest first (no kernel is run).
std::vector<Candidate> ranked_candidates(cudnnHandle_t h, Pass pass, const Descriptors& s) {
  int count = 0;
  switch (pass) {
    case Pass::forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      MIX_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, s.x.get(), s.w.get(), s.conv.get(), s.y.get(),
                                                             CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf));
      return to_candidates(perf, count);
    }
    case Pass::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      MIX_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, s.w.get(), s.y.get(), s.conv.get(), s.x.get(),
                                                                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf));
      return to_candidates(perf, count);
    }
    case Pass::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      MIX_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          h, s.x.get(), s.y.get(), s.conv.get(), s.w.get(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
      return to_candidates(perf, count);
    }
  }
  return {};
}

// cuDNN's workspace for `algo` with the descriptor's current math type; a
// status other than success means cuDNN cannot run that combination.
cudnnStatus_t workspace_size(cudnnHandle_t h, Pass pass, const Descriptors& s, int algo, size_t* bytes) {
  switch (pass) {
    case Pass::forward:
      return cudnnGetConvolutionForwardWorkspaceSize(h, s.x.get(), s.w.get(), s.conv.get(), s.y.get(),
                                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
    case Pass::backward_data:
      return cudnnGetConvolutionBackwardDataWorkspaceSize(h, s.w.get(), s.y.get(), s.conv.get(), s.x.get(),
                                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
    case Pass::backward_filter:
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, s.x.get(), s.y.get(), s.conv.get(), s.w.get(),
                                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

// cuDNN's ranked candidates for `pass` that may run here (an allowed math
// type, a workspace within the limit): for the backward passes the
// deterministic ones first, then the others.
std::vector<Algo> viable_algos(cudnnHandle_t h, Pass pass, DType t, const Descriptors& s) {
  std::vector<Algo> viable, nondeterministic;
  for (const Candidate& c : ranked_candidates(h, pass, s)) {
    if (c.status != CUDNN_STATUS_SUCCESS) continue;
    const bool deterministic = pass == Pass::forward || c.determinism == CUDNN_DETERMINISTIC;
    // Strict FP32 keeps FMA math whatever the heuristics list: cuDNN then
    // refuses (in workspace_size, or when run) an algorithm without an FMA kernel.
    const cudnnMathType_t math = t == DType::f32 && !cuda::allow_tf32() ? CUDNN_FMA_MATH : c.math;
    if (!math_allowed(t, math)) continue;
    MIX_CUDNN_CHECK(cudnnSetConvolutionMathType(s.conv.get(), math));
    size_t bytes = 0;
    if (workspace_size(h, pass, s, c.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > kWorkspaceLimit) continue;
    (deterministic ? viable : nondeterministic).push_back({c.algo, math, bytes, deterministic});
  }
  viable.insert(viable.end(), nondeterministic.begin(), nondeterministic.end());
  return viable;
}

// Why cuDNN would not run candidates of one pass, for the error if none runs:
// while choosing, any status but success only rules its algorithm out. The
// heuristics and the workspace query rule out most combinations beforehand,
// but cuDNN documents no promise that a candidate they let through runs, and
// one refusal (a NOT_SUPPORTED code, or a BAD_PARAM one for a layout a kernel
// lacks) must not end training while another candidate would do.
struct Refusals {
  std::string text;
  void add(int algo, cudnnStatus_t status) {
    text += (text.empty() ? "" : "; ") + std::string("algorithm ") + std::to_string(algo) + ": " +
            cuda::cudnn_status_text(status);
  }
};

// --cudnn-benchmark: `algos` fastest first by one timed run each (after an
// untimed one, which pays for lazy kernel loading), deterministic ones still
// ahead of the others; algorithms cuDNN refuses when run (noted in
// `refusals`), or whose workspace does not fit (run returns no status), are
// dropped. Each run overwrites the pass's output (beta 0); the caller runs the winner last.
template <typename Run>
std::vector<Algo> fastest_first(const std::vector<Algo>& algos, const Run& run, int device, cudaStream_t stream,
                                const char* op, Refusals& refusals) {
  struct Timed {
    Algo algo;
    float ms;
  };
  std::vector<Timed> timed;
  cuda::Event start(/*timing=*/true), stop(/*timing=*/true);
  for (const Algo& a : algos) {
    const std::optional<cudnnStatus_t> status = run(a);
    if (!status) continue;  // no room
    if (*status != CUDNN_STATUS_SUCCESS) {
      refusals.add(a.algo, *status);
      continue;
    }
    start.record(stream);
    const std::optional<cudnnStatus_t> timed_status = run(a);
    stop.record(stream);
    if (!timed_status) continue;  // its workspace, cached by the first run, was taken back meanwhile
    MIX_CUDNN_CHECK(*timed_status);
    // Bounded: the stream may also hold a wait for an all-reduce a dead peer never joins.
    MIX_CHECK(cuda::wait_for_streams(device), op << ": timing cuDNN's algorithms (--cudnn-benchmark) waited more than "
                                                 << cuda::hang_timeout() << " s for the GPU; a peer may have died");
    timed.push_back({a, stop.elapsed_ms_since(start)});
  }
  cuda::discard_cudnn_last_error();  // the refusals are not errors for a later check to report
  std::stable_sort(timed.begin(), timed.end(), [](const Timed& x, const Timed& y) {
    if (x.algo.deterministic != y.algo.deterministic) return x.algo.deterministic;
    return x.ms < y.ms;
  });
  std::vector<Algo> order;
  for (const Timed& t : timed) order.push_back(t.algo);
  return order;
}

// Runs one convolution pass: `call(descriptors, algo, workspace, bytes)`
// with the choice cached for these shapes, or, the first time, with new
// descriptors and cuDNN's viable candidates in order until cuDNN runs one
// (any other status rules it out) and its workspace fits in the device's
// memory; that one is cached with the descriptors.
template <typename Call>
void run_pass(cudnnHandle_t h, const OpContext& ctx, Pass pass, DType t, const ConvDims& d, Call call) {
  const char* op = ctx.op.type.c_str();
  const AlgoKey key = algo_key(ctx.env.device.index, pass, t, d);
  std::string out_of_memory;           // why the last candidate that did not fit did not
  bool deterministic_skipped = false;  // a deterministic candidate did not fit
  // cuDNN's status, or none when the device could not give the workspace.
  auto run = [&](const Descriptors& s, const Algo& a) -> std::optional<cudnnStatus_t> {
    Tensor ws;
    try {
      ws = cuda::device_workspace(a.workspace, ctx.env.device);
    } catch (const OutOfMemoryError& e) {
      out_of_memory = e.what();
      deterministic_skipped = deterministic_skipped || a.deterministic;
      cuda::log_warning(std::string(op) + ": skipping cuDNN " + conv_pass_name(pass) + " algorithm " +
                        std::to_string(a.algo) + " for " + conv_shape_text(t, d) + ": its workspace of " +
                        std::to_string(a.workspace) + " bytes is more than the device can give now");
      return std::nullopt;
    }
    return call(s, a.algo, ws.raw(), a.workspace);
  };
  {
    std::unique_lock<std::mutex> lock(g_algo_mu);
    if (auto it = g_choices.find(key); it != g_choices.end()) {
      const Choice c = it->second;  // the shared descriptors stay alive while this call uses them
      lock.unlock();
      if (const std::optional<cudnnStatus_t> status = run(*c.descriptors, c.algo)) {
        MIX_CUDNN_CHECK(*status);
        return;
      }
      lock.lock();
      g_choices.erase(key);  // its workspace no longer fits: choose again below
    }
  }
  // Fresh descriptors, this thread's alone until cached: choosing sets their math type per candidate.
  const auto s = std::make_shared<Descriptors>(make_descriptors(d, t, op));
  auto try_algo = [&](const Algo& a) {
    MIX_CUDNN_CHECK(cudnnSetConvolutionMathType(s->conv.get(), a.math));
    return run(*s, a);
  };
  Refusals refusals;
  std::vector<Algo> candidates = viable_algos(h, pass, t, *s);
  if (cuda::cudnn_benchmark())
    candidates = fastest_first(candidates, try_algo, ctx.env.device.index, cuda::compute_stream(ctx), op, refusals);
  for (const Algo& a : candidates) {
    const std::optional<cudnnStatus_t> status = try_algo(a);
    if (!status) continue;  // no room for its workspace: the next may need less
    if (*status != CUDNN_STATUS_SUCCESS) {  // refused: the next may run (see Refusals)
      refusals.add(a.algo, *status);
      continue;
    }
    cuda::discard_cudnn_last_error();  // the refusals before it are not errors for a later check to report
    if (!a.deterministic)  // once per shape: the choice is cached below
      cuda::log_warning(std::string(op) + ": cuDNN has no deterministic " + conv_pass_name(pass) + " algorithm for " +
                        conv_shape_text(t, d) +
                        (deterministic_skipped ? " whose workspace fits in the device memory left" : "") +
                        "; running nondeterministic algorithm " + std::to_string(a.algo) +
                        " (the last bits may differ from run to run; ranks still agree)");
    // The math type set for `a` by its run above is the last change to s.
    std::lock_guard<std::mutex> lock(g_algo_mu);
    g_choices[key] = Choice{a, s};
    return;
  }
  cuda::discard_cudnn_last_error();
  if (!out_of_memory.empty())
    throw OutOfMemoryError(MIX_STR_CAT(op << ": no cuDNN " << conv_pass_name(pass) << " algorithm for "
                                          << conv_shape_text(t, d)
                                          << " fits in the device memory left (a smaller --batch-size needs less); "
                                          << "the last one tried: " << out_of_memory));
  MIX_FAIL(
      op << ": cuDNN offers no " << conv_pass_name(pass) << " algorithm for " << conv_shape_text(t, d) << " within a "
         << (kWorkspaceLimit >> 20) << " MiB workspace"
         << (t == DType::f32 && !cuda::allow_tf32() ? " in FMA (non-TF32) math (--allow-tf32 widens the choice)" : "")
         << (refusals.text.empty() ? std::string() : "; refused when run: " + refusals.text));
}

// Runs `pass` through cuDNN's graph API when --cudnn-graph-conv asks for it:
// false when not asked or when the graph API has no plan (run the legacy call).
bool ran_on_graph(cudnnHandle_t h, const OpContext& ctx, Pass pass, DType t, const ConvDims& d, void* x, void* w,
                  void* y) {
  if (!cuda::cudnn_graph_conv()) return false;
  const cuda::ConvGraphShape s{pass, t, cuda::allow_tf32(), d};
  return cuda::run_conv_graph(h, ctx.env.device, s, x, w, y, kWorkspaceLimit);
}

// Runs `pass` as one cuBLAS GEMM when --cublas-1x1-conv asks for it and the
// convolution is pointwise channels last (conv_gemm.h): false otherwise, and
// for extents past cuBLAS's int (cuDNN then takes the pass, or says why not).
// x, w and y as for ran_on_graph (Input or Input@GRAD itself); the filter's
// bytes are used as they are. A strided convolution's GEMM works on its
// sampled pixels in scratch: gathered from Input before, or scattered into
// Input@GRAD after (the pixels it does not sample zeroed).
bool ran_as_gemm(cuda::DeviceContext& dc, const Device& device, Pass pass, DType t, const ConvDims& d, void* x, void* w,
                 void* y) {
  if (!cuda::cublas_1x1_conv() || !conv_runs_as_gemm(d)) return false;
  const ConvGemm g = conv_gemm(pass, d, x, w, y);
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (g.m > kIntMax || g.n > kIntMax || g.k > kIntMax) return false;
  auto run = [&](const ConvGemm& e) {
    cuda::gemm(dc, e.trans_a, e.trans_b, e.m, e.n, e.k, 1.f, e.a, e.b, 0.f, e.c, t);
  };
  if (conv_samples_every_pixel(d)) {
    run(g);
    return true;
  }
  const cudaStream_t stream = dc.compute.get();
  const fn::TransposePlan view = sampled_pixels(d);
  const size_t es = dtype_size(t);
  const char* op = pass == Pass::forward ? "conv2d" : "conv2d_grad";
  const bool writes_input = pass == Pass::backward_data;
  Tensor sampled = Tensor::empty({d.n, d.oh, d.ow, d.c}, t, device);  // released in stream order
  if (!writes_input) cuda::gather_into(x, sampled.raw(), view, sampled.numel(), es, stream, op);
  run(conv_gemm(pass, d, sampled.raw(), w, y));
  if (writes_input) {
    MIX_CUDA_CHECK(cudaMemsetAsync(x, 0, static_cast<size_t>(d.n * d.h * d.w * d.c) * es, stream));
    cuda::scatter_into(sampled.raw(), x, view, sampled.numel(), es, stream, op);
  }
  return true;
}

void check_inputs(const OpContext& ctx, const Tensor& x, const Tensor& filter) {
  const char* op = ctx.op.type.c_str();
  MIX_CHECK(x.dtype() == filter.dtype(), op << ": Input is " << dtype_name(x.dtype()) << " but Filter is "
                                            << dtype_name(filter.dtype()) << " (amp::rewrite inserts casts)");
  cuda::check_on_device(ctx, x, "Input");
  cuda::check_on_device(ctx, filter, "Filter");
}

// Whether cuDNN reads the filter, and writes its gradient, in the parameter's
// own bytes: always channels first, and channels last when [oc, c/g, kh, kw]
// and [oc, kh, kw, c/g] are the same order (kh * kw == 1 or c/g == 1).
bool filter_bytes_as_is(const ConvDims& d) { return !d.channels_last || d.kh * d.kw == 1 || d.c_per_group() == 1; }

// The filter as cuDNN reads it: the parameter itself, or channels last a
// [oc, kh, kw, c/groups] copy in scratch (released in stream order).
Tensor cudnn_filter(const Tensor& filter, const ConvDims& d, cudaStream_t stream, const std::string& op) {
  if (filter_bytes_as_is(d)) return filter;
  Tensor t = Tensor::empty({d.oc, d.kh, d.kw, d.c_per_group()}, filter.dtype(), filter.device());
  cuda::permute_into(filter, layout::to_channels_last(4), t, stream, op);
  return t;
}

void conv2d_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("Input");
  const Tensor filter = ctx.in("Filter");
  check_inputs(ctx, x, filter);
  const ConvDims d = conv_dims(ctx.op, x.shape(), filter.shape());
  Tensor& out = ctx.out("Output", d.out_shape(), x.dtype());
  if (d.n == 0) return;
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  if (ran_as_gemm(dc, ctx.env.device, Pass::forward, x.dtype(), d, x.raw(), filter.raw(), out.raw())) return;
  cudnnHandle_t h = cuda::cudnn_handle(dc);
  const Tensor w = cudnn_filter(filter, d, dc.compute.get(), "conv2d");
  if (ran_on_graph(h, ctx, Pass::forward, x.dtype(), d, x.raw(), w.raw(), out.raw())) return;
  run_pass(h, ctx, Pass::forward, x.dtype(), d, [&](const Descriptors& s, int algo, void* ws, size_t ws_bytes) {
    return cudnnConvolutionForward(h, &cuda::kCudnnOne, s.x.get(), x.raw(), s.w.get(), w.raw(), s.conv.get(),
                                   static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, ws_bytes, &cuda::kCudnnZero,
                                   s.y.get(), out.raw());
  });
}

// dInput = the transposed convolution of dOutput with Filter; dFilter = the
// correlation of Input with dOutput, summed over the batch (beta 0: overwritten).
void conv2d_grad_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("Input");
  const Tensor filter = ctx.in("Filter");
  const Tensor dout = ctx.in("Output@GRAD");
  check_inputs(ctx, x, filter);
  cuda::check_on_device(ctx, dout, "Output@GRAD");
  const ConvDims d = conv_dims(ctx.op, x.shape(), filter.shape());
  MIX_CHECK(dout.shape() == d.out_shape(), "conv2d_grad: Output@GRAD is " << shape_str(dout.shape()) << ", expected "
                                                                          << shape_str(d.out_shape()));
  MIX_CHECK(dout.dtype() == x.dtype(), "conv2d_grad: Output@GRAD is " << dtype_name(dout.dtype()) << " but Input is "
                                                                      << dtype_name(x.dtype()));
  const bool want_dx = ctx.wants("Input@GRAD"), want_dw = ctx.wants("Filter@GRAD");
  Tensor* dx = want_dx ? &ctx.out("Input@GRAD", x.shape(), x.dtype()) : nullptr;
  Tensor* dw = want_dw ? &ctx.out("Filter@GRAD", filter.shape(), filter.dtype()) : nullptr;
  cuda::DeviceContext& dc = cuda::use_device(ctx.env.device.index);
  if (d.n == 0) {  // an empty batch: dFilter is an empty sum
    if (dw) MIX_CUDA_CHECK(cudaMemsetAsync(dw->raw(), 0, dw->bytes(), dc.compute.get()));
    return;
  }
  // A pass cuBLAS ran (--cublas-1x1-conv) is done; cuDNN runs the others.
  const Device& dev = ctx.env.device;
  const bool dx_done =
      dx && ran_as_gemm(dc, dev, Pass::backward_data, x.dtype(), d, dx->raw(), filter.raw(), dout.raw());
  const bool dw_done = dw && ran_as_gemm(dc, dev, Pass::backward_filter, x.dtype(), d, x.raw(), dw->raw(), dout.raw());
  cudnnHandle_t h = cuda::cudnn_handle(dc);
  const cudaStream_t stream = dc.compute.get();
  if (dx && !dx_done) {
    const Tensor w = cudnn_filter(filter, d, stream, "conv2d_grad");
    if (!ran_on_graph(h, ctx, Pass::backward_data, x.dtype(), d, dx->raw(), w.raw(), dout.raw())) {
      run_pass(h, ctx, Pass::backward_data, x.dtype(), d,
               [&](const Descriptors& s, int algo, void* ws, size_t ws_bytes) {
                 return cudnnConvolutionBackwardData(h, &cuda::kCudnnOne, s.w.get(), w.raw(), s.y.get(), dout.raw(),
                                                     s.conv.get(), static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws,
                                                     ws_bytes, &cuda::kCudnnZero, s.x.get(), dx->raw());
               });
    }
  }
  if (dw && !dw_done) {
    // Channels last, cuDNN writes the gradient as [oc, kh, kw, c/groups]: into scratch, then permuted back.
    const bool as_is = filter_bytes_as_is(d);
    Tensor dw_cudnn = as_is ? *dw : Tensor::empty({d.oc, d.kh, d.kw, d.c_per_group()}, dw->dtype(), dw->device());
    if (ran_on_graph(h, ctx, Pass::backward_filter, x.dtype(), d, x.raw(), dw_cudnn.raw(), dout.raw())) {
      if (!as_is) cuda::permute_into(dw_cudnn, layout::to_channels_first(4), *dw, stream, "conv2d_grad");
      return;
    }
    run_pass(h, ctx, Pass::backward_filter, x.dtype(), d,
             [&](const Descriptors& s, int algo, void* ws, size_t ws_bytes) {
               return cudnnConvolutionBackwardFilter(h, &cuda::kCudnnOne, s.x.get(), x.raw(), s.y.get(), dout.raw(),
                                                     s.conv.get(), static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo),
                                                     ws, ws_bytes, &cuda::kCudnnZero, s.w.get(), dw_cudnn.raw());
             });
    if (!as_is) cuda::permute_into(dw_cudnn, layout::to_channels_first(4), *dw, stream, "conv2d_grad");
  }
}

const bool registered = OpRegistry::instance().add_cuda_kernel("conv2d", conv2d_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("conv2d_grad", conv2d_grad_cuda);

}  // namespace
}  // namespace mix
