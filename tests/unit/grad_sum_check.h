#pragma once
// The contract of input Accumulate (runtime/ops/accumulate_input.h), checked
// on one device: layer_norm_grad and lookup_table_grad given a gradient's
// other part write, bit for bit, what the op alone writes followed by `sum`
// of the two parts (lookup_table_grad's FP16/BF16 part cast to FP32 first,
// on the host: widening is exact). That equality is what
// runtime/passes/fold_grad_sums.h rests on. The other part holds -0.0 where
// the op's own part is +0 (rows lookup_table_grad never touches, and one it
// does), where `sum` gives +0, so an op that copied its Accumulate there
// would fail. test_fold_grad_sums.cc runs it on the CPU,
// test_cuda_transformer_ops.cc on the GPU.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"

namespace mix::testing {

/// `sum` of the two parts on `device` (the op itself, one program of its own).
inline Tensor sum_of_parts(Device device, const Tensor& a, const Tensor& b) {
  return run_ops_on({make_op("sum", {{"X", {"a", "b"}}}, {{"Out", {"out"}}})}, {{"a", a}, {"b", b}}, device, ExecEnv{},
                    {"out"})
      .at("out");
}

/// Whether element i of t is -0.0.
inline bool is_negative_zero(const Tensor& t, int64_t i) {
  return t.item_float(i) == 0.f && std::signbit(t.item_float(i));
}

/// layer_norm_grad over X of `shape` (normalised over the last dim) in `dt`,
/// Y@GRAD in `dy_dtype` (dt, or f16/bf16 beside an f32 X).
inline void check_layer_norm_grad_accumulate(Device device, DType dt, DType dy_dtype, const Shape& shape) {
  const std::string what = dname(dt) + " X, " + dname(dy_dtype) + " Y@GRAD " + shape_str(shape);
  INFO("layer_norm_grad Accumulate " << what);
  const int64_t cols = shape.back(), axis = static_cast<int64_t>(shape.size()) - 1;
  const Tensor x = random_tensor(shape, dt, 301, -3.f, 5.f);
  const Tensor scale = random_tensor({cols}, DType::f32, 302, 0.5f, 1.5f);
  const Tensor bias = random_tensor({cols}, DType::f32, 303, -0.5f, 0.5f);
  const std::map<std::string, Attr> attrs{{"begin_norm_axis", axis}};
  const auto stats = run_ops_on({make_op("layer_norm", {{"X", {"x"}}, {"Scale", {"scale"}}, {"Bias", {"bias"}}},
                                         {{"Y", {"y"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}}, attrs)},
                                {{"x", x}, {"scale", scale}, {"bias", bias}}, device, ExecEnv{}, {"mean", "var"});
  const Tensor dy = random_tensor(shape, dy_dtype, 304, -2.f, 2.f);
  std::vector<float> other_v = random_tensor(shape, DType::f32, 305, -4.f, 4.f).to_floats();
  other_v[0] = -0.f;
  const Tensor other = floats(shape, other_v, dt);
  const auto grad = [&](bool accumulate) {
    std::map<std::string, std::vector<std::string>> ins{
        {"X", {"x"}}, {"Scale", {"scale"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}, {"Y@GRAD", {"dy"}}};
    if (accumulate) ins["Accumulate"] = {"other"};
    return run_ops_on(
        {make_op("layer_norm_grad", ins, {{"X@GRAD", {"dx"}}, {"Scale@GRAD", {"ds"}}, {"Bias@GRAD", {"db"}}}, attrs)},
        {{"x", x},
         {"scale", scale},
         {"mean", stats.at("mean")},
         {"var", stats.at("var")},
         {"dy", dy},
         {"other", other}},
        device, ExecEnv{}, {"dx", "ds", "db"});
  };
  const auto own = grad(false), folded = grad(true);
  CHECK(folded.at("dx").dtype() == dt);
  expect_identical(folded.at("dx"), sum_of_parts(device, other, own.at("dx")),
                   "layer_norm_grad with Accumulate vs layer_norm_grad + sum " + what);
  CHECK(std::memcmp(folded.at("dx").raw(), own.at("dx").raw(), own.at("dx").bytes()) != 0);  // the part was added
  for (const char* g : {"ds", "db"}) expect_identical(folded.at(g), own.at(g), std::string(g) + " unchanged " + what);
}

/// lookup_table_grad of a [40, 24] table of `w_dtype` over 21 ids (duplicates,
/// the padding row 5, rows no id names), with its other part in `other_dtype`
/// (w_dtype, or f16/bf16 beside an f32 table).
inline void check_lookup_table_grad_accumulate(Device device, DType w_dtype, DType other_dtype) {
  const std::string what = dname(w_dtype) + " W, " + dname(other_dtype) + " Accumulate";
  INFO("lookup_table_grad Accumulate " << what);
  const int64_t vocab = 40, d = 24;
  const std::vector<int64_t> ids_v{3, 17, 3, 5, 0, 39, 17, 3, 8, 5, 22, 9, 3, 17, 30, 31, 0, 12, 8, 39, 2};
  const Tensor ids = i64_tensor({3, 7}, ids_v);
  const Tensor w = random_tensor({vocab, d}, w_dtype, 311);
  const Tensor dout = random_tensor({3, 7, d}, w_dtype, 312, -2.f, 2.f);
  std::vector<float> other_v = random_tensor({vocab, d}, DType::f32, 313, -3.f, 3.f).to_floats();
  const int64_t untouched = 1 * d + 4, touched_zero = 3 * d + 2;  // row 1: no id; row 3: id 3
  other_v[static_cast<size_t>(untouched)] = -0.f;
  other_v[static_cast<size_t>(touched_zero)] = -0.f;
  std::vector<float> dout_v = dout.to_floats();
  for (size_t i = 0; i < ids_v.size(); ++i)  // id 3's rows at column 2 sum to +0 exactly
    if (ids_v[i] == 3) dout_v[i * static_cast<size_t>(d) + 2] = 0.f;
  const Tensor dout_z = floats({3, 7, d}, dout_v, w_dtype);
  const Tensor other = floats({vocab, d}, other_v, other_dtype);
  const std::map<std::string, Attr> attrs{{"padding_idx", int64_t{5}}};
  const auto grad = [&](bool accumulate) {
    std::map<std::string, std::vector<std::string>> ins{{"W", {"w"}}, {"Ids", {"ids"}}, {"Out@GRAD", {"dout"}}};
    if (accumulate) ins["Accumulate"] = {"other"};
    return run_ops_on({make_op("lookup_table_grad", ins, {{"W@GRAD", {"dw"}}}, attrs)},
                      {{"w", w}, {"ids", ids}, {"dout", dout_z}, {"other", other}}, device, ExecEnv{}, {"dw"})
        .at("dw");
  };
  const Tensor own = grad(false), folded = grad(true);
  CHECK(folded.dtype() == w_dtype);
  expect_identical(folded, sum_of_parts(device, to_dtype(other, w_dtype), own),
                   "lookup_table_grad with Accumulate vs cast + lookup_table_grad + sum " + what);
  // -0.0 + +0 is +0: the part is added to every row, not copied into the rows no id names.
  CHECK(is_negative_zero(other, untouched));
  CHECK(is_negative_zero(other, touched_zero));
  CHECK(folded.item_float(untouched) == 0.f);
  CHECK(!std::signbit(folded.item_float(untouched)));
  CHECK(!std::signbit(folded.item_float(touched_zero)));
}

}  // namespace mix::testing
