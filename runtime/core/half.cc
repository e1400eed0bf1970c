#include "runtime/core/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace mix::half_bulk {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// CPUID rather than __builtin_cpu_supports("f16c"), which clang does not
// know: F16C's instructions need AVX, and AVX needs the operating system to
// save the YMM registers (OSXSAVE, and XCR0's SSE and AVX state bits).
bool probe_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  if (!(ecx & bit_F16C) || !(ecx & bit_AVX) || !(ecx & bit_OSXSAVE)) return false;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  return (xcr0_low & 0x6u) == 0x6u;
}
#else
bool probe_f16c() { return false; }
#endif

}  // namespace

bool cpu_has_f16c() {
  static const bool has = probe_f16c();
  return has;
}

void f32_to_f16_portable(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_half_bits(in[i]);
}
void f16_to_f32_portable(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = half_bits_to_float(in[i]);
}

void f32_to_f16(const float* in, uint16_t* out, size_t n) {
  if (cpu_has_f16c()) {
    f32_to_f16_f16c(in, out, n);
  } else {
    f32_to_f16_portable(in, out, n);
  }
}
void f16_to_f32(const uint16_t* in, float* out, size_t n) {
  if (cpu_has_f16c()) {
    f16_to_f32_f16c(in, out, n);
  } else {
    f16_to_f32_portable(in, out, n);
  }
}

void f16_add_portable(uint16_t* inout, const uint16_t* in, size_t n) {
  for (size_t i = 0; i < n; ++i) inout[i] = float_to_half_bits(half_bits_to_float(inout[i]) + half_bits_to_float(in[i]));
}
void f16_add(uint16_t* inout, const uint16_t* in, size_t n) {
  if (cpu_has_f16c()) {
    f16_add_f16c(inout, in, n);
  } else {
    f16_add_portable(inout, in, n);
  }
}

void f16_scale_portable(const uint16_t* in, uint16_t* out, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_half_bits(factor * half_bits_to_float(in[i]) + 0.f);
}
void f16_scale(const uint16_t* in, uint16_t* out, size_t n, float factor) {
  if (cpu_has_f16c()) {
    f16_scale_f16c(in, out, n, factor);
  } else {
    f16_scale_portable(in, out, n, factor);
  }
}

void f32_to_bf16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
}
void bf16_to_f32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_float(in[i]);
}

}  // namespace mix::half_bulk
