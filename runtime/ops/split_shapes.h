#pragma once
// split's attribute and shape rules, shared by its CPU kernels
// (runtime/ops/split.cc) and its CUDA launchers (runtime/ops/cuda/split.cu):
// the axis, the part sizes from num / sections, X viewed as [outer, dim,
// inner] strips, and split_grad's part sizes from the gradients present and X.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"

namespace mix::split_rules {

inline size_t split_axis(const OpDesc& op, const Shape& x) {
  const int64_t ndim = static_cast<int64_t>(x.size());
  const int64_t attr = op.attr<int64_t>("axis", 0);
  const int64_t a = attr < 0 ? attr + ndim : attr;
  MIX_CHECK(a >= 0 && a < ndim,
            op.type << ": axis " << attr << " is out of range for X " << shape_str(x) << " (" << ndim << " dims)");
  return static_cast<size_t>(a);
}

/// The part sizes along the axis; -1 where the dim is unknown at build time.
inline std::vector<int64_t> part_sizes(const OpDesc& op, const Shape& x, size_t axis) {
  const int64_t dim = x[axis];
  const int64_t num = op.attr<int64_t>("num", 0);
  const std::vector<int64_t> sections = op.attr<std::vector<int64_t>>("sections", {});
  MIX_CHECK(num == 0 || sections.empty(),
            op.type << ": set either num (" << num << ") or sections " << shape_str(sections) << ", not both");
  if (num != 0) {
    MIX_CHECK(num > 0, op.type << ": num must be positive, got " << num);
    MIX_CHECK(dim < 0 || dim % num == 0, op.type << ": num " << num << " does not divide dim " << axis << " of X "
                                                 << shape_str(x) << " (" << dim << "); use sections for unequal parts");
    return std::vector<int64_t>(static_cast<size_t>(num), dim < 0 ? -1 : dim / num);
  }
  MIX_CHECK(!sections.empty(), op.type << ": set num (equal parts) or sections (part sizes)");
  std::vector<int64_t> sizes = sections;
  int64_t known = 0;
  int rest_at = -1;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == -1) {
      MIX_CHECK(rest_at < 0, op.type << ": sections " << shape_str(sections) << " has more than one -1");
      rest_at = static_cast<int>(k);
    } else {
      MIX_CHECK(sizes[k] >= 0, op.type << ": sections " << shape_str(sections) << " has a negative size " << sizes[k]);
      known += sizes[k];
    }
  }
  if (dim < 0) return sizes;  // the -1 entry (if any) stays unknown until run time
  if (rest_at >= 0) {
    MIX_CHECK(known <= dim, op.type << ": sections " << shape_str(sections) << " add up to " << known
                                    << ", more than dim " << axis << " of X " << shape_str(x) << " (" << dim << ")");
    sizes[static_cast<size_t>(rest_at)] = dim - known;
  } else {
    MIX_CHECK(known == dim, op.type << ": sections " << shape_str(sections) << " add up to " << known << " but dim "
                                    << axis << " of X " << shape_str(x) << " is " << dim);
  }
  return sizes;
}

inline void check_out_count(const OpDesc& op, size_t outs, size_t parts) {
  MIX_CHECK(outs == parts,
            op.type << ": output Out lists " << outs << " variables but the attrs make " << parts << " parts");
}

inline Shape with_dim(Shape s, size_t axis, int64_t d) {
  s[axis] = d;
  return s;
}

/// X viewed as [outer, dim, inner] bytes around the axis.
struct Strips {
  int64_t outer = 1, dim = 0;
  size_t inner_bytes = 0;  // bytes of one index along the axis
};
inline Strips strips_of(const Shape& x, size_t axis, DType dtype) {
  Strips s;
  int64_t inner = 1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (i < axis) s.outer *= x[i];
    if (i > axis) inner *= x[i];
  }
  s.dim = x[axis];
  s.inner_bytes = static_cast<size_t>(inner) * dtype_size(dtype);
  return s;
}

/// What split_grad writes: X@GRAD's shape and dtype, the axis and each part's
/// size along it.
struct GradParts {
  Shape x_shape;
  DType dtype = DType::f32;
  size_t axis = 0;
  std::vector<int64_t> sizes;
};

/// split_grad's parts from the part gradients (null where a part has none)
/// and X (null when the op has no X input: then every part has a gradient).
/// Checks that the gradients agree with each other and with X.
inline GradParts grad_parts(const OpDesc& op, const std::vector<const Tensor*>& parts, const Tensor* x) {
  const Tensor* ref = nullptr;
  for (const Tensor* t : parts)
    if (t && !ref) ref = t;
  MIX_CHECK(ref, "split_grad: no part of Out@GRAD has a gradient");
  GradParts g;
  g.axis = split_axis(op, ref->shape());
  g.dtype = ref->dtype();
  const size_t axis = g.axis;
  // Part sizes: from the gradients present, and from X's shape for missing ones.
  std::vector<int64_t>& sizes = g.sizes;
  sizes.assign(parts.size(), -1);
  if (x) {
    sizes = part_sizes(op, x->shape(), axis);
    check_out_count(op, parts.size(), sizes.size());
  }
  for (size_t k = 0; k < parts.size(); ++k) {
    if (!parts[k]) {
      MIX_CHECK(sizes[k] >= 0, "split_grad: part " << k << " has no gradient and no X input gives its size");
      continue;
    }
    const bool same_rank = parts[k]->ndim() == ref->ndim();
    MIX_CHECK(parts[k]->dtype() == ref->dtype() && same_rank &&
                  parts[k]->shape() == with_dim(ref->shape(), axis, parts[k]->shape()[axis]),
              "split_grad: gradient of part " << k << " " << dtype_name(parts[k]->dtype())
                                              << shape_str(parts[k]->shape()) << " does not match part 0's "
                                              << dtype_name(ref->dtype()) << shape_str(ref->shape()) << " outside axis "
                                              << axis);
    const int64_t d = parts[k]->shape()[axis];
    MIX_CHECK(sizes[k] < 0 || sizes[k] == d, "split_grad: gradient of part " << k << " has " << d
                                                                             << " entries along axis " << axis
                                                                             << ", X's part has " << sizes[k]);
    sizes[k] = d;
  }
  int64_t total = 0;
  for (int64_t d : sizes) total += d;
  g.x_shape = with_dim(ref->shape(), axis, total);
  return g;
}

/// The part gradients of split_grad's Out@GRAD list, null where the name is "".
inline std::vector<const Tensor*> grad_inputs(const OpDesc& op, const Scope& scope) {
  std::vector<const Tensor*> r;
  for (auto& n : op.ins("Out@GRAD")) r.push_back(n.empty() ? nullptr : &scope.get(n));
  return r;
}

}  // namespace mix::split_rules
