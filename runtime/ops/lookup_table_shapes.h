#pragma once
// lookup_table's checks and shapes, shared by its CPU kernels
// (runtime/ops/lookup_table.cc) and its CUDA launchers
// (runtime/ops/cuda/lookup_table.cu). Only the id range check is the CPU's
// alone: it reads every id, which on a GPU would cost a host round trip.
#include <cstdint>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"

namespace mix::lookup_rules {

inline bool is_id_dtype(DType t) { return t == DType::i64 || t == DType::i32; }

inline void check_id_dtype(const std::string& op, const Tensor& ids) {
  MIX_CHECK(is_id_dtype(ids.dtype()), op << ": Ids must be i64 or i32, got " << dtype_name(ids.dtype()));
}

inline void check_padding_idx(const std::string& op, int64_t padding_idx, int64_t rows) {
  MIX_CHECK(padding_idx == -1 || (padding_idx >= 0 && (rows < 0 || padding_idx < rows)),
            op << ": padding_idx " << padding_idx << " must be -1 (none) or a row of W in [0, " << rows << ")");
}

/// Out's shape: Ids' shape + [D].
inline Shape out_shape(const Shape& ids, int64_t d) {
  Shape s = ids;
  s.push_back(d);
  return s;
}

inline void check_table(const std::string& op, const Tensor& w) {
  MIX_CHECK(w.ndim() == 2 && is_floating(w.dtype()),
            op << ": W must be a float [V, D] table, got " << dtype_name(w.dtype()) << shape_str(w.shape()));
}

/// lookup_table_grad's Out@GRAD: W's dtype, Out's shape.
inline void check_grad_input(const Tensor& w, const Tensor& ids, const Tensor& dout) {
  const Shape want = out_shape(ids.shape(), w.dim(1));
  MIX_CHECK(dout.shape() == want && dout.dtype() == w.dtype(),
            "lookup_table_grad: Out@GRAD " << dtype_name(dout.dtype()) << shape_str(dout.shape()) << " must be "
                                           << dtype_name(w.dtype()) << shape_str(want));
}

}  // namespace mix::lookup_rules
