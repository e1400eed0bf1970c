// mixbench allreduce's --check (launch/allreduce_bench.cc): its closed-form
// expected values, and that count_wrong_elements finds exactly the elements a
// wrong all-reduce gets wrong. The results here are made by reducing every
// rank's pattern with collective::reduce_into, hop by hop in rank order, as the
// MPI backend's user-defined reduction does (FP32 add, rounded at every hop).
#include <catch2/catch.hpp>

#include <vector>

#include "collective/communicator.h"
#include "launch/allreduce_bench.h"
#include "runtime/core/half.h"
#include "runtime/core/tensor.h"

using namespace mix;
using collective::ReduceOp;

namespace {

Tensor rank_pattern(DType t, int64_t n, int rank) {
  Tensor h = Tensor::empty({n}, t);
  for (int64_t i = 0; i < n; ++i)
    h.set_float(i, static_cast<float>(launch::check_pattern_value(rank, static_cast<uint64_t>(i))));
  return h;
}

// What a correct all-reduce over `world` ranks returns.
Tensor reduced(DType t, int64_t n, int world, ReduceOp op) {
  Tensor acc = rank_pattern(t, n, 0);
  for (int r = 1; r < world; ++r) {
    const Tensor x = rank_pattern(t, n, r);
    collective::reduce_into(acc.raw(), x.raw(), static_cast<size_t>(n), t, op == ReduceOp::max ? op : ReduceOp::sum);
  }
  if (op == ReduceOp::avg)
    for (int64_t i = 0; i < n; ++i) acc.set_float(i, acc.item_float(i) * (1.f / static_cast<float>(world)));
  return acc;
}

void add_one(Tensor& t, int64_t i) { t.set_float(i, t.item_float(i) + 1.f); }

}  // namespace

TEST_CASE("mixbench --check: closed-form values", "[mixbench]") {
  // ranks 0..3 hold 1, 2, 3, 4 times (i % 3 + 1)
  CHECK(launch::check_pattern_value(2, 4) == 6.0);
  CHECK(launch::check_expected_value(ReduceOp::sum, 4, 1) == 20.0);  // (1+2+3+4) * 2
  CHECK(launch::check_expected_value(ReduceOp::max, 3, 2) == 9.0);   // 3 * 3
  CHECK(launch::check_expected_value(ReduceOp::avg, 2, 0) == 1.5);
  CHECK(launch::check_expected_value(ReduceOp::sum, 5, 0) == 11.0);  // rank 4 holds 1 again
}

TEST_CASE("mixbench --check: a correct result passes, each wrong element is counted", "[mixbench]") {
  const int64_t n = 1000;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg})
      for (int world : {1, 2, 3, 4, 8, 40}) {  // 40: bfloat16 sums past 2^8, checked with per-hop rounding
        INFO(dtype_name(t) << " " << collective::reduce_op_name(op) << " over " << world << " ranks");
        Tensor r = reduced(t, n, world, op);
        CHECK(launch::count_wrong_elements(r, op, world) == 0);
        if (t == DType::bf16 && world == 40) continue;  // +1 is within the per-hop bound there
        add_one(r, 7);
        add_one(r, 500);
        CHECK(launch::count_wrong_elements(r, op, world) == 2);
      }
}
