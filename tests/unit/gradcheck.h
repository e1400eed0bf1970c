#pragma once
// Gradient checks for single ops, run through the real IR: Program, autodiff
// (seed_loss_gradient + append_backward) and Executor, exactly as training
// runs them.
//
// For an op under test the harness builds
//     out   = op(inputs)                         float inputs are trainable parameters
//     L     = numel * mean(cast_f32(out) * R)    = sum(out * R), R fixed and random
// so that dL/d(out) = R and dL/d(input) is the op's vector-Jacobian product
// with R. Several projected outputs add their L terms. Integer inputs (labels)
// are stop_gradient feeds.
//
//   check_gradients_fd:  FP32 analytic gradients against central differences.
//   check_low_precision: the op run in FP16 (or BF16) against the same op in
//                        FP32 on the same (exactly representable) values:
//                        outputs and gradients within a tolerance for that
//                        dtype's rounding.
//
// MIX_GRADCHECK_VERBOSE=1 prints every comparison's largest error and its
// ratio to the allowed one (how the tolerances below were calibrated).
//
// Header-only (each tests/unit/test_*.cc is its own executable).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/random.h"
#include "runtime/core/tensor.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/autodiff.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "runtime/ops/gemm.h"

namespace mix::testing {

// ---- tensors for tests ----------------------------------------------------------

/// f32 tensor of uniform values in [lo, hi).
inline Tensor uniform_tensor(const Shape& shape, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  Rng rng = Rng::for_stream(seed, 17);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = rng.uniform(lo, hi);
  return Tensor::from_floats(shape, v);
}

/// Uniform values with |x| in [min_abs, max_abs] and random sign: for ops with a
/// kink at 0 (relu), so that no finite-difference step crosses it.
inline Tensor away_from_zero_tensor(const Shape& shape, uint64_t seed, float min_abs = 0.1f, float max_abs = 1.f) {
  Rng rng = Rng::for_stream(seed, 29);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) {
    const float m = rng.uniform(min_abs, max_abs);
    x = rng.uniform() < 0.5 ? -m : m;
  }
  return Tensor::from_floats(shape, v);
}

inline Tensor i64_tensor(const Shape& shape, const std::vector<int64_t>& values) {
  REQUIRE(shape_numel(shape) == static_cast<int64_t>(values.size()));
  Tensor t = Tensor::empty(shape, DType::i64);
  std::copy(values.begin(), values.end(), t.data<int64_t>());
  return t;
}

/// `t` (any floating dtype) converted to `dtype`, rounding on store.
inline Tensor to_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t.clone();
  Tensor out = Tensor::empty(t.shape(), dtype);
  cpu::store_f32(cpu::as_f32(t, 3), out);
  return out;
}

/// f32 values rounded through `dtype` (exactly representable there).
inline Tensor rounded_through(const Tensor& t, DType dtype) { return to_dtype(to_dtype(t, dtype), DType::f32); }

/// A VarDesc by field (aggregate initialisation would break whenever VarDesc grows a field).
inline VarDesc var_desc(const std::string& name, const Shape& shape, DType dtype) {
  VarDesc v;
  v.name = name;
  v.shape = shape;
  v.dtype = dtype;
  return v;
}

// ---- the op under test ------------------------------------------------------------

struct Input {
  std::string slot;
  Tensor value = {};             // f32 for float inputs (stored in the run's dtype), or an integer tensor
  bool differentiable = true; // float inputs only: false feeds it as a stop_gradient constant
  bool keep_f32 = false;      // float inputs that stay FP32 when the op runs in FP16 (batch_norm's Scale)
  /// The dtype this input has in a run of the op in `run`.
  DType dtype_in(DType run) const { return keep_f32 ? DType::f32 : run; }
};

struct OpCase {
  std::string type;
  std::vector<Input> inputs = {};         // one variable each; a slot given twice holds a list (sum)
  std::vector<std::string> outputs = {};  // every output slot the op writes
  std::map<std::string, Attr> attrs = {};
  std::vector<std::string> project = {};  // output keys in the loss; empty: all of output_keys()
  std::set<std::string> fp32_outputs = {}; // outputs that are FP32 whatever dtype the op runs in
  /// Output slots holding a list of variables (split's Out): slot -> count. Each
  /// variable is addressed by the key "slot#i" (in `project`, `fp32_outputs` and
  /// the maps the harness returns); a single-variable slot's key is the slot.
  std::map<std::string, size_t> list_outputs = {};

  /// Every output key, in `outputs` order.
  std::vector<std::string> output_keys() const {
    std::vector<std::string> keys;
    for (auto& slot : outputs) {
      auto it = list_outputs.find(slot);
      if (it == list_outputs.end()) {
        keys.push_back(slot);
      } else {
        for (size_t i = 0; i < it->second; ++i) keys.push_back(slot + "#" + std::to_string(i));
      }
    }
    return keys;
  }

  std::string describe() const {
    std::ostringstream o;
    o << type << "(";
    for (size_t i = 0; i < inputs.size(); ++i)
      o << (i ? ", " : "") << inputs[i].slot << "=" << dtype_name(inputs[i].value.dtype())
        << shape_str(inputs[i].value.shape());
    o << ")";
    for (auto& [k, v] : attrs) {
      o << " " << k << "=";
      std::visit(
          [&](auto&& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::vector<int64_t>>)
              o << shape_str(x);
            else if constexpr (std::is_same_v<T, std::vector<std::string>> || std::is_same_v<T, std::vector<double>>)
              o << "[...]";
            else
              o << x;
          },
          v);
    }
    return o.str();
  }
  std::vector<std::string> projected() const { return project.empty() ? output_keys() : project; }
};

/// |got - ref| <= abs + rel * |ref|.
struct Tolerance {
  double abs, rel;
};

/// The op's program, built once per float dtype: the op, the projection loss and its backward.
struct BuiltCase {
  std::unique_ptr<Program> program = std::make_unique<Program>();
  DType dtype = DType::f32;
  std::vector<std::string> input_vars;          // by input index
  std::map<std::string, std::string> out_vars;  // slot -> variable
  std::map<std::string, std::string> r_vars;    // projected slot -> its R variable
  std::map<std::string, std::string> grad_vars; // input variable -> gradient variable
  std::string loss;
  std::unique_ptr<Executor> full, forward;
};

inline std::string var_base(const std::string& slot) {
  std::string s;
  for (char c : slot) s += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : (c == '@' || c == '#' ? '_' : c);
  return s;
}

inline std::unique_ptr<BuiltCase> build_case(const OpCase& c, DType dtype) {
  auto b = std::make_unique<BuiltCase>();
  b->dtype = dtype;
  Program& p = *b->program;
  std::map<std::string, std::vector<std::string>> ins, outs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Input& in = c.inputs[i];
    VarDesc v;
    v.name = var_base(in.slot) + std::to_string(i);
    v.shape = in.value.shape();
    const bool is_float = is_floating(in.value.dtype());
    v.dtype = is_float ? in.dtype_in(dtype) : in.value.dtype();
    if (is_float && in.differentiable) {
      v.is_parameter = true;
      v.persistable = true;
    } else {
      v.stop_gradient = true;
    }
    p.add_var(v);
    ins[in.slot].push_back(v.name);
    b->input_vars.push_back(v.name);
  }
  for (auto& key : c.output_keys()) {
    const std::string name = "out_" + var_base(key);
    outs[key.substr(0, key.find('#'))].push_back(name);
    b->out_vars[key] = name;
  }
  p.append_op(make_op(c.type, ins, outs, c.attrs));

  std::vector<std::string> terms;
  for (auto& slot : c.projected()) {
    std::string o = b->out_vars.at(slot);
    const VarDesc od = p.var(o);
    const std::string base = var_base(slot);
    if (od.dtype != DType::f32) {  // project in FP32, as AMP computes the loss
      const std::string o32 = o + "_f32";
      p.append_op(make_op("cast", {{"X", {o}}}, {{"Out", {o32}}}, {{"out_dtype", std::string("f32")}}));
      o = o32;
    }
    VarDesc r;
    r.name = "r_" + base;
    r.shape = od.shape;
    r.dtype = DType::f32;
    r.stop_gradient = true;
    p.add_var(r);
    b->r_vars[slot] = r.name;
    p.append_op(make_op("elementwise_mul", {{"X", {o}}, {"Y", {r.name}}}, {{"Out", {"prod_" + base}}}));
    p.append_op(make_op("mean", {{"X", {"prod_" + base}}}, {{"Out", {"mean_" + base}}}));
    p.append_op(make_op("scale", {{"X", {"mean_" + base}}}, {{"Out", {"loss_" + base}}},
                        {{"scale", static_cast<double>(shape_numel(od.shape))}}));
    terms.push_back("loss_" + base);
  }
  b->loss = terms.at(0);
  for (size_t i = 1; i < terms.size(); ++i) {
    const std::string s = "loss_sum_" + std::to_string(i);
    p.append_op(make_op("elementwise_add", {{"X", {b->loss}}, {"Y", {terms[i]}}}, {{"Out", {s}}}));
    b->loss = s;
  }
  seed_loss_gradient(p, b->loss);
  const BackwardResult br = append_backward(p, b->loss);
  for (auto& [param, grad] : br.param_grads) b->grad_vars[param] = grad;

  std::set<std::string> keep = {b->loss};
  for (auto& [slot, v] : b->out_vars) keep.insert(v);
  for (auto& [param, grad] : b->grad_vars) keep.insert(grad);
  b->full = std::make_unique<Executor>(p, keep, all_ops);
  std::set<std::string> keep_fwd;
  for (auto& [slot, v] : b->out_vars) keep_fwd.insert(v);
  b->forward = std::make_unique<Executor>(p, keep_fwd, forward_ops);
  return b;
}

struct RunResult {
  std::map<std::string, Tensor> outputs;  // by slot, in the run's dtype
  std::vector<Tensor> grads;              // by input index; undefined where no gradient
};

/// Feeds inputs (float ones converted to the build's dtype) and R, runs the full or forward program.
inline RunResult run_case(const BuiltCase& b, const std::vector<Input>& inputs,
                          const std::map<std::string, Tensor>& r, bool with_backward) {
  Scope scope;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& v = inputs[i].value;
    scope.set(b.input_vars[i], is_floating(v.dtype()) ? to_dtype(v, inputs[i].dtype_in(b.dtype)) : v.clone());
  }
  for (auto& [slot, name] : b.r_vars) scope.set(name, r.at(slot).clone());
  ExecEnv env;
  (with_backward ? b.full : b.forward)->run(scope, env);
  RunResult res;
  for (auto& [slot, name] : b.out_vars) res.outputs[slot] = scope.get(name);
  if (with_backward) {
    res.grads.resize(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto it = b.grad_vars.find(b.input_vars[i]);
      if (it != b.grad_vars.end()) res.grads[i] = scope.get(it->second);
    }
  }
  return res;
}

/// R for every projected output: fixed random values in [-1, 1], exactly
/// representable in `dtype` so that dL/d(out) = R holds exactly in that dtype too.
inline std::map<std::string, Tensor> make_projections(const BuiltCase& b, const OpCase& c, DType dtype,
                                                      uint64_t seed) {
  std::map<std::string, Tensor> r;
  uint64_t k = 0;
  for (auto& slot : c.projected()) {
    const Shape& s = b.program->var(b.out_vars.at(slot)).shape;
    r[slot] = rounded_through(uniform_tensor(s, seed * 1000 + 7 + k++), dtype);
  }
  return r;
}

/// sum(out * R) over the projected outputs, in double on the host: the finite
/// differences then see only the op's own FP32 rounding, not the loss's.
inline double projected_loss(const RunResult& res, const OpCase& c, const std::map<std::string, Tensor>& r) {
  double l = 0.0;
  for (auto& slot : c.projected()) {
    const std::vector<float> o = res.outputs.at(slot).to_floats();
    const std::vector<float> w = r.at(slot).to_floats();
    for (size_t i = 0; i < o.size(); ++i) l += static_cast<double>(o[i]) * w[i];
  }
  return l;
}

/// Compares two float vectors elementwise; one CHECK per call, reporting the worst element.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& ref, Tolerance tol,
                         const std::string& what) {
  REQUIRE(got.size() == ref.size());
  size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double allowed = tol.abs + tol.rel * std::fabs(ref[i]);
    const bool ok = err <= allowed;  // NaN fails
    if (!ok) ++bad;
    const double excess = std::isnan(err) ? 1e300 : err - allowed;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (std::getenv("MIX_GRADCHECK_VERBOSE")) {
    double worst_ratio = 0.0, max_abs = 0.0, max_rel = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
      worst_ratio = std::max(worst_ratio, err / (tol.abs + tol.rel * std::fabs(ref[i])));
      max_abs = std::max(max_abs, err);
      if (std::fabs(ref[i]) > 1e-2) max_rel = std::max(max_rel, err / std::fabs(ref[i]));
    }
    std::printf("[gradcheck] %-60s max err %.2e, max rel err %.2e, err/allowed %.3f\n", what.c_str(), max_abs,
                max_rel, worst_ratio);
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements outside abs " << tol.abs << " + rel " << tol.rel
            << "; worst at [" << worst << "]: got " << (got.empty() ? 0.f : got[worst]) << ", expected "
            << (ref.empty() ? 0.0 : ref[worst]));
  CHECK(bad == 0);
}

inline std::vector<double> to_doubles(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// FP32 finite-difference tolerance. L is summed in double, so the difference
// quotient sees only the FP32 rounding of the op's outputs: each output touched
// by the perturbed input carries an independent error of up to u|out| (u =
// 2^-24 ~ 6e-8), and n of them add up to about sqrt(n) u |out| |R| / (2h)
// ~ 2e-4 for n ~ 10 outputs of size ~2 and h = 1e-3 (observed at most 1e-4 over
// all cases here). Truncation, h^2/6 |f'''| ~ 2e-7, is negligible. abs 5e-4
// covers the noise; rel 2e-3 covers larger gradients, whose outputs (and so
// rounding) are larger too. A wrong gradient is off by O(|g|): a missing
// factor, a transpose, a dropped batch term; even a 1% scale error fails
// wherever |g| > 0.06.
inline constexpr Tolerance kFdTolerance{5e-4, 2e-3};
// The finite-difference step, relative to the input's magnitude (never below 1e-3 absolute).
inline constexpr double kFdEps = 1e-3;

/// Analytic FP32 gradients of every differentiable float input against central differences.
inline void check_gradients_fd(const OpCase& c, Tolerance tol = kFdTolerance, uint64_t seed = 1) {
  INFO("op case: " << c.describe());
  auto b = build_case(c, DType::f32);
  const auto r = make_projections(*b, c, DType::f16, seed);
  const RunResult analytic = run_case(*b, c.inputs, r, true);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Input& in = c.inputs[i];
    if (!is_floating(in.value.dtype()) || !in.differentiable) continue;
    const Tensor& g = analytic.grads[i];
    std::vector<float> got = g.defined() && g.numel() == in.value.numel() ? g.to_floats()
                                                                          : std::vector<float>(in.value.numel(), 0.f);
    if (g.defined()) CHECK(g.shape() == in.value.shape());
    std::vector<Input> perturbed = c.inputs;
    std::vector<double> numeric(static_cast<size_t>(in.value.numel()));
    for (int64_t e = 0; e < in.value.numel(); ++e) {
      perturbed[i].value = in.value.clone();
      float* v = perturbed[i].value.data<float>();
      const float x = v[e];
      const float h = static_cast<float>(kFdEps * std::max(1.0, std::fabs(static_cast<double>(x))));
      const float xp = x + h, xm = x - h;
      v[e] = xp;
      const double lp = projected_loss(run_case(*b, perturbed, r, false), c, r);
      v[e] = xm;
      const double lm = projected_loss(run_case(*b, perturbed, r, false), c, r);
      numeric[static_cast<size_t>(e)] = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
    }
    expect_close(got, numeric, tol, "d(loss)/d(" + in.slot + " #" + std::to_string(i) + ") vs central differences");
  }
}

// FP16 tolerance for the op in FP16 against the op in FP32 on identical
// inputs. Each FP16 kernel computes in FP32 and rounds once on store (unit
// roundoff u = 2^-11 ~ 4.9e-4); a gradient may also read forward values that
// were themselves rounded (softmax's Y), and subtractions of rounded values
// (y * (dy - sum(dy y))) turn relative errors into absolute ones on the
// operands' scale (~1). 4u relative plus 4u absolute bounds both.
inline constexpr Tolerance kF16Tolerance{2e-3, 2e-3};
// BF16 has u = 2^-8 ~ 3.9e-3: the same reasoning, 4u.
inline constexpr Tolerance kBf16Tolerance{1.6e-2, 1.6e-2};

/// The op in `low` (f16 or bf16) against the op in FP32: outputs and the
/// gradients of every differentiable float input.
inline void check_low_precision(const OpCase& c, DType low = DType::f16, Tolerance tol = kF16Tolerance,
                                uint64_t seed = 2) {
  INFO("op case: " << c.describe() << " in " << dtype_name(low) << " vs f32");
  OpCase exact = c;  // the same values in both runs: representable in `low`
  for (auto& in : exact.inputs)
    if (is_floating(in.value.dtype())) in.value = rounded_through(in.value, low);
  auto b32 = build_case(exact, DType::f32);
  auto blow = build_case(exact, low);
  const auto r = make_projections(*b32, exact, low, seed);
  const RunResult ref = run_case(*b32, exact.inputs, r, true);
  const RunResult got = run_case(*blow, exact.inputs, r, true);
  for (auto& slot : c.output_keys()) {
    const Tensor& o = got.outputs.at(slot);
    if (!is_floating(o.dtype())) continue;
    CHECK(o.dtype() == (c.fp32_outputs.count(slot) ? DType::f32 : low));
    expect_close(o.to_floats(), to_doubles(ref.outputs.at(slot).to_floats()), tol, "output " + slot);
  }
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Input& in = c.inputs[i];
    if (!is_floating(in.value.dtype()) || !in.differentiable) continue;
    INFO("input " << in.slot << " #" << i);
    REQUIRE(ref.grads[i].defined());
    REQUIRE(got.grads[i].defined());
    CHECK(got.grads[i].dtype() == in.dtype_in(low));
    CHECK(got.grads[i].shape() == in.value.shape());
    expect_close(got.grads[i].to_floats(), to_doubles(ref.grads[i].to_floats()), tol,
                 "gradient of " + in.slot + " #" + std::to_string(i));
  }
}

/// Runs just the op (inputs as feeds, float ones in `dtype`) and returns its outputs by slot.
/// Also checks that the build-time inference declared the shapes and dtypes the kernel produced.
/// `training` false runs it as evaluation does (ExecEnv::training).
inline std::map<std::string, Tensor> run_forward(const OpCase& c, DType dtype = DType::f32, bool training = true) {
  Program p;
  std::map<std::string, std::vector<std::string>> ins, outs;
  Scope scope;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Input& in = c.inputs[i];
    VarDesc v;
    v.name = var_base(in.slot) + std::to_string(i);
    v.shape = in.value.shape();
    v.dtype = is_floating(in.value.dtype()) ? in.dtype_in(dtype) : in.value.dtype();
    v.stop_gradient = true;
    p.add_var(v);
    ins[in.slot].push_back(v.name);
    scope.set(v.name, is_floating(in.value.dtype()) ? to_dtype(in.value, in.dtype_in(dtype)) : in.value.clone());
  }
  std::set<std::string> keep;
  for (auto& key : c.output_keys()) {
    outs[key.substr(0, key.find('#'))].push_back("out_" + var_base(key));
    keep.insert("out_" + var_base(key));
  }
  p.append_op(make_op(c.type, ins, outs, c.attrs));
  ExecEnv env;
  env.training = training;
  Executor(p, keep).run(scope, env);
  std::map<std::string, Tensor> res;
  for (auto& slot : c.output_keys()) {
    const std::string name = "out_" + var_base(slot);
    if (!scope.has(name)) continue;  // not written in this mode (batch_norm's statistics in evaluation)
    res[slot] = scope.get(name);
    const VarDesc& d = p.var(name);
    INFO("inferred " << name << " " << dtype_name(d.dtype) << shape_str(d.shape) << ", kernel wrote "
                     << dtype_name(res[slot].dtype()) << shape_str(res[slot].shape()));
    CHECK(d.shape == res[slot].shape());
    CHECK(d.dtype == res[slot].dtype());
  }
  return res;
}

}  // namespace mix::testing
