#pragma once
// The contract of fused_add_layer_norm (runtime/ops/fused_add_layer_norm.cc),
// checked on one device: its Out, Norm, Mean and Variance are, bit for bit,
// elementwise_add's output and layer_norm's outputs on it, run as two ops on
// the same device. That equality is what runtime/passes/fuse_add_layer_norm.h
// rests on. test_fuse_add_layer_norm.cc runs it on the CPU,
// test_cuda_transformer_ops.cc on the GPU.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/cuda_compare.h"

namespace mix::testing {

/// X of `x_shape` in `x_dtype` plus Y of `y_shape` (X's shape or its trailing
/// dims) in `y_dtype`, normalised over the last dim into `norm_dtype` (X's,
/// or FP16/BF16 for an FP32 X: layer_norm's out_dtype).
inline void check_fused_add_layer_norm(Device device, DType x_dtype, DType y_dtype, DType norm_dtype,
                                       const Shape& x_shape, const Shape& y_shape) {
  const std::string what =
      dname(x_dtype) + shape_str(x_shape) + " + " + dname(y_dtype) + shape_str(y_shape) + " -> " + dname(norm_dtype);
  INFO("fused_add_layer_norm " << what);
  const int64_t cols = x_shape.back();
  std::map<std::string, Attr> attrs{{"begin_norm_axis", static_cast<int64_t>(x_shape.size()) - 1}};
  if (norm_dtype != x_dtype) attrs["out_dtype"] = std::string(dtype_name(norm_dtype));
  const std::vector<std::pair<std::string, Tensor>> feeds{
      {"x", random_tensor(x_shape, x_dtype, 401, -3.f, 3.f)},
      {"y", random_tensor(y_shape, y_dtype, 402, -2.f, 4.f)},
      {"scale", random_tensor({cols}, DType::f32, 403, 0.5f, 1.5f)},
      {"bias", random_tensor({cols}, DType::f32, 404, -0.5f, 0.5f)}};
  const std::map<std::string, std::vector<std::string>> ln_params{{"Scale", {"scale"}}, {"Bias", {"bias"}}};
  std::map<std::string, std::vector<std::string>> fused_ins = ln_params, ln_ins = ln_params;
  fused_ins["X"] = {"x"};
  fused_ins["Y"] = {"y"};
  ln_ins["X"] = {"s"};
  const auto fused =
      run_ops_on({make_op("fused_add_layer_norm", fused_ins,
                          {{"Out", {"s"}}, {"Norm", {"n"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}}, attrs)},
                 feeds, device, ExecEnv{}, {"s", "n", "mean", "var"});
  const auto apart =
      run_ops_on({make_op("elementwise_add", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"s"}}}, {{"axis", int64_t{-1}}}),
                  make_op("layer_norm", ln_ins, {{"Y", {"n"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}}, attrs)},
                 feeds, device, ExecEnv{}, {"s", "n", "mean", "var"});
  CHECK(fused.at("s").dtype() == x_dtype);
  CHECK(fused.at("n").dtype() == norm_dtype);
  for (const char* out : {"s", "n", "mean", "var"})
    expect_identical(fused.at(out), apart.at(out),
                     std::string(out) + " of fused_add_layer_norm vs add + layer_norm " + what);
}

}  // namespace mix::testing
