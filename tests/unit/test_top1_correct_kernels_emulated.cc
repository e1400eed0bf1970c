// top1_correct's CUDA kernel (runtime/ops/cuda/top1_correct_kernels.cuh), its
// very source, run on the CPU (tests/unit/cuda_emulation.h) and launched as
// top1_correct.cu launches it, a block a row, and also through fewer blocks
// than rows, so the grid must stride. It runs everywhere, so a change to the
// kernel's indexing, its block reduction of 64-bit keys or its padded
// columns is checked on every build; test_cuda_ops checks the GPU itself
// where one is lent.
//
// What is compared: an integer maximum and an integer count, which no order
// of comparisons or additions can change, so the emulated count must equal
// the CPU twin's and the plain loop's of top1_check.h exactly: rows with
// ties, signed zeros, subnormals, infinities and NaN, of fewer classes than a
// block has threads and of several per thread; and with attr valid_classes
// the padded logits' count must be the unpadded logits' even though the
// padding holds the largest values and some labels name padding columns.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"
#include "tests/unit/padded_classes_check.h"
#include "tests/unit/top1_check.h"

// The emulation, then the kernel (cuda_emulation.h defines CUDA's keywords as macros).
#include "tests/unit/cuda_emulation.h"

#include "runtime/ops/cuda/top1_correct_kernels.cuh"

using namespace mix;
using namespace mix::testing;
namespace kernels = mix::cuda;

namespace {

// The emulated kernel's count over logits [rows, classes] (only the first
// `valid` columns searched), through `blocks` blocks (0: a block a row, as
// top1_correct.cu launches it).
template <typename T, typename L>
int64_t emulated_count(const Tensor& logits, const Tensor& label, int64_t valid, unsigned blocks) {
  const int64_t classes = logits.dim(-1), rows = logits.numel() / classes;
  const std::vector<T> x = values_of<T>(logits);
  const std::vector<L> y = values_of<L>(label);
  unsigned long long correct = 0;  // as the launcher's memset leaves it
  emulated::run_grid(
      blocks == 0 ? static_cast<unsigned>(rows) : blocks, 1,
      [&] { kernels::top1_correct_rows<T, L>(x.data(), y.data(), rows, classes, valid, &correct); }, kernels::kBlock);
  return static_cast<int64_t>(correct);
}

int64_t emulated_count(const Tensor& logits, const Tensor& label, int64_t valid, unsigned blocks) {
  int64_t n = -1;
  cpu::dispatch_floating(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    n = label.dtype() == DType::i64 ? emulated_count<T, int64_t>(logits, label, valid, blocks)
                                    : emulated_count<T, int32_t>(logits, label, valid, blocks);
  });
  return n;
}

int64_t cpu_count(const Tensor& logits, const Tensor& label, int64_t valid) {
  std::map<std::string, Attr> attrs;
  if (valid != logits.dim(-1)) attrs["valid_classes"] = valid;
  const auto r =
      run_ops_on({make_op("top1_correct", {{"Logits", {"logits"}}, {"Label", {"label"}}}, {{"Correct", {"n"}}}, attrs)},
                 {{"logits", logits}, {"label", label}}, cpu_device(), ExecEnv{}, {"n"});
  return r.at("n").data<int64_t>()[0];
}

}  // namespace

TEST_CASE("emulated top1_correct counts what the CPU and a plain loop count", "[emulated][top1]") {
  // Rows of fewer classes than the block's 256 threads (most threads idle),
  // of a few per thread, and of one class.
  for (DType dt : kFloatTypes)
    for (DType label_dt : {DType::i64, DType::i32})
      for (auto [rows, classes] : {std::pair<int64_t, int64_t>{12, 10}, {9, 1}, {5, 257}, {4, 700}}) {
        const std::string what = dname(dt) + " logits, " + dname(label_dt) + " labels, " + std::to_string(rows) +
                                 " x " + std::to_string(classes);
        INFO(what);
        const Top1Case c = top1_case(rows, classes, dt, label_dt, 31);
        CHECK(c.expected > 0);  // not vacuous: some rows right, some wrong
        CHECK(c.expected < rows);
        CHECK(cpu_count(c.logits, c.label, classes) == c.expected);
        CHECK(emulated_count(c.logits, c.label, classes, 0) == c.expected);
        CHECK(emulated_count(c.logits, c.label, classes, 2) == c.expected);  // the grid strides over rows
      }
}

TEST_CASE("emulated top1_correct with valid_classes never predicts a padding column", "[emulated][top1]") {
  // 70 real classes padded to 128, the padding far above every real logit, as
  // check_padded_classes pads them: a padding column in the search would win
  // every row. Labels: each row's real argmax on even rows (right), a padding
  // column (which must never count) or a wrong real class on odd ones.
  const int64_t rows = 6, classes = 70, padded = 128;
  for (DType dt : kFloatTypes) {
    INFO(dname(dt));
    const Top1Case c = top1_case(rows, classes, dt, DType::i64, 41);
    const Tensor padded_logits = with_padding_columns(c.logits, padded, 40.f);
    std::vector<int64_t> label(c.label.data<int64_t>(), c.label.data<int64_t>() + rows);
    label[1] = classes;  // the first padding column: the argmax if the padding leaked in
    label[3] = padded - 1;
    const Tensor label_t = labels({rows}, label);
    const int64_t unpadded = cpu_count(c.logits, label_t, classes);
    CHECK(unpadded > 0);
    CHECK(cpu_count(padded_logits, label_t, classes) == unpadded);
    CHECK(emulated_count(padded_logits, label_t, classes, 0) == unpadded);
    CHECK(emulated_count(padded_logits, label_t, classes, 1) == unpadded);
    // Searched over every column, the padding wins each row at its first
    // column (ties go to the first index): only row 1 counts, so the search's
    // bound is what keeps the counts above equal.
    CHECK(emulated_count(padded_logits, label_t, padded, 0) == 1);
    CHECK(unpadded != 1);
  }
}
