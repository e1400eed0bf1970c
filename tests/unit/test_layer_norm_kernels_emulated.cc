// layer norm's CUDA kernels (runtime/ops/cuda/layer_norm_kernels.cuh),
// their very source, run on the CPU (tests/unit/cuda_emulation.h): the
// forward kernel of layer_norm and of fused_add_layer_norm (its residual add),
// and X@GRAD's kernel with and without input Accumulate, on rows of a warp and
// rows of a block of 256, with a grid that covers the rows and one that must
// stride over them; and Scale@GRAD's and Bias@GRAD's column sums in chunks of
// rows (check_param_grads says how close they must be). It runs everywhere, so a change to the kernels' indexing,
// their groups of threads or the residual add and Accumulate paths is checked
// on every build; test_cuda_transformer_ops checks the GPU itself, with tight
// bounds, where one is lent.
//
// What is compared:
//  - bit for bit, what the fused op's contract needs (add_layer_norm_check.h
//    and grad_sum_check.h say it for the ops): the fused kernel's sum is
//    elementwise_add's, and its Norm, Mean and Variance are the plain
//    kernel's on that sum; X@GRAD with Accumulate is X@GRAD without it, then
//    fn::add_grad_part;
//  - against the CPU twins (layer_norm, layer_norm_grad), within 1e-4 of each
//    element's magnitude: the kernels sum a row in FP32 along their own tree
//    where the CPU sums in double, which moves a result by about
//    (cols/threads + 8) FP32 roundings of its terms' magnitudes (under 1e-5
//    for these rows; test_cuda_transformer_ops holds the GPU to that bound),
//    while a wrong index or a missed column moves it by the order of the
//    values themselves. An FP16 or BF16 output may round the other way: one
//    ulp of its type more.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/kernels/functors.h"
#include "runtime/kernels/layer_norm_row.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"

// The emulation and its row launch, then the kernels (cuda_emulation.h defines
// CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"
#include "tests/unit/emulated_row_launch.h"

#include "runtime/ops/cuda/column_sums.cuh"
#include "runtime/ops/cuda/layer_norm_kernels.cuh"  // and row_group.cuh, the warp and block trees

using namespace mix;
using namespace mix::testing;
namespace kernels = mix::cuda;

namespace {

constexpr float kEps = 1e-5f;

// A row shape and how the kernels are launched on it.
struct Rows {
  int64_t rows, cols;
  bool strided;  // one block for all the rows: the grid strides over them
};
constexpr Rows kRows[] = {
    {10, 70, false},   // a warp a row, 8 rows a block: 2 blocks, the second part-full; 70 = 2 x 32 + 6
    {10, 70, true},    // the same rows through one block
    {3, 1500, false},  // a block a row: 6 values a thread, some threads 5
    {3, 1500, true},
};

std::string what_of(const Rows& r, DType x, DType y) {
  return dname(x) + " [" + std::to_string(r.rows) + ", " + std::to_string(r.cols) + "] -> " + dname(y) +
         (r.strided ? ", one block" : "");
}

// The kernel's launch, as layer_norm.cu launches it.
template <typename Kernel>
void launch_rows(const Rows& r, Kernel kernel) {
  launch_row_groups(r.rows, r.cols, r.strided, kernel);
}

// What the forward kernel wrote: the sum (with a residual add), Norm, Mean, Variance.
template <typename T, typename TY>
struct Forward {
  std::vector<T> sum;
  std::vector<TY> norm;
  std::vector<float> mean, var;
};

// The forward kernel on x, adding y (of type TA, `period` values repeating)
// when y is not empty; outputs start as NaN, so a value never written shows.
template <typename T, typename TY, typename TA>
Forward<T, TY> forward(const Rows& r, const std::vector<T>& x, const std::vector<TA>& y, int64_t period,
                       const std::vector<float>& scale, const std::vector<float>& bias) {
  Forward<T, TY> f;
  const auto n = static_cast<size_t>(r.rows * r.cols);
  f.sum.assign(y.empty() ? 0 : n, from_float<T>(NAN));
  f.norm.assign(n, from_float<TY>(NAN));
  f.mean.assign(static_cast<size_t>(r.rows), NAN);
  f.var.assign(static_cast<size_t>(r.rows), NAN);
  const kernels::ResidualAdd<T, TA> add{y.empty() ? nullptr : y.data(), period, y.empty() ? nullptr : f.sum.data()};
  launch_rows(r, [&](auto threads) {
    kernels::layer_norm_rows<T, TY, TA, decltype(threads)::value>(
        x.data(), add, f.norm.data(), f.mean.data(), f.var.data(), scale.data(), bias.data(), r.rows, r.cols, kEps);
  });
  return f;
}

// |got - cpu| <= 1e-4 x magnitude(i) + an ulp of the output's type at cpu (the header says why).
void expect_near_cpu(const Tensor& got, const Tensor& cpu, const std::vector<double>& magnitude,
                     const std::string& what) {
  const std::vector<double> ref = doubles(cpu);
  expect_within(
      got, ref,
      [&](int64_t i) {
        return 1e-4 * magnitude[static_cast<size_t>(i)] + 2.0 * store_err(cpu.dtype(), ref[static_cast<size_t>(i)]);
      },
      what);
}

template <typename T, typename TY>
void check_forward(DType x_dt, DType y_dt, DType norm_dt) {
  for (const Rows& r : kRows) {
    const std::string what = what_of(r, x_dt, norm_dt);
    INFO(what);
    const Shape shape{r.rows, r.cols};
    // Mean 1, spread 2: the variance pass must subtract the mean first.
    const Tensor xt = random_tensor(shape, x_dt, 501, -1.f, 3.f);
    const Tensor scale_t = random_tensor({r.cols}, DType::f32, 502, 0.5f, 1.5f);
    const Tensor bias_t = random_tensor({r.cols}, DType::f32, 503, -0.5f, 0.5f);
    const std::vector<T> x = values_of<T>(xt);
    const std::vector<float> scale = values_of<float>(scale_t), bias = values_of<float>(bias_t);

    // The plain kernel (layer_norm) against the CPU's layer_norm.
    const Forward<T, TY> plain = forward<T, TY, T>(r, x, {}, 0, scale, bias);
    std::map<std::string, Attr> attrs{{"begin_norm_axis", int64_t{1}}, {"epsilon", double{kEps}}};
    if (norm_dt != x_dt) attrs["out_dtype"] = dname(norm_dt);
    const auto cpu =
        run_ops_on({make_op("layer_norm", {{"X", {"x"}}, {"Scale", {"scale"}}, {"Bias", {"bias"}}},
                            {{"Y", {"y"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}}, attrs)},
                   {{"x", xt}, {"scale", scale_t}, {"bias", bias_t}}, cpu_device(), ExecEnv{}, {"y", "mean", "var"});
    // Magnitudes: |xhat·scale| + |bias| for Y, the row's mean |x| for Mean, its variance for Variance.
    const std::vector<float> cm = cpu.at("mean").to_floats(), cv = cpu.at("var").to_floats();
    std::vector<double> y_mag(x.size()), mean_mag(static_cast<size_t>(r.rows)), var_mag(mean_mag.size());
    for (int64_t i = 0; i < r.rows; ++i) {
      const double inv_std = 1.0 / std::sqrt(static_cast<double>(cv[i]) + kEps);
      for (int64_t j = 0; j < r.cols; ++j) {
        const size_t e = static_cast<size_t>(i * r.cols + j);
        const double xv = to_float(x[e]);
        y_mag[e] = std::fabs((xv - cm[i]) * inv_std * scale[j]) + std::fabs(bias[j]) + 1.0;
        mean_mag[i] += std::fabs(xv) / static_cast<double>(r.cols);
      }
      var_mag[i] = cv[i];
    }
    expect_near_cpu(tensor_of(plain.norm, shape, norm_dt), cpu.at("y"), y_mag, "Norm against the CPU");
    expect_near_cpu(tensor_of(plain.mean, {r.rows}, DType::f32), cpu.at("mean"), mean_mag, "Mean against the CPU");
    expect_near_cpu(tensor_of(plain.var, {r.rows}, DType::f32), cpu.at("var"), var_mag, "Variance against the CPU");

    // The fused kernel: the sum is elementwise_add's (fn::Add, rounded to T),
    // and the rest the plain kernel's on that sum, bit for bit; with Y of X's
    // shape (in y_dt) and of its last dim (a position embedding, in T).
    for (const bool trailing : {false, true}) {
      INFO((trailing ? "Y of X's last dim" : "Y of X's shape, " + dname(y_dt)));
      const DType dt = trailing ? x_dt : y_dt;
      const Tensor yt = random_tensor(trailing ? Shape{r.cols} : shape, dt, 504, -2.f, 4.f);
      auto run = [&](auto y_tag) {
        using TA = decltype(y_tag);
        const std::vector<TA> y = values_of<TA>(yt);
        const Forward<T, TY> fused = forward<T, TY, TA>(r, x, y, static_cast<int64_t>(y.size()), scale, bias);
        std::vector<T> sum(x.size());
        for (size_t e = 0; e < x.size(); ++e)
          sum[e] = from_float<T>(fn::Add{}(to_float(x[e]), to_float(y[e % y.size()])));
        expect_same_bits(fused.sum, sum, "the sum against elementwise_add's");
        const Forward<T, TY> on_sum = forward<T, TY, T>(r, sum, {}, 0, scale, bias);
        expect_same_bits(fused.norm, on_sum.norm, "Norm against layer_norm's kernel on the sum");
        expect_same_bits(fused.mean, on_sum.mean, "Mean against layer_norm's kernel on the sum");
        expect_same_bits(fused.var, on_sum.var, "Variance against layer_norm's kernel on the sum");
      };
      if (dt == DType::f32) run(float{});
      if (dt == DType::f16) run(half_t{});
      if (dt == DType::bf16) run(bf16_t{});
    }
  }
}

// X@GRAD's kernel (dy in TDY), without and with Accumulate, against the CPU's
// layer_norm_grad and against its own result plus the other part.
template <typename T, typename TDY>
void check_backward(DType x_dt, DType dy_dt) {
  for (const Rows& r : kRows) {
    const std::string what = what_of(r, x_dt, x_dt) + ", dY " + dname(dy_dt);
    INFO(what);
    const Shape shape{r.rows, r.cols};
    const Tensor xt = random_tensor(shape, x_dt, 511, -1.f, 3.f);
    const Tensor dyt = random_tensor(shape, dy_dt, 512);
    const Tensor scale_t = random_tensor({r.cols}, DType::f32, 513, 0.5f, 1.5f);
    const Tensor bias_t = random_tensor({r.cols}, DType::f32, 514, -0.5f, 0.5f);
    // The statistics the gradient reads: the CPU forward's, as in a step.
    const auto fwd =
        run_ops_on({make_op("layer_norm", {{"X", {"x"}}, {"Scale", {"scale"}}, {"Bias", {"bias"}}},
                            {{"Y", {"y"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}},
                            {{"begin_norm_axis", int64_t{1}}, {"epsilon", double{kEps}}})},
                   {{"x", xt}, {"scale", scale_t}, {"bias", bias_t}}, cpu_device(), ExecEnv{}, {"mean", "var"});
    const std::vector<T> x = values_of<T>(xt);
    const std::vector<TDY> dy = values_of<TDY>(dyt);
    const std::vector<float> scale = values_of<float>(scale_t), mean = values_of<float>(fwd.at("mean")),
                             var = values_of<float>(fwd.at("var"));
    // The other part: random, with -0.0 in every seventh place.
    std::vector<T> other = values_of<T>(random_tensor(shape, x_dt, 515));
    for (size_t e = 0; e < other.size(); e += 7) other[e] = from_float<T>(-0.0f);

    auto grad = [&](const T* acc) {
      std::vector<T> dx(x.size(), from_float<T>(NAN));
      launch_rows(r, [&](auto threads) {
        kernels::layer_norm_grad_rows<T, TDY, decltype(threads)::value>(
            x.data(), dy.data(), dx.data(), acc, scale.data(), mean.data(), var.data(), r.rows, r.cols, kEps);
      });
      return dx;
    };
    const std::vector<T> own = grad(nullptr), both = grad(other.data());

    const auto cpu = run_ops_on(
        {make_op("layer_norm_grad",
                 {{"X", {"x"}}, {"Scale", {"scale"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}, {"Y@GRAD", {"dy"}}},
                 {{"X@GRAD", {"dx"}}}, {{"begin_norm_axis", int64_t{1}}, {"epsilon", double{kEps}}})},
        {{"x", xt}, {"scale", scale_t}, {"mean", fwd.at("mean")}, {"var", fwd.at("var")}, {"dy", dyt}}, cpu_device(),
        ExecEnv{}, {"dx"});
    // Magnitude: inv_std·(|g| + mean|g| + |xhat|·mean|g·xhat|), g = dy·scale, the terms dX is the difference of.
    std::vector<double> mag(x.size());
    for (int64_t i = 0; i < r.rows; ++i) {
      const double inv_std = 1.0 / std::sqrt(static_cast<double>(var[i]) + kEps);
      double mg = 0, mgx = 0;
      for (int64_t j = 0; j < r.cols; ++j) {
        const size_t e = static_cast<size_t>(i * r.cols + j);
        const double g = to_float(dy[e]) * scale[j], xhat = (to_float(x[e]) - mean[i]) * inv_std;
        mg += std::fabs(g) / static_cast<double>(r.cols);
        mgx += std::fabs(g * xhat) / static_cast<double>(r.cols);
      }
      for (int64_t j = 0; j < r.cols; ++j) {
        const size_t e = static_cast<size_t>(i * r.cols + j);
        const double g = to_float(dy[e]) * scale[j], xhat = (to_float(x[e]) - mean[i]) * inv_std;
        mag[e] = inv_std * (std::fabs(g) + mg + std::fabs(xhat) * mgx);
      }
    }
    expect_near_cpu(tensor_of(own, shape, x_dt), cpu.at("dx"), mag, "X@GRAD against the CPU");

    // With Accumulate: the own part rounded to T, then the other part added (fn::add_grad_part).
    std::vector<T> expected(x.size());
    for (size_t e = 0; e < x.size(); ++e) expected[e] = from_float<T>(to_float(own[e]) + to_float(other[e]));
    expect_same_bits(both, expected, "X@GRAD with Accumulate against X@GRAD, then the other part added");
  }
}

// Scale@GRAD's and Bias@GRAD's column sums: layer_norm_param_partials over
// chunks of rows, then ChunkColumnSum, as layer_norm.cu launches them, against
// the CPU's layer_norm_grad. Both add the same double terms (dy, and dy·xhat
// with xhat the same float), in different orders: at most one float ulp apart
// (2^-23·|cpu|), plus the double sums' error where a column cancels
// (rows·2^-52·sum|terms|). A missed or repeated row moves a column by a whole term.
template <typename T, typename TDY>
void check_param_grads(DType x_dt, DType dy_dt) {
  // Rows of one chunk, and rows of several chunks over two tiles of 256 columns.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{10, 70}, {100, 300}}) {
    const std::string what =
        dname(x_dt) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "], dY " + dname(dy_dt);
    INFO(what);
    const Shape shape{rows, cols};
    const Tensor xt = random_tensor(shape, x_dt, 521, -1.f, 3.f);
    const Tensor dyt = random_tensor(shape, dy_dt, 522);
    const Tensor scale_t = random_tensor({cols}, DType::f32, 523, 0.5f, 1.5f);
    const Tensor bias_t = random_tensor({cols}, DType::f32, 524, -0.5f, 0.5f);
    const std::map<std::string, Attr> attrs{{"begin_norm_axis", int64_t{1}}, {"epsilon", double{kEps}}};
    const auto fwd =
        run_ops_on({make_op("layer_norm", {{"X", {"x"}}, {"Scale", {"scale"}}, {"Bias", {"bias"}}},
                            {{"Y", {"y"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}}, attrs)},
                   {{"x", xt}, {"scale", scale_t}, {"bias", bias_t}}, cpu_device(), ExecEnv{}, {"mean", "var"});
    const auto cpu = run_ops_on(
        {make_op("layer_norm_grad",
                 {{"X", {"x"}}, {"Scale", {"scale"}}, {"Mean", {"mean"}}, {"Variance", {"var"}}, {"Y@GRAD", {"dy"}}},
                 {{"Scale@GRAD", {"dscale"}}, {"Bias@GRAD", {"dbias"}}}, attrs)},
        {{"x", xt}, {"scale", scale_t}, {"mean", fwd.at("mean")}, {"var", fwd.at("var")}, {"dy", dyt}}, cpu_device(),
        ExecEnv{}, {"dscale", "dbias"});

    const std::vector<T> x = values_of<T>(xt);
    const std::vector<TDY> dy = values_of<TDY>(dyt);
    const std::vector<float> mean = values_of<float>(fwd.at("mean")), var = values_of<float>(fwd.at("var"));
    const auto [chunks, rows_per_chunk] =
        kernels::row_chunks(rows, kernels::kLayerNormParamRowsPerChunk, kernels::kLayerNormParamMaxChunks);
    std::vector<double> partial_scale(static_cast<size_t>(chunks * cols), NAN), partial_bias(partial_scale);
    emulated::run_grid(
        static_cast<unsigned>((cols + kernels::kBlock - 1) / kernels::kBlock), static_cast<unsigned>(chunks),
        [&] {
          kernels::layer_norm_param_partials<T, TDY>(x.data(), dy.data(), mean.data(), var.data(), rows, cols,
                                                     rows_per_chunk, kEps, partial_scale.data(), partial_bias.data());
        },
        kernels::kBlock);
    std::vector<float> dscale(static_cast<size_t>(cols), NAN), dbias(dscale);
    using Sum = kernels::ChunkColumnSum<double, kernels::AddRnDouble, float>;
    emulated_grid_stride(cols, Sum{partial_scale.data(), dscale.data(), chunks, cols});
    emulated_grid_stride(cols, Sum{partial_bias.data(), dbias.data(), chunks, cols});

    // The magnitudes of the terms: sum|dy·xhat| and sum|dy| per column.
    std::vector<double> ds_mag(static_cast<size_t>(cols)), db_mag(ds_mag.size());
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const size_t e = static_cast<size_t>(i * cols + j);
        const double g = to_float(dy[e]);
        const double xhat = (to_float(x[e]) - mean[static_cast<size_t>(i)]) /
                            std::sqrt(static_cast<double>(var[static_cast<size_t>(i)]) + kEps);
        ds_mag[static_cast<size_t>(j)] += std::fabs(g * xhat);
        db_mag[static_cast<size_t>(j)] += std::fabs(g);
      }
    const auto ulp_apart = [rows = rows](const Tensor& cpu_t, const std::vector<double>& mag) {
      return [c = doubles(cpu_t), &mag, rows](int64_t j) {
        const auto k = static_cast<size_t>(j);
        return 0x1p-23 * std::fabs(c[k]) + static_cast<double>(rows) * 0x1p-52 * mag[k] + 0x1p-149;
      };
    };
    expect_within(tensor_of(dscale, {cols}, DType::f32), doubles(cpu.at("dscale")), ulp_apart(cpu.at("dscale"), ds_mag),
                  "Scale@GRAD against the CPU");
    expect_within(tensor_of(dbias, {cols}, DType::f32), doubles(cpu.at("dbias")), ulp_apart(cpu.at("dbias"), db_mag),
                  "Bias@GRAD against the CPU");
  }
}

}  // namespace

TEST_CASE(
    "layer_norm's and fused_add_layer_norm's forward kernel, emulated: the CPU's values, and the fused "
    "op's bits",
    "[layer_norm][fused_add_layer_norm][emulated]") {
  check_forward<float, float>(DType::f32, DType::f32, DType::f32);
  check_forward<half_t, half_t>(DType::f16, DType::f16, DType::f16);
  check_forward<bf16_t, bf16_t>(DType::bf16, DType::bf16, DType::bf16);
  // The AMP residual stream: FP32 X, an FP16 branch added, the norm stored in FP16 (out_dtype).
  check_forward<float, half_t>(DType::f32, DType::f16, DType::f16);
  check_forward<float, bf16_t>(DType::f32, DType::bf16, DType::bf16);
}

TEST_CASE(
    "layer_norm_grad's X@GRAD kernel, emulated: the CPU's values, and with Accumulate the bits of adding "
    "the other part after",
    "[layer_norm][fold_grad_sums][emulated]") {
  check_backward<float, float>(DType::f32, DType::f32);
  check_backward<half_t, half_t>(DType::f16, DType::f16);
  check_backward<bf16_t, bf16_t>(DType::bf16, DType::bf16);
  // FP32 X with the FP16 gradient of a norm stored in FP16.
  check_backward<float, half_t>(DType::f32, DType::f16);
}

TEST_CASE("layer_norm_grad's Scale@GRAD and Bias@GRAD column sums, emulated: within an ulp of the CPU's",
          "[layer_norm][emulated]") {
  check_param_grads<float, float>(DType::f32, DType::f32);
  check_param_grads<half_t, half_t>(DType::f16, DType::f16);
  check_param_grads<bf16_t, bf16_t>(DType::bf16, DType::bf16);
  check_param_grads<float, half_t>(DType::f32, DType::f16);  // FP32 X, the FP16 gradient of an FP16 norm
}
