// [cuda] Whole training steps on the GPU against the same steps on the CPU, in
// FP32 and in AMP (momentum SGD): the MLP (cuBLAS, 3 steps), a narrow
// resnet-small (cuDNN convolutions, batch_norm and pooling, 2 steps) and a tiny
// GPT-style Transformer (embeddings, layer_norm, causal softmax, dropout,
// split/transpose2 attention, 2 steps). Every
// FP32 persistable (parameters, momentum buffers, running statistics) and the
// last loss are compared; integer state (num_batches_tracked) must be equal.
// The ResNet is also fed 8-bit pixels, normalised on the device (image_normalize).
// The programs are mixtrain's, fuse_add_relu and fuse_bn_relu included
// (tests/unit/train_steps.h): the ResNet runs once fused (fused_add_relu,
// fused_sum_relu_grad, batch_norm with fuse_with_relu) and once with neither
// pass (separate relu kernels); channels last both run mixtrain's own
// batch-norm kernels, NCHW cuDNN's.
// Last, the Transformer's steps on the GPU with and without
// amp::fold_widening_casts, and with the loss's softmax recomputed or stored
// (runtime/passes/recompute_softmax.h), which must agree bit for bit; and the MLP's
// and the ResNet's steps recorded once as a CUDA graph and replayed
// (--cuda-graph), which must give the op-by-op steps' bits, dropout's masks
// and an injected overflow included.
// Without a GPU: exit 77 (CTest: skipped).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "models/model.h"
#include "tests/unit/require_gpu.h"
#include "tests/unit/train_steps.h"

#ifdef MIX_HAVE_CUDA
#include "runtime/cuda/context.h"
#endif

using namespace mix;

namespace {

using mix::testing::train_steps;
using mix::testing::TrainedModel;
using mix::testing::TrainOptions;

// `steps` momentum-SGD steps (tests/unit/train_steps.h) of `model` on
// `device`, in AMP or FP32, with `batch` examples a step.
[[maybe_unused]] TrainedModel train(models::Model model, bool use_amp, Device device, int steps, int64_t batch,
                                    uint64_t seed, bool fuse) {
  return train_steps(std::move(model), TrainOptions{.amp = use_amp,
                                                    .fuse_add_relu = fuse,
                                                    .fuse_bn_relu = fuse,
                                                    .device = device,
                                                    .steps = steps,
                                                    .batch = batch,
                                                    .seed = seed});
}

// Every FP32 persistable within `tol` of its tensor's largest |value| (CPU run as
// the reference), integer persistables equal, and the losses within `loss_rel`.
// With `precision_gap` (AMP: the CPU's FP32 run of the same steps), a tensor
// may also differ by twice as much as the CPU's AMP result differs from its
// FP32 one. That difference is how far FP16 rounding alone moves the tensor
// (ReLU inputs that switch sides, batch norm's cancelling sums over few
// values: up to 4% of a momentum buffer's scale in the narrow ResNet); the
// GPU's AMP run rounds at the same points in another order, so it may land as
// far from FP32 on the other side. Seen on a GPU (docs/gpu.md): the GPU's AMP
// momentum buffer of layer2.0.conv1 was 1.004 times the CPU's own AMP - FP32
// difference from the CPU's AMP one, beyond the fixed 2% of scale.
[[maybe_unused]] void compare(const TrainedModel& cpu, const TrainedModel& dev, double tol, double loss_rel,
                              const TrainedModel* precision_gap = nullptr) {
  for (const VarDesc& v : cpu.model.program.vars()) {
    if (!v.persistable) continue;
    INFO(v.name);
    if (v.dtype == DType::i64) {  // num_batches_tracked, step counters: counted, exact
      CHECK(cpu.scope.get(v.name).to(cpu_device()).data<int64_t>()[0] ==
            dev.scope.get(v.name).to(cpu_device()).data<int64_t>()[0]);
      continue;
    }
    if (v.dtype != DType::f32) continue;
    std::vector<float> a = cpu.scope.get(v.name).to_floats(), b = dev.scope.get(v.name).to_floats();
    REQUIRE(a.size() == b.size());
    double scale = 0, worst = 0;
    for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::abs(static_cast<double>(a[i])));
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    double gap = 0;
    if (precision_gap && precision_gap->scope.has(v.name)) {  // not the loss scale: FP32 has none
      const std::vector<float> f = precision_gap->scope.get(v.name).to_floats();
      REQUIRE(f.size() == a.size());
      for (size_t i = 0; i < a.size(); ++i) gap = std::max(gap, std::abs(static_cast<double>(a[i]) - f[i]));
    }
    INFO(v.name << ": worst difference " << worst << " against scale " << scale << " (AMP - FP32 on the CPU: " << gap
                << ")");
    CHECK(worst <= std::max(tol * std::max(scale, 1e-6), 2 * gap));
  }
  // The loss of the last step: the forward differences of the state before it.
  CHECK(cpu.scope.get(cpu.model.loss).item_float() ==
        Approx(dev.scope.get(dev.model.loss).item_float()).epsilon(loss_rel));
}

// compare()'s bounds for one precision: `state` for the persistables, `loss` for the last loss.
struct Tolerance {
  double state, loss;
};

// The model that `build` makes, trained for `steps` steps on the CPU and on
// cuda:0, in FP32 and in AMP, compared with compare() within `fp32` or `amp`;
// `fuse` picks whether the programs run fuse_add_relu and fuse_bn_relu.
[[maybe_unused]] void expect_gpu_matches_cpu(const std::function<models::Model()>& build, int steps, int64_t batch,
                                             uint64_t seed, Tolerance fp32, Tolerance amp, bool fuse = true) {
  const Device gpu = mix::testing::gpu_or_stand_in();
  TrainedModel cpu_fp32 = train(build(), false, cpu_device(), steps, batch, seed, fuse);
  {
    INFO("FP32");
    compare(cpu_fp32, train(build(), false, gpu, steps, batch, seed, fuse), fp32.state, fp32.loss);
  }
  INFO("AMP");
  TrainedModel cpu_amp = train(build(), true, cpu_device(), steps, batch, seed, fuse);
  // A step skipped for an overflow would put a whole update into the AMP -
  // FP32 difference: the precision's gap counts only when every step was applied.
  const bool all_applied =
      std::all_of(cpu_amp.found_inf.begin(), cpu_amp.found_inf.end(), [](float f) { return f == 0; });
  compare(cpu_amp, train(build(), true, gpu, steps, batch, seed, fuse), amp.state, amp.loss,
          all_applied ? &cpu_fp32 : nullptr);
}

// A 2-layer GPT (d_model 32, 4 heads, 16 tokens) with `vocab` tokens.
[[maybe_unused]] models::Model tiny_transformer(int64_t vocab, double dropout) {
  models::TransformerConfig cfg;
  cfg.layers = 2;
  cfg.d_model = 32;
  cfg.heads = 4;
  cfg.context = 16;
  cfg.vocab = vocab;
  cfg.dropout = dropout;
  return models::build_transformer(cfg);
}

}  // namespace

TEST_CASE("MLP training steps on the GPU match the CPU", "[cuda]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  auto mlp = [] { return models::build_mlp({64, {48, 32}, 10}); };
  // FP32: the GEMMs sum in another order (cuBLAS vs OpenBLAS) and nvcc fuses
  // multiply-adds: ~1e-6 relative per step, so 1e-4 of the tensor's scale after
  // 3 steps is generous but still far below a wrong gradient (O(1) relative).
  // AMP: FP16 storage (2^-11) of activations and gradients, the same rounding
  // points on both devices, but a different summation order can flip a rounding:
  // allow 1e-2 of the tensor's scale.
  expect_gpu_matches_cpu(mlp, 3, 32, 1, {1e-4, 1e-4}, {1e-2, 1e-2});
#endif
}

TEST_CASE("BF16 training steps of the MLP and the Transformer on the GPU match the CPU", "[cuda][bf16]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  // --precision bf16: the same rounding points as AMP's with 8-bit mantissas
  // (2^-8 per rounding, 8 times FP16's), so AMP's 1e-2 of the scale becomes
  // 8e-2, or twice BF16's own difference from FP32 on the CPU (compare()).
  const Device gpu = mix::testing::gpu_or_stand_in();
  cuda::set_allow_tf32(false);
  const std::vector<std::pair<const char*, std::function<models::Model()>>> models_to_train = {
      {"MLP", [] { return models::build_mlp({64, {48, 32}, 10}); }},
      {"Transformer", [] { return tiny_transformer(64, 0.0); }}};
  for (const auto& [name, build] : models_to_train) {
    INFO(name);
    auto run = [&](bool mixed, Device device) {
      return train_steps(build(), TrainOptions{.amp = mixed, .low = DType::bf16, .device = device, .steps = 3,
                                               .batch = 8, .seed = 4});
    };
    const TrainedModel cpu_fp32 = run(false, cpu_device());
    const TrainedModel cpu_bf16 = run(true, cpu_device());
    compare(cpu_bf16, run(true, gpu), 8e-2, 8e-2, &cpu_fp32);
  }
#endif
}

TEST_CASE("ResNet training steps on the GPU (cuDNN) match the CPU", "[cuda][resnet]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  cuda::set_allow_tf32(false);
  for (bool channels_last : {false, true}) {
    INFO((channels_last ? "NHWC activations" : "NCHW activations"));
    auto resnet = [channels_last] { return mix::testing::narrow_resnet(channels_last, 16); };
    // FP32: every op agrees to ~1e-6 relative of its terms, but batch_norm's
    // backward cancels (dy - mean(dy) - xhat·mean(dy·xhat)) and its parameter
    // gradients are sums of batch·H·W = 2048 terms that cancel, summed in
    // double on the CPU and in FP32 by cuDNN (up to m·u ~ 1e-4 of sum|dy|); a
    // ReLU input within that error of 0 may also switch sides. 1e-3 of each
    // tensor's scale after 2 steps allows that; a wrong kernel is O(1) off.
    // AMP: FP16 activations and gradients (2^-11 per rounding, the same
    // rounding points on both devices), so a different summation order can flip
    // a rounding, and more ReLU inputs switch sides: 2e-2 of the scale, or
    // twice AMP's own difference from FP32 on the CPU (compare()).
    // Both with the residual adds and the batch norms fused with their relu
    // (mixtrain's default) and without (the sum, relu and relu_grad kernels),
    // over whole steps.
    for (bool fuse : {true, false}) {
      INFO((fuse ? "fused add + relu, batch norm + relu" : "--no-fuse-add-relu --no-fuse-bn-relu"));
      expect_gpu_matches_cpu(resnet, 2, 8, 5, {1e-3, 1e-4}, {2e-2, 1e-2}, fuse);
    }
    // The image readers' batches: u8 NHWC pixels normalised on the device into
    // the activations' layout, under AMP straight into FP16 (the folded cast).
    // The normalisation is bit-identical on both devices
    // (test_cuda_image_normalize.cc), so the bounds stay.
    INFO("from 8-bit pixels (image_normalize)");
    expect_gpu_matches_cpu(
        [channels_last] {
          return mix::testing::narrow_resnet(channels_last, 16, false, mix::testing::imagenet_pixels());
        },
        2, 8, 5, {1e-3, 1e-4}, {2e-2, 1e-2});
  }
  // Bottleneck blocks channels last, on cuDNN alone and then with
  // --cublas-1x1-conv: their first and last 1x1 convolutions and both
  // shortcuts (the second strided) as cuBLAS GEMMs, the others on cuDNN,
  // under the same bounds (the GEMMs keep the convolutions' numerics). The
  // run without the flag tells a fault of the bottleneck model's first GPU
  // run from one of the GEMMs.
  struct PointwiseOffAfter {
    ~PointwiseOffAfter() { cuda::set_cublas_1x1_conv(false); }
  } off_after;
  for (bool gemm : {false, true}) {
    INFO((gemm ? "bottleneck blocks, NHWC, --cublas-1x1-conv" : "bottleneck blocks, NHWC, all on cuDNN"));
    cuda::set_cublas_1x1_conv(gemm);
    expect_gpu_matches_cpu([] { return mix::testing::narrow_resnet(true, 16, /*bottleneck=*/true); }, 2, 8, 5,
                           {1e-3, 1e-4}, {2e-2, 1e-2});
  }
#endif
}

TEST_CASE("Transformer training steps on the GPU match the CPU", "[cuda][transformer]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  cuda::set_allow_tf32(false);
  // Dropout 0.1: the same masks on both devices (same seed, step, rank and op names).
  auto transformer = [] { return tiny_transformer(64, 0.1); };
  // FP32: dropout drops the same units on both devices (bit-identical masks),
  // embeddings and their gradients are identical, the GEMMs (cuBLAS vs
  // OpenBLAS, TF32 off) and the softmax / layer_norm row sums add in another
  // order (FP32 on the GPU where the CPU's layer_norm uses double): ~1e-6
  // relative per op. layer_norm's backward cancels (g - mean(g) - xhat·...),
  // which can amplify that to ~1e-5 of a gradient's scale; after 2 steps,
  // 1e-4 of each tensor's scale is far below a wrong kernel (O(1)).
  // AMP: the matmuls' outputs and gradients are FP16 (2^-11 per rounding, the
  // same rounding points on both devices), so another summation order can
  // flip a rounding, and GELU inputs near 0 amplify it: 2e-2 of the scale, as
  // for the ResNet; the loss within 1e-2.
  expect_gpu_matches_cpu(transformer, 2, 4, 7, {1e-4, 1e-4}, {2e-2, 1e-2});
#endif
}

TEST_CASE("Transformer AMP steps on the GPU: folded casts give the same bits as the casts",
          "[cuda][transformer][fold]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  cuda::set_allow_tf32(false);
  // The same GPU, the same shapes and the same kernels, which add in fixed
  // orders (no atomics in any value the step computes; cuBLAS gives the same
  // bits for the same call on one GPU). The folded softmax and cross-entropy
  // widen the same FP16 values the casts widened and round their gradients to
  // FP16 once, as the casts' gradients did (test_cuda_transformer_ops.cc checks
  // that op by op). So every persistable and the loss must be identical.
  // A 300-token vocabulary: loss rows of more than 256 classes, several values
  // per thread. Without dropout softmax_grad reads the FP16 gradient of the
  // probabilities (amp::fold_widening_grad_casts); with it, dropout reads them.
  const Device gpu = mix::testing::gpu_or_stand_in();
  for (double dropout : {0.0, 0.1}) {
    INFO("dropout " << dropout);
    TrainOptions o{.amp = true, .device = gpu, .steps = 3, .batch = 4, .seed = 9};
    TrainedModel folded = train_steps(tiny_transformer(300, dropout), o);
    o.fold_casts = false;
    TrainedModel plain = train_steps(tiny_transformer(300, dropout), o);
    size_t folded_ops = 0, plain_ops = 0;
    for (const OpDesc& op : folded.model.program.ops()) folded_ops += op.type == "cast";
    for (const OpDesc& op : plain.model.program.ops()) plain_ops += op.type == "cast";
    // Each folded forward cast with its gradient's cast: per layer, its two
    // layer_norms' FP16 casts (written FP16 by layer_norm itself) and its two
    // residual adds' FP32 casts (widened by the add), and with dropout, which
    // runs the unfused attention (fused_attention has none), the scores' cast
    // before softmax (the probabilities' gradient then reaches softmax_grad
    // through dropout's, so no backward-only cast is folded); then ln_f's and
    // the logits'.
    const size_t layers = 2, per_layer = dropout == 0 ? 4 : 5;
    CHECK(plain_ops - folded_ops == 2 * (layers * per_layer + 2));
    mix::testing::expect_same_training(folded, plain);
  }
#endif
}

TEST_CASE("Transformer steps on the GPU: the recomputed softmax gives the bits of the stored one",
          "[cuda][transformer][recompute_softmax]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  cuda::set_allow_tf32(false);
  // The same GPU and kernels; the loss gradient recomputes each softmax value
  // from the logits and the row's max and sum with the forward's operations
  // (the multiply never contracted into an FMA: fn::SoftmaxNormalize), so
  // every persistable and every loss must be identical. A 300-token
  // vocabulary: rows of several values per thread.
  const Device gpu = mix::testing::gpu_or_stand_in();
  for (bool use_amp : {false, true}) {
    INFO((use_amp ? "AMP" : "FP32"));
    TrainOptions o{.amp = use_amp, .device = gpu, .steps = 3, .batch = 4, .seed = 11};
    TrainedModel recomputed = train_steps(tiny_transformer(300, 0.0), o);
    o.recompute_softmax = false;
    TrainedModel stored = train_steps(tiny_transformer(300, 0.0), o);
    mix::testing::expect_same_training(recomputed, stored);
  }
#endif
}

TEST_CASE("Training steps recorded as a CUDA graph and replayed give the bits of op-by-op steps",
          "[cuda][gpu_only][cuda_graph]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  cuda::set_allow_tf32(false);
  // A replay runs the recorded kernels with the recorded arguments on the
  // recorded memory (runtime/exec/step_graph.h): the same GPU work as the op-by-op
  // step, so the same bits, provided the kernels add in fixed orders. They do
  // for the MLP and the Transformer (cuBLAS gives the same bits for the same
  // call; the hand-written kernels add in fixed orders) and for the ResNet as
  // long as cuDNN's backward passes take deterministic algorithms, which
  // conv2d chooses first; two op-by-op runs that differ show otherwise, and
  // the test says so instead of blaming the recording.
  const Device gpu = mix::testing::gpu_or_stand_in();
  auto make_graph = [](const TrainedModel&) { return require_device_backend(DeviceKind::cuda).make_graph(0); };
  // The off-by-default convolution paths a GPU day compares for speed with
  // --cuda-graph (scripts/gpu_check.sh): cuBLAS GEMMs with their strided
  // gathers, scatters and memsets, and graph-API plans with their workspaces,
  // all inside a recording.
  struct ConvFlags {
    bool cublas_1x1 = false, graph_conv = false;
  };
  struct Case {
    const char* name;
    std::function<models::Model()> model;
    bool amp;
    std::optional<amp::InjectOverflow> inject = {};
    ConvFlags flags = {};
  };
  struct FlagsOffAfter {
    ~FlagsOffAfter() {
      cuda::set_cublas_1x1_conv(false);
      cuda::set_cudnn_graph_conv(false);
    }
  } flags_off_after;
  auto bottleneck = [] { return mix::testing::narrow_resnet(true, 16, /*bottleneck=*/true); };
  const std::vector<Case> cases = {
      {"MLP FP32",
       [] {
         return models::build_mlp({64, {48, 32}, 10});
       },
       false},
      {"MLP AMP",
       [] {
         return models::build_mlp({64, {48, 32}, 10});
       },
       true},
      {"resnet NCHW FP32", [] { return mix::testing::narrow_resnet(false, 16); }, false},
      {"resnet NHWC AMP", [] { return mix::testing::narrow_resnet(true, 16); }, true},
      // Dropout's masks and the injected overflow depend on the step number,
      // which a replay reads from device memory (ExecEnv::device_step).
      {"transformer AMP, dropout", [] { return tiny_transformer(300, 0.1); }, true},
      {"MLP AMP, overflow injected at step 3",
       [] {
         return models::build_mlp({64, {48, 32}, 10});
       },
       true, amp::InjectOverflow{3, -1, ""}},
      // Without the flags first, so that a failure below is the flag's, not the model's.
      {"bottleneck resnet NHWC AMP", bottleneck, true},
      {"bottleneck resnet NHWC AMP, --cublas-1x1-conv", bottleneck, true, {}, {.cublas_1x1 = true}},
      {"bottleneck resnet NHWC AMP, --cudnn-graph-conv", bottleneck, true, {}, {.graph_conv = true}},
      {"bottleneck resnet NHWC AMP, both", bottleneck, true, {}, {.cublas_1x1 = true, .graph_conv = true}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    cuda::set_cublas_1x1_conv(c.flags.cublas_1x1);
    cuda::set_cudnn_graph_conv(c.flags.graph_conv);
    TrainOptions o{.amp = c.amp, .device = gpu, .steps = 5, .batch = 8, .seed = 11, .inject = c.inject};
    const TrainedModel eager = train_steps(c.model(), o);
    const TrainedModel eager_again = train_steps(c.model(), o);
    bool deterministic = eager.losses == eager_again.losses;
    for (const VarDesc& v : eager.model.program.vars()) {
      if (!v.persistable || !deterministic) continue;
      const Tensor a = eager.scope.get(v.name).to(cpu_device()), b = eager_again.scope.get(v.name).to(cpu_device());
      deterministic = a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
    }
    INFO(
        "two op-by-op runs of the same steps differ: a kernel is nondeterministic, and the recording cannot be "
        "compared bit for bit");
    CHECK(deterministic);
    if (!deterministic) continue;  // the next cases still run

    std::vector<StepGraph::Ran> ran;
    o.make_graph = make_graph;
    o.ran = &ran;
    const TrainedModel replayed = train_steps(c.model(), o);
    using Ran = StepGraph::Ran;
    CHECK(ran == std::vector<Ran>{Ran::eager, Ran::recorded, Ran::replayed, Ran::replayed, Ran::replayed});
    mix::testing::expect_same_training(eager, replayed);
    if (c.inject) CHECK(replayed.found_inf == std::vector<float>{0, 0, 1, 0, 0});
  }
#endif
}
