// top1_correct (runtime/ops/top1_correct.cc), evaluation's accuracy count, on
// the CPU: hand-made rows with ties, signed zeros, infinities, NaN and labels
// out of range; logits of more than two dims and i32 labels; random tie-heavy
// rows in every float dtype against a plain loop (tests/unit/top1_check.h);
// and the errors of mismatched inputs. The GPU kernel is compared with this
// one in test_cuda_ops.cc.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "runtime/ir/op_registry.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/top1_check.h"

using namespace mix;
using namespace mix::testing;
using Catch::Matchers::Contains;

namespace {

int64_t count_correct(const Tensor& logits, const Tensor& label) {
  const auto r =
      run_ops_on({make_op("top1_correct", {{"Logits", {"logits"}}, {"Label", {"label"}}}, {{"Correct", {"correct"}}})},
                 {{"logits", logits}, {"label", label}}, cpu_device(), ExecEnv{}, {"correct"});
  const Tensor& c = r.at("correct");
  REQUIRE(c.dtype() == DType::i64);
  REQUIRE(c.numel() == 1);
  return c.data<int64_t>()[0];
}

// One row of three logits against one label: 1 when it counts as correct.
int64_t row_hit(std::vector<float> row, int64_t label) {
  return count_correct(Tensor::from_floats({1, 3}, row), labels({1}, {label}));
}

}  // namespace

TEST_CASE("top1_correct: the first maximum, NaN rows and foreign labels never count", "[ops][top1]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  CHECK(row_hit({1, 3, 2}, 1) == 1);
  CHECK(row_hit({1, 3, 2}, 2) == 0);
  // Ties: the first index wins, -0 ties with +0, infinities tie with each other.
  CHECK(row_hit({1, 3, 3}, 1) == 1);
  CHECK(row_hit({1, 3, 3}, 2) == 0);
  CHECK(row_hit({-0.f, 0.f, -1}, 0) == 1);
  CHECK(row_hit({0.f, -0.f, -1}, 1) == 0);
  CHECK(row_hit({inf, inf, 2}, 0) == 1);
  CHECK(row_hit({-inf, -inf, -inf}, 0) == 1);
  CHECK(row_hit({-inf, -1e30f, -inf}, 1) == 1);
  // Subnormals are numbers, not zeros (no flush to zero).
  CHECK(row_hit({0.f, 1e-45f, -1}, 1) == 1);
  CHECK(row_hit({-1e-45f, -0.f, -1}, 1) == 1);
  // A NaN anywhere makes the prediction undefined: never correct.
  CHECK(row_hit({nan, 1, 2}, 0) == 0);
  CHECK(row_hit({nan, 1, 2}, 2) == 0);
  CHECK(row_hit({1, 2, -nan}, 1) == 0);
  // Labels outside [0, 3) (PyTorch's ignore_index -100 among them) never match.
  CHECK(row_hit({1, 2, 3}, 3) == 0);
  CHECK(row_hit({3, 2, 1}, -100) == 0);
}

TEST_CASE("top1_correct: logits of more dims, labels with or without a trailing 1, i32", "[ops][top1]") {
  // [2, 3, 4]: six rows; their argmaxes are 0, 1, 2, 3, 3, 0.
  const Tensor logits = Tensor::from_floats({2, 3, 4}, {9, 1, 1, 1, 0, 5, 0, 0, 0, 0, 7, 1,  //
                                                        1, 2, 3, 4, 0, 0, 0, 1, 2, 2, 2, 2});
  const std::vector<int64_t> want = {0, 1, 2, 0, 3, 0};  // all but the fourth row are right
  for (DType dt : {DType::i64, DType::i32}) {
    CHECK(count_correct(logits, labels({2, 3}, want, dt)) == 5);
    CHECK(count_correct(logits, labels({2, 3, 1}, want, dt)) == 5);
  }
  for (DType dt : kFloatTypes) CHECK(count_correct(to_dtype(logits, dt), labels({6}, want)) == 5);
}

TEST_CASE("top1_correct: random rows with ties and specials count as a plain loop does", "[ops][top1]") {
  for (DType dt : kFloatTypes)
    // 1500 classes: rows of three CPU chunks (cpu::kChunk), ties across them.
    for (auto [rows, classes] : {std::pair<int64_t, int64_t>{64, 10}, {37, 1}, {9, 300}, {200, 3}, {12, 1500}}) {
      INFO(dname(dt) << " " << rows << " x " << classes);
      const Top1Case c = top1_case(rows, classes, dt, DType::i64, 11);
      // Not vacuous: some rows are right and some wrong (one class: every
      // label drawn from [-1, 1] on odd rows is 0 a third of the time).
      CHECK(c.expected > 0);
      CHECK(c.expected < rows);
      CHECK(count_correct(c.logits, c.label) == c.expected);
    }
}

TEST_CASE("top1_correct: a maximum past the first CPU chunk counts at its own index", "[ops][top1]") {
  // The CPU kernel scans a row in chunks of cpu::kChunk = 512 logits; the
  // random rows above hold their maximum in the first chunk almost always. Here
  // each row of 1500 holds a single 1 among zeros, at 513, 777, 1024 and 1499
  // (a language model's vocabulary is usually far wider than 512), and a row
  // whose 1 is at 700 also holds a 1 at 600: the first index wins.
  const int64_t classes = 1500;
  const std::vector<int64_t> at = {513, 777, 1024, 1499, 600};
  std::vector<float> v(at.size() * classes, 0.f);
  for (size_t r = 0; r < at.size(); ++r) v[r * classes + static_cast<size_t>(at[r])] = 1.f;
  v[4 * classes + 700] = 1.f;
  for (DType dt : kFloatTypes) {
    INFO(dname(dt));
    const Tensor logits = to_dtype(Tensor::from_floats({5, classes}, v), dt);
    CHECK(count_correct(logits, labels({5}, at)) == 5);
  }
}

TEST_CASE("top1_correct: mismatched inputs are named", "[ops][top1]") {
  const Tensor logits = Tensor::from_floats({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK_THROWS_WITH(count_correct(logits, labels({3}, {0, 1, 2})),
                    Contains("Label [3] holds 3 values for the 2 rows of Logits [2, 3]"));
  CHECK_THROWS_WITH(count_correct(logits, Tensor::from_floats({2}, {0, 1})), Contains("expected i64 or i32"));
}
