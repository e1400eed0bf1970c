// [cuda] Whole training steps on the GPU against the same steps on the CPU, in
// FP32 and in AMP (momentum SGD): the MLP (cuBLAS, 3 steps) and a narrow
// resnet-small (cuDNN convolutions, batch_norm and pooling, 2 steps). Every
// FP32 persistable (parameters, momentum buffers, running statistics) and the
// last loss are compared; integer state (num_batches_tracked) must be equal.
// Without a GPU: exit 77 (CTest: skipped).
#include <catch2/catch.hpp>

#include "tests/unit/require_gpu.h"
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <vector>

#include "amp/decorate.h"
#include "collective/communicator.h"
#include "collective/grad_allreduce_pass.h"
#include "models/model.h"
#include "runtime/executor.h"
#include "runtime/init.h"
#include "runtime/random.h"

#ifdef MIX_HAVE_CUDA
#include "runtime/cuda/context.h"
#endif

using namespace mix;

namespace {

struct Run {
  models::Model model;
  Scope scope;
};

/// `steps` momentum-SGD steps of `model` on `device` from the state seeded by
/// `seed`; batch s has inputs N(0, 1) of the model's example shape and random labels.
// Unused in builds without CUDA, where the tests only report themselves skipped.
[[maybe_unused]] Run train(models::Model model, bool use_amp, Device device, int steps, int64_t batch, uint64_t seed) {
  Run r;
  r.model = std::move(model);
  std::unique_ptr<optim::Optimizer> opt = optim::make_momentum(0.9);
  if (use_amp) opt = amp::decorate(std::move(opt));
  collective::GradSyncOptions sync;
  sync.mode = use_amp ? collective::GradReduce::fp16 : collective::GradReduce::fp32;
  opt->minimize(r.model.program, r.model.loss, collective::grad_allreduce_pass(sync));
  initialize_persistables(r.model.program, r.scope, seed);
  for (const VarDesc& v : r.model.program.vars())
    if (v.persistable) r.scope.set(v.name, r.scope.get(v.name).to(device));
  r.scope.get(optim::kLearningRate).copy_from(Tensor::from_floats({1}, {0.05f}));

  auto comm = collective::make_local_communicator();  // world 1: the all-reduces are the identity
  Executor step(r.model.program, {r.model.loss});
  ExecEnv env;
  env.comm = comm.get();
  env.device = device;
  Shape x_shape{batch};
  x_shape.insert(x_shape.end(), r.model.example_shape.begin(), r.model.example_shape.end());
  for (int s = 0; s < steps; ++s) {
    Rng rng = Rng::for_stream(seed + 10, static_cast<uint64_t>(s));
    std::vector<float> x(static_cast<size_t>(shape_numel(x_shape)));
    for (auto& v : x) v = static_cast<float>(rng.normal());
    Tensor labels = Tensor::empty({batch, 1}, DType::i64);
    for (int64_t i = 0; i < batch; ++i)
      labels.data<int64_t>()[i] = static_cast<int64_t>(rng.below(static_cast<uint64_t>(r.model.num_classes)));
    r.scope.set(r.model.input, Tensor::from_floats(x_shape, x).to(device));
    r.scope.set(r.model.label, labels.to(device));
    env.step = s + 1;
    step.run(r.scope, env);
  }
  return r;
}

/// Every FP32 persistable within `tol` of its tensor's largest |value| (CPU run as
/// the reference), integer persistables equal, and the losses within `loss_rel`.
[[maybe_unused]] void compare(const Run& cpu, const Run& dev, double tol, double loss_rel) {
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
    INFO(v.name << ": worst difference " << worst << " against scale " << scale);
    CHECK(worst <= tol * std::max(scale, 1e-6));
  }
  // The loss of the last step: the forward differences of the state before it.
  CHECK(cpu.scope.get(cpu.model.loss).item_float() ==
        Approx(dev.scope.get(dev.model.loss).item_float()).epsilon(loss_rel));
}

}  // namespace

TEST_CASE("MLP training steps on the GPU match the CPU", "[cuda]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  const Device gpu{DeviceKind::cuda, 0};
  for (bool use_amp : {false, true}) {
    INFO((use_amp ? "AMP" : "FP32"));
    auto mlp = [] { return models::build_mlp({64, {48, 32}, 10}); };
    Run cpu = train(mlp(), use_amp, cpu_device(), 3, 32, 1);
    Run dev = train(mlp(), use_amp, gpu, 3, 32, 1);
    // FP32: the GEMMs sum in another order (cuBLAS vs OpenBLAS) and nvcc fuses
    // multiply-adds: ~1e-6 relative per step, so 1e-4 of the tensor's scale after
    // 3 steps is generous but still far below a wrong gradient (O(1) relative).
    // AMP: FP16 storage (2^-11) of activations and gradients, the same rounding
    // points on both devices, but a different summation order can flip a rounding:
    // allow 1e-2 of the tensor's scale.
    compare(cpu, dev, use_amp ? 1e-2 : 1e-4, use_amp ? 1e-2 : 1e-4);
  }
#endif
}

TEST_CASE("ResNet training steps on the GPU (cuDNN) match the CPU", "[cuda][resnet]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  cuda::set_allow_tf32(false);
  const Device gpu{DeviceKind::cuda, 0};
  for (bool use_amp : {false, true}) {
    INFO((use_amp ? "AMP" : "FP32"));
    auto resnet = [] {
      models::ResNetConfig cfg = models::resnet_preset("resnet-small");
      cfg.width = 4;
      cfg.blocks = {1, 1};
      cfg.image_size = 16;
      return models::build_resnet(cfg, "resnet-small");
    };
    Run cpu = train(resnet(), use_amp, cpu_device(), 2, 8, 5);
    Run dev = train(resnet(), use_amp, gpu, 2, 8, 5);
    // FP32: every op agrees to ~1e-6 relative of its terms, but batch_norm's
    // backward cancels (dy - mean(dy) - xhat·mean(dy·xhat)) and its parameter
    // gradients are sums of batch·H·W = 2048 terms that cancel, summed in
    // double on the CPU and in FP32 by cuDNN (up to m·u ~ 1e-4 of sum|dy|); a
    // ReLU input within that error of 0 may also switch sides. 1e-3 of each
    // tensor's scale after 2 steps allows that; a wrong kernel is O(1) off.
    // AMP: FP16 activations and gradients (2^-11 per rounding, the same
    // rounding points on both devices), so a different summation order can flip
    // a rounding, and more ReLU inputs switch sides: 2e-2 of the scale.
    compare(cpu, dev, use_amp ? 2e-2 : 1e-3, use_amp ? 1e-2 : 1e-4);
  }
#endif
}
