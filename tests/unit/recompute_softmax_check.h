#pragma once
// What the tests of softmax_with_cross_entropy without a stored softmax
// (runtime/passes/recompute_softmax.h) share: its gradient computed both ways on one
// device. test_recompute_softmax.cc runs it on the CPU, test_cuda_ops.cc on
// the GPU; on each, the two must be the same bits.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/ir/op_registry.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"

namespace mix::testing {

/// The op's dtype pairings: logits and softmax alike, or FP16/BF16 logits
/// with FP32 softmax and loss (attr out_dtype, runtime/ops/widening.h).
struct SoftmaxDtypes {
  DType logits, softmax;
};
inline constexpr SoftmaxDtypes kSoftmaxDtypes[] = {{DType::f32, DType::f32},
                                                   {DType::f16, DType::f16},
                                                   {DType::bf16, DType::bf16},
                                                   {DType::f16, DType::f32},
                                                   {DType::bf16, DType::f32}};

/// softmax_with_cross_entropy over `logits` with `attrs` on `device`, with
/// the softmax and loss in dtype `out` (through attr out_dtype where it
/// differs from the logits'), and its grad both ways: the forward with Softmax
/// then the grad reading it (`stored`: dx, loss, y), and the forward with
/// RowStats then the grad recomputing (`recomputed`: dx, loss).
struct CrossEntropyBothWays {
  std::map<std::string, Tensor> stored, recomputed;
};
inline CrossEntropyBothWays cross_entropy_both_ways(const Tensor& logits, const Tensor& label, DType out,
                                                    std::map<std::string, Attr> attrs, Device device) {
  std::map<std::string, Attr> grad_attrs = attrs;
  if (out != logits.dtype()) {
    attrs["out_dtype"] = std::string(dtype_name(out));
    grad_attrs["x_grad_dtype"] = std::string(dtype_name(logits.dtype()));
  }
  const int64_t rows = logits.numel() / logits.dim(-1);
  const std::vector<std::pair<std::string, Tensor>> feeds{
      {"x", logits}, {"label", label}, {"dloss", to_dtype(uniform_tensor({rows, 1}, 9, 0.5f, 2.f), out)}};
  CrossEntropyBothWays r;
  r.stored = run_ops_on(
      {make_op("softmax_with_cross_entropy", {{"Logits", {"x"}}, {"Label", {"label"}}},
               {{"Softmax", {"y"}}, {"Loss", {"loss"}}}, attrs),
       make_op("softmax_with_cross_entropy_grad", {{"Softmax", {"y"}}, {"Label", {"label"}}, {"Loss@GRAD", {"dloss"}}},
               {{"Logits@GRAD", {"dx"}}}, grad_attrs)},
      feeds, device, ExecEnv{}, {"dx", "loss", "y"});
  grad_attrs["softmax_dtype"] = std::string(dtype_name(out));
  r.recomputed =
      run_ops_on({make_op("softmax_with_cross_entropy", {{"Logits", {"x"}}, {"Label", {"label"}}},
                          {{"RowStats", {"stats"}}, {"Loss", {"loss"}}}, attrs),
                  make_op("softmax_with_cross_entropy_grad",
                          {{"Logits", {"x"}}, {"RowStats", {"stats"}}, {"Label", {"label"}}, {"Loss@GRAD", {"dloss"}}},
                          {{"Logits@GRAD", {"dx"}}}, grad_attrs)},
                 feeds, device, ExecEnv{}, {"dx", "loss"});
  return r;
}

/// Both ways of computing Logits@GRAD for `logits` on `device` (cross_entropy_both_ways),
/// label 3 ignored. Returns {stored, recomputed}, and checks that the losses are identical.
inline std::pair<Tensor, Tensor> stored_and_recomputed_grads(const Tensor& logits, const Tensor& label, DType out,
                                                             Device device) {
  const CrossEntropyBothWays r = cross_entropy_both_ways(logits, label, out, {{"ignore_index", int64_t{3}}}, device);
  expect_identical(r.recomputed.at("loss"), r.stored.at("loss"), "the loss");
  return {r.stored.at("dx"), r.recomputed.at("dx")};
}

}  // namespace mix::testing
