#pragma once
// update_loss_scaling over a scaler's state variables, in place, as the AMP
// rewrite appends it: shared by the tests that run the op (test_loss_scaler,
// test_cuda_ops, test_amp_step_kernels_emulated).
#include <map>
#include <string>

#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"

namespace mix::testing {

/// The variables of the scaler's state, by role.
struct ScalerStateNames {
  std::string scale, good, bad, skipped, at_min;
};

/// update_loss_scaling reading FoundInfinite `found` and writing each state
/// variable in place.
inline OpDesc update_loss_scaling_op(const std::string& found, const ScalerStateNames& s,
                                     const std::map<std::string, Attr>& attrs) {
  return make_op("update_loss_scaling",
                 {{"FoundInfinite", {found}},
                  {"PrevLossScaling", {s.scale}},
                  {"InGoodSteps", {s.good}},
                  {"InBadSteps", {s.bad}},
                  {"Skipped", {s.skipped}},
                  {"ConsecutiveSkipsAtMin", {s.at_min}}},
                 {{"LossScaling", {s.scale}},
                  {"OutGoodSteps", {s.good}},
                  {"OutBadSteps", {s.bad}},
                  {"OutSkipped", {s.skipped}},
                  {"OutConsecutiveSkipsAtMin", {s.at_min}}},
                 attrs);
}

}  // namespace mix::testing
