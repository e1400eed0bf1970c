// F16C paths of the bulk conversions. This file alone is compiled with -mf16c;
// callers reach it only after cpu_has_f16c() said yes.
#include <immintrin.h>

#include "runtime/half.h"

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

}  // namespace mix::half_bulk
