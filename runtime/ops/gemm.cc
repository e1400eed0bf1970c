#include "runtime/ops/gemm.h"

#include <cblas.h>

#include <cstring>
#include <vector>

#include "runtime/check.h"

namespace mix::cpu {

namespace {
std::vector<float>& scratch(int slot) {
  thread_local std::vector<float> buffers[5];
  MIX_CHECK(slot >= 0 && slot < 5, "scratch slot " << slot << " out of range");
  return buffers[slot];
}
}  // namespace

const float* as_f32(const Tensor& t, int slot) {
  if (t.dtype() == DType::f32) return t.data<float>();
  std::vector<float>& buf = scratch(slot);
  buf.resize(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::f16) {
    half_bulk::f16_to_f32(t.data<uint16_t>(), buf.data(), buf.size());
  } else if (t.dtype() == DType::bf16) {
    half_bulk::bf16_to_f32(t.data<uint16_t>(), buf.data(), buf.size());
  } else {
    MIX_FAIL("GEMM input of dtype " << dtype_name(t.dtype()) << " (expected f32, f16 or bf16)");
  }
  return buf.data();
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
           float beta, float* c) {
  if (m == 0 || n == 0) return;
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, lda, b, ldb, beta, c,
              static_cast<int>(n));
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

void gemm_tensors(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b,
                  Tensor& out) {
  const float* af = as_f32(a, 0);
  const float* bf = as_f32(b, 1);
  if (out.dtype() == DType::f32) {
    sgemm(trans_a, trans_b, m, n, k, 1.f, af, bf, 0.f, out.data<float>());
    return;
  }
  std::vector<float>& acc = scratch(2);
  acc.resize(static_cast<size_t>(m * n));
  sgemm(trans_a, trans_b, m, n, k, 1.f, af, bf, 0.f, acc.data());
  store_f32(acc.data(), out);
}

}  // namespace mix::cpu
