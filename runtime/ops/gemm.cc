#include "runtime/ops/gemm.h"

#include <cblas.h>

#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/library_versions.h"

namespace mix::cpu {

#ifdef OPENBLAS_VERSION
namespace {
// OPENBLAS_VERSION reads " OpenBLAS 0.3.21 ": the number is its last word.
[[maybe_unused]] const bool registered = [] {
  std::string v = OPENBLAS_VERSION;
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return register_library_version("OpenBLAS", v.substr(v.rfind(' ') + 1));
}();
}  // namespace
#endif

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
           float beta, float* c) {
  if (m == 0 || n == 0) return;
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, lda, b, ldb, beta, c,
              static_cast<int>(n));
}

void gemm_tensors(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b,
                  Tensor& out) {
  const float* af = as_f32(a, 0);
  const float* bf = as_f32(b, 1);
  if (out.dtype() == DType::f32) {
    sgemm(trans_a, trans_b, m, n, k, 1.f, af, bf, 0.f, out.data<float>());
    return;
  }
  std::vector<float>& acc = scratch_f32(2);
  acc.resize(static_cast<size_t>(m * n));
  sgemm(trans_a, trans_b, m, n, k, 1.f, af, bf, 0.f, acc.data());
  store_f32(acc.data(), out);
}

}  // namespace mix::cpu
