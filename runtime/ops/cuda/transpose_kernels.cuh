#pragma once
// The copy kernel of transpose2 and of any strided view (gather_into,
// scatter_into: strided_copy.h), and the host's choice of its copy unit
// (transpose2.cu's header says why). Like row_group.cuh it needs no CUDA
// header, so tests/unit/test_transpose_kernels_emulated.cc runs this same
// source on the CPU against transpose_rules::gather_cpu and scatter_cpu.
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/core/check.h"
#include "runtime/cuda/copy_unit.cuh"
#include "runtime/kernels/transpose_index.h"

namespace mix::cuda {

/// out[o] = x[plan.src_offset(o)] (a gather) or out[plan.src_offset(o)] =
/// x[o] (a scatter), for o in [0, n), in units of E (a grid-stride map).
template <typename E, bool kScatter>
struct PlannedCopy {
  const E* x;
  E* out;
  fn::TransposePlan plan;
  __device__ void operator()(int64_t o) const {
    if constexpr (kScatter)
      out[plan.src_offset(o)] = x[o];
    else
      out[o] = x[plan.src_offset(o)];
  }
};

/// The widest unit (16, 8, 4 or 2 bytes, else the element's own `es`) that
/// covers whole elements of the plan's innermost run when that run is
/// contiguous on both sides, divides the run and every outer stride (always so
/// for a permutation: each steps over whole runs), and aligns both buffers.
inline size_t planned_copy_unit(const fn::TransposePlan& plan, size_t es, const void* x, const void* out) {
  if (!plan.inner_contiguous()) return es;
  const size_t run_bytes = static_cast<size_t>(plan.out_dims[plan.ndim - 1]) * es;
  const size_t unit = widest_copy_unit(run_bytes, x, out, [&](size_t u) {
    if (u <= es || u % es != 0) return false;  // whole elements, more than one
    const auto per = static_cast<int64_t>(u / es);
    for (int k = 0; k < plan.ndim - 1; ++k)
      if (plan.src_strides[k] % per != 0) return false;
    return true;
  });
  return unit > es ? unit : es;
}

/// The copy of `numel` elements of `es` bytes between x and out that `plan`
/// maps (a gather or, kScatter, a scatter: the plan's strides are on the
/// strided side, x for a gather, out for a scatter), in the unit
/// planned_copy_unit picks, the plan rescaled to count units:
/// launch(PlannedCopy<E, kScatter>{...}, units) runs it, E the unit's type.
/// Returns the unit in bytes (0: nothing to copy).
template <bool kScatter, typename Launch>
size_t planned_copy_in_units(const void* x, void* out, fn::TransposePlan plan, int64_t numel, size_t es,
                             const std::string& op, Launch&& launch) {
  if (numel == 0) return 0;
  const size_t unit = planned_copy_unit(plan, es, x, out);
  if (unit != es) {
    const auto per = static_cast<int64_t>(unit / es);  // elements per unit
    plan.out_dims[plan.ndim - 1] /= per;
    for (int k = 0; k < plan.ndim - 1; ++k) plan.src_strides[k] /= per;
  }
  const int64_t units = numel * static_cast<int64_t>(es) / static_cast<int64_t>(unit);
  const bool ran = with_copy_unit(unit, [&](auto unit_tag) {
    using E = typename decltype(unit_tag)::type;
    launch(PlannedCopy<E, kScatter>{static_cast<const E*>(x), static_cast<E*>(out), plan}, units);
  });
  MIX_CHECK(ran, op << ": no copy for elements of " << es << " bytes");
  return unit;
}

}  // namespace mix::cuda
