// [cuda] Whole training steps on the GPU against the same steps on the CPU:
// the MLP in FP32 and in AMP (momentum SGD, 3 steps), every parameter and
// momentum buffer compared. Without a GPU: exit 77 (CTest: skipped).
#include <catch2/catch.hpp>

#include "tests/unit/require_gpu.h"
#include <cmath>
#include <cstdlib>

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

// Unused in builds without CUDA, where the test only reports itself skipped.
[[maybe_unused]] Run train(bool use_amp, Device device, int steps) {
  Run r;
  r.model = models::build_mlp({64, {48, 32}, 10});
  std::unique_ptr<optim::Optimizer> opt = optim::make_momentum(0.9);
  if (use_amp) opt = amp::decorate(std::move(opt));
  collective::GradSyncOptions sync;
  sync.mode = use_amp ? collective::GradReduce::fp16 : collective::GradReduce::fp32;
  opt->minimize(r.model.program, r.model.loss, collective::grad_allreduce_pass(sync));
  initialize_persistables(r.model.program, r.scope, 3);
  for (const VarDesc& v : r.model.program.vars())
    if (v.persistable) r.scope.set(v.name, r.scope.get(v.name).to(device));
  r.scope.get(optim::kLearningRate).copy_from(Tensor::from_floats({1}, {0.05f}));

  auto comm = collective::make_local_communicator();  // world 1: the all-reduces are the identity
  Executor step(r.model.program, {r.model.loss});
  ExecEnv env;
  env.comm = comm.get();
  env.device = device;
  for (int s = 0; s < steps; ++s) {
    Rng rng = Rng::for_stream(11, static_cast<uint64_t>(s));
    std::vector<float> x(32 * 64);
    for (auto& v : x) v = static_cast<float>(rng.normal());
    Tensor labels = Tensor::empty({32, 1}, DType::i64);
    for (int i = 0; i < 32; ++i) labels.data<int64_t>()[i] = static_cast<int64_t>(rng.below(10));
    r.scope.set(r.model.input, Tensor::from_floats({32, 64}, x).to(device));
    r.scope.set(r.model.label, labels.to(device));
    env.step = s + 1;
    step.run(r.scope, env);
  }
  return r;
}

}  // namespace

TEST_CASE("MLP training steps on the GPU match the CPU", "[cuda]") {
  mix::testing::require_gpu();
#ifdef MIX_HAVE_CUDA
  const Device gpu{DeviceKind::cuda, 0};
  for (bool use_amp : {false, true}) {
    INFO((use_amp ? "AMP" : "FP32"));
    Run cpu = train(use_amp, cpu_device(), 3);
    Run dev = train(use_amp, gpu, 3);
    // FP32: the GEMMs sum in another order (cuBLAS vs OpenBLAS) and nvcc fuses
    // multiply-adds: ~1e-6 relative per step, so 1e-4 of the tensor's scale after
    // 3 steps is generous but still far below a wrong gradient (O(1) relative).
    // AMP: FP16 storage (2^-11) of activations and gradients, the same rounding
    // points on both devices, but a different summation order can flip a rounding:
    // allow 1e-2 of the tensor's scale.
    const double tol = use_amp ? 1e-2 : 1e-4;
    for (const VarDesc& v : cpu.model.program.vars()) {
      if (!v.persistable || v.dtype != DType::f32) continue;
      std::vector<float> a = cpu.scope.get(v.name).to_floats(), b = dev.scope.get(v.name).to_floats();
      REQUIRE(a.size() == b.size());
      double scale = 0, worst = 0;
      for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::abs(static_cast<double>(a[i])));
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
      INFO(v.name << ": worst difference " << worst << " against scale " << scale);
      CHECK(worst <= tol * std::max(scale, 1e-6));
    }
    CHECK(cpu.scope.get(cpu.model.loss).item_float() ==
          Approx(dev.scope.get(dev.model.loss).item_float()).epsilon(use_amp ? 1e-2 : 1e-4));
  }
#endif
}
