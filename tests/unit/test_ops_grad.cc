// Gradients of every differentiable op in runtime/ops/, through the real
// autodiff and executor (tests/unit/gradcheck.h): FP32 analytic gradients
// against central differences, and the op in FP16 (BF16 for some) against the
// op in FP32. Tolerances and their reasons are in gradcheck.h.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "tests/unit/gradcheck.h"

using namespace mix;
using namespace mix::testing;

namespace {

// FD check in f32 plus the f16 (and optionally bf16) comparison.
void check_all(const OpCase& c, bool bf16 = false) {
  check_gradients_fd(c);
  check_low_precision(c, DType::f16, kF16Tolerance);
  if (bf16) check_low_precision(c, DType::bf16, kBf16Tolerance);
}

Shape cat(Shape a, std::initializer_list<int64_t> b) {
  a.insert(a.end(), b);
  return a;
}

}  // namespace

TEST_CASE("grad: matmul, every transpose, batched and shared Y, alpha", "[grad][matmul]") {
  const int64_t m = 3, k = 4, n = 2;
  uint64_t seed = 100;
  for (int tx = 0; tx < 2; ++tx)
    for (int ty = 0; ty < 2; ++ty)
      for (int mode = 0; mode < 3; ++mode) {
        // mode 0: 2-D; 1: batch [2] with batched Y; 2: batch [2, 2] with a shared 2-D Y
        const Shape batch = mode == 0 ? Shape{} : mode == 1 ? Shape{2} : Shape{2, 2};
        const Shape xs = cat(batch, {tx ? k : m, tx ? m : k});
        const Shape ys = cat(mode == 1 ? batch : Shape{}, {ty ? n : k, ty ? k : n});
        OpCase c{"matmul", {{"X", uniform_tensor(xs, ++seed)}, {"Y", uniform_tensor(ys, ++seed)}}, {"Out"},
                 {{"transpose_X", tx == 1}, {"transpose_Y", ty == 1}, {"alpha", mode == 2 ? 0.5 : 1.0}}};
        check_all(c, mode == 1);
      }
}

TEST_CASE("grad: matmul with only one input needing a gradient", "[grad][matmul]") {
  OpCase c{"matmul", {{"X", uniform_tensor({2, 3, 4}, 1)}, {"Y", uniform_tensor({4, 5}, 2), false}}, {"Out"}};
  check_gradients_fd(c);
  OpCase d{"matmul", {{"X", uniform_tensor({3, 4}, 3), false}, {"Y", uniform_tensor({4, 5}, 4)}}, {"Out"}};
  check_gradients_fd(d);
}

TEST_CASE("grad: elementwise_add and elementwise_mul with broadcasting", "[grad][elementwise]") {
  struct Bc {
    Shape x, y;
    int64_t axis;
  };
  const Bc cases[] = {
      {{4, 3}, {3}, -1},         // bias
      {{2, 3}, {2, 3}, -1},      // same shape (residual)
      {{2, 3, 4}, {3}, 1},       // channel bias
      {{2, 3, 4}, {3, 4}, -1},   // trailing block
      {{2, 3, 2}, {3, 1}, 1},    // trailing 1 dropped
      {{3, 2}, {3}, 0},          // leading axis
      {{4, 3}, {1, 3}, -1},      // PyTorch-style bias with a leading 1
      {{2, 3}, {1}, -1},         // scalar
  };
  uint64_t seed = 200;
  for (const char* type : {"elementwise_add", "elementwise_mul"})
    for (const Bc& b : cases) {
      OpCase c{type, {{"X", uniform_tensor(b.x, ++seed)}, {"Y", uniform_tensor(b.y, ++seed)}}, {"Out"},
               {{"axis", b.axis}}};
      check_all(c, b.x.size() == 3);
    }
}

TEST_CASE("grad: the bias gradient is accumulated in FP32", "[grad][elementwise]") {
  // dY of a bias over 4096 rows of dOut = 1 is 4096, exact in f16, but an FP16
  // running sum would stall at 2048 (2048 + 1 rounds back to 2048).
  for (const char* type : {"elementwise_add", "elementwise_mul"}) {
    INFO(type);
    OpCase c{type, {{"X", Tensor::from_floats({4096, 1}, std::vector<float>(4096, 1.f))}, {"Y", uniform_tensor({1}, 1)}},
             {"Out"}};
    auto b = build_case(c, DType::f16);
    const std::map<std::string, Tensor> ones = {{"Out", Tensor::from_floats({4096, 1}, std::vector<float>(4096, 1.f))}};
    const RunResult r = run_case(*b, c.inputs, ones, true);
    CHECK(r.grads[1].dtype() == DType::f16);
    CHECK(r.grads[1].item_float(0) == 4096.f);
  }
}

TEST_CASE("grad: broadcast gradients over rows longer than one CPU chunk", "[grad][elementwise]") {
  // dY sums dOut (add) or dOut * X (mul) over the broadcast dims, in chunks of
  // cpu::kChunk = 512 values of a [pre, n, post] row; each chunk must land on
  // its own entries of Y. Rows of 1100 (a bias wider than a chunk, post = 1)
  // and of 3 x 400 (a channel bias, post = 400) cross chunk boundaries. Values
  // on a 1/8 grid in [-1, 1] make every product a multiple of 2^-6 and every
  // partial sum (at most 800 terms) exact in FP32: the sums must equal the
  // double ones exactly.
  auto eighths = [](const Shape& s, uint64_t seed) {
    std::vector<float> v = uniform_tensor(s, seed, -8.f, 9.f).to_floats();
    for (float& x : v) x = std::floor(x) / 8.f;
    return Tensor::from_floats(s, v);
  };
  struct Bc {
    Shape x, y;
    int64_t axis, pre, n, post;
  };
  for (const Bc& k : {Bc{{3, 1100}, {1100}, -1, 3, 1100, 1}, Bc{{2, 3, 400}, {3}, 1, 2, 3, 400}})
    for (const char* type : {"elementwise_add", "elementwise_mul"}) {
      const bool mul = std::string(type) == "elementwise_mul";
      OpCase c{type, {{"X", eighths(k.x, 31)}, {"Y", eighths(k.y, 32)}}, {"Out"}, {{"axis", k.axis}}};
      INFO(c.describe());
      const Tensor r = eighths(k.x, 33);
      auto b = build_case(c, DType::f32);
      const RunResult res = run_case(*b, c.inputs, {{"Out", r}}, true);
      const std::vector<float> x = c.inputs[0].value.to_floats(), rv = r.to_floats();
      std::vector<double> dy(static_cast<size_t>(k.n), 0.0);
      for (int64_t p = 0; p < k.pre; ++p)
        for (int64_t j = 0; j < k.n; ++j)
          for (int64_t q = 0; q < k.post; ++q) {
            const size_t i = static_cast<size_t>((p * k.n + j) * k.post + q);
            dy[static_cast<size_t>(j)] += static_cast<double>(rv[i]) * (mul ? x[i] : 1.0);
          }
      expect_close(res.grads[1].to_floats(), dy, {0, 0}, "Y@GRAD");
    }
}

TEST_CASE("grad: mean", "[grad][mean]") {
  check_all(OpCase{"mean", {{"X", uniform_tensor({5}, 1)}}, {"Out"}});
  check_all(OpCase{"mean", {{"X", uniform_tensor({3, 4, 2}, 2)}}, {"Out"}});
}

TEST_CASE("grad: softmax", "[grad][softmax]") {
  check_all(OpCase{"softmax", {{"X", uniform_tensor({4, 5}, 1, -2.f, 2.f)}}, {"Out"}}, true);
  check_all(OpCase{"softmax", {{"X", uniform_tensor({2, 3, 6}, 2, -3.f, 3.f)}}, {"Out"}, {{"axis", int64_t{2}}}});
  check_all(OpCase{"softmax", {{"X", uniform_tensor({3, 1}, 3)}}, {"Out"}});  // one class: gradient 0
}

TEST_CASE("grad: softmax_with_cross_entropy, with an ignored row", "[grad][cross_entropy]") {
  OpCase c{"softmax_with_cross_entropy",
           {{"Logits", uniform_tensor({4, 5}, 1, -2.f, 2.f)}, {"Label", i64_tensor({4, 1}, {0, 4, 2, 2})}},
           {"Softmax", "Loss"},
           {},
           {"Loss"}};
  check_all(c, true);
  // Label [N], ignore_index -100 on row 1: that row's logits get exactly zero gradient.
  OpCase ig{"softmax_with_cross_entropy",
            {{"Logits", uniform_tensor({3, 6}, 2, -3.f, 3.f)}, {"Label", i64_tensor({3}, {5, -100, 0})}},
            {"Softmax", "Loss"},
            {},
            {"Loss"}};
  check_all(ig);
  auto b = build_case(ig, DType::f32);
  const RunResult r = run_case(*b, ig.inputs, make_projections(*b, ig, DType::f16, 3), true);
  const std::vector<float> g = r.grads[0].to_floats();
  for (int k = 0; k < 6; ++k) CHECK(g[6 + k] == 0.f);
  CHECK(r.outputs.at("Loss").item_float(1) == 0.f);
  // The language model's shape: logits [batch, seq, vocab], labels [batch, seq],
  // one position ignored; the vocabulary axis is the last.
  OpCase lm{"softmax_with_cross_entropy",
            {{"Logits", uniform_tensor({2, 3, 7}, 4, -3.f, 3.f)}, {"Label", i64_tensor({2, 3}, {6, 0, 3, -100, 2, 5})}},
            {"Softmax", "Loss"},
            {},
            {"Loss"}};
  check_all(lm);
  auto blm = build_case(lm, DType::f32);
  const RunResult rlm = run_case(*blm, lm.inputs, make_projections(*blm, lm, DType::f16, 3), true);
  CHECK(rlm.outputs.at("Loss").shape() == Shape{2, 3, 1});
  const std::vector<float> glm = rlm.grads[0].to_floats();
  for (int k = 0; k < 7; ++k) CHECK(glm[3 * 7 + k] == 0.f);  // row (1, 0) is ignored
  CHECK(rlm.outputs.at("Loss").item_float(3) == 0.f);
}

TEST_CASE("grad: cross-entropy gradient is softmax - onehot", "[grad][cross_entropy]") {
  // With Loss@GRAD = 1 per row (R = 1), Logits@GRAD = softmax - onehot(label) exactly.
  OpCase c{"softmax_with_cross_entropy", {{"Logits", uniform_tensor({2, 3}, 5)}, {"Label", i64_tensor({2, 1}, {1, 2})}},
           {"Softmax", "Loss"}, {}, {"Loss"}};
  auto b = build_case(c, DType::f32);
  std::map<std::string, Tensor> ones = {{"Loss", Tensor::from_floats({2, 1}, {1.f, 1.f})}};
  const RunResult r = run_case(*b, c.inputs, ones, true);
  const std::vector<float> sm = r.outputs.at("Softmax").to_floats(), g = r.grads[0].to_floats();
  const int labels[2] = {1, 2};
  for (int row = 0; row < 2; ++row)
    for (int k = 0; k < 3; ++k) CHECK(g[row * 3 + k] == sm[row * 3 + k] - (k == labels[row] ? 1.f : 0.f));
}

TEST_CASE("grad: reshape2", "[grad][reshape2]") {
  const Tensor x = uniform_tensor({2, 3, 4}, 1);
  for (std::vector<int64_t> shape : {std::vector<int64_t>{0, -1}, {4, 6}, {-1}, {0, 0, 2, 2}})
    check_all(OpCase{"reshape2", {{"X", x}}, {"Out"}, {{"shape", shape}}});
}

TEST_CASE("grad: mul (nn.Linear layout)", "[grad][mul]") {
  check_all(OpCase{"mul", {{"X", uniform_tensor({3, 4}, 1)}, {"Y", uniform_tensor({5, 4}, 2)}}, {"Out"}}, true);
  check_all(OpCase{"mul", {{"X", uniform_tensor({2, 2, 3}, 3)}, {"Y", uniform_tensor({4, 3}, 4)}}, {"Out"},
                   {{"x_num_col_dims", int64_t{2}}}});
}

TEST_CASE("grad: scale", "[grad][scale]") {
  check_all(OpCase{"scale", {{"X", uniform_tensor({3, 4}, 1)}}, {"Out"}, {{"scale", 2.5}, {"bias", 0.3}}});
  check_all(OpCase{"scale", {{"X", uniform_tensor({5}, 2)}}, {"Out"},
                   {{"scale", -0.75}, {"bias", 1.0}, {"bias_after_scale", false}}});
}

TEST_CASE("grad: sum", "[grad][sum]") {
  check_all(OpCase{"sum", {{"X", uniform_tensor({2, 3}, 1)}, {"X", uniform_tensor({2, 3}, 2)}, {"X", uniform_tensor({2, 3}, 3)}},
                   {"Out"}});
  // A constant among the summands gets no gradient; the others still do.
  check_gradients_fd(OpCase{"sum", {{"X", uniform_tensor({4}, 4)}, {"X", uniform_tensor({4}, 5), false}}, {"Out"}});
}

TEST_CASE("grad: activations", "[grad][activation]") {
  // relu's kink at 0 would break central differences: keep |x| >= 0.1 > the step.
  check_all(OpCase{"relu", {{"X", away_from_zero_tensor({3, 5}, 1)}}, {"Out"}});
  check_all(OpCase{"gelu", {{"X", uniform_tensor({3, 5}, 2, -3.f, 3.f)}}, {"Out"}}, true);
  check_all(OpCase{"tanh", {{"X", uniform_tensor({3, 5}, 3, -2.f, 2.f)}}, {"Out"}});
}

TEST_CASE("grad: cast", "[grad][cast]") {
  // f32 -> f32 is the identity: finite differences apply.
  check_gradients_fd(OpCase{"cast", {{"X", uniform_tensor({2, 3}, 1)}}, {"Out"}, {{"out_dtype", std::string("f32")}}});
  // f32 -> f16 rounds its output, so differences of it are noise; the gradient has a
  // closed form instead: dX = cast_f32(dOut) = R (R is exact in f16).
  OpCase c{"cast", {{"X", uniform_tensor({2, 3}, 2)}}, {"Out"}, {{"out_dtype", std::string("f16")}}};
  auto b = build_case(c, DType::f32);
  const auto r = make_projections(*b, c, DType::f16, 7);
  const RunResult res = run_case(*b, c.inputs, r, true);
  CHECK(res.outputs.at("Out").dtype() == DType::f16);
  CHECK(res.grads[0].dtype() == DType::f32);
  CHECK(res.grads[0].to_floats() == r.at("Out").to_floats());
  // f16 parameters cast to f32 (the reverse direction): dX = R rounded to f16 = R.
  OpCase up{"cast", {{"X", uniform_tensor({4}, 3)}}, {"Out"}, {{"out_dtype", std::string("f32")}}};
  auto b16 = build_case(up, DType::f16);
  const auto r16 = make_projections(*b16, up, DType::f16, 8);
  const RunResult res16 = run_case(*b16, up.inputs, r16, true);
  CHECK(res16.grads[0].dtype() == DType::f16);
  CHECK(res16.grads[0].to_floats() == r16.at("Out").to_floats());
}

TEST_CASE("grad: a chain through several ops (an MLP layer and its loss)", "[grad][chain]") {
  // softmax_with_cross_entropy(relu(X W^T + b) reshaped) exercises gradient flow
  // between ops, the shared bias reduction and the loss op together.
  Program p;
  auto param = [&](const std::string& name, Shape s) {
    VarDesc v = var_desc(name, s, DType::f32);
    v.is_parameter = v.persistable = true;
    p.add_var(v);
  };
  param("x", {4, 6});
  param("w", {3, 6});
  param("b", {3});
  VarDesc label = var_desc("label", {4, 1}, DType::i64);
  label.stop_gradient = true;
  p.add_var(label);
  p.append_op(make_op("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"h"}}}));
  p.append_op(make_op("elementwise_add", {{"X", {"h"}}, {"Y", {"b"}}}, {{"Out", {"hb"}}}));
  p.append_op(make_op("tanh", {{"X", {"hb"}}}, {{"Out", {"a"}}}));
  p.append_op(make_op("reshape2", {{"X", {"a"}}}, {{"Out", {"a2"}}}, {{"shape", std::vector<int64_t>{0, -1}}}));
  p.append_op(make_op("softmax_with_cross_entropy", {{"Logits", {"a2"}}, {"Label", {"label"}}},
                      {{"Softmax", {"sm"}}, {"Loss", {"loss_rows"}}}));
  p.append_op(make_op("mean", {{"X", {"loss_rows"}}}, {{"Out", {"loss"}}}));
  seed_loss_gradient(p, "loss");
  const BackwardResult br = append_backward(p, "loss");
  REQUIRE(br.param_grads.size() == 3);

  const std::map<std::string, Tensor> init = {
      {"x", uniform_tensor({4, 6}, 1)}, {"w", uniform_tensor({3, 6}, 2)}, {"b", uniform_tensor({3}, 3)}};
  const Tensor labels = i64_tensor({4, 1}, {0, 2, 1, 2});
  auto run = [&](const std::map<std::string, Tensor>& vals, bool backward) {
    Scope s;
    for (auto& [k, v] : vals) s.set(k, v.clone());
    s.set("label", labels.clone());
    std::set<std::string> keep = {"loss"};
    for (auto& [param_name, grad] : br.param_grads) keep.insert(grad);
    ExecEnv env;
    Executor(p, keep, backward ? all_ops : forward_ops).run(s, env);
    return s;
  };
  Scope s = run(init, true);
  for (auto& [name, grad] : br.param_grads) {
    INFO("parameter " << name);
    std::vector<double> numeric;
    for (int64_t e = 0; e < init.at(name).numel(); ++e) {
      auto vals = init;
      vals[name] = init.at(name).clone();
      float* v = vals[name].data<float>();
      const float x0 = v[e], h = 1e-3f;
      v[e] = x0 + h;
      const double lp = run(vals, false).get("loss").item_float(0);
      v[e] = x0 - h;
      const double lm = run(vals, false).get("loss").item_float(0);
      numeric.push_back((lp - lm) / (static_cast<double>(x0 + h) - static_cast<double>(x0 - h)));
    }
    // The loss is a single FP32 scalar of magnitude ~1 here: its rounding (6e-8) over
    // the step (2e-3) gives ~3e-5 of noise, far inside the usual FD tolerance.
    expect_close(s.get(grad).to_floats(), numeric, kFdTolerance, "chain gradient of " + name);
  }
}
