#include "runtime/core/float_convert.h"

#include <cstring>

#include "runtime/core/check.h"
#include "runtime/core/half.h"

namespace mix::cpu {

std::vector<float>& scratch_f32(int slot) {
  thread_local std::vector<float> buffers[5];
  MIX_CHECK(slot >= 0 && slot < 5, "scratch slot " << slot << " out of range");
  return buffers[slot];
}

const float* as_f32(const Tensor& t, int slot) {
  if (t.dtype() == DType::f32) return t.data<float>();
  std::vector<float>& buf = scratch_f32(slot);
  buf.resize(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::f16) {
    half_bulk::f16_to_f32(t.data<uint16_t>(), buf.data(), buf.size());
  } else if (t.dtype() == DType::bf16) {
    half_bulk::bf16_to_f32(t.data<uint16_t>(), buf.data(), buf.size());
  } else {
    MIX_FAIL("cannot read a " << dtype_name(t.dtype()) << " tensor as floats (expected f32, f16 or bf16)");
  }
  return buf.data();
}

void store_f32(const float* src, Tensor& dst) {
  const size_t n = static_cast<size_t>(dst.numel());
  switch (dst.dtype()) {
    case DType::f32:
      if (n > 0) std::memcpy(dst.data<float>(), src, n * 4);  // an empty tensor has no storage: no null to memcpy
      return;
    case DType::f16: half_bulk::f32_to_f16(src, dst.data<uint16_t>(), n); return;
    case DType::bf16: half_bulk::f32_to_bf16(src, dst.data<uint16_t>(), n); return;
    default: MIX_FAIL("cannot store floats into a " << dtype_name(dst.dtype()) << " tensor");
  }
}

}  // namespace mix::cpu
