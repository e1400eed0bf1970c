#pragma once
// A small seeded random number generator whose output is bit-identical on every
// platform and compiler: splitmix64 for the integers, and only IEEE-exact
// arithmetic (+, -, *, /, sqrt) for the doubles, with a logarithm of our own
// instead of libm's (whose last bit differs between C libraries). Weight
// initialisation, data shuffles and synthetic data all draw from it, so a run
// with a given --seed is reproducible anywhere.
//
// Each statement below does one rounding step on purpose, so that no compiler
// fuses a multiply and an add into an FMA (which rounds once, not twice): clang
// contracts only within an expression. GCC contracts across statements too, in
// C++ under any -std, wherever the target has FMA (aarch64; x86-64 with
// -march), so the build turns contraction off (-ffp-contract=off, CMakeLists.txt).
#include <cstdint>
#include <cmath>

namespace mix {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}

  /// An independent generator for (seed, stream), e.g. (--seed, epoch) for a
  /// shuffle or (--seed, parameter index) for weight init. Nearby seeds and
  /// streams give unrelated sequences.
  static Rng for_stream(uint64_t seed, uint64_t stream) {
    const uint64_t s = mix64(seed ^ 0x6a09e667f3bcc908ull);
    return Rng(mix64(s ^ mix64(stream + 0xbb67ae8584caa73bull)));
  }

  /// splitmix64 (Steele, Lea, Flood 2014): full period 2^64.
  uint64_t next_u64() {
    state_ += 0x9e3779b97f4a7c15ull;
    return mix64(state_);
  }

  /// Uniform in [0, 1), 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  /// Uniform integer in [0, n) without modulo bias; n must be > 0.
  uint64_t below(uint64_t n) {
    // Values under `threshold` would make the low residues more likely; redraw them.
    const uint64_t threshold = (0 - n) % n;
    for (;;) {
      const uint64_t r = next_u64();
      if (r >= threshold) return r % n;
    }
  }

  /// Standard normal N(0, 1), Marsaglia's polar method (two values per accepted pair).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      const double uu = u * u;
      const double vv = v * v;
      s = uu + vv;
    } while (s >= 1.0 || s == 0.0);
    const double l = -2.0 * log_exact_ops(s);
    const double f = std::sqrt(l / s);  // sqrt is correctly rounded by IEEE 754
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }

  /// N(mean, std) as float.
  float normal(float mean, float std) {
    const double z = static_cast<double>(std) * normal();
    return static_cast<float>(mean + z);
  }
  /// Uniform in [lo, hi) as float (may round up to hi when the range is tiny).
  float uniform(float lo, float hi) {
    const double span = static_cast<double>(hi) - lo;
    const double z = span * uniform();
    return static_cast<float>(lo + z);
  }

  /// Natural log of x > 0 (finite) from IEEE-exact operations only: x = m * 2^e
  /// with m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(t), t = (m-1)/(m+1), |t| < 0.172,
  /// summed as a series to double precision.
  static double log_exact_ops(double x) {
    int e = 0;
    double m = std::frexp(x, &e);  // exact: m in [0.5, 1)
    if (m < 0.70710678118654752440) {
      m = m * 2.0;  // exact
      e -= 1;
    }
    const double num = m - 1.0;  // exact (Sterbenz)
    const double den = m + 1.0;
    const double t = num / den;
    const double t2 = t * t;
    // atanh(t) = t (1 + t^2/3 + t^4/5 + ...); t^2 < 0.0295, so 11 terms reach 2^-53.
    double sum = 1.0 / 23.0;
    for (int k = 10; k >= 0; --k) {
      const double p = sum * t2;
      sum = p + 1.0 / (2.0 * k + 1.0);
    }
    const double atanh2 = 2.0 * t;
    const double lm = atanh2 * sum;
    // ln 2 split into a high part with a short mantissa (e * hi is exact) and the rest.
    const double ln2_hi = 6.93147180369123816490e-01;
    const double ln2_lo = 1.90821492927058770002e-10;
    const double de = static_cast<double>(e);
    const double a = de * ln2_hi;
    const double b = de * ln2_lo;
    const double c = lm + b;
    return a + c;
  }

  /// splitmix64's finaliser: a well-mixed 64-bit hash of z (also for stateless per-element hashing).
  static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:

  uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace mix
