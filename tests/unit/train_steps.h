#pragma once
// A few momentum-SGD training steps of a model on random batches: the harness
// of the tests that train one model two ways and compare the results, folded
// casts or not (test_fold_casts.cc), fused add + relu or not
// (test_fuse_add_relu.cc), fused weight casts or not (test_fuse_param_casts.cc), the softmax stored or recomputed
// (test_recompute_softmax.cc), the GPU against the CPU and the passes on the GPU
// (test_cuda_train_step.cc), steps recorded and replayed or not (test_step_graph.cc,
// test_cuda_train_step.cc). Header-only (each test file is its own executable).
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "launch/train_program.h"
#include "models/model.h"
#include "runtime/core/random.h"
#include "runtime/exec/executor.h"
#include "runtime/exec/init.h"
#include "runtime/exec/step_graph.h"
#include "runtime/optim/optimizer.h"

namespace mix::testing {

struct TrainedModel;

struct TrainOptions {
  bool amp = false;           // --precision amp (else fp32)
  DType low = DType::f16;     // AMP's low precision
  bool fold_casts = true;     // AmpSettings::fold_casts
  bool fuse_add_relu = true;  // the whole-step passes (StepPasses), each on as in mixtrain
  bool fuse_bn_relu = true;
  bool recompute_softmax = true;
  bool fuse_param_casts = true;   // AMP only
  bool fuse_matmul_bias = true;
  bool fold_grad_sums = true;
  bool fuse_add_layer_norm = true;
  bool elide_single_rank_sync = true;
  size_t bucket_bytes = 25u << 20;  // the gradient all-reduce's (collective::GradSyncOptions)
  bool overlap = true;
  Device device = cpu_device();
  int steps = 2;
  int64_t batch = 3;
  uint64_t seed = 5;  // the initial state and the batches
  std::optional<amp::InjectOverflow> inject = {};  // AMP: --inject-overflow
  /// When set, the steps run through a StepGraph (--cuda-graph) on the
  /// recording it makes for the model being trained (its program and scope are in place).
  std::function<std::unique_ptr<DeviceGraph>(const TrainedModel&)> make_graph = {};
  /// With make_graph: how each step ran (eager, recorded, replayed), in order.
  std::vector<StepGraph::Ran>* ran = nullptr;
  /// When set, a model with f32 image input [C, S, S] is fed the batches a
  /// pixel-input model of the same seed gets, 8-bit pixels [batch, S, S, C],
  /// made into its input by this function (the host's normalisation).
  std::function<Tensor(const Tensor& pixels)> pixels_to_input = {};
};

struct TrainedModel {
  models::Model model;
  launch::TrainProgram train;
  Scope scope;
  std::vector<float> losses;     // each step's loss
  std::vector<float> found_inf;  // AMP: each step's overflow flag (0: the step was applied)
};

/// `o.steps` steps of `model` (momentum 0.9, learning rate 0.05, world size 1)
/// on `o.device` from the state `o.seed` initialises. Batch s has inputs
/// N(0, 1) of the model's example shape (uniform random tokens for a language
/// model, uniform random pixels for a pixel input or with o.pixels_to_input)
/// and uniform random labels, drawn from `o.seed` and s alone, so two runs
/// with one seed see the same batches.
inline TrainedModel train_steps(models::Model model, const TrainOptions& o) {
  TrainedModel r;
  r.model = std::move(model);
  launch::TrainProgramOptions po;  // momentum 0.9, the gradient all-reduce of one rank
  po.precision = !o.amp ? amp::Precision::fp32 : o.low == DType::bf16 ? amp::Precision::bf16 : amp::Precision::amp;
  po.amp.fold_casts = o.fold_casts;
  po.amp.inject = o.inject;
  po.passes = {o.recompute_softmax, o.fuse_add_relu,  o.fuse_param_casts,    o.fuse_bn_relu,
               o.fuse_matmul_bias,  o.fold_grad_sums, o.fuse_add_layer_norm, o.elide_single_rank_sync};
  po.grad_sync->bucket_bytes = o.bucket_bytes;
  po.grad_sync->overlap = o.overlap;
  r.train = launch::build_train_program(r.model.program, r.model.loss, po);
  const std::set<std::string>& keep = r.train.read_back;

  initialize_persistables(r.model.program, r.scope, o.seed);
  r.scope.get(optim::kLearningRate).data<float>()[0] = 0.05f;
  for (const VarDesc& v : r.model.program.vars())
    if (v.persistable) r.scope.set(v.name, r.scope.get(v.name).to(o.device));

  auto comm = collective::make_local_communicator();  // world 1: the all-reduces, where kept, are the identity
  Executor step(r.model.program, keep);
  std::unique_ptr<StepGraph> graph;
  if (o.make_graph)
    graph = std::make_unique<StepGraph>(r.model.program, step, std::vector<std::string>{r.model.input, r.model.label},
                                        std::vector<std::string>(keep.begin(), keep.end()), o.make_graph(r));
  ExecEnv env;
  env.comm = comm.get();
  env.device = o.device;
  Shape x_shape{o.batch};
  x_shape.insert(x_shape.end(), r.model.example_shape.begin(), r.model.example_shape.end());
  Shape label_shape{o.batch};
  label_shape.insert(label_shape.end(), r.model.label_shape.begin(), r.model.label_shape.end());
  const auto classes = static_cast<uint64_t>(r.model.num_classes);
  for (int s = 0; s < o.steps; ++s) {
    Rng rng = Rng::for_stream(o.seed + 10, static_cast<uint64_t>(s));
    if (r.model.input_dtype == DType::u8 || o.pixels_to_input) {
      // A pixel model's example is [S, S, C]; an f32 image model's [C, S, S].
      const Shape& e = r.model.example_shape;
      const Shape pixel_shape = r.model.input_dtype == DType::u8 ? x_shape : Shape{o.batch, e[1], e[2], e[0]};
      Tensor pixels = Tensor::empty(pixel_shape, DType::u8);
      for (int64_t i = 0; i < pixels.numel(); ++i) pixels.data<uint8_t>()[i] = static_cast<uint8_t>(rng.below(256));
      r.scope.set(r.model.input, (o.pixels_to_input ? o.pixels_to_input(pixels) : pixels).to(o.device));
    } else if (r.model.input_dtype == DType::i64) {  // tokens
      Tensor tokens = Tensor::empty(x_shape, DType::i64);
      for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int64_t>()[i] = static_cast<int64_t>(rng.below(classes));
      r.scope.set(r.model.input, tokens.to(o.device));
    } else {
      std::vector<float> x(static_cast<size_t>(shape_numel(x_shape)));
      for (auto& v : x) v = static_cast<float>(rng.normal());
      r.scope.set(r.model.input, Tensor::from_floats(x_shape, x).to(o.device));
    }
    Tensor labels = Tensor::empty(label_shape, DType::i64);
    for (int64_t i = 0; i < labels.numel(); ++i) labels.data<int64_t>()[i] = static_cast<int64_t>(rng.below(classes));
    r.scope.set(r.model.label, labels.to(o.device));
    env.step = s + 1;
    if (graph) {
      const StepGraph::Ran ran = graph->run(r.scope, env);
      if (o.ran) o.ran->push_back(ran);
    } else {
      step.run(r.scope, env);
    }
    r.losses.push_back(r.scope.get(r.model.loss).item_float());
    if (!r.train.found_inf.empty()) r.found_inf.push_back(r.scope.get(r.train.found_inf).item_float());
  }
  return r;
}

/// A tiny GPT for the whole-step passes' tests: 2 blocks, d_model 16, 2
/// heads, context 8, vocabulary 40; `tied`: the output layer reuses wte.
inline models::Model tiny_gpt_model(bool tied, double dropout = 0.0) {
  return models::build_transformer(models::TransformerConfig{
      .layers = 2, .d_model = 16, .heads = 2, .context = 8, .vocab = 40, .tie_weights = tied, .dropout = dropout});
}

/// out = 2 x: an op that reads `x` and writes `out` (in place when they are
/// one), for the passes' tests of what may lie between two ops.
inline OpDesc doubling_op(const std::string& x, const std::string& out) {
  return make_op("scale", {{"X", {x}}}, {{"Out", {out}}}, {{"scale", 2.0}, {"bias", 0.0}});
}

/// The pipeline step whose name starts with `prefix` ("fold_grad_sums"); a
/// failed check when there is none.
inline const launch::PassRun& pass_named(const launch::TrainProgram& t, const std::string& prefix) {
  for (const launch::PassRun& p : t.passes)
    if (p.name.rfind(prefix, 0) == 0) return p;
  FAIL("no pass named " << prefix);
  return t.passes.front();
}

/// How many ops of `type` the program has.
inline int count_ops(const Program& p, const std::string& type) {
  int n = 0;
  for (const OpDesc& op : p.ops()) n += op.type == type;
  return n;
}

/// The options of `m`'s training program as mixtrain makes it for one rank
/// (momentum SGD, AMP or FP32) before its whole-step passes.
inline launch::TrainProgramOptions program_options(bool use_amp) {
  launch::TrainProgramOptions o;
  o.precision = use_amp ? amp::Precision::amp : amp::Precision::fp32;
  o.passes = launch::StepPasses::none();
  return o;
}

/// `m`'s training program as program_options(use_amp) describes it, untrained.
inline Program training_program(models::Model m, bool use_amp) {
  launch::build_train_program(m.program, m.loss, program_options(use_amp));
  return m.program;
}

/// A narrow resnet-small (width 4, two stages of one basic block) on
/// `image_size`-square images, for training steps; `in_channels` of them, or
/// with `pixels` RGB 8-bit pixels it normalises itself (image_normalize).
inline models::Model narrow_resnet(bool channels_last = false, int64_t image_size = 8, bool bottleneck = false,
                                   std::optional<models::PixelInput> pixels = std::nullopt, int64_t in_channels = 1) {
  models::ResNetConfig cfg = models::resnet_preset("resnet-small");
  cfg.bottleneck = bottleneck;  // ResNet-50's 1x1-3x3-1x1 blocks
  cfg.width = 4;
  cfg.blocks = {1, 1};
  cfg.image_size = image_size;
  cfg.channels_last = channels_last;
  cfg.in_channels = pixels ? 3 : in_channels;
  cfg.pixel_input = std::move(pixels);
  return models::build_resnet(cfg, "resnet-small");
}

/// ImageNet's per-channel constants (torchvision's Normalize) as a pixel input.
inline models::PixelInput imagenet_pixels() { return {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}}; }

/// Two runs of one model, trained two ways that must agree bit for bit: the
/// same losses, which moved (the steps trained), the same steps skipped (AMP),
/// and every persistable (parameters, optimizer and scaler state, running
/// statistics) the same bytes, wherever it lives.
inline void expect_same_training(const TrainedModel& a, const TrainedModel& b) {
  CHECK(a.losses == b.losses);
  CHECK(a.losses.front() != a.losses.back());
  CHECK(a.found_inf == b.found_inf);
  for (const VarDesc& v : b.model.program.vars()) {
    if (!v.persistable) continue;
    INFO(v.name);
    const Tensor ta = a.scope.get(v.name).to(cpu_device());
    const Tensor tb = b.scope.get(v.name).to(cpu_device());
    REQUIRE(ta.bytes() == tb.bytes());
    CHECK(std::memcmp(ta.raw(), tb.raw(), ta.bytes()) == 0);
  }
}

}  // namespace mix::testing
