#pragma once
// The contract of out_dtype / x_grad_dtype (runtime/ops/widening.h), checked
// on one device: softmax and softmax_with_cross_entropy reading an FP16/BF16
// input with out_dtype "f32" give, bit for bit, what the FP32 op gives on the
// input cast to FP32; their gradients with x_grad_dtype give the FP32
// gradient cast back; softmax_grad reading an FP16 Out@GRAD gives what it
// gives on that gradient widened. Exact equality is the claim the folding
// passes (amp/fold_casts.h) rest on (widening is exact, and both sides round the gradient once, to
// nearest even), and both sides run the same kernel code on the same device,
// in the same order of additions. (The FP32 gradient is cast back on the host:
// a gradient op declares no output variable for a following op to read, and
// the host's conversion rounds to nearest even as the devices' do.)
// test_fold_casts.cc runs it on the CPU, test_cuda_transformer_ops.cc on the GPU.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/random.h"
#include "tests/unit/cuda_compare.h"

namespace mix::testing {

inline void check_widening_softmax(Device device, DType narrow, const Shape& s, bool causal) {
  const std::string what = std::string(dtype_name(narrow)) + " " + shape_str(s) + (causal ? " causal" : "");
  INFO("softmax " << what);
  std::vector<float> xv = uniform_tensor(s, 71, -8.f, 8.f).to_floats();
  if (xv.size() > 3) xv[1] = -std::numeric_limits<float>::infinity();  // a masked logit widens exactly too
  const Tensor x = floats(s, xv, narrow);
  const std::map<std::string, Attr> base{{"causal", causal}};
  std::map<std::string, Attr> widened = base;
  widened["out_dtype"] = std::string("f32");
  const auto cast_to = [](const std::string& in, const std::string& out, DType t) {
    return make_op("cast", {{"X", {in}}}, {{"Out", {out}}}, {{"out_dtype", std::string(dtype_name(t))}});
  };
  const auto folded =
      run_ops_on({make_op("softmax", {{"X", {"x"}}}, {{"Out", {"y"}}}, widened)}, {{"x", x}}, device, ExecEnv{}, {"y"});
  const auto cast =
      run_ops_on({cast_to("x", "xw", DType::f32), make_op("softmax", {{"X", {"xw"}}}, {{"Out", {"y"}}}, base)},
                 {{"x", x}}, device, ExecEnv{}, {"y"});
  CHECK(folded.at("y").dtype() == DType::f32);
  expect_identical(folded.at("y"), cast.at("y"), "softmax out_dtype f32 vs softmax(cast) " + what);

  const Tensor y = cast.at("y");
  const Tensor dy = random_tensor(s, DType::f32, 72, -2.f, 2.f);
  std::map<std::string, Attr> grad_attrs = base;
  grad_attrs["x_grad_dtype"] = std::string(dtype_name(narrow));
  const auto gfolded =
      run_ops_on({make_op("softmax_grad", {{"Out", {"y"}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dx"}}}, grad_attrs)},
                 {{"y", y}, {"dy", dy}}, device, ExecEnv{}, {"dx"});
  const auto gwide =
      run_ops_on({make_op("softmax_grad", {{"Out", {"y"}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dx"}}}, base)},
                 {{"y", y}, {"dy", dy}}, device, ExecEnv{}, {"dx"});
  CHECK(gfolded.at("dx").dtype() == narrow);
  expect_identical(gfolded.at("dx"), to_dtype(gwide.at("dx"), narrow),
                   "softmax_grad x_grad_dtype vs cast(softmax_grad) " + what);

  // Out@GRAD narrower than Out (amp::fold_widening_grad_casts): reading the
  // FP16 gradient gives what reading its FP32 widening gives, whether X@GRAD
  // is narrow (a folded softmax) or FP32 (a softmax of an FP32 input).
  const Tensor dy_narrow = to_dtype(dy, narrow);
  using Attrs = std::map<std::string, Attr>;
  for (const Attrs* attrs : {static_cast<const Attrs*>(&grad_attrs), &base}) {
    const OpDesc grad_op =
        make_op("softmax_grad", {{"Out", {"y"}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dx"}}}, *attrs);
    const auto gnarrow = run_ops_on({grad_op}, {{"y", y}, {"dy", dy_narrow}}, device, ExecEnv{}, {"dx"});
    const auto gwidened =
        run_ops_on({grad_op}, {{"y", y}, {"dy", to_dtype(dy_narrow, DType::f32)}}, device, ExecEnv{}, {"dx"});
    CHECK(gnarrow.at("dx").dtype() == (attrs == &base ? DType::f32 : narrow));
    expect_identical(gnarrow.at("dx"), gwidened.at("dx"),
                     "softmax_grad on a narrow Out@GRAD vs its widening, X@GRAD " +
                         std::string(dtype_name(gnarrow.at("dx").dtype())) + " " + what);
  }
}

inline void check_widening_cross_entropy(Device device, DType narrow, const Shape& logits_shape) {
  const std::string what = std::string(dtype_name(narrow)) + " " + shape_str(logits_shape);
  INFO("softmax_with_cross_entropy " << what);
  const int64_t classes = logits_shape.back(), rows = shape_numel(logits_shape) / classes;
  const Tensor x = random_tensor(logits_shape, narrow, 73, -8.f, 8.f);
  Rng rng(74);
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  for (auto& l : labels) l = static_cast<int64_t>(rng.below(static_cast<uint64_t>(classes)));
  labels[0] = -100;  // an ignored row: loss 0 and gradient 0 on both sides
  Shape label_shape(logits_shape.begin(), logits_shape.end() - 1);
  label_shape.push_back(1);
  const Tensor label = i64_tensor(label_shape, labels);
  const auto swce = [](const std::string& logits, std::map<std::string, Attr> attrs) {
    return make_op("softmax_with_cross_entropy", {{"Logits", {logits}}, {"Label", {"label"}}},
                   {{"Softmax", {"sm"}}, {"Loss", {"loss"}}}, std::move(attrs));
  };
  const auto folded = run_ops_on({swce("x", {{"out_dtype", std::string("f32")}})}, {{"x", x}, {"label", label}}, device,
                                 ExecEnv{}, {"sm", "loss"});
  const auto cast = run_ops_on(
      {make_op("cast", {{"X", {"x"}}}, {{"Out", {"xw"}}}, {{"out_dtype", std::string("f32")}}), swce("xw", {})},
      {{"x", x}, {"label", label}}, device, ExecEnv{}, {"sm", "loss"});
  for (const char* out : {"sm", "loss"}) {
    CHECK(folded.at(out).dtype() == DType::f32);
    expect_identical(folded.at(out), cast.at(out),
                     std::string(out) + ": out_dtype f32 vs the op on cast logits " + what);
  }

  const Tensor dloss = random_tensor(cast.at("loss").shape(), DType::f32, 75, 0.5f, 2.f);
  const auto grad = [](const std::string& dx, std::map<std::string, Attr> attrs) {
    return make_op("softmax_with_cross_entropy_grad",
                   {{"Softmax", {"sm"}}, {"Label", {"label"}}, {"Loss@GRAD", {"dloss"}}}, {{"Logits@GRAD", {dx}}},
                   std::move(attrs));
  };
  const std::vector<std::pair<std::string, Tensor>> feeds{{"sm", cast.at("sm")}, {"label", label}, {"dloss", dloss}};
  const auto gfolded =
      run_ops_on({grad("dx", {{"x_grad_dtype", std::string(dtype_name(narrow))}})}, feeds, device, ExecEnv{}, {"dx"});
  const auto gwide = run_ops_on({grad("dx", {})}, feeds, device, ExecEnv{}, {"dx"});
  CHECK(gfolded.at("dx").dtype() == narrow);
  expect_identical(gfolded.at("dx"), to_dtype(gwide.at("dx"), narrow),
                   "Logits@GRAD x_grad_dtype vs cast(grad) " + what);
}

/// elementwise_add of an FP32 X and an FP16/BF16 Y of its shape (the residual
/// add amp::fold_widening_casts makes) gives, bit for bit, the add of Y cast to
/// FP32; its gradient writes dY as dOut rounded once to Y's dtype, the cast's
/// gradient, and dX as dOut.
inline void check_narrow_residual_add(Device device, DType narrow, const Shape& s) {
  const std::string what = std::string(dtype_name(narrow)) + " " + shape_str(s);
  INFO("elementwise_add with a narrow Y " << what);
  const Tensor x = with_specials(random_tensor(s, DType::f32, 81, -4.f, 4.f), DType::f32);
  const Tensor y = random_tensor(s, narrow, 82, -4.f, 4.f);
  const auto add = [](const std::string& y_name) {
    return make_op("elementwise_add", {{"X", {"x"}}, {"Y", {y_name}}}, {{"Out", {"out"}}});
  };
  const auto folded = run_ops_on({add("y")}, {{"x", x}, {"y", y}}, device, ExecEnv{}, {"out"});
  const auto cast =
      run_ops_on({make_op("cast", {{"X", {"y"}}}, {{"Out", {"yw"}}}, {{"out_dtype", std::string("f32")}}), add("yw")},
                 {{"x", x}, {"y", y}}, device, ExecEnv{}, {"out"});
  CHECK(folded.at("out").dtype() == DType::f32);
  expect_identical(folded.at("out"), cast.at("out"), "add(x, narrow y) vs add(x, cast(y)) " + what);

  // The grad maker's attrs as elementwise_add's would set them for this Y
  // (declared with a -1 batch, resolved against Out@GRAD).
  Shape declared = s;
  declared[0] = -1;
  const Tensor dout = with_specials(random_tensor(s, DType::f32, 83, -70000.f, 70000.f), DType::f32);
  const auto grad =
      run_ops_on({make_op("elementwise_add_grad", {{"Out@GRAD", {"dout"}}}, {{"X@GRAD", {"dx"}}, {"Y@GRAD", {"dy"}}},
                          {{"y_shape", declared}, {"y_dtype", std::string(dtype_name(narrow))}})},
                 {{"dout", dout}}, device, ExecEnv{}, {"dx", "dy"});
  CHECK(grad.at("dy").dtype() == narrow);
  CHECK(grad.at("dy").shape() == s);
  expect_identical(grad.at("dy"), to_dtype(dout, narrow), "dY of a narrow Y vs dOut cast " + what);
  expect_identical(grad.at("dx"), dout, "dX of the residual add " + what);
}

/// layer_norm of an FP32 X with out_dtype FP16/BF16 (amp::fold_casts_into_producers)
/// gives, bit for bit, the FP32 op's Y cast to that dtype and the same
/// statistics; layer_norm_grad reading that narrow Y's gradient gives what it
/// gives on the gradient widened to FP32.
inline void check_narrowing_layer_norm(Device device, DType narrow, const Shape& s) {
  const std::string what = std::string(dtype_name(narrow)) + " " + shape_str(s);
  INFO("layer_norm out_dtype " << what);
  const int64_t cols = s.back();
  const Tensor x = random_tensor(s, DType::f32, 91, -3.f, 5.f);
  const Tensor scale = random_tensor({cols}, DType::f32, 92, 0.5f, 1.5f);
  const Tensor bias = random_tensor({cols}, DType::f32, 93, -0.5f, 0.5f);
  const std::vector<std::pair<std::string, Tensor>> feeds{{"x", x}, {"scale", scale}, {"bias", bias}};
  const int64_t axis = static_cast<int64_t>(s.size()) - 1;
  const auto ln = [&](std::map<std::string, Attr> attrs) {
    attrs["begin_norm_axis"] = axis;
    return make_op("layer_norm", {{"X", {"x"}}, {"Scale", {"scale"}}, {"Bias", {"bias"}}},
                   {{"Y", {"y"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}}, attrs);
  };
  const auto folded = run_ops_on({ln({{"out_dtype", std::string(dtype_name(narrow))}})}, feeds, device, ExecEnv{},
                                 {"y", "mean", "var"});
  const auto wide = run_ops_on({ln({})}, feeds, device, ExecEnv{}, {"y", "mean", "var"});
  CHECK(folded.at("y").dtype() == narrow);
  expect_identical(folded.at("y"), to_dtype(wide.at("y"), narrow), "layer_norm out_dtype vs cast(layer_norm) " + what);
  for (const char* stat : {"mean", "var"})
    expect_identical(folded.at(stat), wide.at(stat), std::string(stat) + " " + what);

  const Tensor dy = random_tensor(s, narrow, 94, -2.f, 2.f);
  const auto grad = [&](const Tensor& dy_value) {
    std::vector<std::pair<std::string, Tensor>> f = feeds;
    f.emplace_back("mean", wide.at("mean"));
    f.emplace_back("var", wide.at("var"));
    f.emplace_back("dy", dy_value);
    return run_ops_on(
        {make_op("layer_norm_grad",
                 {{"X", {"x"}}, {"Scale", {"scale"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}, {"Y@GRAD", {"dy"}}},
                 {{"X@GRAD", {"dx"}}, {"Scale@GRAD", {"dscale"}}, {"Bias@GRAD", {"dbias"}}},
                 {{"begin_norm_axis", axis}})},
        f, device, ExecEnv{}, {"dx", "dscale", "dbias"});
  };
  const auto gnarrow = grad(dy), gwidened = grad(to_dtype(dy, DType::f32));
  CHECK(gnarrow.at("dx").dtype() == DType::f32);
  for (const char* g : {"dx", "dscale", "dbias"})
    expect_identical(gnarrow.at(g), gwidened.at(g), std::string(g) + " from a narrow Y@GRAD vs its widening " + what);
}

}  // namespace mix::testing
