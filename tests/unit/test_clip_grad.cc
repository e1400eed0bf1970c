// The gradient norm and clipping ops (runtime/optim/clip_grad.cc): the norm is
// the FP64 sum of squares rounded once; clip_by_global_norm scales by
// torch's coefficient, ORs a non-finite norm into the step's overflow flag
// and then leaves the gradients alone; clip_by_value clamps and lets NaN
// through. Against PyTorch on whole steps: e2e.test_cli_parity; under AMP:
// e2e.test_clip_grad.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/functors.h"
#include "runtime/optim/clip_grad.h"

using namespace mix;

namespace {

// Two FP32 gradients g0, g1 in a program built by `build`; runs it and returns the scope.
struct Grads {
  Program p;
  Scope scope;

  Grads(const std::vector<float>& g0, const std::vector<float>& g1) {
    p.add_var(VarDesc{"g0", {static_cast<int64_t>(g0.size())}, DType::f32, false, false, false, {}});
    p.add_var(VarDesc{"g1", {static_cast<int64_t>(g1.size())}, DType::f32, false, false, false, {}});
    scope.set("g0", Tensor::from_floats({static_cast<int64_t>(g0.size())}, g0));
    scope.set("g1", Tensor::from_floats({static_cast<int64_t>(g1.size())}, g1));
  }
  void run() {
    ExecEnv env;
    Executor(p, {"g0", "g1", optim::kGradNorm, "found_inf"}).run(scope, env);
  }
  float norm() const { return scope.get(optim::kGradNorm).data<float>()[0]; }
  std::vector<float> get(const char* v) const { return scope.get(v).to_floats(); }
};

}  // namespace

TEST_CASE("grad_global_norm: the L2 norm of all the gradients, summed in FP64", "[clip]") {
  Grads g({3.f, 4.f}, {12.f});
  optim::append_grad_norm(g.p, {"g0", "g1"});
  g.run();
  CHECK(g.norm() == 13.f);  // sqrt(9 + 16 + 144)
  // 1 + 2^-30 many times: FP32 partial sums would stall at 1 + ..., FP64 does not.
  std::vector<float> many(1 << 16, 1.f);
  many[0] = 4096.f;
  Grads h(many, {0.f});
  optim::append_grad_norm(h.p, {"g0", "g1"});
  h.run();
  const double want = std::sqrt(4096.0 * 4096.0 + ((1 << 16) - 1));
  CHECK(h.norm() == static_cast<float>(want));
  Grads nan({1.f, std::numeric_limits<float>::quiet_NaN()}, {1.f});
  optim::append_grad_norm(nan.p, {"g0", "g1"});
  nan.run();
  CHECK(std::isnan(nan.norm()));
}

TEST_CASE("clip_by_global_norm scales by torch's coefficient, only when the norm is above C", "[clip]") {
  for (const double c : {5.0, 100.0}) {
    INFO("C = " << c);
    Grads g({3.f, 4.f}, {12.f});
    optim::append_grad_norm(g.p, {"g0", "g1"});
    optim::append_clip_by_global_norm(g.p, {"g0", "g1"}, c, "found_inf");
    g.run();
    const float coef = c < 13 ? static_cast<float>(c) / (13.f + 1e-6f) : 1.f;
    CHECK(g.get("g0") == std::vector<float>{3.f * coef, 4.f * coef});
    CHECK(g.get("g1") == std::vector<float>{12.f * coef});
    CHECK(g.norm() == 13.f);  // grad_norm is the norm before the clip
    CHECK(g.scope.get("found_inf").data<int32_t>()[0] == 0);
    CHECK(fn::clip_coefficient(13.f, static_cast<float>(c)) == coef);
  }
}

TEST_CASE("a non-finite norm raises found_inf and leaves the gradients alone; a raised flag stays raised",
          "[clip]") {
  const float inf = std::numeric_limits<float>::infinity();
  Grads g({inf, 1.f}, {2.f});
  optim::append_grad_norm(g.p, {"g0", "g1"});
  optim::append_clip_by_global_norm(g.p, {"g0", "g1"}, 1.0, "found_inf");
  g.run();
  CHECK(g.scope.get("found_inf").data<int32_t>()[0] == 1);
  CHECK(g.get("g0") == std::vector<float>{inf, 1.f});
  CHECK(g.get("g1") == std::vector<float>{2.f});

  // Under AMP the step's flag comes in raised (an overflow elsewhere) and the clip ORs into it.
  Grads a({3.f, 4.f}, {12.f});
  a.p.add_var(VarDesc{"found_inf", {1}, DType::i32, false, false, true, {}});
  Tensor raised = Tensor::empty({1}, DType::i32);
  raised.data<int32_t>()[0] = 1;
  a.scope.set("found_inf", raised);
  optim::append_grad_norm(a.p, {"g0", "g1"});
  a.p.append_op(make_op("clip_by_global_norm",
                        {{"X", {"g0", "g1"}}, {"Norm", {optim::kGradNorm}}, {"FoundInfinite", {"found_inf"}}},
                        {{"Out", {"g0", "g1"}}, {"FoundInfiniteOut", {"found_inf"}}}, {{"max_norm", 100.0}}));
  a.run();
  CHECK(a.scope.get("found_inf").data<int32_t>()[0] == 1);
}

TEST_CASE("clip_by_value clamps to [-V, V] and lets NaN through", "[clip]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Grads g({-3.f, 0.5f, nan}, {2.f});
  optim::append_clip_by_value(g.p, {"g0", "g1"}, 1.0);
  g.run();
  const std::vector<float> g0 = g.get("g0");
  CHECK(g0[0] == -1.f);
  CHECK(g0[1] == 0.5f);
  CHECK(std::isnan(g0[2]));
  CHECK(g.get("g1") == std::vector<float>{1.f});
}
