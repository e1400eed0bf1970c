#pragma once
// Floating tensors of any dtype (f32, f16, bf16) read as FP32 and written from
// FP32, rounding to nearest even on store: how the CPU kernels, initialisation
// and checkpoints convert, so every path rounds the same way.
#include <vector>

#include "runtime/core/tensor.h"

namespace mix::cpu {

/// A per-thread FP32 scratch buffer, slot 0..4, reused across calls (as_f32
/// takes the slot it is given; GEMM's accumulator is slot 2).
std::vector<float>& scratch_f32(int slot);

/// A read-only FP32 view of a tensor: the data itself for f32, else a widened
/// copy held in scratch_f32(scratch_slot).
const float* as_f32(const Tensor& t, int scratch_slot);

/// Stores an FP32 buffer into a tensor of any floating dtype (rounding on store).
void store_f32(const float* src, Tensor& dst);

}  // namespace mix::cpu
