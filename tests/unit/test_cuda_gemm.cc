// [cuda] The cuBLAS GEMM ops (mul, mul_grad, matmul, matmul_grad, fused_matmul_bias) on cuda:0
// against their CPU kernels, as one-op Programs run by the Executor on each
// device with the same inputs, in f32, f16 and bf16, over odd sizes, every
// transpose combination, batch dims, a shared 2-D Y and alpha.
//
// Tolerances are per element: |gpu - cpu| <= acc * K * mag + rel * |cpu| + abs, where
//   mag = the same op run on |inputs| (and |alpha|) on the CPU: sum |a_p b_p| of that
//         element, which bounds the accumulation error of any summation order
//         (|fl(sum) - sum| <= K u sum |a_p b_p|, Higham's gamma_K) even where the sum
//         cancels to nearly nothing;
//   K   = the number of terms summed into that element (the folded batch included);
//   acc = the two sides' unit roundoffs added: OpenBLAS FP32 (2^-24) plus the GPU's
//         FP32 accumulator: 2^-24 for FP32 on CUDA cores, 2^-23 on tensor cores,
//         whose FP32 adders truncate instead of rounding to nearest (Fasi et al.,
//         "Numerical behavior of NVIDIA tensor cores", 2021);
//   rel = 2^-23 for alpha's multiply and the FP32 store, plus, for f16 / bf16
//         outputs, one ulp of the output (2^-10 f16, 2^-7 bf16): both sides round
//         nearly equal FP32 sums once, and those can land on neighbouring values;
//   abs = f16's subnormal spacing 2^-24 for f16 outputs (its ulp there is not
//         relative), else 0.
// Products of f16 / bf16 inputs are exact in FP32 (11 x 11 and 8 x 8 significand
// bits), so with 16-bit inputs only summation order and the final rounding differ.
// With TF32 off the FP32 bound is tight enough to catch TF32 sneaking in: at
// K = 5..13 it allows ~1e-6 * mag, TF32's input rounding alone costs ~1e-4 * mag.
//
// Without a GPU (or in a build without CUDA) the test exits 77: CTest reports it
// as skipped, never as passed.
#include <catch2/catch.hpp>

#include "tests/unit/require_gpu.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "tests/unit/gradcheck.h"

#ifdef MIX_HAVE_CUDA
#include "runtime/cuda/context.h"
#include "runtime/cuda/gemm.h"
#endif

using namespace mix;
using namespace mix::testing;
using Catch::Matchers::Contains;

namespace {

using mix::testing::require_gpu;

const Device kGpu = gpu_or_stand_in();

bool tf32_allowed() {
#ifdef MIX_HAVE_CUDA
  return cuda::allow_tf32();
#else
  return false;
#endif
}

// Turns --allow-tf32 on for a scope (and back off after, even when a check throws).
struct AllowTf32 {
  AllowTf32() { set(true); }
  ~AllowTf32() { set(false); }
  AllowTf32(const AllowTf32&) = delete;
  AllowTf32& operator=(const AllowTf32&) = delete;
  static void set(bool on) {
#ifdef MIX_HAVE_CUDA
    cuda::set_allow_tf32(on);
#else
    (void)on;
#endif
  }
};

// One op with its inputs (CPU tensors, already in the run's dtype) and the output slots it writes.
struct OneOp {
  std::string type;
  std::map<std::string, Tensor> inputs;
  std::vector<std::string> outputs;
  std::map<std::string, Attr> attrs = {};
};

// Runs the op alone on `device` (inputs copied there) and returns its outputs, copied back to the host.
std::map<std::string, Tensor> run_on(const OneOp& o, Device device) {
  Program p;
  Scope scope;
  std::map<std::string, std::vector<std::string>> ins, outs;
  int i = 0;
  for (auto& [slot, t] : o.inputs) {
    const std::string name = "in" + std::to_string(i++) + "_" + var_base(slot);
    VarDesc v = var_desc(name, t.shape(), t.dtype());
    v.stop_gradient = true;
    p.add_var(v);
    ins[slot] = {name};
    scope.set(name, t.to(device));
  }
  std::set<std::string> keep;
  for (auto& slot : o.outputs) {
    outs[slot] = {"out_" + var_base(slot)};
    keep.insert("out_" + var_base(slot));
  }
  p.append_op(make_op(o.type, ins, outs, o.attrs));
  ExecEnv env;
  env.device = device;
  Executor(p, keep).run(scope, env);
  std::map<std::string, Tensor> res;
  for (auto& slot : o.outputs) {
    const Tensor& t = scope.get("out_" + var_base(slot));
    CHECK(t.device() == device);
    res[slot] = t.to(cpu_device());
  }
  return res;
}

// The same op on |inputs| widened to f32 and |alpha|, on the CPU: sum |a_p b_p| per element.
std::map<std::string, Tensor> magnitudes(const OneOp& o) {
  OneOp m = o;
  for (auto& [slot, t] : m.inputs) {
    std::vector<float> v = t.to_floats();
    for (auto& x : v) x = std::fabs(x);
    t = Tensor::from_floats(t.shape(), v);
  }
  if (auto it = m.attrs.find("alpha"); it != m.attrs.end()) it->second = std::fabs(std::get<double>(it->second));
  return run_on(m, cpu_device());
}

struct Precision {
  double acc;  // both sides' accumulation roundoff, per term
  double rel;  // relative to |ref|
  double abs;
};

Precision precision_of(DType dt, bool tf32) {
  const double u24 = std::ldexp(1.0, -24), u23 = std::ldexp(1.0, -23);
  switch (dt) {
    case DType::f32:
      return {u24 + (tf32 ? u23 : u24), u23, 0.0};
    case DType::f16:
      return {u24 + u23, u23 + std::ldexp(1.0, -10), std::ldexp(1.0, -24)};
    case DType::bf16:
      return {u24 + u23, u23 + std::ldexp(1.0, -7), 0.0};
    default:
      FAIL("no GEMM precision for " << dtype_name(dt));
  }
  return {};
}

// |got - ref| <= p.acc * terms * mag + p.rel * |ref| + p.abs (+ `extra_mag` * mag: TF32's input rounding).
void expect_gemm_close(const Tensor& got, const Tensor& ref, const Tensor& mag, int64_t terms, Precision p,
                       const std::string& what, double extra_mag = 0.0) {
  INFO(what);
  REQUIRE(got.shape() == ref.shape());
  REQUIRE(got.dtype() == ref.dtype());
  const std::vector<float> g = got.to_floats(), r = ref.to_floats(), m = mag.to_floats();
  REQUIRE(m.size() == r.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - r[i]);
    const double tol = (p.acc * static_cast<double>(terms) + extra_mag) * m[i] + p.rel * std::fabs(r[i]) + p.abs;
    const double ratio = tol > 0 ? err / tol : (err > 0 ? 1e30 : 0.0);
    if (!(err <= tol)) ++bad;  // NaN counts as bad
    if (ratio > worst_ratio || std::isnan(err)) {
      worst_ratio = std::isnan(err) ? 1e30 : ratio;
      worst = i;
    }
  }
  if (std::getenv("MIX_GRADCHECK_VERBOSE")) std::printf("%-70s worst err/tol %.3g\n", what.c_str(), worst_ratio);
  INFO(bad << " of " << g.size() << " elements outside the tolerance; worst at " << worst << ": gpu "
           << (g.empty() ? 0.f : g[worst]) << " cpu " << (r.empty() ? 0.f : r[worst]) << " mag "
           << (m.empty() ? 0.f : m[worst]) << " (err/tol " << worst_ratio << ")");
  CHECK(bad == 0);
}

Tensor random_input(const Shape& s, DType dt, uint64_t seed) { return to_dtype(uniform_tensor(s, seed), dt); }

const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};

// Runs `o` on both devices and compares every output; `terms` gives each output's K.
void compare_devices(const OneOp& o, const std::map<std::string, int64_t>& terms, const std::string& what,
                     double extra_mag = 0.0) {
  const DType dt = o.inputs.begin()->second.dtype();
  const Precision p = precision_of(dt, tf32_allowed());
  const auto ref = run_on(o, cpu_device());
  const auto got = run_on(o, kGpu);
  const auto mag = magnitudes(o);
  for (auto& slot : o.outputs)
    expect_gemm_close(got.at(slot), ref.at(slot), mag.at(slot), terms.at(slot), p,
                      what + " " + slot + " " + std::string(dtype_name(dt)), extra_mag);
}

// ---- mul -------------------------------------------------------------------------------------

struct MulCase {
  Shape x;
  int ncol;
  int64_t out;
};
const MulCase kMulCases[] = {
    {{1, 1}, 1, 1},    {{7, 13}, 1, 5},     {{33, 65}, 1, 17},     {{2, 5, 7}, 2, 3},
    {{4, 3, 5}, 1, 9}, {{128, 257}, 1, 96}, {{300, 1024}, 1, 130},
};

std::string mul_name(const MulCase& c) {
  return "mul X" + shape_str(c.x) + " x_num_col_dims=" + std::to_string(c.ncol) + " out=" + std::to_string(c.out);
}

void check_mul(const MulCase& c, DType dt, uint64_t seed, double extra_mag = 0.0) {
  int64_t rows = 1, in = 1;
  for (int i = 0; i < static_cast<int>(c.x.size()); ++i) (i < c.ncol ? rows : in) *= c.x[i];
  const Tensor x = random_input(c.x, dt, seed), y = random_input({c.out, in}, dt, seed + 1);
  Shape out_shape(c.x.begin(), c.x.begin() + c.ncol);
  out_shape.push_back(c.out);
  const Tensor g = random_input(out_shape, dt, seed + 2);
  const std::map<std::string, Attr> attrs = {{"x_num_col_dims", int64_t{c.ncol}}};
  compare_devices({"mul", {{"X", x}, {"Y", y}}, {"Out"}, attrs}, {{"Out", in}}, mul_name(c), extra_mag);
  compare_devices({"mul_grad", {{"X", x}, {"Y", y}, {"Out@GRAD", g}}, {"X@GRAD", "Y@GRAD"}, attrs},
                  {{"X@GRAD", c.out}, {"Y@GRAD", rows}}, mul_name(c), extra_mag);
}

// ---- matmul ----------------------------------------------------------------------------------

struct MatmulCase {
  Shape batch;
  bool y_shared;
  int64_t m, k, n;
  bool tx, ty;
  double alpha;
};

std::string matmul_name(const MatmulCase& c) {
  return "matmul batch" + shape_str(c.batch) + (c.y_shared ? " shared Y" : "") + " m=" + std::to_string(c.m) +
         " k=" + std::to_string(c.k) + " n=" + std::to_string(c.n) + (c.tx ? " tX" : "") + (c.ty ? " tY" : "") +
         " alpha=" + std::to_string(c.alpha);
}

void check_matmul(const MatmulCase& c, DType dt, uint64_t seed, double extra_mag = 0.0) {
  int64_t count = 1;
  for (int64_t b : c.batch) count *= b;
  Shape xs = c.batch, ys = c.y_shared ? Shape{} : c.batch, os = c.batch;
  xs.insert(xs.end(), {c.tx ? c.k : c.m, c.tx ? c.m : c.k});
  ys.insert(ys.end(), {c.ty ? c.n : c.k, c.ty ? c.k : c.n});
  os.insert(os.end(), {c.m, c.n});
  const Tensor x = random_input(xs, dt, seed), y = random_input(ys, dt, seed + 1), g = random_input(os, dt, seed + 2);
  const std::map<std::string, Attr> attrs = {{"transpose_X", c.tx}, {"transpose_Y", c.ty}, {"alpha", c.alpha}};
  compare_devices({"matmul", {{"X", x}, {"Y", y}}, {"Out"}, attrs}, {{"Out", c.k}}, matmul_name(c), extra_mag);
  // A shared Y's gradient sums over the whole batch: count * m terms.
  compare_devices({"matmul_grad", {{"X", x}, {"Y", y}, {"Out@GRAD", g}}, {"X@GRAD", "Y@GRAD"}, attrs},
                  {{"X@GRAD", c.n}, {"Y@GRAD", c.y_shared ? count * c.m : c.m}}, matmul_name(c), extra_mag);
}

std::vector<MatmulCase> matmul_cases() {
  struct Mkn {
    int64_t m, k, n;
  };
  const Mkn sizes[] = {{1, 1, 1}, {5, 7, 3}, {17, 33, 9}, {64, 128, 31}};
  const struct {
    Shape batch;
    bool shared;
  } batches[] = {{{}, true}, {{3}, false}, {{3}, true}, {{2, 3}, false}, {{2, 3}, true}};
  const double alphas[] = {1.0, 0.5, -1.5};
  std::vector<MatmulCase> r;
  size_t i = 0;
  for (auto& s : sizes)
    for (auto& b : batches)
      for (int t = 0; t < 4; ++t, ++i)
        r.push_back({b.batch, b.shared, s.m, s.k, s.n, (t & 1) != 0, (t & 2) != 0, alphas[i % 3]});
  return r;
}

}  // namespace

TEST_CASE("CUDA mul and mul_grad match the CPU kernels", "[cuda][gemm][mul]") {
  require_gpu();
  uint64_t seed = 100;
  for (DType dt : kDtypes)
    for (const MulCase& c : kMulCases) check_mul(c, dt, seed += 10);
}

TEST_CASE("CUDA mul_grad writes only the gradients asked for", "[cuda][gemm][mul]") {
  require_gpu();
  const Tensor x = random_input({6, 10}, DType::f16, 7), y = random_input({4, 10}, DType::f16, 8);
  const Tensor g = random_input({6, 4}, DType::f16, 9);
  // The weight's gradient only (X is data, as in a first layer).
  const OneOp o{"mul_grad", {{"X", x}, {"Y", y}, {"Out@GRAD", g}}, {"Y@GRAD"}};
  compare_devices(o, {{"Y@GRAD", 6}}, "mul_grad Y@GRAD only");
  const OneOp dx_only{"mul_grad", {{"X", x}, {"Y", y}, {"Out@GRAD", g}}, {"X@GRAD"}};
  compare_devices(dx_only, {{"X@GRAD", 4}}, "mul_grad X@GRAD only");
}

TEST_CASE("CUDA matmul and matmul_grad match the CPU kernels", "[cuda][gemm][matmul]") {
  require_gpu();
  const std::vector<MatmulCase> cases = matmul_cases();
  uint64_t seed = 5000;
  for (DType dt : kDtypes)
    for (const MatmulCase& c : cases) check_matmul(c, dt, seed += 10);
}

TEST_CASE("CUDA matmul: a long shared-Y batch under transpose_X sums its gradient in FP32", "[cuda][gemm][matmul]") {
  require_gpu();
  // 16 batch entries of 40 rows: dY sums 640 terms per element, over 16 GEMMs
  // into one FP32 buffer; the f16 result is rounded once (rel tolerance 2^-10).
  for (DType dt : kDtypes) check_matmul({{16}, true, 40, 24, 20, true, false, 1.0}, dt, 77);
  for (DType dt : kDtypes) check_matmul({{4, 4}, true, 40, 24, 20, true, true, 0.5}, dt, 78);
}

TEST_CASE("CUDA matmul: K = 0 gives zeros, like the CPU kernel", "[cuda][gemm][matmul]") {
  require_gpu();
  for (DType dt : kDtypes) {
    const Tensor x = Tensor::zeros({2, 3, 0}, dt), y = Tensor::zeros({2, 0, 4}, dt);
    const auto got = run_on({"matmul", {{"X", x}, {"Y", y}}, {"Out"}}, kGpu);
    REQUIRE(got.at("Out").shape() == Shape{2, 3, 4});
    for (float v : got.at("Out").to_floats()) CHECK(v == 0.f);
  }
}

static uint64_t epilogue_runs() {
#ifdef MIX_HAVE_CUDA
  return cuda::gemm_bias_epilogue_runs();
#else
  return 0;
#endif
}

TEST_CASE("CUDA fused_matmul_bias matches the CPU kernel, on cuBLASLt's bias epilogue", "[cuda][gemm][matmul]") {
  require_gpu();
  // The bias is one more term of each sum (K + 1), its magnitude in mag. Odd
  // sizes, batch dims, alpha, transpose_Y or not, K = 0 (the bias alone), and
  // two linear layers of the Transformer's shapes, which must take cuBLASLt's
  // epilogue (the others may take the fallback: FP32 sums, then a kernel).
  struct Case {
    Shape batch;
    int64_t m, k, n;
    bool ty;
    double alpha;
    bool epilogue;  // must run on cuBLASLt's epilogue
  };
  const Case cases[] = {
      {{}, 1, 1, 1, false, 1.0, false},        {{3}, 5, 7, 3, true, 0.5, false},
      {{2, 3}, 17, 33, 9, false, -1.5, false}, {{2, 4}, 64, 128, 96, true, 1.0, true},
      {{4}, 64, 512, 1536, true, 1.0, true},   {{3}, 8, 0, 16, true, 1.0, false},
  };
  uint64_t seed = 9000;
  for (DType dt : kDtypes) {
    for (const Case& c : cases) {
      Shape xs = c.batch, os = c.batch;
      xs.insert(xs.end(), {c.m, c.k});
      os.insert(os.end(), {c.m, c.n});
      const Tensor x = random_input(xs, dt, seed += 10),
                   y = random_input(c.ty ? Shape{c.n, c.k} : Shape{c.k, c.n}, dt, seed + 1);
      const Tensor b = random_input({c.n}, dt, seed + 2);
      const std::string what = "fused_matmul_bias batch" + shape_str(c.batch) + " m=" + std::to_string(c.m) +
                               " k=" + std::to_string(c.k) + " n=" + std::to_string(c.n) + (c.ty ? " tY" : "");
      const uint64_t before = epilogue_runs();
      compare_devices({"fused_matmul_bias",
                       {{"X", x}, {"Y", y}, {"Bias", b}},
                       {"Out"},
                       {{"transpose_Y", c.ty}, {"alpha", c.alpha}}},
                      {{"Out", c.k + 1}}, what);
      INFO(what << " " << dtype_name(dt));
      if (c.epilogue && on_real_gpu()) CHECK(epilogue_runs() > before);
    }
  }
}

#ifdef MIX_HAVE_CUDA
// Values k/8 with |k| <= 16: exact in f16 and bf16, their products exact
// multiples of 1/64 below 4 in magnitude.
static Tensor eighths(const Shape& shape, uint64_t seed, DType dtype) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int>((seed >> 33) % 33) - 16) / 8.f;
  }
  return to_dtype(Tensor::from_floats(shape, v), dtype);
}

static bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}
#endif

TEST_CASE("CUDA gemm_bias gives the CPU's bits where every partial sum is exact in FP32, split-K shapes included",
          "[cuda][gemm][matmul]") {
  require_gpu();
#ifdef MIX_HAVE_CUDA
  // With eighths (above) every partial sum of up to 16384 products is a
  // multiple of 1/64 below 2^16, exact in FP32 in any order, so the one
  // rounding of the sum plus the bias is the whole error and the GPU must
  // give the CPU's bits. Few outputs over a long K is where cuBLASLt splits
  // K: a split whose partial sums were kept in a 16-bit C (reduction schemes
  // INPLACE or OUTPUT_TYPE) rounds each of them, here to fewer bits than
  // they hold. The same shapes run again with the bias 16 bytes past an
  // aligned one: the plan chosen for the first bias must not be reused for
  // it (cuBLASLt's heuristic assumes the bias pointer's alignment).
  struct Case {
    int64_t m, k, n;
    bool ty;
  };
  const Case cases[] = {{8, 8192, 64, false}, {8, 8192, 64, true}, {4, 16384, 32, true}, {64, 4096, 96, false}};
  uint64_t seed = 12000;
  for (DType dt : kDtypes) {
    for (const Case& c : cases) {
      const std::string what = std::string(dtype_name(dt)) + " m=" + std::to_string(c.m) + " k=" + std::to_string(c.k) +
                               " n=" + std::to_string(c.n) + (c.ty ? " tY" : "");
      INFO(what);
      const Tensor x = eighths({c.m, c.k}, seed += 10, dt);
      const Tensor y = eighths(c.ty ? Shape{c.n, c.k} : Shape{c.k, c.n}, seed + 1, dt);
      const Tensor b = eighths({c.n}, seed + 2, dt);
      // The exact sums, rounded once: what the CPU twin must give too.
      const std::vector<float> xv = x.to_floats(), yv = y.to_floats(), bv = b.to_floats();
      std::vector<float> exact(static_cast<size_t>(c.m * c.n));
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          double sum = bv[j];
          for (int64_t p = 0; p < c.k; ++p) sum += double(xv[i * c.k + p]) * yv[c.ty ? j * c.k + p : p * c.n + j];
          exact[i * c.n + j] = static_cast<float>(sum);
          REQUIRE(double(exact[i * c.n + j]) == sum);  // the premise: exact in FP32
        }
      const Tensor want = to_dtype(Tensor::from_floats({c.m, c.n}, exact), dt);
      const auto cpu = run_on(
          {"fused_matmul_bias", {{"X", x}, {"Y", y}, {"Bias", b}}, {"Out"}, {{"transpose_Y", c.ty}}}, cpu_device());
      REQUIRE(same_bytes(cpu.at("Out"), want));
      if (!on_real_gpu()) continue;  // the rest calls cuBLASLt itself

      // The bias at an aligned address, then 16 bytes past one, as gemm_bias's callers could pass a view.
      const int64_t pad = 16 / static_cast<int64_t>(dtype_size(dt));
      std::vector<float> padded(static_cast<size_t>(pad), 0.f);
      padded.insert(padded.end(), bv.begin(), bv.end());
      const Tensor gx = x.to(kGpu), gy = y.to(kGpu), gb = b.to(kGpu);
      const Tensor gb_padded = to_dtype(Tensor::from_floats({pad + c.n}, padded), dt).to(kGpu);
      const void* aligned_bias = gb.raw();
      const void* offset_bias = static_cast<const char*>(gb_padded.raw()) + 16;
      REQUIRE(reinterpret_cast<uintptr_t>(offset_bias) % 32 == 16);
      for (const void* bias : {aligned_bias, offset_bias}) {
        INFO((bias == aligned_bias ? "bias aligned" : "bias 16 bytes off"));
        Tensor out = Tensor::empty({c.m, c.n}, dt, kGpu);
        const uint64_t before = epilogue_runs();
        cuda::gemm_bias(cuda::use_device(kGpu.index), c.ty, c.m, c.n, c.k, 1.f, gx.raw(), gy.raw(), bias, out.raw(),
                        dt);
        CHECK(same_bytes(out.to(cpu_device()), want));
        if (epilogue_runs() == before) WARN(what << ": gemm_bias took its fallback, not cuBLASLt's epilogue");
      }
    }
  }
#endif
}

TEST_CASE("CUDA FP32 GEMMs use TF32 only under --allow-tf32", "[cuda][gemm][tf32]") {
  require_gpu();
  REQUIRE_FALSE(tf32_allowed());  // the default
  // With TF32 off the f32 cases above already hold to the FP32 bound, which TF32
  // would break at small K. With it on, each input loses its mantissa below
  // 10 bits (relative error <= 2^-10 with truncation, 2^-11 rounded): a product
  // is off by up to (1 + 2^-10)^2 - 1 = 2^-9 + 2^-20 of its magnitude, on top of
  // the FP32 accumulation.
  const double tf32_inputs = std::ldexp(1.0, -9) + std::ldexp(1.0, -20);
  AllowTf32 on;
#ifdef MIX_HAVE_CUDA
  REQUIRE(tf32_allowed());
#endif  // a build without CUDA has no switch to turn on: the bounds below still run on the CPU stand-in
  uint64_t seed = 9000;
  for (const MulCase& c : kMulCases) check_mul(c, DType::f32, seed += 10, tf32_inputs);
  for (const MatmulCase& c : matmul_cases()) check_matmul(c, DType::f32, seed += 10, tf32_inputs);

  // Whether cuBLAS took the offer (it may not, for tiny shapes): informational only.
  const Tensor x = random_input({256, 256}, DType::f32, 1), y = random_input({256, 256}, DType::f32, 2);
  const OneOp o{"matmul", {{"X", x}, {"Y", y}}, {"Out"}};
  const std::vector<float> with = run_on(o, kGpu).at("Out").to_floats();
  AllowTf32::set(false);
  const std::vector<float> without = run_on(o, kGpu).at("Out").to_floats();
  AllowTf32::set(true);
  size_t differ = 0;
  for (size_t i = 0; i < with.size(); ++i) differ += with[i] != without[i];
  WARN("256^3 FP32 matmul: " << differ << " of " << with.size() << " elements differ with TF32 on vs off");
}

TEST_CASE("CUDA GEMM ops name a tensor on the wrong device", "[cuda][gpu_only][gemm][errors]") {
  require_gpu();
  const Tensor x = random_input({3, 4}, DType::f32, 1), y = random_input({4, 5}, DType::f32, 2);
  Program p;
  p.add_var(var_desc("x", {3, 4}, DType::f32));
  p.add_var(var_desc("y", {4, 5}, DType::f32));
  p.append_op(make_op("matmul", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"o"}}}));
  Scope scope;
  scope.set("x", x);  // left on the host
  scope.set("y", y.to(kGpu));
  ExecEnv env;
  env.device = kGpu;
  CHECK_THROWS_WITH(Executor(p, {"o"}).run(scope, env), Contains("is on cpu") && Contains("cuda:0"));
}
