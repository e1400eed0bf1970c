#pragma once
// softmax's axis and causal rules, shared by its CPU kernels
// (runtime/ops/softmax.cc) and its CUDA launchers (runtime/ops/cuda/softmax.cu):
// X as rows of its last dim, and for causal=true the query count T (dim -2)
// that fixes each row's visible prefix (fn::causal_valid_cols).
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/program.h"
#include "runtime/kernels/softmax_row.h"

namespace mix::softmax_rules {

/// Rows and row length of X [..., C], after checking the axis attribute; for a
/// causal softmax, t is the query count (dim -2), else 0.
struct Rows {
  int64_t rows, cols, t = 0;
  /// The columns row r keeps: all of them, or its causal prefix.
  int64_t valid(int64_t r) const { return t > 0 ? fn::causal_valid_cols(r, t, cols) : cols; }
};

inline void check_axis(int64_t axis, size_t ndim, const std::string& op) {
  const int64_t last = static_cast<int64_t>(ndim) - 1;
  MIX_CHECK(ndim >= 1, op << ": input must have at least one dim");
  MIX_CHECK(axis == -1 || axis == last, op << ": only the last axis is supported (axis -1 or " << last << "), got axis "
                                           << axis << "; transpose the softmax axis to the end first");
}

/// With causal, X must be [..., T, S] with T <= S (dims of -1, unknown at build
/// time, pass; the kernel checks the real ones).
inline void check_causal(const OpDesc& op, const Shape& s, const std::string& what) {
  if (!op.attr<bool>("causal", false)) return;
  MIX_CHECK(s.size() >= 2,
            op.type << ": causal needs " << what << " of shape [..., T, S] (queries, keys), got " << shape_str(s));
  const int64_t t = s[s.size() - 2], k = s.back();
  MIX_CHECK(t < 0 || k < 0 || t <= k, op.type << ": causal needs no more queries than keys, but " << what << " "
                                              << shape_str(s) << " has T = " << t << " > S = " << k
                                              << " (the first queries would see no key)");
}

/// The kernels' view of X (or Out): the axis and causal checks, then the rows.
inline Rows rows_of(const OpDesc& op, const Shape& s, const std::string& what) {
  check_axis(op.attr<int64_t>("axis", -1), s.size(), op.type);
  check_causal(op, s, what);
  const int64_t cols = s.back();
  Rows r{cols == 0 ? 0 : shape_numel(s) / cols, cols};
  if (op.attr<bool>("causal", false)) r.t = s[s.size() - 2];
  return r;
}

}  // namespace mix::softmax_rules
