// fused_attention (runtime/ops/fused_attention.cc) on the CPU:
//  - against the unfused composition the Transformer builds with
//    --no-fused-attention (matmul q.k^T with alpha, softmax with causal,
//    matmul att.v), forward and the Q, K, V gradients, through the real
//    autodiff and executor, in f32, f16 and bf16, causal or not, at 1, 7 and 33
//    tokens, several heads, and a causal case with fewer queries than keys;
//    and both against one reference computed here in double from the same
//    (already rounded) inputs, where the fused op must be the closer of the
//    two in low precision (it rounds once, on store);
//  - the LSE statistic against the double log-sum-exp;
//  - central differences of the FP32 gradients (tests/unit/gradcheck.h);
//  - shape inference with a -1 batch, and the errors of bad shapes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/autodiff.h"
#include "runtime/ir/op_registry.h"
#include "tests/unit/attention_reference.h"
#include "tests/unit/gradcheck.h"

using namespace mix;
using namespace mix::testing;
using namespace mix::testing::attention;
using Catch::Matchers::Contains;

namespace {

struct Results {
  Tensor out, lse, dq, dk, dv;
};

// How the fused op is fed: heads first (Q, K, V [B, H, T, D]), tokens first
// ([B, T, H, D], layout "bthd"), or packed (one QKV [B, T, 3, H, D]).
enum class Feed { heads_first, tokens_first, packed };

// L = sum(Out * R) through the fused op or the unfused composition in dtype
// dt; Out and the gradients of Q, K and V (all in dt), and LSE for the fused op.
// Tokens first and packed (fused only, lead [B, H]): the inputs moved into
// that layout, the results moved back heads first.
Results run_attention(bool fused, const Problem& pb, DType dt, const Inputs& in, Feed feed = Feed::heads_first) {
  const bool tokens_first = feed != Feed::heads_first;
  auto layout = [&](const Shape& heads_first) {
    return tokens_first ? Shape{heads_first[0], heads_first[2], heads_first[1], heads_first[3]} : heads_first;
  };
  auto fed = [&](const Tensor& t) { return tokens_first ? swap_tokens_and_heads(t) : t.clone(); };
  Program p;
  auto add_param = [&](const std::string& name, const Shape& shape) {
    VarDesc v = var_desc(name, shape, dt);
    v.is_parameter = v.persistable = true;
    p.add_var(v);
  };
  if (feed == Feed::packed) {
    add_param("qkv", {pb.lead[0], pb.t, 3, pb.lead[1], pb.d});
  } else {
    for (const char* name : {"q", "k", "v"})
      add_param(name, layout(std::string(name) == "q" ? pb.q_shape() : pb.kv_shape()));
  }
  VarDesc r = var_desc("r", layout(pb.q_shape()), DType::f32);
  r.stop_gradient = true;
  p.add_var(r);
  if (fused) {
    const std::map<std::string, std::vector<std::string>> inputs =
        feed == Feed::packed
            ? std::map<std::string, std::vector<std::string>>{{"QKV", {"qkv"}}}
            : std::map<std::string, std::vector<std::string>>{{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}};
    p.append_op(make_op(
        "fused_attention", inputs, {{"Out", {"out"}}, {"LSE", {"lse"}}},
        {{"scale", pb.scale()}, {"causal", pb.causal}, {"layout", std::string(tokens_first ? "bthd" : "bhtd")}}));
  } else {
    p.append_op(make_op("matmul", {{"X", {"q"}}, {"Y", {"k"}}}, {{"Out", {"scores"}}},
                        {{"transpose_Y", true}, {"alpha", pb.scale()}}));
    p.append_op(
        make_op("softmax", {{"X", {"scores"}}}, {{"Out", {"att"}}}, {{"axis", int64_t{-1}}, {"causal", pb.causal}}));
    p.append_op(make_op("matmul", {{"X", {"att"}}, {"Y", {"v"}}}, {{"Out", {"out"}}}));
  }
  std::string out32 = "out";
  if (dt != DType::f32) {
    out32 = "out_f32";
    p.append_op(make_op("cast", {{"X", {"out"}}}, {{"Out", {out32}}}, {{"out_dtype", std::string("f32")}}));
  }
  p.append_op(make_op("elementwise_mul", {{"X", {out32}}, {"Y", {"r"}}}, {{"Out", {"prod"}}}));
  p.append_op(make_op("mean", {{"X", {"prod"}}}, {{"Out", {"mean"}}}));
  p.append_op(make_op("scale", {{"X", {"mean"}}}, {{"Out", {"loss"}}},
                      {{"scale", static_cast<double>(shape_numel(pb.q_shape()))}}));
  seed_loss_gradient(p, "loss");
  const BackwardResult br = append_backward(p, "loss");
  std::set<std::string> keep{"out"};
  if (fused) keep.insert("lse");
  std::map<std::string, std::string> grad_of;
  for (auto& [param, grad] : br.param_grads) {
    grad_of[param] = grad;
    keep.insert(grad);
  }
  Scope scope;
  const Tensor q = to_dtype(in.q, dt), k = to_dtype(in.k, dt), v = to_dtype(in.v, dt);
  if (feed == Feed::packed) {
    scope.set("qkv", pack_qkv(q, k, v));
  } else {
    scope.set("q", fed(q));
    scope.set("k", fed(k));
    scope.set("v", fed(v));
  }
  scope.set("r", fed(in.r));
  ExecEnv env;
  Executor(p, keep).run(scope, env);
  auto back = [&](const std::string& name) {
    const Tensor& t = scope.get(name);
    return tokens_first ? swap_tokens_and_heads(t) : t;
  };
  Results res;
  res.out = back("out");
  if (fused) res.lse = scope.get("lse");  // [B, H, T] in every layout
  if (feed == Feed::packed) {
    const Tensor& dqkv = scope.get(grad_of.at("qkv"));
    res.dq = unpack_qkv(dqkv, 0);
    res.dk = unpack_qkv(dqkv, 1);
    res.dv = unpack_qkv(dqkv, 2);
  } else {
    res.dq = back(grad_of.at("q"));
    res.dk = back(grad_of.at("k"));
    res.dv = back(grad_of.at("v"));
  }
  return res;
}

}  // namespace

TEST_CASE("fused_attention: against the unfused composition and a double reference, forward and gradients",
          "[ops][transformer][fused_attention]") {
  const std::vector<Problem> problems = {
      {{2, 3}, 1, 1, 8, false},    {{2, 3}, 1, 1, 8, true},    {{2, 3}, 7, 7, 8, false}, {{2, 3}, 7, 7, 8, true},
      {{1, 2}, 33, 33, 16, false}, {{1, 2}, 33, 33, 16, true}, {{2, 2}, 5, 9, 8, true},  {{3}, 70, 70, 4, true},
  };
  uint64_t seed = 100;
  for (const Problem& pb : problems) {
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      INFO(pb.describe() << ", " << dtype_name(dt));
      const Inputs in = make_inputs(pb, dt, seed += 10);
      const Results fused = run_attention(true, pb, dt, in);
      const Results unfused = run_attention(false, pb, dt, in);
      const Reference ref = reference_attention(pb, in);
      for (const Tensor* t : {&fused.out, &fused.dq, &fused.dk, &fused.dv}) REQUIRE(t->dtype() == dt);
      REQUIRE(fused.lse.dtype() == DType::f32);
      REQUIRE(fused.out.shape() == pb.q_shape());
      const Shape q_shape = pb.q_shape();
      REQUIRE(fused.lse.shape() == Shape(q_shape.begin(), q_shape.end() - 1));
      REQUIRE(fused.dk.shape() == pb.kv_shape());

      // The fused op computes in FP32 and rounds each result once on store,
      // so it sits within half an ulp of dt of the exact value plus FP32
      // noise. The gradients read the stored Out (delta = dO . O), which
      // carries that half ulp into every dS: a few ulps of the terms' size.
      const double u = half_ulp(dt), fp32_err = pb.f32_err();
      expect_near(fused.out, ref.out, fp32_err, u, "fused Out vs double");
      expect_near(fused.lse, ref.lse, fp32_err, fp32_err, "fused LSE vs double");
      const double grad_scaled = dt == DType::f32 ? fp32_err : 4 * u;
      expect_near(fused.dq, ref.dq, grad_scaled, u, "fused dQ vs double");
      expect_near(fused.dk, ref.dk, grad_scaled, u, "fused dK vs double");
      expect_near(fused.dv, ref.dv, dt == DType::f32 ? fp32_err : u, u, "fused dV vs double");

      // The unfused composition also rounds the scores and the probabilities
      // to dt (|score| up to ~16 here, which moves a probability by up to
      // ~16 ulps, relative), and its gradient rounds dP and dS: against the
      // fused op, 8 ulps of the tensor's largest value (observed: about 1),
      // and agreement within FP32 noise in f32.
      const double composed = dt == DType::f32 ? fp32_err : 8 * u;
      expect_near(fused.out, doubles_of(unfused.out), composed, u, "fused Out vs unfused");
      expect_near(fused.dq, doubles_of(unfused.dq), composed, u, "fused dQ vs unfused");
      expect_near(fused.dk, doubles_of(unfused.dk), composed, u, "fused dK vs unfused");
      expect_near(fused.dv, doubles_of(unfused.dv), composed, u, "fused dV vs unfused");
      // Rounding once, the fused forward is at least as close to the exact
      // output as the composition, which rounds three times.
      if (dt != DType::f32) CHECK(max_error(fused.out, ref.out) <= max_error(unfused.out, ref.out));
    }
  }
}

TEST_CASE("fused_attention: causal rows see only their prefix, whatever the masked keys hold",
          "[ops][transformer][fused_attention]") {
  // The last key of each group set to huge values: no causal row but the
  // last sees it, so all other rows' outputs must not move.
  const Problem pb{{2}, 6, 6, 4, true};
  Inputs in = make_inputs(pb, DType::f32, 7);
  const Results base = run_attention(true, pb, DType::f32, in);
  float* k = in.k.data<float>();
  float* v = in.v.data<float>();
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t c = 0; c < pb.d; ++c) {
      k[(g * pb.s + pb.s - 1) * pb.d + c] = 1e4f;
      v[(g * pb.s + pb.s - 1) * pb.d + c] = 1e4f;
    }
  const Results moved = run_attention(true, pb, DType::f32, in);
  const std::vector<float> a = base.out.to_floats(), b = moved.out.to_floats();
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t i = 0; i + 1 < pb.t; ++i)
      for (int64_t c = 0; c < pb.d; ++c) {
        const size_t e = static_cast<size_t>((g * pb.t + i) * pb.d + c);
        REQUIRE(a[e] == b[e]);
      }
}

TEST_CASE("grad: fused_attention against central differences, causal and not", "[grad][transformer][fused_attention]") {
  for (bool causal : {false, true}) {
    OpCase c{"fused_attention",
             {{"Q", uniform_tensor({1, 2, 5, 4}, 31)},
              {"K", uniform_tensor({1, 2, 5, 4}, 32)},
              {"V", uniform_tensor({1, 2, 5, 4}, 33)}},
             {"Out", "LSE"},
             {{"causal", causal}},  // scale: the default, 1 / sqrt(4)
             {"Out"},
             {"LSE"}};
    check_gradients_fd(c);
  }
}

TEST_CASE("fused_attention: the tokens-first layout and packed QKV give the heads-first layout's bits",
          "[ops][transformer][fused_attention]") {
  // The Transformer feeds the op one packed QKV [B, T, 3, H, D] ("bthd": no
  // split or transposes around it); Q, K, V tokens first ([B, T, H, D]) is the
  // other way to use the layout. Both must compute exactly what the default
  // layout computes from the same numbers: Out, LSE and the three gradients,
  // bit for bit. (Packed needs T = S: Q, K and V share the tokens.)
  const std::vector<Problem> problems = {
      {{2, 3}, 7, 7, 8, true}, {{1, 2}, 33, 33, 16, true}, {{2, 2}, 5, 9, 8, true}, {{2, 3}, 6, 6, 4, false}};
  uint64_t seed = 900;
  for (const Problem& pb : problems) {
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      INFO(pb.describe() << ", " << dtype_name(dt));
      const Inputs in = make_inputs(pb, dt, seed += 7);
      const Results heads_first = run_attention(true, pb, dt, in, Feed::heads_first);
      for (Feed feed : {Feed::tokens_first, Feed::packed}) {
        if (feed == Feed::packed && pb.t != pb.s) continue;
        INFO((feed == Feed::packed ? "packed QKV" : "tokens first"));
        const Results other = run_attention(true, pb, dt, in, feed);
        CHECK(other.out.shape() == heads_first.out.shape());
        CHECK(other.lse.shape() == heads_first.lse.shape());
        CHECK(other.out.to_floats() == heads_first.out.to_floats());
        CHECK(other.lse.to_floats() == heads_first.lse.to_floats());
        CHECK(other.dq.to_floats() == heads_first.dq.to_floats());
        CHECK(other.dk.to_floats() == heads_first.dk.to_floats());
        CHECK(other.dv.to_floats() == heads_first.dv.to_floats());
      }
    }
  }
}

TEST_CASE("fused_attention: inference keeps -1 batch dims; bad shapes name the problem",
          "[ops][transformer][fused_attention][errors]") {
  Program p;
  p.add_var(var_desc("q", {-1, 4, 7, 16}, DType::f16));
  p.add_var(var_desc("k", {-1, 4, 7, 16}, DType::f16));
  p.add_var(var_desc("v", {-1, 4, 7, 16}, DType::f16));
  p.append_op(make_op("fused_attention", {{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}}, {{"Out", {"o"}}, {"LSE", {"l"}}},
                      {{"causal", true}}));
  CHECK(p.var("o").shape == Shape{-1, 4, 7, 16});
  CHECK(p.var("o").dtype == DType::f16);
  CHECK(p.var("l").shape == Shape{-1, 4, 7});
  CHECK(p.var("l").dtype == DType::f32);

  auto build = [](const Shape& q, const Shape& k, const Shape& v, bool causal, DType kd = DType::f32) {
    Program bad;
    bad.add_var(var_desc("q", q, DType::f32));
    bad.add_var(var_desc("k", k, kd));
    bad.add_var(var_desc("v", v, DType::f32));
    bad.append_op(make_op("fused_attention", {{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}},
                          {{"Out", {"o"}}, {"LSE", {"l"}}}, {{"causal", causal}}));
  };
  CHECK_THROWS_WITH(build({2, 5, 8}, {2, 5, 4}, {2, 5, 4}, false), Contains("head_dim"));
  CHECK_THROWS_WITH(build({2, 5, 8}, {3, 5, 8}, {3, 5, 8}, false), Contains("leading (batch, head) dims"));
  CHECK_THROWS_WITH(build({2, 5, 8}, {2, 5, 8}, {2, 6, 8}, false), Contains("as many tokens"));
  CHECK_THROWS_WITH(build({2, 5, 8}, {2, 3, 8}, {2, 3, 8}, true), Contains("T = 5 > S = 3"));
  CHECK_THROWS_WITH(build({2, 5, 8}, {2, 5, 8}, {2, 5, 8}, false, DType::f16), Contains("one float dtype"));
  CHECK_NOTHROW(build({2, 5, 8}, {2, 3, 8}, {2, 3, 8}, false));  // fewer keys is fine without the mask

  // The tokens-first layout: [B, T, H, D], LSE [B, H, T].
  auto tokens_first = [](const Shape& q, const Shape& k, const std::string& layout = "bthd") {
    Program t;
    t.add_var(var_desc("q", q, DType::f16));
    t.add_var(var_desc("k", k, DType::f16));
    t.add_var(var_desc("v", k, DType::f16));
    t.append_op(make_op("fused_attention", {{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}}, {{"Out", {"o"}}, {"LSE", {"l"}}},
                        {{"causal", true}, {"layout", layout}}));
    return t;
  };
  const Program t = tokens_first({-1, 7, 4, 16}, {-1, 9, 4, 16});
  CHECK(t.var("o").shape == Shape{-1, 7, 4, 16});
  CHECK(t.var("l").shape == Shape{-1, 4, 7});
  CHECK_THROWS_WITH(tokens_first({2, 7, 16}, {2, 7, 16}), Contains("[batch, tokens, heads, head_dim]"));
  CHECK_THROWS_WITH(tokens_first({2, 7, 4, 16}, {2, 7, 3, 16}), Contains("batch and head dims"));
  CHECK_THROWS_WITH(tokens_first({2, 9, 4, 16}, {2, 7, 4, 16}), Contains("T = 9 > S = 7"));
  CHECK_THROWS_WITH(tokens_first({2, 7, 4, 16}, {2, 7, 4, 16}, "tbhd"), Contains("attr layout must be"));

  // Packed: QKV [B, T, 3, H, D] gives Out [B, T, H, D] and LSE [B, H, T]; only tokens first.
  auto packed = [](const Shape& qkv, const std::string& layout = "bthd") {
    Program prog;
    prog.add_var(var_desc("qkv", qkv, DType::f16));
    prog.append_op(make_op("fused_attention", {{"QKV", {"qkv"}}}, {{"Out", {"o"}}, {"LSE", {"l"}}},
                           {{"causal", true}, {"layout", layout}}));
    return prog;
  };
  const Program pk = packed({-1, 7, 3, 4, 16});
  CHECK(pk.var("o").shape == Shape{-1, 7, 4, 16});
  CHECK(pk.var("l").shape == Shape{-1, 4, 7});
  CHECK_THROWS_WITH(packed({2, 7, 2, 4, 16}), Contains("[batch, tokens, 3, heads, head_dim]"));
  CHECK_THROWS_WITH(packed({2, 7, 3, 4, 16}, "bhtd"), Contains("needs attr layout \"bthd\""));
}
