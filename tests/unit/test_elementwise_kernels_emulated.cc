// The CUDA kernels of elementwise_add, elementwise_mul and their gradients
// (runtime/ops/cuda/elementwise_kernels.cuh, with the maps of maps.cuh and
// the packed and grid-stride kernels of runtime/cuda/map_kernels.cuh), and
// cast's between float dtypes (maps.cuh), their very source, run on the CPU
// (tests/unit/cuda_emulation.h) and launched as elementwise.cu and
// device_ops.cuh launch them. It runs everywhere, so a change to the
// broadcast indexing, the packs or the column sums is checked on every
// build; test_cuda_ops checks the GPU itself where one is lent.
//
// What is compared:
//  - the maps (Out of add and mul, mul's X@GRAD is the same map) give the
//    CPU twin's bits: one functor call per element, the same on both sides.
//    Every broadcast (same shape, a bias on rows, Y on leading dims, the
//    general case, a scalar Y), with 32- and 64-bit indices, on arrays
//    aligned as device memory is (packs where the shape allows) and one
//    element past it (no packs); and FP32 X beside an FP16 or BF16 Y, the AMP
//    Transformer's residual add; the casts between float dtypes (FloatCast),
//    NaN, infinities and values past FP16's range among them; and the
//    activations' maps (relu, gelu, tanh and their gradients), whose device
//    math (erff, expf, tanhf) only the GPU test can check;
//  - the Y gradients' column sums, each of the three kernels on the shapes
//    it can take, not only where the launcher picks it (the tree on those of
//    a few columns): the sequential one
//    gives the CPU twin's bits (same terms, same order); the row-chunked and
//    tree sums are within the bound of their own order of additions
//    (column_sum_check.h), which a missed or repeated term exceeds.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/functors.h"
#include "runtime/ops/broadcast.h"
#include "tests/unit/column_sum_check.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"

// The emulation and its map launches, then the kernels (cuda_emulation.h
// defines CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"

#include "runtime/ops/cuda/column_sums.cuh"
#include "runtime/ops/cuda/elementwise_kernels.cuh"
#include "runtime/ops/cuda/maps.cuh"

using namespace mix;
using namespace mix::testing;
namespace kernels = mix::cuda;
using kernels::ColumnSumPath;
using kernels::YIndex;

namespace {

// What the launcher's map wrote, and whether it ran in packs.
struct MapRun {
  Tensor out;
  bool packed;
};

// Out = f(x, y broadcast as d says) by the map elementwise.cu's launcher picks
// (BinaryMap for the same shape, else y_index_kind's BroadcastMap with index
// type I), in packs of kPackWidth<T> where the arrays allow.
template <typename T, typename I, typename F>
MapRun emulated_map(const Tensor& x, const Tensor& y, const BroadcastDims& d, F f, int offset) {
  const int64_t n = x.numel();
  const Placed<T> xs(values_of<T>(x), offset, x.dtype()), ys(values_of<T>(y), offset, y.dtype());
  Placed<T> out(std::vector<T>(static_cast<size_t>(n), from_float<T>(NAN)), offset, x.dtype());
  constexpr int V = kernels::kPackWidth<T>;
  const auto in = static_cast<I>(d.n), post = static_cast<I>(d.post);
  bool packed = false;
  if (d.same_shape()) {
    packed = emulated_packed<V>(n, kernels::BinaryMap<T, F>{xs.p, ys.p, out.p, f});
  } else {
    switch (kernels::y_index_kind(d)) {
      case YIndex::rows:
        packed = emulated_packed<V>(n, kernels::BroadcastMap<T, F, I, YIndex::rows>{xs.p, ys.p, out.p, in, post, f});
        break;
      case YIndex::blocks:
        packed = emulated_packed<V>(n, kernels::BroadcastMap<T, F, I, YIndex::blocks>{xs.p, ys.p, out.p, in, post, f});
        break;
      case YIndex::general:
        packed = emulated_packed<V>(n, kernels::BroadcastMap<T, F, I, YIndex::general>{xs.p, ys.p, out.p, in, post, f});
        break;
    }
  }
  return {tensor_of(out.values(static_cast<size_t>(n)), x.shape(), x.dtype()), packed};
}

Tensor cpu_out(const std::string& type, const Tensor& x, const Tensor& y, int axis) {
  return run_ops_on({make_op(type, {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"out"}}}, {{"axis", int64_t{axis}}})},
                    {{"x", x}, {"y", y}}, cpu_device(), ExecEnv{}, {"out"})
      .at("out");
}

struct Broadcast {
  Shape x, y;
  int axis;
};
// test_cuda_ops' shapes, smaller where only the count of blocks would grow.
const Broadcast kMaps[] = {
    {{64, 100}, {100}, -1},     // a bias on rows: post 1, rows of 100 (packs of 4 floats, not of 8 halves)
    {{16, 64}, {64}, -1},       // a bias on rows of 64: packs in every dtype
    {{2, 3, 4, 5}, {3, 4}, 1},  // pre 2, n 12, post 5: the general case
    {{3, 4, 5}, {3}, 0},        // Y on X's leading dim: pre 1, post 20
    {{3, 2, 8}, {3}, 0},        // pre 1, post 16: a pack shares one Y element
    {{2, 3, 16}, {3}, 1},       // the general case, post 16
    {{15, 3, 2}, {3, 1}, 1},    // a trailing 1 in Y
    {{6, 9}, {1, 9}, -1},       // a leading 1 in Y
    {{2, 3, 7}, {1}, -1},       // a scalar Y
    {{4, 5}, {4, 5}, -1},       // the same shape, 20 values: two packs of 8 halves and 4 left over
    {{40, 50}, {40, 50}, -1},   // the same shape, whole packs
};

template <typename T>
void check_maps(DType dt) {
  int packed_runs = 0;
  for (const Broadcast& c : kMaps)
    for (const char* type : {"elementwise_add", "elementwise_mul"}) {
      const Tensor x = random_tensor(c.x, dt, 51, -2.f, 2.f), y = random_tensor(c.y, dt, 52, -2.f, 2.f);
      const BroadcastDims d = broadcast_dims(c.x, c.y, c.axis, "test");
      const Tensor want = cpu_out(type, x, y, c.axis);
      for (int offset : {0, 1})
        for (bool wide : {false, true}) {
          const std::string what = std::string(type) + " " + dname(dt) + " X" + shape_str(c.x) + " Y" + shape_str(c.y) +
                                   (wide ? ", 64-bit indices" : "") + (offset ? ", one element past alignment" : "");
          INFO(what);
          const MapRun r = std::string(type) == "elementwise_add"
                               ? (wide ? emulated_map<T, int64_t>(x, y, d, fn::Add{}, offset)
                                       : emulated_map<T, uint32_t>(x, y, d, fn::Add{}, offset))
                               : (wide ? emulated_map<T, int64_t>(x, y, d, fn::Mul{}, offset)
                                       : emulated_map<T, uint32_t>(x, y, d, fn::Mul{}, offset));
          expect_identical(r.out, want, what);
          if (offset == 1) CHECK_FALSE(r.packed);
          packed_runs += r.packed;
        }
    }
  CHECK(packed_runs > 0);  // the packs were tried, not only the element-wise fallback
}

}  // namespace

TEST_CASE("emulated elementwise maps give the CPU's bits on every broadcast, packed and not",
          "[emulated][elementwise]") {
  check_maps<float>(DType::f32);
  check_maps<half_t>(DType::f16);
  check_maps<bf16_t>(DType::bf16);
}

namespace {

template <typename TY>
void check_narrow_y(DType y_dt) {
  for (const Shape& s : {Shape{4, 5}, Shape{8, 64}, Shape{3, 333}}) {
    const Tensor x = random_tensor(s, DType::f32, 61, -2.f, 2.f), y = random_tensor(s, y_dt, 62, -2.f, 2.f);
    const Tensor want = cpu_out("elementwise_add", x, y, -1);
    const int64_t n = x.numel();
    for (int offset : {0, 1}) {
      const std::string what = "FP32 X" + shape_str(s) + " + " + dname(y_dt) + " Y" + (offset ? ", unaligned" : "");
      INFO(what);
      const Placed<float> xs(values_of<float>(x), offset, DType::f32);
      const Placed<TY> ys(values_of<TY>(y), offset, y_dt);
      Placed<float> out(std::vector<float>(static_cast<size_t>(n), NAN), offset, DType::f32);
      // As add_cuda launches it: packs of 8, 16 bytes of the narrower Y.
      const bool packed = emulated_packed<kernels::kPackWidth<float, TY>>(
          n, kernels::BinaryMap<float, fn::Add, TY>{xs.p, ys.p, out.p, fn::Add{}});
      expect_identical(tensor_of(out.values(static_cast<size_t>(n)), s, DType::f32), want, what);
      CHECK(packed == (offset == 0 && n >= 8));
    }
  }
}

}  // namespace

TEST_CASE("emulated elementwise_add of FP32 X and a narrower Y gives the CPU's bits", "[emulated][elementwise]") {
  check_narrow_y<half_t>(DType::f16);
  check_narrow_y<bf16_t>(DType::bf16);
}

namespace {

// cast between float dtypes (FloatCast, as float_cast launches it) against the
// CPU's cast: widening is exact, narrowing rounds once to nearest even on both
// sides. The values hold infinities, a NaN, zeros of both signs and values
// past FP16's range.
template <typename From, typename To>
void check_cast(DType from, DType to) {
  for (const Shape& s : {Shape{3, 5}, Shape{40, 50}})
    for (int offset : {0, 1}) {
      const std::string what = dname(from) + " -> " + dname(to) + " " + shape_str(s) + (offset ? ", unaligned" : "");
      INFO(what);
      const Tensor x = with_specials(uniform_tensor(s, 81, -1e5f, 1e5f), from);
      const Tensor want = run_ops_on({make_op("cast", {{"X", {"x"}}}, {{"Out", {"y"}}}, {{"out_dtype", dname(to)}})},
                                     {{"x", x}}, cpu_device(), ExecEnv{}, {"y"})
                              .at("y");
      const int64_t n = x.numel();
      const Placed<From> xs(values_of<From>(x), offset, from);
      Placed<To> out(std::vector<To>(static_cast<size_t>(n), from_float<To>(-7.f)), offset, to);
      const bool packed = emulated_packed<kernels::kPackWidth<From, To>>(n, kernels::FloatCast<From, To>{xs.p, out.p});
      expect_identical(tensor_of(out.values(static_cast<size_t>(n)), s, to), want, what);
      CHECK(packed == (offset == 0));
    }
}

}  // namespace

TEST_CASE("emulated casts between float dtypes give the CPU's bits", "[emulated][cast]") {
  check_cast<float, half_t>(DType::f32, DType::f16);
  check_cast<float, bf16_t>(DType::f32, DType::bf16);
  check_cast<half_t, float>(DType::f16, DType::f32);
  check_cast<bf16_t, float>(DType::bf16, DType::f32);
  check_cast<half_t, bf16_t>(DType::f16, DType::bf16);
  check_cast<bf16_t, half_t>(DType::bf16, DType::f16);
}

namespace {

// An activation and its gradient as activation.cu launches them (unary_tensor,
// binary_tensor: UnaryMap and BinaryMap, packed where aligned) against the CPU
// op: the same functor on the same values, so the same bits. The gradient
// reads X (gelu) or Out (relu, tanh), as the op's saved slot says.
template <typename T, typename Fwd, typename Bwd>
void check_activation(const std::string& type, DType dt, bool grad_reads_x) {
  for (const Shape& s : {Shape{3, 5}, Shape{40, 50}})
    for (int offset : {0, 1}) {
      const std::string what = type + " " + dname(dt) + shape_str(s) + (offset ? ", unaligned" : "");
      INFO(what);
      const Tensor x = with_specials(uniform_tensor(s, 91, -6.f, 6.f), dt), dout = random_tensor(s, dt, 92);
      const auto cpu = run_ops_on(
          {make_op(type, {{"X", {"x"}}}, {{"Out", {"y"}}}),
           make_op(type + "_grad", {{grad_reads_x ? "X" : "Out", {grad_reads_x ? "x" : "y"}}, {"Out@GRAD", {"dy"}}},
                   {{"X@GRAD", {"dx"}}})},
          {{"x", x}, {"dy", dout}}, cpu_device(), ExecEnv{}, {"y", "dx"});
      const int64_t n = x.numel();
      constexpr int V = kernels::kPackWidth<T>;
      const Placed<T> xs(values_of<T>(x), offset, dt), dys(values_of<T>(dout), offset, dt);
      Placed<T> y(std::vector<T>(static_cast<size_t>(n), from_float<T>(-7.f)), offset, dt);
      Placed<T> dx(std::vector<T>(static_cast<size_t>(n), from_float<T>(-7.f)), offset, dt);
      emulated_packed<V>(n, kernels::UnaryMap<T, Fwd>{xs.p, y.p, Fwd{}});
      emulated_packed<V>(n, kernels::BinaryMap<T, Bwd>{grad_reads_x ? xs.p : y.p, dys.p, dx.p, Bwd{}});
      expect_identical(tensor_of(y.values(static_cast<size_t>(n)), s, dt), cpu.at("y"), what + " Out");
      expect_identical(tensor_of(dx.values(static_cast<size_t>(n)), s, dt), cpu.at("dx"), what + " X@GRAD");
    }
}

template <typename T>
void check_activations(DType dt) {
  check_activation<T, fn::ReluFwd, fn::ReluBwd>("relu", dt, false);
  check_activation<T, fn::GeluFwd, fn::GeluBwd>("gelu", dt, true);
  check_activation<T, fn::TanhFwd, fn::TanhBwd>("tanh", dt, false);
}

}  // namespace

TEST_CASE("emulated activations and their gradients give the CPU's bits", "[emulated][activation]") {
  check_activations<float>(DType::f32);
  check_activations<half_t>(DType::f16);
  check_activations<bf16_t>(DType::bf16);
}

namespace {

// dY (of shape y_shape) = the column sums of f(a, b) (b null: f(a, 0)) by one of the kernels, in T.
template <typename T, typename F>
Tensor emulated_column_sums(ColumnSumPath path, const Tensor& a, const Tensor* b, const BroadcastDims& d, F f,
                            const Shape& y_shape, unsigned tree_blocks) {
  const std::vector<T> av = values_of<T>(a);
  const std::vector<T> bv = b ? values_of<T>(*b) : std::vector<T>{};
  const T* bp = b ? bv.data() : nullptr;
  std::vector<T> dy(static_cast<size_t>(d.n), from_float<T>(NAN));
  switch (path) {
    case ColumnSumPath::sequential:
      emulated_grid_stride(d.n, kernels::ColumnSumSequential<T, T, F>{av.data(), bp, dy.data(), d, f});
      break;
    case ColumnSumPath::row_chunks: {
      const auto [chunks, rows_per_chunk] =
          kernels::row_chunks(d.pre, kernels::kColumnSumRowsPerChunk, kernels::kColumnSumMaxChunks);
      std::vector<float> partial(static_cast<size_t>(chunks * d.n), NAN);
      const auto column_tiles = static_cast<unsigned>((d.n + kernels::kBlock - 1) / kernels::kBlock);
      emulated::run_grid(
          column_tiles, static_cast<unsigned>(chunks),
          [&] { kernels::column_chunk_partials<T, F>(av.data(), bp, partial.data(), d, rows_per_chunk, f); },
          kernels::kBlock);
      emulated_grid_stride(d.n,
                           kernels::ChunkColumnSum<float, kernels::AddRn, T>{partial.data(), dy.data(), chunks, d.n});
      break;
    }
    case ColumnSumPath::tree:
      emulated::run_grid(
          tree_blocks, 1, [&] { kernels::column_sum_tree<T, T, F>(av.data(), bp, dy.data(), d, f); }, kernels::kBlock);
      break;
  }
  return tensor_of(dy, y_shape, a.dtype());
}

// The rounding steps of a path's sums (column_sum_check.h): test_cuda_ops' terms.
double path_terms(ColumnSumPath path, const BroadcastDims& d) {
  const int64_t m = d.pre * d.post;
  switch (path) {
    case ColumnSumPath::sequential:
      return static_cast<double>(m);
    case ColumnSumPath::row_chunks: {
      const auto [chunks, rows_per_chunk] =
          kernels::row_chunks(d.pre, kernels::kColumnSumRowsPerChunk, kernels::kColumnSumMaxChunks);
      return static_cast<double>(rows_per_chunk + chunks);
    }
    case ColumnSumPath::tree:
      return static_cast<double>(gpu_block_row_terms(m));
  }
  return 0.0;
}

const char* path_name(ColumnSumPath p) {
  return p == ColumnSumPath::sequential ? "sequential" : p == ColumnSumPath::row_chunks ? "row chunks" : "tree";
}

const Broadcast kColumnSums[] = {
    {{64, 100}, {100}, -1},     // a bias of 64 rows: 64 terms a column
    {{2, 3, 4, 5}, {3, 4}, 1},  // 10 terms a column, post 5
    {{2, 3, 7}, {1}, -1},       // a scalar Y: one column of 42 terms
    {{1500, 40}, {40}, -1},     // a bias of 1500 rows: row chunks
    {{1100, 300}, {300}, -1},   // 300 columns: two tiles of 256 columns a chunk
    {{1500, 3, 2}, {3, 1}, 1},  // columns of 3000 terms, post 2: the tree
};

template <typename T>
void check_column_sums(DType dt) {
  for (const Broadcast& c : kColumnSums)
    for (const std::string type : {"elementwise_add", "elementwise_mul"}) {
      const bool mul = type == "elementwise_mul";
      const Tensor x = random_tensor(c.x, dt, 71, -2.f, 2.f), y = random_tensor(c.y, dt, 72, -2.f, 2.f);
      const Tensor dout = random_tensor(c.x, dt, 73);
      const BroadcastDims d = broadcast_dims(c.x, c.y, c.axis, "test");
      std::map<std::string, std::vector<std::string>> ins{{"Y", {"y"}}, {"Out@GRAD", {"dout"}}};
      std::vector<std::pair<std::string, Tensor>> feeds{{"y", y}, {"dout", dout}};
      std::map<std::string, Attr> attrs{{"axis", int64_t{c.axis}}};
      if (mul) {
        ins["X"] = {"x"};
        feeds.push_back({"x", x});
      } else {
        attrs.insert({{"y_shape", c.y}, {"y_dtype", dname(dt)}});
      }
      const Tensor cpu_dy = run_ops_on({make_op(type + "_grad", ins, {{"Y@GRAD", {"dy"}}}, attrs)}, feeds, cpu_device(),
                                       ExecEnv{}, {"dy"})
                                .at("dy");
      const std::vector<float> xv = x.to_floats(), dv = dout.to_floats();
      const ColumnSumRef ref = column_sum_ref(d, dv, mul ? &xv : nullptr);
      // The tree takes a block of 256 threads a column, many fiber switches
      // each in the emulation: it runs on the shapes of up to 40 columns.
      std::vector<ColumnSumPath> paths{ColumnSumPath::sequential};
      if (d.n <= 40) paths.push_back(ColumnSumPath::tree);
      if (d.post == 1) paths.push_back(ColumnSumPath::row_chunks);
      for (ColumnSumPath path : paths)
        for (unsigned tree_blocks : {kernels::column_sum_tree_blocks(d.n), 2u}) {
          if (path != ColumnSumPath::tree && tree_blocks == 2u) continue;  // the grid of the tree only
          const std::string what = type + "_grad " + dname(dt) + " X" + shape_str(c.x) + " Y" + shape_str(c.y) + ", " +
                                   path_name(path) + (tree_blocks == 2u ? " in 2 blocks" : "") +
                                   (path == kernels::column_sum_path(d) ? " (the launcher's)" : "");
          INFO(what);
          const Tensor dy = mul ? emulated_column_sums<T>(path, dout, &x, d, fn::Mul{}, c.y, tree_blocks)
                                : emulated_column_sums<T>(path, dout, nullptr, d, fn::TakeFirst{}, c.y, tree_blocks);
          if (path == ColumnSumPath::sequential)
            expect_identical(dy, cpu_dy, what);  // the CPU's terms in the CPU's order
          else
            expect_within(dy, ref.sum, column_sum_bound(ref, path_terms(path, d), dt), what);
        }
    }
}

}  // namespace

TEST_CASE("emulated column sums of the Y gradients: sequential gives the CPU's bits, the others their bound",
          "[emulated][elementwise]") {
  check_column_sums<float>(DType::f32);
  check_column_sums<half_t>(DType::f16);
  check_column_sums<bf16_t>(DType::bf16);
}
