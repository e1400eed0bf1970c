#pragma once
// Shape and attribute rules of softmax_with_cross_entropy, shared by its CPU
// and CUDA kernels (the host-side checks both make before computing).
#include <cstdint>

#include "runtime/check.h"
#include "runtime/program.h"
#include "runtime/tensor.h"

namespace mix::xent {

inline constexpr const char* kOp = "softmax_with_cross_entropy";

/// Checks Label's shape against Logits' ([..., 1] or [...]); -1 (batch) matches anything.
inline void check_label_shape(const Shape& logits, const Shape& label) {
  const Shape lead(logits.begin(), logits.end() - 1);
  Shape with_one = lead;
  with_one.push_back(1);
  auto matches = [](const Shape& a, const Shape& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] >= 0 && b[i] >= 0 && a[i] != b[i]) return false;
    return true;
  };
  MIX_CHECK(matches(label, with_one) || matches(label, lead),
            kOp << ": Label " << shape_str(label) << " does not match Logits " << shape_str(logits) << " (expected "
                << shape_str(with_one) << " or " << shape_str(lead) << ")");
}

inline void check_attrs(const OpDesc& op, size_t logits_ndim) {
  MIX_CHECK(!op.attr<bool>("soft_label", false), kOp << ": soft_label=true is not supported (hard labels only)");
  const int64_t axis = op.attr<int64_t>("axis", -1);
  const int64_t last = static_cast<int64_t>(logits_ndim) - 1;
  MIX_CHECK(axis == -1 || axis == last,
            kOp << ": only the last axis is supported (axis -1 or " << last << "), got axis " << axis);
}

struct Dims {
  int64_t rows, classes;
};

inline Dims dims_of(const Tensor& logits, const Tensor& label) {
  MIX_CHECK(logits.ndim() >= 1, kOp << ": Logits must have at least one dim");
  MIX_CHECK(label.dtype() == DType::i64 || label.dtype() == DType::i32,
            kOp << ": Label is " << dtype_name(label.dtype()) << ", expected i64 class indices");
  check_label_shape(logits.shape(), label.shape());
  const int64_t c = logits.dim(-1);
  const int64_t rows = c == 0 ? 0 : logits.numel() / c;
  MIX_CHECK(label.numel() == rows, kOp << ": Label holds " << label.numel() << " values for " << rows << " rows");
  return {rows, c};
}

inline Shape loss_shape_of(const Shape& logits) {
  Shape s(logits.begin(), logits.end() - 1);
  s.push_back(1);
  return s;
}

}  // namespace mix::xent
