// transpose2's CUDA copy (runtime/ops/cuda/transpose_kernels.cuh), its very
// source, run on the CPU (tests/unit/cuda_emulation.h) and launched as
// transpose2.cu launches it: the unit the host picks (16, 8, 4 or 2 bytes, or
// the element's own), the plan rescaled to count units, and the grid-stride
// copy, as a gather (transpose2, permute_into, conv2d's strided 1x1 sampling)
// and as a scatter (that sampling's gradient). Every case is compared byte for
// byte with the CPU's copy (transpose_rules::gather_cpu and scatter_cpu) over
// the whole destination, so a scatter that writes outside its view shows too;
// the unit each case takes is checked, so the wide paths are not left untried.
// test_cuda_transformer_ops checks the GPU itself where one is lent.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/random.h"
#include "runtime/kernels/transpose_index.h"
#include "runtime/ops/transpose2_shapes.h"

// The emulation and its map launches, then the kernels (cuda_emulation.h
// defines CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"

#include "runtime/ops/cuda/transpose_kernels.cuh"

using namespace mix;
using namespace mix::testing;
namespace cu = mix::cuda;

namespace {

// A byte buffer placed `offset` bytes past a 64-byte boundary (a tensor in
// device memory starts on one; an offset of one element is a view into a buffer).
struct Buffer {
  std::vector<unsigned char> storage;
  unsigned char* p;
  Buffer(size_t bytes, size_t offset, uint64_t seed) : storage(bytes + offset + 64) {
    auto at = reinterpret_cast<uintptr_t>(storage.data());
    p = storage.data() + (64 - at % 64) % 64 + offset;
    Rng rng(seed);
    for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(rng.next_u64());
  }
  std::vector<unsigned char> bytes(size_t n) const { return {p, p + n}; }
};

// One copy: X's dims, and either a permutation (Out = X.permute(perm)) or a
// strided view of X (dims and strides in X's elements).
struct Case {
  std::string name;
  size_t es;                     // element bytes
  std::vector<int64_t> dims;     // X's dims (permutation) or the view's
  std::vector<int64_t> perm;     // empty: a view
  std::vector<int64_t> strides;  // the view's strides
  int64_t strided_extent = 0;    // the view's side: elements of the buffer it lies in
  size_t unit;                   // the copy unit expected with both buffers aligned
};

fn::TransposePlan plan_of(const Case& c) {
  const int nd = static_cast<int>(c.dims.size());
  return c.perm.empty() ? fn::make_view_plan(c.dims.data(), c.strides.data(), nd)
                        : fn::make_transpose_plan(c.dims.data(), c.perm.data(), nd);
}
int64_t numel_of(const Case& c) {
  int64_t n = 1;
  for (int64_t d : c.dims) n *= d;
  return n;
}

const Case kCases[] = {
    // Attention's [B, T, H, hd] <-> [B, H, T, hd]: runs of 64 halves, 16 bytes a unit.
    {"heads first, hd 64", 2, {2, 5, 3, 64}, {0, 2, 1, 3}, {}, 0, 16},
    // Runs of 6 halves (12 bytes): 4-byte units, 2 elements each.
    {"heads first, hd 6", 2, {2, 5, 3, 6}, {0, 2, 1, 3}, {}, 0, 4},
    // Runs of 3 floats: 12 bytes, whole in 4-byte units only: the element's.
    {"runs of 3 floats", 4, {4, 2, 3}, {1, 0, 2}, {}, 0, 4},
    // Runs of 2 floats (8 bytes): 8-byte units (uint2).
    {"runs of 2 floats", 4, {3, 4, 2}, {1, 0, 2}, {}, 0, 8},
    // The last dim moves: element by element, strided reads.
    {"last dim moves", 4, {3, 4, 5}, {2, 0, 1}, {}, 0, 4},
    // Identity: one run of 192 floats.
    {"identity", 4, {4, 6, 8}, {0, 1, 2}, {}, 0, 16},
    // Bytes (u8) reversed, and i64 with its last two dims kept: 16-byte units of 2.
    {"u8 reversed", 1, {2, 3, 4, 5}, {3, 2, 1, 0}, {}, 0, 1},
    {"i64 outer dims swapped", 8, {3, 2, 2, 4}, {1, 0, 2, 3}, {}, 0, 16},
    // Size-1 dims dropped before planning.
    {"size-1 dims", 2, {1, 7, 1, 4}, {2, 3, 0, 1}, {}, 0, 2},
    // conv2d's strided 1x1 sampling of NHWC [2, 6, 6, 8] FP16 at stride 2: 16-byte runs of channels.
    {"stride-2 pixels of 8 halves", 2, {2, 3, 3, 8}, {}, {288, 96, 16, 1}, 2 * 6 * 6 * 8, 16},
    // Rows of 8 halves 12 apart: a 16-byte run, but the rows' stride is whole 8-byte units only.
    {"rows of 8 halves, 12 apart", 2, {3, 8}, {}, {12, 1}, 36, 8},
    // The same of 3 channels of BF16: 6-byte runs, 2-byte units.
    {"stride-2 pixels of 3 halves", 2, {2, 3, 3, 3}, {}, {108, 36, 6, 1}, 2 * 6 * 6 * 3, 2},
};

// The emulated copy; returns the unit it took.
template <bool kScatter>
size_t emulated_copy(const void* x, void* out, const fn::TransposePlan& plan, int64_t numel, size_t es) {
  return cu::planned_copy_in_units<kScatter>(x, out, plan, numel, es, "test",
                                             [](auto copy, int64_t units) { emulated_grid_stride(units, copy); });
}

// x_off, out_off: each buffer's offset past alignment, in elements.
void check_case(const Case& c, size_t x_off, size_t out_off) {
  const std::string what =
      c.name + (x_off ? ", X one element past alignment" : "") + (out_off ? ", Out one element past alignment" : "");
  INFO(what);
  const fn::TransposePlan plan = plan_of(c);
  const int64_t n = numel_of(c);
  const size_t dense = static_cast<size_t>(n) * c.es;
  // The strided side: X for a gather (a permutation's X has n elements), out for a scatter.
  const size_t strided = static_cast<size_t>(c.perm.empty() ? c.strided_extent : n) * c.es;
  // A unit wider than the element needs both buffers aligned to it.
  const size_t expected_unit = x_off || out_off ? c.es : c.unit;

  // Gather: out (dense) = x (strided) through the plan.
  {
    const Buffer x(strided, x_off * c.es, 1);
    Buffer got(dense, out_off * c.es, 2), want(dense, out_off * c.es, 2);  // the same bytes before the copy
    CHECK(emulated_copy<false>(x.p, got.p, plan, n, c.es) == expected_unit);
    transpose_rules::gather_cpu(x.p, want.p, plan, n, c.es);
    CHECK(got.bytes(dense) == want.bytes(dense));
  }
  // Scatter: out (strided) = x (dense) through the plan; nothing else of out changes.
  {
    const Buffer x(dense, x_off * c.es, 3);
    Buffer got(strided, out_off * c.es, 4), want(strided, out_off * c.es, 4);
    CHECK(emulated_copy<true>(x.p, got.p, plan, n, c.es) == expected_unit);
    transpose_rules::scatter_cpu(x.p, want.p, plan, n, c.es);
    CHECK(got.bytes(strided) == want.bytes(strided));
  }
}

}  // namespace

TEST_CASE("emulated transpose2 copy gives the CPU's bytes, at every copy unit", "[emulated][transpose2]") {
  for (const Case& c : kCases) {
    check_case(c, 0, 0);
    check_case(c, 1, 0);
    check_case(c, 0, 1);
  }
}

TEST_CASE("emulated transpose2 copy of nothing launches nothing", "[emulated][transpose2]") {
  const Case c{"empty", 2, {2, 0, 3}, {0, 2, 1}, {}, 0, 2};
  bool launched = false;
  const size_t unit = cu::planned_copy_in_units<false>(nullptr, nullptr, plan_of(c), 0, 2, "test",
                                                       [&](auto, int64_t) { launched = true; });
  CHECK(unit == 0);
  CHECK_FALSE(launched);
}

TEST_CASE("a copy of elements of no unit's size is an error naming the op", "[emulated][transpose2]") {
  const Case c{"3-byte elements", 3, {2, 3}, {1, 0}, {}, 0, 3};
  const Buffer x(18, 0, 5);
  Buffer out(18, 0, 6);
  CHECK_THROWS_WITH(cu::planned_copy_in_units<false>(x.p, out.p, plan_of(c), 6, 3, "transpose2", [](auto, int64_t) {}),
                    Catch::Contains("transpose2") && Catch::Contains("3 bytes"));
}
