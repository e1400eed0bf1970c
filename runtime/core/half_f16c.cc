// F16C paths of the bulk conversions. This file alone is compiled with -mf16c;
// callers reach it only after cpu_has_f16c() said yes.
#include <immintrin.h>

#include "runtime/core/half.h"

namespace mix::half_bulk {

void f32_to_f16_f16c(const float* in, uint16_t* out, size_t n) {
#if defined(__F16C__)
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    // Immediate 0: round to nearest even, the IEEE default and the GPU's.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  // The tail goes through the portable function in half.cc rather than the inline
  // float_to_half_bits: an out-of-line copy of an inline function emitted here would
  // carry AVX encodings, and the linker may pick it for every other caller too.
  f32_to_f16_portable(in + i, out + i, n - i);
#else
  f32_to_f16_portable(in, out, n);
#endif
}

void f16_to_f32_f16c(const uint16_t* in, float* out, size_t n) {
#if defined(__F16C__)
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  f16_to_f32_portable(in + i, out + i, n - i);  // see f32_to_f16_f16c
#else
  f16_to_f32_portable(in, out, n);
#endif
}

void f16_add_f16c(uint16_t* inout, const uint16_t* in, size_t n) {
#if defined(__F16C__)
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(inout + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(inout + i),
                     _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
  }
  f16_add_portable(inout + i, in + i, n - i);  // see f32_to_f16_f16c
#else
  f16_add_portable(inout, in, n);
#endif
}

void f16_scale_f16c(const uint16_t* in, uint16_t* out, size_t n, float factor) {
#if defined(__F16C__)
  const __m256 f = _mm256_set1_ps(factor);
  const __m256 zero = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_add_ps(_mm256_mul_ps(f, x), zero), _MM_FROUND_TO_NEAREST_INT));
  }
  f16_scale_portable(in + i, out + i, n - i, factor);  // see f32_to_f16_f16c
#else
  f16_scale_portable(in, out, n, factor);
#endif
}

}  // namespace mix::half_bulk
