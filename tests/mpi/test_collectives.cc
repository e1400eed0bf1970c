// Multi-rank tests of the MPI communicator; CTest runs them under mpirun on 2
// and on 4 ranks. Every rank runs every test case and takes part in every
// collective in the same order, so a failing CHECK never leaves a rank waiting;
// the exit code is the maximum over the ranks, so a failure anywhere fails the run.
//
// Expected values are closed forms (rank r contributes r+1: the sum is
// n(n+1)/2, the max n). Where per-hop FP16 rounding makes the answer depend on
// the reduction tree, which MPI chooses freely, the test enumerates every tree
// over the ranks' values, each hop rounded by a reference written here (not
// the communicator's own hop), and requires the answer to be one of them and
// to be identical on every rank. The rounding itself is pinned by sums whose
// every tree gives one answer, written out by hand as binary16 / bfloat16 bit
// patterns.
#include "tests/mpi/mpi_test_main.h"

#include "collective/mpi_check.h"  // first: <mpi.h> without the C++ bindings

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "collective/communicator.h"
#include "collective/mpi_communicator.h"
#include "runtime/core/check.h"
#include "runtime/core/half.h"
#include "runtime/core/hash.h"

namespace {

using mix::DType;
using mix::fnv1a;
using mix::collective::Communicator;
using mix::collective::ReduceOp;
using mix::collective::Traffic;
namespace mc = mix::collective;

Communicator* g_comm = nullptr;
Communicator& comm() { return *g_comm; }

const DType kDtypes[] = {DType::f16, DType::bf16, DType::f32, DType::i32};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::max, ReduceOp::avg};
const size_t kSizes[] = {1, 7, 1000, size_t{1} << 20};

// ---- element access in any dtype ---------------------------------------------

// Stores v (exactly representable, or rounded as the dtype rounds) at element i.
void store(void* buf, size_t i, DType t, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(buf)[i] = static_cast<float>(v); return;
    case DType::f16: static_cast<uint16_t*>(buf)[i] = mix::float_to_half_bits(static_cast<float>(v)); return;
    case DType::bf16: static_cast<uint16_t*>(buf)[i] = mix::float_to_bf16_bits(static_cast<float>(v)); return;
    case DType::i32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); return;
    case DType::i64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); return;
    case DType::u8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); return;
  }
}

double load(const void* buf, size_t i, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(buf)[i];
    case DType::f16: return mix::half_bits_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DType::bf16: return mix::bf16_bits_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DType::i32: return static_cast<const int32_t*>(buf)[i];
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DType::u8: return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

// The value the backend must produce from an exact sum or max: avg is the
// (exact) sum stored in the dtype, then multiplied by 1/world in FP32 and
// rounded to the dtype; integers divide, truncating toward zero.
void store_expected(void* buf, size_t i, DType t, ReduceOp op, double exact, int world) {
  if (op != ReduceOp::avg) return store(buf, i, t, exact);
  if (t == DType::i32) return store(buf, i, t, static_cast<double>(static_cast<int32_t>(exact) / world));
  store(buf, i, t, exact);
  const float sum = static_cast<float>(load(buf, i, t));
  store(buf, i, t, static_cast<double>(sum * (1.0f / static_cast<float>(world))));
}

// Counts elements whose bytes differ; describes the first one.
size_t count_mismatches(const std::vector<char>& got, const std::vector<char>& want, size_t n, DType t,
                        std::string* first) {
  const size_t es = mix::dtype_size(t);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0) {
      if (bad == 0) {
        *first = "element " + std::to_string(i) + ": got " + std::to_string(load(got.data(), i, t)) + ", want " +
                 std::to_string(load(want.data(), i, t));
      }
      ++bad;
    }
  }
  return bad;
}

// True when every rank holds the same 64-bit value.
bool same_on_all_ranks(Communicator& c, uint64_t v) {
  std::vector<uint64_t> all(static_cast<size_t>(c.world_size()));
  c.all_gather(&v, all.data(), sizeof(v));
  for (uint64_t x : all) {
    if (x != v) return false;
  }
  return true;
}

// Runs one all-reduce where rank r contributes value(r, i) at element i, and
// compares with the closed form from exact(i) (the exact sum or max).
template <typename ValueFn, typename ExactFn>
void check_reduce(Communicator& c, DType t, ReduceOp op, size_t n, ValueFn value, ExactFn exact) {
  const int world = c.world_size();
  const size_t es = mix::dtype_size(t);
  std::vector<char> buf(n * es), want(n * es);
  for (size_t i = 0; i < n; ++i) {
    store(buf.data(), i, t, value(c.rank(), i));
    store_expected(want.data(), i, t, op, exact(i), world);
  }
  c.all_reduce(buf.data(), n, t, op);
  std::string first;
  const size_t bad = count_mismatches(buf, want, n, t, &first);
  INFO(mix::dtype_name(t) << " " << mc::reduce_op_name(op) << " of " << n << " elements on " << world
                          << " ranks; rank " << c.rank() << " " << first);
  CHECK(bad == 0);
}

// ---- every reduction tree ------------------------------------------------------

using HopFn = float (*)(float, float);

// x rounded to a float format with `mant_bits` stored mantissa bits and
// smallest normal exponent `min_exp`, IEEE round-to-nearest-even, |x| at or
// past `overflow_at` (the maximum plus half its spacing) to inf. Written in
// double arithmetic, apart from half.h: std::nearbyint rounds ties to even.
double round_to_format(double x, int mant_bits, int min_exp, double overflow_at) {
  if (x == 0 || std::isnan(x) || std::isinf(x)) return x;
  const double a = std::fabs(x);
  if (a >= overflow_at) return std::copysign(std::numeric_limits<double>::infinity(), x);
  const int e = std::max(std::ilogb(a), min_exp);  // subnormals share the smallest normal spacing
  const double spacing = std::ldexp(1.0, e - mant_bits);
  return std::copysign(std::nearbyint(a / spacing) * spacing, x);
}

// One hop of the sum: widen, add (exact in double for the test's values, as in
// FP32), round once to the 16-bit format.
float f16_sum_hop(float a, float b) {
  return static_cast<float>(round_to_format(static_cast<double>(a) + b, 10, -14, 65520.0));
}
float bf16_sum_hop(float a, float b) {
  return static_cast<float>(round_to_format(static_cast<double>(a) + b, 7, -126, std::ldexp(2.0 - 0x1p-8, 127)));
}

// Every result of combining vals with `hop` over any binary tree and any order.
std::set<float> all_tree_results(const std::vector<float>& vals, HopFn hop) {
  if (vals.size() == 1) return {vals[0]};
  std::set<float> out;
  const unsigned n = static_cast<unsigned>(vals.size());
  // Split into a part holding element 0 and a non-empty rest.
  for (unsigned mask = 1; mask < (1u << n) - 1; mask += 2) {
    std::vector<float> left, right;
    for (unsigned k = 0; k < n; ++k) ((mask >> k) & 1u ? left : right).push_back(vals[k]);
    for (float l : all_tree_results(left, hop)) {
      for (float r : all_tree_results(right, hop)) {
        out.insert(hop(l, r));
        out.insert(hop(r, l));
      }
    }
  }
  return out;
}

std::string describe(const std::set<float>& s) {
  std::string out;
  for (float v : s) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return "{" + out + "}";
}

std::vector<std::string> all_hostnames(Communicator& c) {
  constexpr size_t kLen = 256;
  char mine[kLen] = {0};
  gethostname(mine, kLen - 1);
  std::vector<char> all(kLen * static_cast<size_t>(c.world_size()));
  c.all_gather(mine, all.data(), kLen);
  std::vector<std::string> names;
  for (int r = 0; r < c.world_size(); ++r) names.emplace_back(all.data() + static_cast<size_t>(r) * kLen);
  return names;
}

}  // namespace

TEST_CASE("ranks, world and hosts", "[mpi]") {
  Communicator& c = comm();
  const int n = c.world_size();
  CHECK(c.backend_name() == "mpi");
  CHECK(c.rank() >= 0);
  CHECK(c.rank() < n);
  CHECK(mc::launched_under_mpi());
  if (const char* env = std::getenv("OMPI_COMM_WORLD_SIZE")) CHECK(n == std::atoi(env));
  if (const char* env = std::getenv("OMPI_COMM_WORLD_RANK")) CHECK(c.rank() == std::atoi(env));

  int32_t me = c.rank();
  std::vector<int32_t> ranks(static_cast<size_t>(n), -1);
  c.all_gather(&me, ranks.data(), sizeof(me));
  for (int r = 0; r < n; ++r) CHECK(ranks[static_cast<size_t>(r)] == r);

  // local rank = position among the ranks of this host, in world order.
  const auto hosts = all_hostnames(c);
  int expect_local_rank = 0, expect_local_size = 0;
  for (int r = 0; r < n; ++r) {
    if (hosts[static_cast<size_t>(r)] != hosts[static_cast<size_t>(c.rank())]) continue;
    if (r < c.rank()) ++expect_local_rank;
    ++expect_local_size;
  }
  CHECK(c.local_rank() == expect_local_rank);
  CHECK(c.local_size() == expect_local_size);
  bool one_host = true;
  for (const auto& host : hosts) one_host = one_host && host == hosts[0];
  if (one_host) {
    CHECK(c.local_rank() == c.rank());
    CHECK(c.local_size() == n);
  }
  // set_process_identity ran at construction: errors name this rank.
  CHECK(mix::process_identity().find("rank " + std::to_string(c.rank()) + "/" + std::to_string(n)) !=
        std::string::npos);
}

TEST_CASE("rank r contributes r+1: closed forms for every dtype, op and size", "[mpi][all_reduce]") {
  Communicator& c = comm();
  const double n = c.world_size();
  for (DType t : kDtypes) {
    for (ReduceOp op : kOps) {
      for (size_t size : kSizes) {
        const double exact = op == ReduceOp::max ? n : n * (n + 1) / 2;
        check_reduce(
            c, t, op, size, [](int r, size_t) { return r + 1.0; }, [&](size_t) { return exact; });
      }
    }
  }
}

TEST_CASE("per-element patterns", "[mpi][all_reduce]") {
  Communicator& c = comm();
  const int world = c.world_size();
  const double n = world;
  for (DType t : kDtypes) {
    for (ReduceOp op : kOps) {
      for (size_t size : {size_t{7}, size_t{1000}, size_t{1} << 20}) {
        // A: (r+1) * (i % 5); the max comes from the last rank.
        check_reduce(
            c, t, op, size, [](int r, size_t i) { return (r + 1.0) * static_cast<double>(i % 5); },
            [&](size_t i) {
              const double k = static_cast<double>(i % 5);
              return op == ReduceOp::max ? n * k : k * n * (n + 1) / 2;
            });
        // B: a rotating rank holds the max, values are signed, and floats carry
        // quarters (exact in f16 and bf16): scale * ((r + i) % n) - 3 * (i % 3).
        const double scale = t == DType::i32 ? 1.0 : 0.25;
        check_reduce(
            c, t, op, size,
            [&](int r, size_t i) {
              return scale * static_cast<double>((static_cast<size_t>(r) + i) % static_cast<size_t>(world)) -
                     3.0 * static_cast<double>(i % 3);
            },
            [&](size_t i) {
              const double k = 3.0 * static_cast<double>(i % 3);
              return op == ReduceOp::max ? scale * (n - 1) - k : scale * n * (n - 1) / 2 - n * k;
            });
      }
    }
  }
}

TEST_CASE("f16/bf16 sums round per hop, in some tree order, identically on every rank", "[mpi][all_reduce][f16]") {
  Communicator& c = comm();
  const int world = c.world_size();
  struct Case {
    DType dtype;
    float big;
    HopFn hop;
  };
  // big + (n-1) ones: each 1 is half a spacing of big, so the answer depends on
  // how the ones are grouped: on 4 ranks ((2048+1)+1)+1 = 2048, (2048+1)+(1+1) =
  // 2050, 2048+((1+1)+1) = 2052.
  for (const Case& k : {Case{DType::f16, 2048.0f, &f16_sum_hop}, Case{DType::bf16, 256.0f, &bf16_sum_hop}}) {
    std::vector<float> vals(static_cast<size_t>(world), 1.0f);
    vals[0] = k.big;
    const std::set<float> plausible = world <= 8 ? all_tree_results(vals, k.hop) : std::set<float>{};
    for (size_t size : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
      // The big value sits on rank i % n, so every rank plays every part.
      std::vector<uint16_t> buf(size);
      for (size_t i = 0; i < size; ++i) {
        const float v = static_cast<int>(i % static_cast<size_t>(world)) == c.rank() ? k.big : 1.0f;
        buf[i] = k.dtype == DType::f16 ? mix::float_to_half_bits(v) : mix::float_to_bf16_bits(v);
      }
      c.all_reduce(buf.data(), size, k.dtype, ReduceOp::sum);
      size_t outside = 0;
      float first_outside = 0;
      for (size_t i = 0; i < size; ++i) {
        const float got = k.dtype == DType::f16 ? mix::half_bits_to_float(buf[i]) : mix::bf16_bits_to_float(buf[i]);
        // Without the enumeration (more than 8 ranks): within the exact sum's
        // neighbourhood, at most one spacing of big (2 for f16, 2 for bf16) per extra rank.
        const bool ok = plausible.empty()
                            ? std::fabs(got - (k.big + static_cast<float>(world - 1))) <= 2.0f * static_cast<float>(world)
                            : plausible.count(got) == 1;
        if (!ok && outside++ == 0) first_outside = got;
      }
      INFO(mix::dtype_name(k.dtype) << " " << size << " elements, rank " << c.rank() << ": " << outside
                                    << " results outside " << describe(plausible) << ", first " << first_outside);
      CHECK(outside == 0);
      CHECK(same_on_all_ranks(c, fnv1a(buf.data(), size * 2)));  // ranks compare hashes, not whole buffers
    }
  }
}

namespace {

// ---- rounding pinned by sums that every reduction tree agrees on -------------
//
// The FP16/BF16 sum's hop widens to FP32, adds and rounds to nearest even once.
// Round-to-nearest-even, truncation and rounding half up differ only on sums
// that fall between two 16-bit values, so the cases below sit there; each
// expected result is worked out by hand and written as its bit pattern.

// Rank p holds a, rank q holds b, every other rank +0. Adding +0 is exact, so
// on any tree over any number of ranks the only rounding hop is a + b.
struct PairCase {
  uint16_t a, b, want;
  const char* what;
};
const PairCase kF16Pairs[] = {
    {0x6801, 0x3c00, 0x6802, "2050 + 1 = 2051: a tie of 2050 (odd) and 2052 (even) -> 2052; truncation gives 2050"},
    {0x6802, 0x3c00, 0x6802, "2052 + 1 = 2053: a tie of 2052 (even) and 2054 -> 2052; half up gives 2054"},
    {0x6800, 0x3e00, 0x6801, "2048 + 1.5 = 2049.5: nearer 2050 -> 2050; truncation gives 2048"},
    {0x6800, 0xb800, 0x6800, "2048 - 0.5 = 2047.5: a tie of 2047 (odd) and 2048 (even) -> 2048; truncation gives 2047"},
    {0x3c01, 0x1000, 0x3c02, "(1 + 2^-10) + 2^-11: a tie -> the even 1 + 2^-9; truncation gives 1 + 2^-10"},
    {0x7bff, 0x4c00, 0x7c00, "65504 + 16 = 65520: halfway to 2^16, past the max, ties to even -> inf; truncation gives 65504"},
    {0x7bff, 0x4b80, 0x7bff, "65504 + 15 = 65519: below halfway -> 65504"},
    {0xe801, 0xbc00, 0xe802, "-2050 - 1 = -2051: a tie -> -2052; truncation toward zero gives -2050"},
    {0xfbff, 0xcc00, 0xfc00, "-65504 - 16 = -65520 -> -inf"},
};
const PairCase kBf16Pairs[] = {
    {0x4381, 0x3f80, 0x4382, "258 + 1 = 259: a tie of 258 (odd) and 260 (even) -> 260; truncation gives 258"},
    {0x4382, 0x3f80, 0x4382, "260 + 1 = 261: a tie of 260 (even) and 262 -> 260; half up gives 262"},
    {0x4380, 0x3fc0, 0x4381, "256 + 1.5 = 257.5: nearer 258 -> 258; truncation gives 256"},
    {0x4380, 0xbf00, 0x4380, "256 - 0.5 = 255.5: a tie of 255 (odd) and 256 (even) -> 256; truncation gives 255"},
    {0x7f7f, 0x7b00, 0x7f80, "max + 2^119: halfway to 2^128, ties to even -> inf; truncation gives max"},
    {0x7f7f, 0x7a80, 0x7f7f, "max + 2^118: below halfway -> max"},
    {0xc381, 0xbf80, 0xc382, "-258 - 1 = -259: a tie -> -260; truncation toward zero gives -258"},
    {0xff7f, 0xfb00, 0xff80, "-max - 2^119 -> -inf"},
};

// Every rank takes part: `big` on rank p, `odd` on rank q, `four` on the rest.
// In [2048, 4096) FP16's spacing is 2 (BF16's in [256, 512) too), the small
// values add exactly among themselves, and any partial sum holding big and
// odd is big + odd + 4k: one rounding per tree, whatever its shape, of the
// same kind (odd = 3 sits on a tie that goes up, 1 on one that goes down, 1.5
// is nearer the value above), later hops adding multiples of 4 exactly. The
// sum is big + odd + 4(n - 2), rounded once: per world size, by hand.
struct RanksCase {
  uint16_t big, odd, four, want_np2, want_np4;
  const char* what;
};
const RanksCase kF16Ranks[] = {
    {0x6800, 0x4200, 0x4400, 0x6802, 0x6806, "2048 + 3 + 4(n-2): 2051 -> 2052, 2059 -> 2060 (truncation: 2050, 2058)"},
    {0x6800, 0x3c00, 0x4400, 0x6800, 0x6804, "2048 + 1 + 4(n-2): 2049 -> 2048, 2057 -> 2056 (half up: 2050, 2058)"},
    {0x6800, 0x3e00, 0x4400, 0x6801, 0x6805, "2048 + 1.5 + 4(n-2): 2049.5 -> 2050, 2057.5 -> 2058"},
    {0xe800, 0xc200, 0xc400, 0xe802, 0xe806, "-2048 - 3 - 4(n-2): -2051 -> -2052, -2059 -> -2060"},
};
const RanksCase kBf16Ranks[] = {
    {0x4380, 0x4040, 0x4080, 0x4382, 0x4386, "256 + 3 + 4(n-2): 259 -> 260, 267 -> 268 (truncation: 258, 266)"},
    {0x4380, 0x3f80, 0x4080, 0x4380, 0x4384, "256 + 1 + 4(n-2): 257 -> 256, 265 -> 264 (half up: 258, 266)"},
    {0x4380, 0x3fc0, 0x4080, 0x4381, 0x4385, "256 + 1.5 + 4(n-2): 257.5 -> 258, 265.5 -> 266"},
    {0xc380, 0xc040, 0xc080, 0xc382, 0xc386, "-256 - 3 - 4(n-2): -259 -> -260, -267 -> -268"},
};

// Element i tests case i % cases with the two named roles on ranks p != q,
// cycling through every ordered pair, so each rank plays each part.
struct Roles {
  size_t which;
  int p, q;
};
Roles roles_of(size_t i, size_t cases, int world) {
  const size_t w = static_cast<size_t>(world);
  const size_t pair = (i / cases) % (w * (w - 1));
  const size_t p = pair / (w - 1);
  const size_t q = (p + 1 + pair % (w - 1)) % w;
  return {i % cases, static_cast<int>(p), static_cast<int>(q)};
}

// All-reduces buf (sum) blocking or started-and-waited (the gradient buckets'
// way), and counts the elements whose bits differ from want(i).
template <typename WantFn, typename WhatFn>
void check_pinned_sum(Communicator& c, DType t, std::vector<uint16_t> buf, bool started, WantFn want, WhatFn what) {
  if (started) {
    c.wait(c.all_reduce_start(buf.data(), buf.size(), t, ReduceOp::sum, Traffic::gradients));
  } else {
    c.all_reduce(buf.data(), buf.size(), t, ReduceOp::sum);
  }
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] == want(i)) continue;
    if (bad++ == 0) {
      char bits[64];
      std::snprintf(bits, sizeof bits, ": got 0x%04x, want 0x%04x", buf[i], want(i));
      first = "element " + std::to_string(i) + " (" + what(i) + ")" + bits;
    }
  }
  INFO(mix::dtype_name(t) << (started ? " started" : "") << " sum of " << buf.size() << " elements on "
                          << c.world_size() << " ranks, rank " << c.rank() << ": " << bad << " wrong, first "
                          << first);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("f16/bf16 sums round to nearest even: hand-worked bit patterns", "[mpi][all_reduce][f16][rounding]") {
  Communicator& c = comm();
  const int world = c.world_size();
  struct Table {
    DType dtype;
    const PairCase* pairs;
    size_t n_pairs;
    const RanksCase* ranks;
    size_t n_ranks;
  };
  const Table tables[] = {
      {DType::f16, kF16Pairs, std::size(kF16Pairs), kF16Ranks, std::size(kF16Ranks)},
      {DType::bf16, kBf16Pairs, std::size(kBf16Pairs), kBf16Ranks, std::size(kBf16Ranks)},
  };
  for (const Table& tb : tables) {
    for (bool started : {false, true}) {
      // One element per case and ordered rank pair, then a million (MPI's
      // segmented and pipelined paths).
      for (size_t size : {tb.n_pairs * static_cast<size_t>(world * (world - 1)), size_t{1} << 20}) {
        std::vector<uint16_t> buf(size);
        for (size_t i = 0; i < size; ++i) {
          const Roles r = roles_of(i, tb.n_pairs, world);
          const PairCase& k = tb.pairs[r.which];
          buf[i] = c.rank() == r.p ? k.a : c.rank() == r.q ? k.b : uint16_t{0};  // +0 elsewhere
        }
        check_pinned_sum(
            c, tb.dtype, std::move(buf), started, [&](size_t i) { return tb.pairs[roles_of(i, tb.n_pairs, world).which].want; },
            [&](size_t i) { return std::string(tb.pairs[roles_of(i, tb.n_pairs, world).which].what); });
      }
      if (world != 2 && world != 4) continue;  // worked out for the world sizes CTest runs; skipped below
      for (size_t size : {tb.n_ranks * static_cast<size_t>(world * (world - 1)), size_t{1} << 20}) {
        std::vector<uint16_t> buf(size);
        for (size_t i = 0; i < size; ++i) {
          const Roles r = roles_of(i, tb.n_ranks, world);
          const RanksCase& k = tb.ranks[r.which];
          buf[i] = c.rank() == r.p ? k.big : c.rank() == r.q ? k.odd : k.four;
        }
        check_pinned_sum(
            c, tb.dtype, std::move(buf), started,
            [&](size_t i) {
              const RanksCase& k = tb.ranks[roles_of(i, tb.n_ranks, world).which];
              return world == 2 ? k.want_np2 : k.want_np4;
            },
            [&](size_t i) { return std::string(tb.ranks[roles_of(i, tb.n_ranks, world).which].what); });
      }
    }
  }
  if (world != 2 && world != 4)
    mix::testing::skip_part("every-rank rounding sums are worked out for 2 and 4 ranks, not " + std::to_string(world));
}

TEST_CASE("inf and NaN survive every reduction tree", "[mpi][all_reduce]") {
  Communicator& c = comm();
  const int last = c.world_size() - 1;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  SECTION("f32 max: a NaN on one rank reaches every rank") {
    // The builtin MPI_MAX keeps or drops a NaN by operand order; ours must not.
    std::vector<float> v(64, 1.0f);
    if (c.rank() == 0) v[0] = nan;
    if (c.rank() == last) v[1] = nan;
    v[2] = static_cast<float>(c.rank());
    c.all_reduce(v.data(), v.size(), DType::f32, ReduceOp::max);
    CHECK(std::isnan(v[0]));
    CHECK(std::isnan(v[1]));
    CHECK(v[2] == static_cast<float>(last));
    CHECK(v[3] == 1.0f);
  }
  SECTION("f16 max and sum with NaN, and an overflowing f16 sum") {
    std::vector<uint16_t> m(16, mix::float_to_half_bits(1.0f));
    if (c.rank() == last) m[0] = 0x7e00;  // quiet NaN
    if (c.rank() == 0) m[1] = 0x7e00;
    c.all_reduce(m.data(), m.size(), DType::f16, ReduceOp::max);
    CHECK(std::isnan(mix::half_bits_to_float(m[0])));
    CHECK(std::isnan(mix::half_bits_to_float(m[1])));
    CHECK(mix::half_bits_to_float(m[2]) == 1.0f);

    // 40000 from every rank: the first hop already exceeds 65504 -> inf, as on a GPU.
    std::vector<uint16_t> s(16, mix::float_to_half_bits(40000.0f));
    if (c.rank() == 0) s[1] = 0x7e00;
    c.all_reduce(s.data(), s.size(), DType::f16, ReduceOp::sum);
    CHECK(mix::half_bits_to_float(s[0]) == (c.world_size() > 1 ? std::numeric_limits<float>::infinity() : 40000.0f));
    CHECK(std::isnan(mix::half_bits_to_float(s[1])));
  }
}

TEST_CASE("broadcast from the first and the last rank", "[mpi][broadcast]") {
  Communicator& c = comm();
  for (int root : {0, c.world_size() - 1}) {
    for (size_t bytes : {size_t{1}, size_t{1000}, (size_t{1} << 20) + 3}) {
      std::vector<unsigned char> buf(bytes, 0xEE);
      auto pattern = [&](size_t i) { return static_cast<unsigned char>((i * 7 + static_cast<size_t>(root) * 13) & 0xff); };
      if (c.rank() == root) {
        for (size_t i = 0; i < bytes; ++i) buf[i] = pattern(i);
      }
      c.broadcast(buf.data(), bytes, root);
      size_t bad = 0;
      for (size_t i = 0; i < bytes; ++i) bad += buf[i] != pattern(i);
      INFO("root " << root << ", " << bytes << " bytes, rank " << c.rank());
      CHECK(bad == 0);
    }
  }
  c.broadcast(nullptr, 0, 0);
  int x = 0;
  CHECK_THROWS_AS(c.broadcast(&x, sizeof(x), c.world_size()), mix::Error);
  CHECK_THROWS_AS(c.broadcast(&x, sizeof(x), -1), mix::Error);
}

TEST_CASE("broadcast_many: every buffer gets the root's bytes, in one packed message", "[mpi][broadcast]") {
  Communicator& c = comm();
  // Sizes as a model's buffers come: floats, an int64 counter, an empty one, a large one.
  const std::vector<size_t> sizes = {256, 8, 0, 1, 4096 * 4 + 3};
  for (int root : {0, c.world_size() - 1}) {
    std::vector<std::vector<unsigned char>> bufs;
    std::vector<mc::ByteSpan> spans;
    auto pattern = [&](size_t k, size_t i) { return static_cast<unsigned char>((k * 31 + i * 7 + root) & 0xff); };
    for (size_t k = 0; k < sizes.size(); ++k) {
      bufs.emplace_back(sizes[k], static_cast<unsigned char>(0xEE));
      if (c.rank() == root)
        for (size_t i = 0; i < sizes[k]; ++i) bufs[k][i] = pattern(k, i);
    }
    for (auto& b : bufs) spans.push_back({b.empty() ? nullptr : b.data(), b.size()});
    const uint64_t before = c.bytes().other_bytes;
    c.broadcast_many(spans, root);
    size_t bad = 0;
    for (size_t k = 0; k < sizes.size(); ++k)
      for (size_t i = 0; i < sizes[k]; ++i) bad += bufs[k][i] != pattern(k, i);
    INFO("root " << root << ", rank " << c.rank());
    CHECK(bad == 0);
    CHECK(c.bytes().other_bytes - before == 256 + 8 + 0 + 1 + 4096 * 4 + 3);
  }
  c.broadcast_many({}, 0);
  int x = 0;
  CHECK_THROWS_AS(c.broadcast_many({{&x, sizeof(x)}}, c.world_size()), mix::Error);
  CHECK_THROWS_AS(c.broadcast_many({{nullptr, 4}}, 0), mix::Error);
}

TEST_CASE("all_gather in rank order, and in place", "[mpi][all_gather]") {
  Communicator& c = comm();
  const size_t n = static_cast<size_t>(c.world_size());
  const size_t me = static_cast<size_t>(c.rank());
  auto pattern = [](size_t r, size_t i) { return static_cast<unsigned char>((r * 31 + i * 3 + 1) & 0xff); };
  for (size_t bpr : {size_t{1}, size_t{13}, size_t{100000}}) {
    std::vector<unsigned char> send(bpr), recv(bpr * n, 0xEE);
    for (size_t i = 0; i < bpr; ++i) send[i] = pattern(me, i);
    c.all_gather(send.data(), recv.data(), bpr);
    size_t bad = 0;
    for (size_t r = 0; r < n; ++r) {
      for (size_t i = 0; i < bpr; ++i) bad += recv[r * bpr + i] != pattern(r, i);
    }
    INFO(bpr << " bytes per rank, rank " << me);
    CHECK(bad == 0);

    // In place: this rank's block already sits in its slot.
    std::vector<unsigned char> inplace(bpr * n, 0xEE);
    std::memcpy(inplace.data() + me * bpr, send.data(), bpr);
    c.all_gather(inplace.data() + me * bpr, inplace.data(), bpr);
    CHECK(inplace == recv);
  }
}

TEST_CASE("barrier waits for every rank", "[mpi][barrier]") {
  Communicator& c = comm();
  const auto hosts = all_hostnames(c);
  bool one_host = true;
  for (const auto& host : hosts) one_host = one_host && host == hosts[0];
  c.barrier();
  if (!one_host) return;  // the file check needs one file system; barrier() above still ran

  // Rank 0 makes a fresh directory and tells the others; the last rank writes
  // its file late; after the barrier every rank must see every file.
  char dir[256] = {0};
  if (c.rank() == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mix_barrier_XXXXXX").string();
    std::vector<char> path(tmpl.begin(), tmpl.end());
    path.push_back('\0');
    if (mkdtemp(path.data()) != nullptr) std::snprintf(dir, sizeof(dir), "%s", path.data());
  }
  c.broadcast(dir, sizeof(dir), 0);
  REQUIRE(dir[0] != '\0');  // same outcome on every rank: they all received rank 0's answer
  if (c.rank() == c.world_size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::ofstream(std::filesystem::path(dir) / std::to_string(c.rank())) << "here";
  c.barrier();
  int missing = 0;
  for (int r = 0; r < c.world_size(); ++r) missing += !std::filesystem::exists(std::filesystem::path(dir) / std::to_string(r));
  CHECK(missing == 0);
  c.barrier();
  if (c.rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("byte counters split gradient and control traffic", "[mpi][bytes]") {
  Communicator& c = comm();
  c.reset_bytes();
  std::vector<uint16_t> grads(1000, mix::float_to_half_bits(1.0f));
  c.all_reduce(grads.data(), grads.size(), DType::f16, ReduceOp::sum, Traffic::gradients);
  std::vector<float> grads32(10, 1.0f);
  c.all_reduce(grads32.data(), grads32.size(), DType::f32, ReduceOp::avg, Traffic::gradients);
  CHECK(c.bytes().grad_allreduce_bytes == 2040);
  CHECK(c.bytes().grad_allreduce_calls == 2);
  CHECK(c.bytes().other_bytes == 0);

  int32_t found_inf = c.rank() == 0 ? 1 : 0;
  c.all_reduce(&found_inf, 1, DType::i32, ReduceOp::max);
  CHECK(found_inf == 1);
  CHECK(c.bytes().other_bytes == 4);
  char blob[100] = {};
  c.broadcast(blob, sizeof(blob), 0);
  CHECK(c.bytes().other_bytes == 104);
  uint64_t fp = 42;
  std::vector<uint64_t> all(static_cast<size_t>(c.world_size()));
  c.all_gather(&fp, all.data(), sizeof(fp));  // counts what this rank hands in
  CHECK(c.bytes().other_bytes == 112);
  c.barrier();
  CHECK(c.bytes().other_bytes == 112);
  CHECK(c.bytes().grad_allreduce_bytes == 2040);
  CHECK(c.bytes().grad_allreduce_calls == 2);
  c.reset_bytes();
  CHECK(c.bytes().grad_allreduce_bytes == 0);
  CHECK(c.bytes().other_bytes == 0);
  CHECK(c.bytes().grad_allreduce_calls == 0);
}

TEST_CASE("chunked calls give the same results (a second communicator, 1002 bytes per call)", "[mpi][chunks]") {
  // What keeps counts beyond INT_MAX working, exercised on small buffers; this
  // communicator does not own MPI, so destroying it leaves the main one working.
  auto small = mc::make_mpi_communicator(1002);
  Communicator& c = *small;
  REQUIRE(c.rank() == comm().rank());
  REQUIRE(c.world_size() == comm().world_size());
  const double n = c.world_size();
  for (DType t : kDtypes) {
    for (ReduceOp op : kOps) {
      check_reduce(
          c, t, op, 100003, [](int r, size_t i) { return (r + 1.0) * static_cast<double>(i % 5); },
          [&](size_t i) {
            const double k = static_cast<double>(i % 5);
            return op == ReduceOp::max ? n * k : k * n * (n + 1) / 2;
          });
    }
  }
  const int root = c.world_size() - 1;
  std::vector<unsigned char> buf(10007, 0xEE);
  if (c.rank() == root) {
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i & 0xff);
  }
  c.broadcast(buf.data(), buf.size(), root);
  size_t bad = 0;
  for (size_t i = 0; i < buf.size(); ++i) bad += buf[i] != static_cast<unsigned char>(i & 0xff);
  CHECK(bad == 0);

  const size_t bpr = 5003, world = static_cast<size_t>(c.world_size()), me = static_cast<size_t>(c.rank());
  auto pattern = [](size_t r, size_t i) { return static_cast<unsigned char>((r * 101 + i) & 0xff); };
  std::vector<unsigned char> send(bpr), recv(bpr * world, 0xEE), inplace(bpr * world, 0xEE);
  for (size_t i = 0; i < bpr; ++i) send[i] = pattern(me, i);
  c.all_gather(send.data(), recv.data(), bpr);
  bad = 0;
  for (size_t r = 0; r < world; ++r) {
    for (size_t i = 0; i < bpr; ++i) bad += recv[r * bpr + i] != pattern(r, i);
  }
  CHECK(bad == 0);
  std::memcpy(inplace.data() + me * bpr, send.data(), bpr);
  c.all_gather(inplace.data() + me * bpr, inplace.data(), bpr);
  CHECK(inplace == recv);
}

TEST_CASE("started all-reduces: several in flight, every dtype and op, chunked, waited out of order", "[mpi][start]") {
  // The overlapped gradient sync keeps several all-reduces in flight while
  // backward runs; the results must be those of the blocking call.
  auto small = mc::make_mpi_communicator(1002);  // several MPI requests per started all-reduce
  for (Communicator* cp : {&comm(), small.get()}) {
    Communicator& c = *cp;
    const int world = c.world_size();
    const double n = world;
    struct Job {
      DType t;
      ReduceOp op;
      size_t count;
      std::vector<char> buf, want;
      mc::Request request = 0;
    };
    std::vector<Job> jobs;
    for (DType t : kDtypes)
      for (ReduceOp op : kOps) jobs.push_back({t, op, 3001 + jobs.size(), {}, {}, 0});
    // And 1-3 elements: fewer than the ranks on 4, where a ring (which the MPI
    // backend asks Open MPI to use for started all-reduces) has empty segments.
    for (DType t : kDtypes)
      for (ReduceOp op : kOps) jobs.push_back({t, op, 1 + jobs.size() % 3, {}, {}, 0});
    const uint64_t grad_bytes_before = c.bytes().grad_allreduce_bytes;
    uint64_t started_bytes = 0;
    for (Job& j : jobs) {
      const size_t es = mix::dtype_size(j.t);
      j.buf.resize(j.count * es);
      j.want.resize(j.count * es);
      for (size_t i = 0; i < j.count; ++i) {
        const double k = static_cast<double>(i % 7);
        store(j.buf.data(), i, j.t, (c.rank() + 1.0) * k);
        store_expected(j.want.data(), i, j.t, j.op, j.op == ReduceOp::max ? n * k : k * n * (n + 1) / 2, world);
      }
      j.request = c.all_reduce_start(j.buf.data(), j.count, j.t, j.op, Traffic::gradients);
      started_bytes += j.count * es;
      c.progress();
    }
    CHECK(c.in_flight() == jobs.size());
    CHECK(c.bytes().grad_allreduce_bytes - grad_bytes_before == started_bytes);
    // Waited for in reverse: completion order is free, results are not.
    for (size_t k = jobs.size(); k-- > 0;) {
      Job& j = jobs[k];
      c.wait(j.request);
      std::string first;
      const size_t bad = count_mismatches(j.buf, j.want, j.count, j.t, &first);
      INFO(mix::dtype_name(j.t) << " " << mc::reduce_op_name(j.op) << " of " << j.count << " elements on " << world
                                << " ranks, started; rank " << c.rank() << " " << first);
      CHECK(bad == 0);
    }
    CHECK(c.in_flight() == 0);
    CHECK_THROWS_WITH(c.wait(jobs[0].request), Catch::Contains("no such request"));
    // Nothing in flight: progress is a no-op; an empty all-reduce starts and completes.
    c.progress();
    const mc::Request empty = c.all_reduce_start(nullptr, 0, DType::f32, ReduceOp::sum);
    c.wait(empty);
    CHECK(c.in_flight() == 0);
  }
}

TEST_CASE("make_default_communicator picks MPI under mpirun", "[mpi]") {
  auto d = mc::make_default_communicator();
  CHECK(d->backend_name() == "mpi");
  CHECK(d->world_size() == comm().world_size());
  CHECK(d->rank() == comm().rank());
  int32_t one = 1;
  d->all_reduce(&one, 1, DType::i32, ReduceOp::sum);
  CHECK(one == d->world_size());
}

TEST_CASE("errors name the call, the place and the rank", "[mpi][errors]") {
  Communicator& c = comm();
  int x = 0;
  // An invalid root fails each rank's argument check locally: no rank waits.
  try {
    MIX_MPI_CHECK(MPI_Bcast(&x, 1, MPI_INT, c.world_size() + 5, MPI_COMM_WORLD));
    FAIL("MIX_MPI_CHECK did not throw on an invalid root");
  } catch (const mix::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("MPI_Bcast") != std::string::npos);
    CHECK(msg.find("test_collectives.cc:") != std::string::npos);
    CHECK(msg.find("rank " + std::to_string(c.rank()) + "/") != std::string::npos);
    CHECK(msg.find("MPI call failed: ") != std::string::npos);
  }
  CHECK(mc::mpi_error_string(MPI_ERR_ROOT).size() > 0);
  CHECK_THROWS_AS(c.all_reduce(nullptr, 3, DType::f32, ReduceOp::sum), mix::Error);
  c.all_reduce(nullptr, 0, DType::f32, ReduceOp::sum);  // nothing to do is fine
  c.barrier();
}

int main(int argc, char** argv) { return mix::testing::run_mpi_tests(argc, argv, "test_collectives", g_comm); }
