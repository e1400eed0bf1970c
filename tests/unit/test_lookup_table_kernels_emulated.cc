// lookup_table's forward row copy and lookup_table_grad's CUDA kernels
// (runtime/ops/cuda/lookup_table_kernels.cuh), their very source, run on the
// CPU (tests/unit/cuda_emulation.h). test_cuda_transformer_ops checks the GPU
// itself where one is lent.
//
// The copy must give the CPU's bits at each copy unit (16, 8, 4 and 2 bytes,
// by the row's size and Out's alignment), the padding row zeros, and an id
// out of range a row of NaN; through a block for every 8 ids and through one
// block that strides over them.
//
// The gradient's steps run as lookup_table.cu runs them: the keys and
// positions, a stable sort by key (cub's radix sort on the GPU,
// std::stable_sort here: both keep positions ascending within a key), each
// row's start (zeros, or with input Accumulate the other part plus 0), and
// one block per run of equal ids. The kernels add each id's rows in position
// order, the CPU loop's FP32 additions in its order, so W@GRAD must be the
// CPU's bit for bit: FP32, FP16 and BF16 tables, the tied embedding's FP32
// table with an FP16 or BF16 other part, ids repeated, the padding id and
// rows no id names, the other part holding -0.0 there (the result is +0, as
// the op then `sum` gives), columns over one block and over several of its
// strides, a grid of a block an id and one that strides over the ids.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/kernels/functors.h"
#include "runtime/kernels/lookup_row.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"

// The emulation and its map launches, then the kernels (cuda_emulation.h
// defines CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"

#include "runtime/ops/cuda/lookup_table_kernels.cuh"

using namespace mix;
using namespace mix::testing;
namespace kernels = mix::cuda;

namespace {

constexpr int64_t kRows = 11, kPadding = 3;
// 40 positions over 11 rows: repeats, the padding id, and rows 6 and 9 named by none.
const std::vector<int64_t> kIds = {0, 4, 4, 10, 3, 1, 4, 7, 0, 2,  8, 3, 4, 5, 10, 10, 1, 2, 7, 8,
                                   0, 0, 4, 3,  5, 5, 1, 7, 2, 10, 8, 4, 4, 0, 1,  2,  3, 7, 8, 5};

// W@GRAD from the emulated kernels; `other` empty: no Accumulate.
template <typename T, typename TA>
std::vector<T> emulated_grad(const std::vector<T>& dout, const std::vector<TA>& other, int64_t d, bool strided) {
  const auto n = static_cast<int64_t>(kIds.size());
  std::vector<T> dw(static_cast<size_t>(kRows * d), from_float<T>(NAN));
  // Step 0: zeros (a memset on the GPU), or the other part plus 0 (OtherPartOnly).
  if (other.empty())
    std::fill(dw.begin(), dw.end(), from_float<T>(0.f));
  else
    emulated_grid_stride(kRows * d, kernels::OtherPartOnly<T, TA>{other.data(), dw.data()});
  // Step 1: keys and positions (GradKeys).
  std::vector<uint32_t> keys(static_cast<size_t>(n));
  std::vector<int32_t> pos(static_cast<size_t>(n));
  emulated_grid_stride(n, kernels::GradKeys<int64_t>{kIds.data(), keys.data(), pos.data(), kRows, kPadding});
  // Step 2: sorted by key, stably.
  std::vector<size_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  std::vector<uint32_t> sorted_keys;
  std::vector<int32_t> sorted_pos;
  for (size_t i : order) {
    sorted_keys.push_back(keys[i]);
    sorted_pos.push_back(pos[i]);
  }
  // Step 3: the runs, launched as lookup_table.cu launches them (or through 3 blocks).
  const unsigned blocks = strided ? 3u : static_cast<unsigned>(n);
  emulated::run_grid(
      blocks, 1,
      [&] {
        kernels::lookup_grad_runs<T, TA>(sorted_keys.data(), sorted_pos.data(), dout.data(),
                                         other.empty() ? nullptr : other.data(), dw.data(), n,
                                         static_cast<uint32_t>(kRows), d);
      },
      kernels::grad_run_threads(d));
  return dw;
}

template <typename T, typename TA>
void check(DType w_dt, DType other_dt, bool accumulate) {
  for (const int64_t d : {int64_t{70}, int64_t{600}})
    for (const bool strided : {false, true}) {
      const std::string what = dname(w_dt) + " table [" + std::to_string(kRows) + ", " + std::to_string(d) + "]" +
                               (accumulate ? ", Accumulate " + dname(other_dt) : std::string()) +
                               (strided ? ", 3 blocks" : "");
      INFO(what);
      const auto n = static_cast<int64_t>(kIds.size());
      Tensor ids = Tensor::empty({n}, DType::i64);
      std::memcpy(ids.raw(), kIds.data(), kIds.size() * sizeof(int64_t));
      const Tensor dout_t = random_tensor({n, d}, w_dt, 601, -2.f, 2.f);
      Tensor other_t = random_tensor({kRows, d}, other_dt, 602);
      // -0.0 in row 6 (no id names it) and in the padding row: the sum with the op's +0 is +0.
      std::vector<TA> other = values_of<TA>(other_t);
      for (const int64_t row : {int64_t{6}, kPadding})
        for (int64_t c = 0; c < d; ++c) other[static_cast<size_t>(row * d + c)] = from_float<TA>(-0.0f);
      std::memcpy(other_t.raw(), other.data(), other.size() * sizeof(TA));

      const std::vector<T> got =
          emulated_grad<T, TA>(values_of<T>(dout_t), accumulate ? other : std::vector<TA>{}, d, strided);

      std::map<std::string, std::vector<std::string>> ins{{"W", {"w"}}, {"Ids", {"ids"}}, {"Out@GRAD", {"dout"}}};
      std::vector<std::pair<std::string, Tensor>> feeds{
          {"w", Tensor::zeros({kRows, d}, w_dt)}, {"ids", ids}, {"dout", dout_t}};
      if (accumulate) {
        ins["Accumulate"] = {"other"};
        feeds.push_back({"other", other_t});
      }
      const auto cpu =
          run_ops_on({make_op("lookup_table_grad", ins, {{"W@GRAD", {"dw"}}}, {{"padding_idx", kPadding}})}, feeds,
                     cpu_device(), ExecEnv{}, {"dw"});
      const std::vector<T> want = values_of<T>(cpu.at("dw"));
      REQUIRE(got.size() == want.size());
      size_t differing = 0;
      for (size_t i = 0; i < got.size(); ++i) differing += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
      CHECK(differing == 0);
      // The rows no id names, and the padding row: +0 (zeros, or -0.0 + 0).
      for (const int64_t row : {int64_t{6}, kPadding}) {
        INFO("row " << row);
        CHECK(std::signbit(to_float(got[static_cast<size_t>(row * d)])) == false);
        CHECK(to_float(got[static_cast<size_t>(row * d)]) == 0.f);
      }
    }
}

// ---- the forward copy ----------------------------------------------------------------------

// Out = W[Ids] by lookup_rows, its copy unit chosen as lookup_table.cu
// chooses it for W and for an Out `offset` elements past alignment; through
// lookup_row_blocks(n) blocks, or one that strides over the ids. Returns Out
// and the unit.
template <typename T>
std::pair<std::vector<T>, int> emulated_lookup(const Tensor& w, const std::vector<int64_t>& ids, int offset,
                                               bool strided) {
  const int64_t d = w.dim(1), n = static_cast<int64_t>(ids.size());
  Placed<T> out(std::vector<T>(static_cast<size_t>(n * d), from_float<T>(-7.f)), offset, w.dtype());
  const T* wp = w.data<T>();
  const int unit = kernels::lookup_copy_unit(static_cast<size_t>(d) * sizeof(T), wp, out.p);
  const unsigned blocks = strided ? 1u : kernels::lookup_row_blocks(n);
  kernels::with_copy_unit(static_cast<size_t>(unit), [&](auto unit_tag) {
    using V = typename decltype(unit_tag)::type;
    emulated::run_grid(
        blocks, 1, [&] { kernels::lookup_rows<T, int64_t, V>(wp, ids.data(), out.p, n, w.dim(0), d, kPadding); },
        kernels::kBlock);
  });
  return {out.values(static_cast<size_t>(n * d)), unit};
}

template <typename T>
void check_forward(DType dt, std::set<int>& units) {
  // Ids out of range (-1 and kRows) get a row of NaN here, where the CPU
  // kernel reports them: the CPU runs with 0 in their place, and those rows
  // are checked apart.
  std::vector<int64_t> ids = kIds;
  ids.insert(ids.begin() + 5, -1);
  ids.push_back(kRows);
  std::vector<int64_t> cpu_ids = ids;
  for (int64_t& id : cpu_ids) id = id < 0 || id >= kRows ? 0 : id;
  // Rows of 8 values, 6, 3, 70 and 600 (past a warp's 32 lanes of the widest copy unit).
  for (const int64_t d : {int64_t{8}, int64_t{6}, int64_t{3}, int64_t{70}, int64_t{600}})
    for (int offset : {0, 1})
      for (bool strided : {false, true}) {
        const std::string what = dname(dt) + " rows of " + std::to_string(d) + (offset ? ", Out unaligned" : "") +
                                 (strided ? ", one block" : "");
        INFO(what);
        const Tensor w = random_tensor({kRows, d}, dt, 611, -2.f, 2.f);
        const auto [got, unit] = emulated_lookup<T>(w, ids, offset, strided);
        units.insert(unit);
        INFO("copy unit " << unit);
        Tensor ids_t = Tensor::empty({static_cast<int64_t>(ids.size())}, DType::i64);
        std::memcpy(ids_t.raw(), cpu_ids.data(), cpu_ids.size() * sizeof(int64_t));
        const Tensor want = run_ops_on({make_op("lookup_table", {{"W", {"w"}}, {"Ids", {"ids"}}}, {{"Out", {"out"}}},
                                                {{"padding_idx", kPadding}})},
                                       {{"w", w}, {"ids", ids_t}}, cpu_device(), ExecEnv{}, {"out"})
                                .at("out");
        const std::vector<T> want_v = values_of<T>(want);
        size_t differing = 0, not_nan = 0;
        for (size_t i = 0; i < ids.size(); ++i)
          for (int64_t c = 0; c < d; ++c) {
            const size_t e = i * static_cast<size_t>(d) + static_cast<size_t>(c);
            if (ids[i] != cpu_ids[i])
              not_nan += !std::isnan(to_float(got[e]));
            else
              differing += std::memcmp(&got[e], &want_v[e], sizeof(T)) != 0;
          }
        CHECK(differing == 0);  // a copy, and the padding row's zeros: the CPU's bits
        CHECK(not_nan == 0);    // the bad ids' rows
      }
}

}  // namespace

TEST_CASE("lookup_table_grad's kernels, emulated: the CPU's bits, with and without Accumulate",
          "[lookup_table][fold_grad_sums][emulated]") {
  check<float, float>(DType::f32, DType::f32, false);
  check<half_t, half_t>(DType::f16, DType::f16, false);
  check<bf16_t, bf16_t>(DType::bf16, DType::bf16, false);
  check<float, float>(DType::f32, DType::f32, true);
  check<half_t, half_t>(DType::f16, DType::f16, true);
  check<bf16_t, bf16_t>(DType::bf16, DType::bf16, true);
  // The tied embedding under AMP: an FP32 table, the output layer's FP16 or BF16 part.
  check<float, half_t>(DType::f32, DType::f16, true);
  check<float, bf16_t>(DType::f32, DType::bf16, true);
}

TEST_CASE("lookup_table's row copy, emulated: the CPU's bits at every copy unit, NaN rows for bad ids",
          "[lookup_table][emulated]") {
  std::set<int> units;
  check_forward<float>(DType::f32, units);
  check_forward<half_t>(DType::f16, units);
  check_forward<bf16_t>(DType::bf16, units);
  CHECK(units == std::set<int>{2, 4, 8, 16});  // every copy unit was taken
}
