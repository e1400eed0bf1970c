#pragma once
// IEEE binary16 and bfloat16 conversions, written once for host and device.
//
// Rounding is round-to-nearest-even, subnormals are kept, values beyond the
// largest finite half become inf, and NaN stays NaN (quiet). These are the
// semantics of the GPU conversion instructions, so the CPU backend reproduces
// underflow and overflow exactly where a GPU would.
//
// On the device the conversions are those instructions (cvt), not the portable
// integer code below: that code is a few dozen instructions with branches per
// value, and in an FP16 elementwise kernel it cost more time than moving the
// bytes. The results are the same bits for every number, infinity and zero; a
// NaN stays a NaN, its payload the GPU's own (as everywhere on a GPU).
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define MIX_HD __host__ __device__ __forceinline__
#else
#define MIX_HD inline
#endif

namespace mix {

struct half_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};

MIX_HD uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
MIX_HD float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

/// float -> binary16 bits: cvt.rn.f16.f32 on the device, portable integer arithmetic on the host.
MIX_HD uint16_t float_to_half_bits(float f) {
#ifdef __CUDA_ARCH__
  return __half_as_ushort(__float2half_rn(f));
#else
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x0200u | ((abs >> 13) & 0x3ffu) : 0u));
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to zero
    // Shift the implicit-1 mantissa into place, rounding to nearest even.
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14..24
    const uint32_t half_mant = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    uint32_t r = half_mant;
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped bits.
  uint32_t r = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | r);
#endif
}

/// binary16 bits -> float (exact): cvt.f32.f16 on the device.
MIX_HD float half_bits_to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) {
    // inf stays inf; a NaN keeps its payload and gets the quiet bit, as F16C's
    // vcvtph2ps and the GPU's cvt.f32.f16 do (a signalling NaN becomes quiet).
    return bits_float(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u));
  }
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: value = mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
#endif
}

/// float -> bfloat16 bits, round to nearest even; NaN stays quiet NaN (on the
/// device cvt.rn.bf16.f32 where the GPU has it, sm_80 on).
MIX_HD uint16_t float_to_bf16_bits(float f) {
#ifdef __CUDA_ARCH__
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + lsb) >> 16);
#endif
}

MIX_HD float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

MIX_HD half_t to_half(float f) { return half_t{float_to_half_bits(f)}; }
MIX_HD float to_float(half_t h) { return half_bits_to_float(h.bits); }
MIX_HD bf16_t to_bf16(float f) { return bf16_t{float_to_bf16_bits(f)}; }
MIX_HD float to_float(bf16_t b) { return bf16_bits_to_float(b.bits); }
MIX_HD float to_float(float f) { return f; }

/// Storage conversion: the value a kernel writes when its output is of type T.
template <typename T>
MIX_HD T from_float(float f);
template <>
MIX_HD float from_float<float>(float f) { return f; }
template <>
MIX_HD half_t from_float<half_t>(float f) { return to_half(f); }
template <>
MIX_HD bf16_t from_float<bf16_t>(float f) { return to_bf16(f); }

/// Rounds through binary16 and back: what an FP16 store then load yields.
MIX_HD float round_to_half(float f) { return half_bits_to_float(float_to_half_bits(f)); }
/// Rounds through T and back: what a store to a T tensor then a load yields.
template <typename T>
MIX_HD float round_as(float f) {
  return to_float(from_float<T>(f));
}

// ---- bulk conversions (host). These pick F16C when the CPU has it. ------------
namespace half_bulk {
/// True when this CPU executes F16C instructions (checked once).
bool cpu_has_f16c();
void f32_to_f16(const float* in, uint16_t* out, size_t n);
void f16_to_f32(const uint16_t* in, float* out, size_t n);
// The two paths, exposed so tests can check them against each other.
void f32_to_f16_portable(const float* in, uint16_t* out, size_t n);
void f16_to_f32_portable(const uint16_t* in, float* out, size_t n);
void f32_to_f16_f16c(const float* in, uint16_t* out, size_t n);
void f16_to_f32_f16c(const uint16_t* in, float* out, size_t n);
void f32_to_bf16(const float* in, uint16_t* out, size_t n);
void bf16_to_f32(const uint16_t* in, float* out, size_t n);

/// inout[i] = inout[i] + in[i], added in FP32 and rounded to binary16 once: one hop
/// of a half-precision all-reduce. Fused, so the F16C path reads each input once
/// and needs no FP32 staging buffer (the MPI reduction's hot loop).
void f16_add(uint16_t* inout, const uint16_t* in, size_t n);
void f16_add_portable(uint16_t* inout, const uint16_t* in, size_t n);
void f16_add_f16c(uint16_t* inout, const uint16_t* in, size_t n);

/// out[i] = factor * in[i] + 0, in FP32, rounded to binary16 once: fn::Scale{factor,
/// 0, true} on half storage, bit for bit (the + 0 turns a -0 product into +0, as
/// the functor does). The pre/post division of the gradient all-reduce runs on
/// every FP16 gradient each step; fused, it is one read and one write. in may be out.
void f16_scale(const uint16_t* in, uint16_t* out, size_t n, float factor);
void f16_scale_portable(const uint16_t* in, uint16_t* out, size_t n, float factor);
void f16_scale_f16c(const uint16_t* in, uint16_t* out, size_t n, float factor);
}  // namespace half_bulk

}  // namespace mix
