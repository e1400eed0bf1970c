// Whole-model parity with PyTorch: the MLP's loss, its parameter gradients and
// the parameters after 1 and 4 steps of SGD, momentum SGD and AdamW must match
// what torch computes from the same initial parameters and batch.
//
// The reference values come from tests/python/mlp_reference.py, run here at test
// time with Debian's /usr/bin/python3 (python3-torch; scripts/setup.sh installs
// it). It writes a safetensors file with the initial parameters (`init.<name>`),
// the batch (`x`, `label`), the loss and gradients at the initial parameters
// (`loss`, `grad.<name>`; also `loss64`/`grad64.<name>`, the same in float64), and
// the parameters after 1 and 1 + 3 steps of each optimizer (`<opt>.<name>`,
// `<opt>3.<name>`), with the optimizers' hyperparameters in the metadata.
//
// Every comparison is elementwise |got - want| <= abs + rel * |want|, where abs
// may include a part scaled by the tensor's largest |want| (`of_max`): an element
// that is the sum of terms of either sign loses relative accuracy, never absolute
// accuracy measured against the size of its terms. Each tolerance says why it is
// what it is where it is defined. MIX_PARITY_VERBOSE=1 prints the error of every
// check next to its tolerance (to review the margins).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "launch/train_program.h"
#include "models/model.h"
#include "runtime/core/check.h"
#include "runtime/exec/executor.h"
#include "runtime/exec/init.h"
#include "runtime/io/safetensors.h"
#include "runtime/ir/op_registry.h"
#include "runtime/optim/optimizer.h"
#include "tests/unit/parity.h"

namespace {

using mix::DType;
using mix::Executor;
using mix::ExecEnv;
using mix::Scope;
using mix::Tensor;
using mix::grad_name;
using mix::testing::Tol;
using mix::testing::check_close;
using mix::testing::verbose;

struct Reference {
  mix::io::SafetensorsFile file;
  std::vector<int64_t> sizes;  // in, hidden..., classes
  int64_t batch = 0;

  const Tensor& get(const std::string& name) const {
    const Tensor* t = file.find(name);
    if (!t) FAIL("the reference file has no tensor '" << name << "' (is tests/python/mlp_reference.py current?)");
    return *t;
  }
  double num(const std::string& key) const {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end()) FAIL("the reference file's metadata has no '" << key << "'");
    return std::stod(it->second);
  }
};

// Runs the reference script once per test process and reads its file.
const Reference& reference() {
  static const Reference ref = [] {
    Reference r;
    r.file = mix::testing::run_reference_script("mlp_reference.py");
    r.sizes = mix::testing::split_ints(r.file.metadata.at("sizes"));
    r.batch = std::stoll(r.file.metadata.at("batch"));
    REQUIRE(r.sizes.size() >= 2);
    return r;
  }();
  return ref;
}

// ---- comparisons -----------------------------------------------------------------

Tensor scalar(float v) { return Tensor::from_floats({1}, {v}); }

// ---- our side: the MLP, a training program, a scope ------------------------------

enum class Precision { fp32, amp };

// One training setup: the model, its training program (launch::build_train_program with the
// gradient all-reduce pass over the local communicator), the reference's
// initial parameters in the scope, the batch fed.
class Trainer {
 public:
  Trainer(const Reference& ref, const mix::optim::OptimizerOptions& opt, double lr, Precision precision)
      : ref_(ref), comm_(mix::collective::make_local_communicator()) {
    mix::models::MlpConfig mc;
    mc.in_features = ref.sizes.front();
    mc.hidden.assign(ref.sizes.begin() + 1, ref.sizes.end() - 1);
    mc.num_classes = ref.sizes.back();
    model_ = mix::models::build_mlp(mc);
    mix::launch::TrainProgramOptions o;  // AMP's defaults: Paddle lists, dynamic scale 32768, FP16 all-reduce
    o.precision = precision == Precision::amp ? mix::amp::Precision::amp : mix::amp::Precision::fp32;
    o.optimizer = opt;
    o.passes = mix::launch::StepPasses::none();
    train_ = mix::launch::build_train_program(model_.program, model_.loss, o);

    std::set<std::string> keep{model_.loss};
    for (auto& [param, grad] : train_.param_grads) keep.insert(grad);
    if (!train_.found_inf.empty()) keep.insert(train_.found_inf);
    exec_ = std::make_unique<Executor>(model_.program, keep);

    mix::initialize_persistables(model_.program, scope_, 1);
    const std::vector<std::string> params = model_.program.parameters();
    REQUIRE(params.size() == 2 * (ref.sizes.size() - 1));
    for (const std::string& name : params) {
      const Tensor& init = ref.get("init." + name);
      Tensor& p = scope_.get(name);
      INFO("parameter " << name);
      REQUIRE(p.shape() == init.shape());
      REQUIRE(init.dtype() == DType::f32);
      scope_.set(name, init.clone());
    }
    scope_.get(mix::optim::kLearningRate).data<float>()[0] = static_cast<float>(lr);
    env_.comm = comm_.get();
  }

  // One training step on the reference batch; returns the loss it computed.
  float step() {
    scope_.set(model_.input, ref_.get("x").clone());
    scope_.set(model_.label, ref_.get("label").clone());
    env_.step = ++steps_;
    exec_->run(scope_, env_);
    if (!train_.found_inf.empty()) REQUIRE(scope_.get(train_.found_inf).item_float() == 0.f);
    return scope_.get(model_.loss).item_float();
  }

  const Tensor& param(const std::string& name) const { return scope_.get(name); }
  std::vector<std::string> params() const { return model_.program.parameters(); }
  const mix::optim::ParamGrads& param_grads() const { return train_.param_grads; }
  const Tensor& var(const std::string& name) const { return scope_.get(name); }

 private:
  const Reference& ref_;
  std::unique_ptr<mix::collective::Communicator> comm_;
  mix::models::Model model_;
  mix::launch::TrainProgram train_;
  std::unique_ptr<Executor> exec_;
  Scope scope_;
  ExecEnv env_;
  int64_t steps_ = 0;
};

// ---- FP32 tolerances -------------------------------------------------------------
// Both sides compute in FP32 (unit roundoff u = 2^-24 = 6e-8) from the same FP32
// inputs, but sum in different orders (OpenBLAS vs MKL-DNN/ATen blocking, our
// softmax and mean vs ATen's log_softmax + nll_loss). The error of a K-term sum
// grows like u * sqrt(K) (random) to u * K (worst) times the size of its terms.

// The loss is ~2.3 after three layers (K = 784, 64, 32) and a 10-way log-sum-exp:
// both sides land within a few 1e-7 relative of the exact value; 1e-5 relative is
// ~30x that, and far below anything a wrong formula (a missing 1/B, a wrong
// class) would change (~1e-1).
constexpr Tol kLossTol{1e-6, 0, 1e-5};

// Gradients: backward adds at most K = 784 (fc1, through dX) or B = 16 terms of
// either sign per element, so an element that cancels keeps an absolute error
// relative to the size of the tensor's terms, not to its own size: 1e-5 of the
// tensor's largest |grad| (~100x the u * sqrt(K) * few-layers figure) plus 1e-4
// relative. A transposed or mis-scaled gradient is off by O(1) of max|grad|.
constexpr Tol kGradTol{1e-9, 1e-5, 1e-4};

// SGD and momentum parameters: p - lr * (velocity); the parameter itself carries
// one rounding (u * |p|, |p| <= 1/sqrt(in) ~ 0.2), the update carries lr times
// the gradient's error (lr = 0.1, gradient error <= 1e-5 * max|grad| ~ 1e-6).
// After 4 steps the gradients are taken at slightly different parameters, so
// errors compound a little; 1e-6 absolute + 1e-5 relative bounds all of it with
// margin, while one update's worth (lr * |grad| ~ 1e-3 .. 1e-2) is far outside.
constexpr Tol kParamTol{1e-6, 0, 1e-5};

// AdamW parameters. A step moves each parameter by about lr * m / sqrt(v) ~ lr =
// 1e-3 times +-1 (the first step is lr * sign(g) exactly, less the decay), almost
// independent of |g|, so an error in g matters only through its sign. The
// update's own FP32 arithmetic is ~1e-7 of lr; 1e-6 absolute (1e-3 of one step) +
// 1e-5 relative of |p| is generous for that, and a wrong bias correction, a
// coupled instead of decoupled weight decay, or a missed step is off by ~lr.
// Elements whose reference gradient is nonzero but within the gradient tolerance
// of zero have no well-defined sign (either side may round to the other sign);
// they are allowed the full 2 * lr * steps and counted (they must be rare). The
// sign test uses the gradient at the initial parameters for the 4-step check
// too: a heuristic, but the parameters move by ~4e-3 at most in 4 steps.
constexpr Tol kAdamTol{1e-6, 0, 1e-5};

// ---- AMP tolerances ---------------------------------------------------------------
// FP16 keeps 11 significant bits: every FP16 store rounds with relative error up
// to u16 = 2^-11 = 4.9e-4 (~2.8e-4 rms). Under AMP the inputs x, the weight
// casts and the outputs of the mul ops (white list) are stored in FP16, while
// the products accumulate in FP32 over K = 784, 64, 32. A dot product of K terms
// whose two factors each carry an independent rounding error is then off by
// ~sqrt(2) * u16 * (rms term) * sqrt(K), and the result itself has size
// ~(rms term) * sqrt(K): ~7e-4 relative of a typical output, plus u16 for
// storing the output in FP16. Over three layers that is ~1e-3 relative on the
// logits (|logit| ~ 0.3, so ~3e-4 absolute); the loss, a mean over B = 16 of
// log-sum-exp minus a logit, moves by ~1e-4 (independent errors average down).
// 5e-4 absolute + 2e-4 relative (~1e-3 at a loss of 2.3) allows ~10x that, while
// a loss left multiplied by the scale, or computed from wrongly cast values, is
// off by orders of magnitude more.
constexpr Tol kAmpLossTol{5e-4, 0, 2e-4};

// AMP gradients: the FP32 master gradients after check_finite_and_unscale, which
// is what the optimizer reads. The backward of each mul reads FP16 activations
// and FP16 output gradients (the loss gradient is scaled by 2^15, so nothing
// underflows), and writes an FP16 weight gradient summed over B = 16 in FP32:
// ~sqrt(2) * u16 of the terms' size times sqrt(16), i.e. ~u16 of a typical
// element, on top of the forward errors flowing in (~1e-3 relative), and a relu
// whose pre-activation is within FP16 rounding of zero can flip. An element that
// cancels keeps the error of its terms, so the bound is against the tensor's
// largest |grad|: 5e-3 of it + 5e-3 relative is ~10 u16, several times the
// ~1e-3 these give (measured: 6e-4 of max|grad| at worst); forgetting to unscale
// is off by 32768x, a gradient through the wrong cast or of the wrong sign by O(1).
constexpr Tol kAmpGradTol{1e-9, 5e-3, 5e-3};

// A lower bound, so that the AMP test cannot pass by not being AMP: FP16 storage
// must make the gradients differ from FP32 torch by more than FP32 noise ever
// does (~1e-7 of max|grad|, see kGradTol), here at least 1e-5 of max|grad|.
constexpr double kAmpMinDeviation = 1e-5;

mix::optim::OptimizerOptions make(const Reference& ref, const std::string& opt) {
  mix::optim::OptimizerOptions o;
  o.weight_decay = 0;
  if (opt == "sgd") {
    o.kind = mix::optim::OptimizerKind::sgd;
  } else if (opt == "momentum") {
    o.kind = mix::optim::OptimizerKind::momentum;
    o.momentum = ref.num("momentum.momentum");
  } else {
    o.kind = mix::optim::OptimizerKind::adamw;
    o.beta1 = ref.num("adamw.beta1");
    o.beta2 = ref.num("adamw.beta2");
    o.eps = ref.num("adamw.eps");
    o.weight_decay = ref.num("adamw.weight_decay");
  }
  return o;
}

// AdamW comparison: kAdamTol, except for elements whose reference gradient is
// within the gradient tolerance of zero (no reliable sign), which may differ by
// a whole step per step taken.
void check_adamw_params(const std::string& what, const Tensor& got, const Tensor& want, const Tensor& grad_ref,
                        double lr, int steps) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  const std::vector<float> g = got.to_floats(), w = want.to_floats(), gr = grad_ref.to_floats();
  double gmax = 0;
  for (float v : gr) gmax = std::max(gmax, std::fabs(static_cast<double>(v)));
  std::vector<float> strict_got, strict_want;
  size_t ambiguous = 0, ambiguous_bad = 0, ambiguous_lenient = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double gtol = kGradTol.abs + kGradTol.of_max * gmax + kGradTol.rel * std::fabs(gr[i]);
    // An exact zero is structural (a relu closed for the whole batch): both sides get exactly 0, so
    // the update is exactly the decay, and any difference is a real one.
    if (gr[i] != 0.f && std::fabs(static_cast<double>(gr[i])) <= gtol) {
      ++ambiguous;
      ambiguous_lenient += !(std::fabs(static_cast<double>(g[i]) - w[i]) <= kAdamTol.abs + kAdamTol.rel * std::fabs(w[i]));
      // Each step moves a parameter by at most about lr (|m / sqrt(v)| <= ~1 when g has one sign); allow
      // the two sides opposite signs on every step.
      if (!(std::fabs(static_cast<double>(g[i]) - w[i]) <= 2.0 * lr * steps + kAdamTol.abs + kAdamTol.rel * std::fabs(w[i])))
        ++ambiguous_bad;
      continue;
    }
    strict_got.push_back(g[i]);
    strict_want.push_back(w[i]);
  }
  const int64_t n = static_cast<int64_t>(strict_want.size());
  check_close(what + " (elements with a clear gradient sign)", Tensor::from_floats({n}, strict_got),
              Tensor::from_floats({n}, strict_want), kAdamTol);
  INFO(ambiguous << " of " << w.size() << " elements have a reference gradient within tolerance of 0");
  CHECK(ambiguous_bad == 0);
  CHECK(ambiguous <= std::max<size_t>(2, w.size() / 100));
  if (verbose())
    std::fprintf(stderr, "[parity] %-70s %zu elements with no reliable gradient sign, %zu of them over kAdamTol\n",
                 what.c_str(), ambiguous, ambiguous_lenient);
}

}  // namespace

TEST_CASE("MLP loss and gradients match PyTorch in FP32", "[parity][torch]") {
  const Reference& ref = reference();
  Trainer t(ref, make(ref, "sgd"), ref.num("sgd.lr"), Precision::fp32);
  const float loss = t.step();
  check_close("loss vs torch", scalar(loss), ref.get("loss"), kLossTol);
  check_close("loss vs float64", scalar(loss), ref.get("loss64"), kLossTol);
  REQUIRE(t.param_grads().size() == t.params().size());
  for (auto& [param, grad] : t.param_grads()) {
    CHECK(grad == param + "@GRAD");
    check_close("gradient " + grad + " vs torch", t.var(grad), ref.get("grad." + param), kGradTol);
    check_close("gradient " + grad + " vs float64", t.var(grad), ref.get("grad64." + param), kGradTol);
  }
  // Sanity of the reference itself: torch FP32 against float64, same tolerance.
  check_close("torch loss vs float64", ref.get("loss"), ref.get("loss64"), kLossTol);
  for (const std::string& p : t.params())
    check_close("torch gradient of " + p + " vs float64", ref.get("grad." + p), ref.get("grad64." + p), kGradTol);
}

TEST_CASE("MLP parameters after 1 and 4 optimizer steps match PyTorch", "[parity][torch]") {
  const Reference& ref = reference();
  const int extra = static_cast<int>(ref.num("extra_steps"));
  for (const std::string opt : {"sgd", "momentum", "adamw"}) {
    SECTION(opt) {
      const double lr = ref.num(opt + ".lr");
      Trainer t(ref, make(ref, opt), lr, Precision::fp32);
      const Tensor& losses = ref.get(opt + ".loss");
      REQUIRE(losses.numel() == 1 + extra);
      for (int s = 0; s <= extra; ++s) {
        const float loss = t.step();
        check_close(opt + " loss at step " + std::to_string(s + 1), scalar(loss), scalar(losses.item_float(s)),
                    kLossTol);
        if (s != 0 && s != extra) continue;
        const std::string prefix = s == 0 ? opt : opt + std::to_string(extra);
        const int steps = s + 1;
        for (const std::string& p : t.params()) {
          const std::string what = p + " after " + std::to_string(steps) + " " + opt + " step(s)";
          if (opt == "adamw")
            check_adamw_params(what, t.param(p), ref.get(prefix + "." + p), ref.get("grad." + p), lr, steps);
          else
            check_close(what, t.param(p), ref.get(prefix + "." + p), kParamTol);
        }
      }
    }
  }
}

TEST_CASE("AMP MLP loss and unscaled gradients are within FP16 tolerance of PyTorch FP32", "[parity][torch][amp]") {
  const Reference& ref = reference();
  const double lr = ref.num("sgd.lr");
  Trainer t(ref, make(ref, "sgd"), lr, Precision::amp);
  const float loss = t.step();
  check_close("AMP loss vs torch FP32", scalar(loss), ref.get("loss"), kAmpLossTol);
  // The loss scale stays at its initial 2^15 after one finite step.
  CHECK(t.var(mix::amp::ScalerVars::scale).item_float() == 32768.f);
  REQUIRE(t.param_grads().size() == t.params().size());
  for (auto& [param, grad] : t.param_grads()) {
    REQUIRE(t.var(grad).dtype() == DType::f32);
    check_close("AMP master gradient " + grad + " vs torch FP32", t.var(grad), ref.get("grad." + param), kAmpGradTol);
  }
  {
    const std::string w = t.params().front();  // fc1.weight: K = 784 in the forward, FP16 everywhere
    const std::vector<float> got = t.var(grad_name(w)).to_floats(), want = ref.get("grad." + w).to_floats();
    double max_diff = 0, max_want = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
      max_want = std::max(max_want, std::fabs(static_cast<double>(want[i])));
    }
    INFO("the AMP gradient of " << w << " differs from FP32 torch by at most " << max_diff << ", max |grad| "
                                << max_want << ": did the forward and backward run in FP16 at all?");
    CHECK(max_diff > kAmpMinDeviation * max_want);
  }
  // The SGD step applied the unscaled gradient to the FP32 masters: the
  // parameters differ from torch's by lr times the gradient error at most.
  for (const std::string& p : t.params()) {
    const Tensor& g = ref.get("grad." + p);
    double gmax = 0;
    for (float v : g.to_floats()) gmax = std::max(gmax, std::fabs(static_cast<double>(v)));
    const Tol tol{kParamTol.abs + lr * (kAmpGradTol.of_max * gmax), 0, kParamTol.rel};
    check_close(p + " after 1 AMP SGD step vs torch FP32", t.param(p), ref.get("sgd." + p), tol);
  }
}
