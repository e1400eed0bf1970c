// Tests of runtime/core/half.h: binary16 / bfloat16 conversions, scalar and bulk.
//
// The oracles, from strongest to weakest independence:
//   - NumPy (float16) and PyTorch (bfloat16) on a table of boundary cases written by
//     tests/python/gen_rounding_table.py;
//   - a rounding check in double arithmetic written here (nearest value, ties to
//     even, overflow to inf), run on a few million random floats;
//   - an independent decoder of binary16 patterns (ldexp of mantissa and exponent);
//   - the scalar functions, the portable bulk loops and the F16C instructions
//     compared with each other bit for bit;
//   - the fused half kernels of the all-reduce against the functor loops.
// Test cases tagged [needs_f16c] test the F16C instructions: CTest runs them as
// unit.test_half.f16c, which reports skipped on a CPU without them.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/core/tensor.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "tests/skip_part.h"

namespace {

namespace hb = mix::half_bulk;

// False (the part is reported skipped) where the CPU has no F16C/AVX.
bool have_f16c() {
  if (hb::cpu_has_f16c()) return true;
  mix::testing::skip_part("this CPU has no F16C/AVX: the F16C paths are not tested here");
  return false;
}

bool half_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool bf16_is_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }
bool f32_is_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%0*x", digits, static_cast<unsigned>(v));
  return buf;
}
std::string hex16(uint16_t v) { return hex(v, 4); }
std::string hex32(uint32_t v) { return hex(v, 8); }

// Counts mismatches and keeps the first few, so a broken conversion reports one
// readable failure instead of 65,536 (or four million) of them.
struct Mismatches {
  std::string what;
  size_t count = 0;
  std::string first;
  explicit Mismatches(std::string w) : what(std::move(w)) {}
  void add(const std::string& s) {
    if (count++ < 10) first += "  " + s + "\n";
  }
};
#define CHECK_NONE(m)                                                           \
  do {                                                                          \
    INFO((m).what << ": " << (m).count << " mismatch(es), first:\n" << (m).first); \
    CHECK((m).count == 0);                                                      \
  } while (0)

// Value of a finite binary16 pattern, decoded independently of half.h.
double half_value_ref(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000u) ? -v : v;
}

// True when h is x rounded to binary16 as IEEE round-to-nearest-even says: no
// neighbour is nearer, a tie picks the even mantissa, and anything at or beyond
// 65520 (halfway from 65504 to the next power of two) is inf. NaN maps to NaN.
bool is_rne_half(float x, uint16_t h) {
  if (std::isnan(x)) return half_is_nan(h);
  if (((h & 0x8000u) != 0) != std::signbit(x)) return false;
  const double a = std::fabs(static_cast<double>(x));
  const uint16_t m = h & 0x7fffu;
  if (m == 0x7c00u) return a >= 65520.0;
  if (m > 0x7c00u) return false;
  const double v = half_value_ref(m);
  const double up = m == 0x7bffu ? 65536.0 : half_value_ref(static_cast<uint16_t>(m + 1));
  const double dn = m == 0 ? -half_value_ref(1) : half_value_ref(static_cast<uint16_t>(m - 1));
  // All differences are exact in double: both operands have few significant bits.
  const double d = std::fabs(a - v), du = std::fabs(up - a), dd = std::fabs(a - dn);
  if (d > du || d > dd) return false;
  if ((d == du || d == dd) && (m & 1u)) return false;
  return true;
}

// The same for bfloat16 (the upper 16 bits of a float32, rounded).
bool is_rne_bf16(float x, uint16_t b) {
  if (std::isnan(x)) return bf16_is_nan(b);
  if (((b & 0x8000u) != 0) != std::signbit(x)) return false;
  const double a = std::fabs(static_cast<double>(x));
  const uint16_t m = b & 0x7fffu;
  auto val = [](uint32_t bits) { return static_cast<double>(mix::bits_float(bits << 16)); };
  const double max_next = std::ldexp(1.0, 128);  // where 0x7f80 would sit if finite
  if (m == 0x7f80u) return a >= (val(0x7f7fu) + max_next) / 2;
  if (m > 0x7f80u) return false;
  const double v = val(m);
  const double up = m == 0x7f7fu ? max_next : val(m + 1u);
  const double dn = m == 0 ? -val(1) : val(m - 1u);
  const double d = std::fabs(a - v), du = std::fabs(up - a), dd = std::fabs(a - dn);
  if (d > du || d > dd) return false;
  if ((d == du || d == dd) && (m & 1u)) return false;
  return true;
}

std::vector<uint16_t> all_patterns() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

// Float32 inputs chosen where float->half conversion can go wrong, a few million
// of them, fixed seed. A quarter are uniform bit patterns (every exponent, inf
// and NaN included); the rest sit in or near the binary16 range.
const std::vector<float>& random_floats() {
  static const std::vector<float> v = [] {
    constexpr size_t kN = size_t{1} << 22;
    std::vector<float> out(kN);
    std::mt19937_64 rng(0x6d6978747261696eull);
    const float specials[] = {0.0f,
                              -0.0f,
                              65504.0f,
                              65519.99f,
                              65520.0f,
                              std::nextafter(65520.0f, 0.0f),
                              std::nextafter(65520.0f, 1e9f),
                              65536.0f,
                              std::numeric_limits<float>::max(),
                              std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::signaling_NaN(),
                              mix::bits_float(0x7f800001u),
                              mix::bits_float(0x7fbfffffu),
                              mix::bits_float(0x7f802000u),
                              std::ldexp(1.0f, -25),
                              std::nextafter(std::ldexp(1.0f, -25), 1.0f),
                              std::ldexp(1.0f, -24),
                              std::ldexp(1.5f, -24),
                              std::ldexp(1.0f, -14),
                              std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25),
                              std::numeric_limits<float>::denorm_min(),
                              std::numeric_limits<float>::min()};
    constexpr size_t kSpecials = sizeof specials / sizeof specials[0];
    for (size_t i = 0; i < kN; ++i) {
      const uint64_t r = rng();
      const uint32_t lo = static_cast<uint32_t>(r);
      const uint32_t sign = static_cast<uint32_t>(r >> 63) << 31;
      const unsigned kind = static_cast<unsigned>((r >> 40) % 20);
      uint32_t bits;
      if (kind < 5) {  // any bit pattern
        bits = lo;
      } else if (kind < 10) {  // float exponents 2^-26 .. 2^16: the binary16 range and its edges
        const uint32_t e = 101u + static_cast<uint32_t>((r >> 32) % 43u);
        bits = sign | (e << 23) | (lo & 0x7fffffu);
      } else if (kind < 14) {  // halfway between adjacent halves, or one float ulp off it
        const uint16_t h = static_cast<uint16_t>((r >> 32) % 0x7bffu);
        const float mid = static_cast<float>((half_value_ref(h) + half_value_ref(static_cast<uint16_t>(h + 1))) / 2);
        const int off = static_cast<int>((r >> 48) % 3u) - 1;
        bits = sign | static_cast<uint32_t>(static_cast<int64_t>(mix::float_bits(mid)) + off);
      } else if (kind < 16) {  // float subnormals and values far below the half subnormals
        const uint32_t e = static_cast<uint32_t>((r >> 32) % 102u);
        bits = sign | (e << 23) | (lo & 0x7fffffu);
      } else if (kind < 18) {  // around the overflow edge 65504 .. 65520 .. 65536
        const uint32_t centre = ((r >> 36) & 1u) ? 0x477ff000u : 0x47800000u;
        bits = sign | (centre - 4096u + (lo & 8191u));
      } else {
        bits = mix::float_bits(specials[(r >> 32) % kSpecials]) ^ sign;
      }
      out[i] = mix::bits_float(bits);
    }
    return out;
  }();
  return v;
}

}  // namespace

TEST_CASE("half: known values", "[half]") {
  struct Case {
    uint32_t f32;
    uint16_t f16;
    uint16_t bf16;
  };
  const Case cases[] = {
      {0x00000000u, 0x0000u, 0x0000u},  // +0
      {0x80000000u, 0x8000u, 0x8000u},  // -0
      {0x3f800000u, 0x3c00u, 0x3f80u},  // 1
      {0xc0000000u, 0xc000u, 0xc000u},  // -2
      {0x3dcccccdu, 0x2e66u, 0x3dcdu},  // 0.1f
      {0x3eaaaaabu, 0x3555u, 0x3eabu},  // 1/3
      {0x477fe000u, 0x7bffu, 0x4780u},  // 65504, the largest half
      {0x477fefffu, 0x7bffu, 0x4780u},  // 65519.99f: below the overflow tie
      {0x477ff000u, 0x7c00u, 0x4780u},  // 65520: tie with an odd mantissa, rounds up to inf
      {0x47800000u, 0x7c00u, 0x4780u},  // 65536
      {0x33000000u, 0x0000u, 0x3300u},  // 2^-25, half the smallest subnormal: tie -> 0
      {0x33000001u, 0x0001u, 0x3300u},  // just above it -> smallest subnormal
      {0x33800000u, 0x0001u, 0x3380u},  // 2^-24, smallest subnormal
      {0x33c00000u, 0x0002u, 0x33c0u},  // 1.5 * 2^-24: tie -> even (2)
      {0x34200000u, 0x0002u, 0x3420u},  // 2.5 * 2^-24: tie -> even (2)
      {0x387fc000u, 0x03ffu, 0x3880u},  // largest subnormal half
      {0x387fe000u, 0x0400u, 0x3880u},  // tie between it and 2^-14: rounds up into the normals
      {0x38800000u, 0x0400u, 0x3880u},  // 2^-14, smallest normal half
      {0x3f801000u, 0x3c00u, 0x3f80u},  // 1 + 2^-11: half tie, even stays
      {0x3f803000u, 0x3c02u, 0x3f80u},  // 1 + 3*2^-11: half tie, odd rounds up
      {0x3f808000u, 0x3c04u, 0x3f80u},  // bf16 tie, even stays
      {0x3f818000u, 0x3c0cu, 0x3f82u},  // bf16 tie, odd rounds up
      {0x3f808001u, 0x3c04u, 0x3f81u},  // just above a bf16 tie
      {0x7f7f7fffu, 0x7c00u, 0x7f7fu},  // just below bf16's overflow tie
      {0x7f7f8000u, 0x7c00u, 0x7f80u},  // bf16 overflow tie (max bf16 is odd) -> inf
      {0x7f7fffffu, 0x7c00u, 0x7f80u},  // FLT_MAX
      {0x7f800000u, 0x7c00u, 0x7f80u},  // inf
      {0xff800000u, 0xfc00u, 0xff80u},  // -inf
      {0x00000001u, 0x0000u, 0x0000u},  // smallest float subnormal
      {0x007fffffu, 0x0000u, 0x0080u},  // largest float subnormal: bf16 rounds up to FLT_MIN
  };
  for (const Case& c : cases) {
    INFO("f32 bits " << hex32(c.f32));
    const float x = mix::bits_float(c.f32);
    CHECK(hex16(mix::float_to_half_bits(x)) == hex16(c.f16));
    CHECK(hex16(mix::float_to_bf16_bits(x)) == hex16(c.bf16));
    CHECK(mix::to_half(x).bits == c.f16);
    CHECK(mix::from_float<mix::half_t>(x).bits == c.f16);
    CHECK(mix::from_float<mix::bf16_t>(x).bits == c.bf16);
  }
  // NaN in, quiet NaN out, sign kept; float->half->float keeps NaN quiet.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0xffc00000u, 0xff800001u}) {
    INFO("NaN bits " << hex32(nan));
    const float x = mix::bits_float(nan);
    const uint16_t h = mix::float_to_half_bits(x);
    const uint16_t b = mix::float_to_bf16_bits(x);
    CHECK(half_is_nan(h));
    CHECK((h & 0x0200u) != 0);
    CHECK((h >> 15) == (nan >> 31));
    CHECK(bf16_is_nan(b));
    CHECK((b & 0x0040u) != 0);
    CHECK((b >> 15) == (nan >> 31));
    CHECK(std::isnan(mix::round_to_half(x)));
  }
}

TEST_CASE("half: every binary16 pattern decodes exactly and round-trips (scalar)", "[half]") {
  Mismatches decode("half_bits_to_float vs independent decoder");
  Mismatches trip("half -> float -> half");
  Mismatches nan("NaN handling");
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = mix::half_bits_to_float(h);
    const uint32_t fb = mix::float_bits(f);
    const uint16_t back = mix::float_to_half_bits(f);
    if (half_is_nan(h)) {
      // NaN stays NaN, becomes quiet (float bit 22, half bit 9) and keeps its sign.
      if (!f32_is_nan(fb) || !(fb & 0x00400000u) || (fb >> 31) != (i >> 15u))
        nan.add(hex16(h) + " -> float " + hex32(fb));
      if (!half_is_nan(back) || !(back & 0x0200u) || (back >> 15) != (i >> 15u))
        nan.add(hex16(h) + " -> float " + hex32(fb) + " -> half " + hex16(back));
      continue;
    }
    const bool inf = (h & 0x7fffu) == 0x7c00u;
    const float ref = inf ? ((h & 0x8000u) ? -std::numeric_limits<float>::infinity()
                                           : std::numeric_limits<float>::infinity())
                          : static_cast<float>(half_value_ref(h));  // exact: 11 significant bits
    if (fb != mix::float_bits(ref))
      decode.add(hex16(h) + " -> " + hex32(fb) + ", expected " + hex32(mix::float_bits(ref)));
    if (back != h) trip.add(hex16(h) + " -> " + hex32(fb) + " -> " + hex16(back));
    if (mix::round_to_half(f) != f && !std::isnan(f)) trip.add("round_to_half moves exact value " + hex16(h));
  }
  CHECK_NONE(decode);
  CHECK_NONE(trip);
  CHECK_NONE(nan);

  // Decoding is strictly increasing over the positive finite halves.
  size_t non_monotonic = 0;
  for (uint16_t h = 0; h < 0x7bffu; ++h)
    if (!(mix::half_bits_to_float(h) < mix::half_bits_to_float(static_cast<uint16_t>(h + 1)))) ++non_monotonic;
  CHECK(non_monotonic == 0);
}

TEST_CASE("half: portable bulk path equals the scalar functions on all patterns", "[half][bulk]") {
  const std::vector<uint16_t> h = all_patterns();
  std::vector<float> f(h.size());
  std::vector<uint16_t> back(h.size());
  hb::f16_to_f32_portable(h.data(), f.data(), h.size());
  hb::f32_to_f16_portable(f.data(), back.data(), f.size());
  Mismatches m("portable bulk vs scalar");
  for (size_t i = 0; i < h.size(); ++i) {
    const uint32_t fb = mix::float_bits(f[i]);
    if (fb != mix::float_bits(mix::half_bits_to_float(h[i]))) m.add("f16->f32 " + hex16(h[i]) + " -> " + hex32(fb));
    if (back[i] != mix::float_to_half_bits(f[i])) m.add("f32->f16 " + hex32(fb) + " -> " + hex16(back[i]));
    const bool ok = half_is_nan(h[i]) ? half_is_nan(back[i]) && (back[i] & 0x0200u) : back[i] == h[i];
    if (!ok) m.add("round trip " + hex16(h[i]) + " -> " + hex16(back[i]));
  }
  CHECK_NONE(m);

  const std::vector<float>& x = random_floats();
  std::vector<uint16_t> out(x.size());
  hb::f32_to_f16_portable(x.data(), out.data(), x.size());
  Mismatches r("portable bulk vs scalar, random floats");
  for (size_t i = 0; i < x.size(); ++i)
    if (out[i] != mix::float_to_half_bits(x[i])) r.add(hex32(mix::float_bits(x[i])) + " -> " + hex16(out[i]));
  CHECK_NONE(r);
}

TEST_CASE("half: float->half and float->bf16 round to nearest even (random floats)", "[half][bf16]") {
  const std::vector<float>& x = random_floats();
  Mismatches h("float_to_half_bits vs double-arithmetic RNE check");
  Mismatches b("float_to_bf16_bits vs double-arithmetic RNE check");
  for (float v : x) {
    const uint16_t hv = mix::float_to_half_bits(v);
    if (!is_rne_half(v, hv)) h.add(hex32(mix::float_bits(v)) + " -> " + hex16(hv));
    const uint16_t bv = mix::float_to_bf16_bits(v);
    if (!is_rne_bf16(v, bv)) b.add(hex32(mix::float_bits(v)) + " -> " + hex16(bv));
  }
  CHECK_NONE(h);
  CHECK_NONE(b);
  // The oracle itself must be able to fail: the truncated (round-toward-zero)
  // result of a value above a tie is rejected.
  CHECK_FALSE(is_rne_half(mix::bits_float(0x3f801001u), 0x3c00u));
  CHECK_FALSE(is_rne_half(65520.0f, 0x7bffu));
  CHECK_FALSE(is_rne_bf16(mix::bits_float(0x3f818000u), 0x3f81u));
}

TEST_CASE("half: F16C bulk path agrees with the portable path bit for bit", "[half][bulk][f16c][needs_f16c]") {
  if (!have_f16c()) return;
  const std::vector<uint16_t> h = all_patterns();
  std::vector<float> fp(h.size()), fc(h.size()), fd(h.size());
  hb::f16_to_f32_portable(h.data(), fp.data(), h.size());
  hb::f16_to_f32_f16c(h.data(), fc.data(), h.size());
  hb::f16_to_f32(h.data(), fd.data(), h.size());  // the dispatcher picks F16C here
  std::vector<uint16_t> bp(h.size()), bc(h.size());
  hb::f32_to_f16_portable(fc.data(), bp.data(), fc.size());
  hb::f32_to_f16_f16c(fc.data(), bc.data(), fc.size());
  Mismatches m("F16C vs portable, all half patterns");
  for (size_t i = 0; i < h.size(); ++i) {
    const uint32_t p = mix::float_bits(fp[i]), c = mix::float_bits(fc[i]);
    if (p != c) m.add("f16->f32 " + hex16(h[i]) + ": portable " + hex32(p) + ", f16c " + hex32(c));
    if (mix::float_bits(fd[i]) != c) m.add("dispatcher f16->f32 " + hex16(h[i]));
    if (bp[i] != bc[i]) m.add("f32->f16 " + hex32(c) + ": portable " + hex16(bp[i]) + ", f16c " + hex16(bc[i]));
    const bool ok = half_is_nan(h[i]) ? half_is_nan(bc[i]) && (bc[i] & 0x0200u) : bc[i] == h[i];
    if (!ok) m.add("F16C round trip " + hex16(h[i]) + " -> " + hex16(bc[i]));
  }
  CHECK_NONE(m);

  const std::vector<float>& x = random_floats();
  std::vector<uint16_t> op(x.size()), oc(x.size()), od(x.size());
  hb::f32_to_f16_portable(x.data(), op.data(), x.size());
  hb::f32_to_f16_f16c(x.data(), oc.data(), x.size());
  hb::f32_to_f16(x.data(), od.data(), x.size());
  Mismatches r("F16C vs portable, " + std::to_string(x.size()) + " random floats");
  for (size_t i = 0; i < x.size(); ++i) {
    if (op[i] != oc[i])
      r.add(hex32(mix::float_bits(x[i])) + ": portable " + hex16(op[i]) + ", f16c " + hex16(oc[i]));
    if (od[i] != oc[i]) r.add("dispatcher f32->f16 " + hex32(mix::float_bits(x[i])));
  }
  CHECK_NONE(r);

  // Lengths and offsets that are not multiples of the 8-wide vector: the tails.
  Mismatches t("F16C tails");
  for (size_t off : {size_t{0}, size_t{1}, size_t{3}, size_t{5}}) {
    for (size_t n : {0, 1, 2, 7, 8, 9, 15, 16, 17, 23, 31, 33, 64, 65}) {
      std::vector<uint16_t> a(n + 1, 0xabcdu), c(n + 1, 0xabcdu);
      hb::f32_to_f16_f16c(x.data() + 1000 + off, a.data(), n);
      hb::f32_to_f16_portable(x.data() + 1000 + off, c.data(), n);
      if (a != c) t.add("f32->f16 off " + std::to_string(off) + " n " + std::to_string(n));
      std::vector<float> g(n + 1, -7.0f), p(n + 1, -7.0f);
      hb::f16_to_f32_f16c(h.data() + 0x3c00 + off, g.data(), n);
      hb::f16_to_f32_portable(h.data() + 0x3c00 + off, p.data(), n);
      if (std::memcmp(g.data(), p.data(), (n + 1) * sizeof(float)) != 0)
        t.add("f16->f32 off " + std::to_string(off) + " n " + std::to_string(n));
    }
  }
  CHECK_NONE(t);
}

TEST_CASE("bf16: every pattern decodes exactly and round-trips; bulk equals scalar", "[bf16][bulk]") {
  const std::vector<uint16_t> b = all_patterns();
  std::vector<float> f(b.size());
  std::vector<uint16_t> back(b.size());
  hb::bf16_to_f32(b.data(), f.data(), b.size());
  hb::f32_to_bf16(f.data(), back.data(), f.size());
  Mismatches m("bf16 -> float -> bf16");
  for (size_t i = 0; i < b.size(); ++i) {
    const uint32_t fb = mix::float_bits(f[i]);
    // bfloat16 is the top half of a float32: decoding is a shift, NaN payloads included.
    if (fb != static_cast<uint32_t>(b[i]) << 16) m.add("decode " + hex16(b[i]) + " -> " + hex32(fb));
    if (fb != mix::float_bits(mix::bf16_bits_to_float(b[i]))) m.add("bulk vs scalar decode " + hex16(b[i]));
    if (back[i] != mix::float_to_bf16_bits(f[i])) m.add("bulk vs scalar encode " + hex32(fb));
    const bool ok = bf16_is_nan(b[i]) ? bf16_is_nan(back[i]) && (back[i] & 0x0040u) && (back[i] >> 15) == (b[i] >> 15)
                                      : back[i] == b[i];
    if (!ok) m.add("round trip " + hex16(b[i]) + " -> " + hex16(back[i]));
  }
  CHECK_NONE(m);

  const std::vector<float>& x = random_floats();
  std::vector<uint16_t> out(x.size());
  hb::f32_to_bf16(x.data(), out.data(), x.size());
  Mismatches r("bf16 bulk vs scalar, random floats");
  for (size_t i = 0; i < x.size(); ++i)
    if (out[i] != mix::float_to_bf16_bits(x[i])) r.add(hex32(mix::float_bits(x[i])));
  CHECK_NONE(r);
}

namespace {

constexpr const char* kSetupHint =
    "the rounding table needs /usr/bin/python3 with numpy and torch (Debian python3-numpy and "
    "python3-torch): run scripts/setup.sh";

std::filesystem::path table_script() {
  if (const char* src = std::getenv("MIX_SOURCE_DIR"); src && *src)
    return std::filesystem::path(src) / "tests" / "python" / "gen_rounding_table.py";
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "python" / "gen_rounding_table.py";
}

struct TableRow {
  uint32_t f32;
  uint16_t f16;
  uint16_t bf16;
  std::string tag;
  int line;
};

// The boundary cases of tests/python/gen_rounding_table.py (or $MIX_ROUNDING_TABLE).
std::vector<TableRow> rounding_table() {
  std::string path;
  bool remove_after = false;
  if (const char* env = std::getenv("MIX_ROUNDING_TABLE"); env && *env) {
    path = env;
  } else {
    if (!std::filesystem::exists("/usr/bin/python3")) FAIL("/usr/bin/python3 not found; " << kSetupHint);
    const std::filesystem::path script = table_script();
    if (!std::filesystem::exists(script))
      FAIL("table generator not found at " << script.string() << " (set MIX_SOURCE_DIR to the source tree)");
    std::string tmpl = (std::filesystem::temp_directory_path() / "mix_rounding_table_XXXXXX").string();
    const int fd = mkstemp(tmpl.data());
    REQUIRE(fd >= 0);
    close(fd);
    path = tmpl;
    remove_after = true;
    const std::string cmd = "/usr/bin/python3 '" + script.string() + "' '" + path + "'";
    const int status = std::system(cmd.c_str());
    if (status != 0) {
      std::filesystem::remove(path);
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      FAIL("`" << cmd << "` failed (exit " << code << "); " << kSetupHint);
    }
  }

  std::vector<TableRow> rows;
  {
    std::ifstream in(path);
    if (!in) FAIL("cannot read rounding table " << path);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.empty() || line[0] == '#') continue;
      std::istringstream ls(line);
      unsigned long f32 = 0, f16 = 0, bf16 = 0;
      TableRow row;
      ls >> std::hex >> f32 >> f16 >> bf16;
      if (!ls || f32 > 0xffffffffu || f16 > 0xffffu || bf16 > 0xffffu)
        FAIL("malformed line " << n << " in " << path << ": '" << line << "'");
      ls >> row.tag;
      row.f32 = static_cast<uint32_t>(f32);
      row.f16 = static_cast<uint16_t>(f16);
      row.bf16 = static_cast<uint16_t>(bf16);
      row.line = n;
      rows.push_back(std::move(row));
    }
  }
  if (remove_after) std::filesystem::remove(path);
  INFO("rounding table " << path << ": " << rows.size() << " cases");
  REQUIRE(rows.size() >= 1000);
  return rows;
}

bool same16(uint16_t got, uint16_t want, bool (*is_nan)(uint16_t)) {
  return is_nan(want) ? is_nan(got) : got == want;  // NaN: NaN-ness only
}

}  // namespace

TEST_CASE("half/bf16: rounding matches NumPy float16 and PyTorch bfloat16 on boundary cases",
          "[half][bf16][numpy]") {
  const std::vector<TableRow> rows = rounding_table();
  std::vector<float> x(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) x[i] = mix::bits_float(rows[i].f32);
  std::vector<uint16_t> hp(x.size()), bb(x.size());
  hb::f32_to_f16_portable(x.data(), hp.data(), x.size());
  hb::f32_to_bf16(x.data(), bb.data(), x.size());

  Mismatches mh("float -> half vs numpy.float16");
  Mismatches mb("float -> bf16 vs torch.bfloat16");
  for (size_t i = 0; i < rows.size(); ++i) {
    const TableRow& r = rows[i];
    const std::string where = "line " + std::to_string(r.line) + " (" + r.tag + ") f32 " + hex32(r.f32);
    const uint16_t s = mix::float_to_half_bits(x[i]);
    if (!same16(s, r.f16, half_is_nan)) mh.add(where + ": scalar " + hex16(s) + ", numpy " + hex16(r.f16));
    if (!same16(hp[i], r.f16, half_is_nan))
      mh.add(where + ": portable bulk " + hex16(hp[i]) + ", numpy " + hex16(r.f16));
    const uint16_t bs = mix::float_to_bf16_bits(x[i]);
    if (!same16(bs, r.bf16, bf16_is_nan)) mb.add(where + ": scalar " + hex16(bs) + ", torch " + hex16(r.bf16));
    if (!same16(bb[i], r.bf16, bf16_is_nan)) mb.add(where + ": bulk " + hex16(bb[i]) + ", torch " + hex16(r.bf16));
  }
  CHECK_NONE(mh);
  CHECK_NONE(mb);
}

TEST_CASE("half: the F16C conversion matches NumPy float16 on boundary cases", "[half][numpy][needs_f16c]") {
  if (!have_f16c()) return;
  const std::vector<TableRow> rows = rounding_table();
  std::vector<float> x(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) x[i] = mix::bits_float(rows[i].f32);
  std::vector<uint16_t> hc(x.size());
  hb::f32_to_f16_f16c(x.data(), hc.data(), x.size());
  Mismatches mh("F16C float -> half vs numpy.float16");
  for (size_t i = 0; i < rows.size(); ++i) {
    const TableRow& r = rows[i];
    if (!same16(hc[i], r.f16, half_is_nan))
      mh.add("line " + std::to_string(r.line) + " (" + r.tag + ") f32 " + hex32(r.f32) + ": F16C bulk " +
             hex16(hc[i]) + ", numpy " + hex16(r.f16));
  }
  CHECK_NONE(mh);
}

// The fused half kernels of the gradient all-reduce (f16_add: one reduction hop;
// f16_scale: the pre/post division) against the blocked functor loops they replace
// (cpu::binary with fn::Add, cpu::unary with fn::Scale), which widen a chunk,
// compute in FP32 and round once. Every binary16 value is an input; NaN results
// are compared by NaN-ness and the quiet bit only (which NaN operand's payload
// survives an add is up to the instruction and the compiler's operand order).
namespace {

// The check below, on the portable paths and the dispatcher (f16c false) or
// on the F16C ones called directly and their tails (f16c true).
void check_fused_kernels(bool f16c) {
  const std::vector<uint16_t> a = all_patterns();
  // A fixed shuffle of the patterns as the second operand: every value meets a
  // different one, including inf-inf, NaN+x, subnormal sums and overflow.
  std::vector<uint16_t> b(a.size());
  for (uint32_t i = 0; i < 65536; ++i) b[i] = static_cast<uint16_t>(i * 40503u + 12345u);
  auto same = [](uint16_t got, uint16_t want) {
    return half_is_nan(want) ? half_is_nan(got) && (got & 0x0200u) : got == want;
  };
  auto as_half = [](std::vector<uint16_t>& v) { return reinterpret_cast<mix::half_t*>(v.data()); };

  std::vector<uint16_t> want(a.size());
  std::vector<uint16_t> a_copy = a, b_copy = b;
  mix::cpu::binary(as_half(a_copy), as_half(b_copy), as_half(want), static_cast<int64_t>(a.size()), mix::fn::Add{});
  Mismatches add("f16_add vs cpu::binary(fn::Add)");
  for (int path = 0; path < 3; ++path) {
    if ((path == 2) != f16c) continue;
    std::vector<uint16_t> got = a;
    if (path == 0) hb::f16_add_portable(got.data(), b.data(), got.size());
    if (path == 1) hb::f16_add(got.data(), b.data(), got.size());
    if (path == 2) hb::f16_add_f16c(got.data(), b.data(), got.size());
    for (size_t i = 0; i < a.size(); ++i)
      if (!same(got[i], want[i]))
        add.add("path " + std::to_string(path) + ": " + hex16(a[i]) + " + " + hex16(b[i]) + " -> " + hex16(got[i]) +
                ", functor " + hex16(want[i]));
  }
  CHECK_NONE(add);
  if (!f16c) {
    // It must be able to fail: a sum that rounds (1 + 2^-11 is a tie, to even 1.0)
    // differs from the unrounded one, and 0x3c00 + 0x3c00 is 2.0 (0x4000).
    uint16_t one = 0x3c00u, tiny = 0x1000u, two = 0x3c00u;
    hb::f16_add(&one, &tiny, 1);
    hb::f16_add(&two, &two, 1);
    CHECK(one == 0x3c00u);
    CHECK(two == 0x4000u);
  }

  Mismatches scale("f16_scale vs cpu::unary(fn::Scale)");
  // Exact and inexact factors, a negative one (-0 products become +0), one that
  // sends normals to subnormals and zero, one that overflows to inf, and 1.
  for (float factor : {0.5f, 0.125f, 1.0f / 3.0f, 1.0f / 48.0f, -0.25f, 3.0f, 1e-5f, 65504.0f, 1.0f}) {
    std::vector<uint16_t> ref(a.size());
    mix::cpu::unary(reinterpret_cast<const mix::half_t*>(a.data()), as_half(ref), static_cast<int64_t>(a.size()),
                    mix::fn::Scale{factor, 0.f, true});
    for (int path = 0; path < 4; ++path) {
      if ((path >= 2) != f16c) continue;
      std::vector<uint16_t> got(a.size(), 0xabcdu);
      if (path == 0) hb::f16_scale_portable(a.data(), got.data(), got.size(), factor);
      if (path == 1) hb::f16_scale(a.data(), got.data(), got.size(), factor);
      if (path == 2) hb::f16_scale_f16c(a.data(), got.data(), got.size(), factor);
      if (path == 3) {  // in place
        got = a;
        hb::f16_scale_f16c(got.data(), got.data(), got.size(), factor);
      }
      for (size_t i = 0; i < a.size(); ++i)
        if (!same(got[i], ref[i]))
          scale.add("path " + std::to_string(path) + ": " + hex16(a[i]) + " * " + std::to_string(factor) + " -> " +
                    hex16(got[i]) + ", functor " + hex16(ref[i]));
    }
  }
  CHECK_NONE(scale);
  if (!f16c) {
    uint16_t neg_zero = 0x8000u;
    hb::f16_scale(&neg_zero, &neg_zero, 1, 0.5f);
    CHECK(neg_zero == 0x0000u);  // -0 * 0.5 + 0 = +0, as the functor gives
    return;
  }
  // Lengths and offsets around the 8-wide vector: the tails, and nothing written past n.
  Mismatches t("fused F16C tails");
  for (size_t off : {size_t{0}, size_t{1}, size_t{3}}) {
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 33}) {
      std::vector<uint16_t> p(n + 1, 0xabcdu), c(n + 1, 0xabcdu);
      std::copy_n(a.begin() + 0x3800 + off, n, p.begin());
      std::copy_n(a.begin() + 0x3800 + off, n, c.begin());
      hb::f16_add_portable(p.data(), b.data() + off, n);
      hb::f16_add_f16c(c.data(), b.data() + off, n);
      if (p != c) t.add("f16_add off " + std::to_string(off) + " n " + std::to_string(n));
      std::vector<uint16_t> sp(n + 1, 0xabcdu), sc(n + 1, 0xabcdu);
      hb::f16_scale_portable(a.data() + 0x3800 + off, sp.data(), n, 0.3f);
      hb::f16_scale_f16c(a.data() + 0x3800 + off, sc.data(), n, 0.3f);
      if (sp != sc || sc[n] != 0xabcdu) t.add("f16_scale off " + std::to_string(off) + " n " + std::to_string(n));
    }
  }
  CHECK_NONE(t);
}

}  // namespace

TEST_CASE("half: fused f16_add and f16_scale equal the functor loops (portable, and as dispatched)",
          "[half][bulk]") {
  check_fused_kernels(false);
}

TEST_CASE("half: fused F16C f16_add and f16_scale equal the functor loops, tails included",
          "[half][bulk][f16c][needs_f16c]") {
  if (have_f16c()) check_fused_kernels(true);
}

// Tensor::set_float, item_float's inverse, stores through the same rounding.
TEST_CASE("Tensor::set_float rounds to the dtype as a store does, and refuses the rest", "[half][tensor]") {
  const float tie = 1.0f + 0x1p-11f;  // halfway between 1 and the next half: even is 1
  const float above = 1.0f + 0x1p-11f + 0x1p-20f;
  mix::Tensor h = mix::Tensor::empty({3}, mix::DType::f16);
  h.set_float(0, tie);
  h.set_float(1, above);
  h.set_float(2, 1e6f);
  CHECK(h.data<uint16_t>()[0] == 0x3c00u);
  CHECK(h.data<uint16_t>()[1] == 0x3c01u);
  CHECK(h.data<uint16_t>()[2] == 0x7c00u);  // overflow to inf
  mix::Tensor b = mix::Tensor::empty({1}, mix::DType::bf16);
  b.set_float(0, 1.0f + 0x1p-8f);  // a bf16 tie: even is 1
  CHECK(b.data<uint16_t>()[0] == mix::float_to_bf16_bits(1.0f));
  mix::Tensor f = mix::Tensor::empty({1}, mix::DType::f32);
  f.set_float(0, above);
  CHECK(f.item_float(0) == above);
  mix::Tensor i = mix::Tensor::empty({1}, mix::DType::i32);
  CHECK_THROWS_WITH(i.set_float(0, 1.f), Catch::Contains("floating dtypes only"));
  CHECK_THROWS_WITH(h.set_float(3, 1.f), Catch::Contains("out of range"));
}
