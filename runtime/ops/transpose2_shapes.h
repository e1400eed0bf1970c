#pragma once
// transpose2's permutation rules, shared by its CPU kernels
// (runtime/ops/transpose2.cc) and its CUDA launchers
// (runtime/ops/cuda/transpose2.cu): the checked axis attr, the permuted shape
// and the inverse permutation (the grad's).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/program.h"
#include "runtime/kernels/transpose_index.h"

namespace mix::transpose_rules {

using Perm = std::vector<int64_t>;

/// The axis attr, checked to be a permutation of 0..ndim-1 (ndim <= kMaxTransposeDims).
inline Perm perm_attr(const OpDesc& op, size_t ndim) {
  MIX_CHECK(op.has_attr("axis"), op.type << ": attr 'axis' (the permutation) is required");
  const Perm p = op.attr<Perm>("axis", {});
  MIX_CHECK(p.size() == ndim,
            op.type << ": axis " << shape_str(p) << " has " << p.size() << " entries but X has " << ndim << " dims");
  MIX_CHECK(ndim <= static_cast<size_t>(fn::kMaxTransposeDims),
            op.type << ": X has " << ndim << " dims, more than the " << fn::kMaxTransposeDims << " supported");
  std::vector<bool> seen(ndim, false);
  for (int64_t a : p) {
    MIX_CHECK(a >= 0 && a < static_cast<int64_t>(ndim) && !seen[static_cast<size_t>(a)],
              op.type << ": axis " << shape_str(p) << " is not a permutation of 0.." << ndim - 1 << " (entry " << a
                      << (a >= 0 && a < static_cast<int64_t>(ndim) ? " repeats)" : " is out of range)"));
    seen[static_cast<size_t>(a)] = true;
  }
  return p;
}

inline Shape permuted(const Shape& x, const Perm& p) {
  Shape s(p.size());
  for (size_t k = 0; k < p.size(); ++k) s[k] = x[static_cast<size_t>(p[k])];
  return s;
}

inline Perm inverse(const Perm& p) {
  Perm inv(p.size());
  for (size_t k = 0; k < p.size(); ++k) inv[static_cast<size_t>(p[k])] = static_cast<int64_t>(k);
  return inv;
}

/// out = host tensor x permuted by `perm` (out already has the permuted shape
/// and x's dtype, checked): transpose2's CPU copy, also used by the channels-last CPU
/// kernels (runtime/ops/data_format.h). Defined in runtime/ops/transpose2.cc.
void permute_into_cpu(const Tensor& x, const Perm& perm, Tensor& out);

/// The copies under permute_into_cpu, over raw host buffers of `numel`
/// elements of `elem_bytes` each (the CPU twins of cuda::gather_into and
/// cuda::scatter_into): gather_cpu writes out[o] = x[plan.src_offset(o)],
/// scatter_cpu writes out[plan.src_offset(o)] = x[o] (and nothing else of out),
/// o running over [0, numel) = the plan's dims. Defined in runtime/ops/transpose2.cc.
void gather_cpu(const void* x, void* out, const fn::TransposePlan& plan, int64_t numel, size_t elem_bytes);
void scatter_cpu(const void* x, void* out, const fn::TransposePlan& plan, int64_t numel, size_t elem_bytes);

/// XShape's declared shape: [0] + X's shape (it holds no data).
inline Shape xshape_of(const Shape& x) {
  Shape xs{0};
  xs.insert(xs.end(), x.begin(), x.end());
  return xs;
}

}  // namespace mix::transpose_rules
