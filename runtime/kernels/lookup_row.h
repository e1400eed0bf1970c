#pragma once
// lookup_table (embedding) row steps, written once for host and device
// (MIX_HD). The CPU kernel validates every id before any row is touched and
// names a bad one; the CUDA kernel (runtime/ops/cuda/lookup_table.cu) cannot
// without a host round trip, so it writes a NaN row for an id outside [0, V)
// and sends it no gradient. Rows are D contiguous values of W's storage type T.
#include <cstdint>

#include "runtime/core/half.h"

namespace mix::fn {

/// Whether `id` is the padding row (padding_idx -1: there is none): it reads
/// as zeros and takes no gradient.
MIX_HD bool lookup_is_padding(int64_t id, int64_t padding_idx) { return padding_idx >= 0 && id == padding_idx; }

/// Whether `id` names a row of a table with `rows` rows.
MIX_HD bool lookup_id_valid(int64_t id, int64_t rows) { return id >= 0 && id < rows; }

/// out[0..d) = W[id] (a plain copy, no rounding), or zeros for the padding row.
template <typename T>
MIX_HD void lookup_row(const T* w, int64_t id, int64_t d, int64_t padding_idx, T* out) {
  if (lookup_is_padding(id, padding_idx)) {
    for (int64_t j = 0; j < d; ++j) out[j] = from_float<T>(0.f);
    return;
  }
  const T* src = w + id * d;
  for (int64_t j = 0; j < d; ++j) out[j] = src[j];
}

/// acc[0..d) += dout[0..d): one occurrence of an id in the FP32 accumulator of
/// W@GRAD (duplicate ids sum, in position order; the CUDA twin sorts the ids
/// stably and adds each id's rows in the same order, so it gives the same bits).
template <typename T>
MIX_HD void lookup_grad_row_add(float* acc, const T* dout, int64_t d) {
  for (int64_t j = 0; j < d; ++j) acc[j] += to_float(dout[j]);
}

}  // namespace mix::fn
