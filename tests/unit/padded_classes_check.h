#pragma once
// What the tests of a padded vocabulary (attr valid_classes of
// softmax_with_cross_entropy and top1_correct; models/transformer.cc) share:
// the ops on logits with padding columns against the same ops on the logits
// without them, on one device. test_gpt2.cc runs it on the CPU,
// test_cuda_ops.cc on the GPU. The padding holds values far above every real
// logit, so a padding column that leaked into the max, the sum or the argmax
// would change every result. On one device the real columns go through the
// same operations in the same order either way: the loss, the softmax and the
// gradient of the real columns must be the same bits, the padding's softmax and
// gradient exactly 0, and the argmax count the same.
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/ir/op_registry.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/recompute_softmax_check.h"

namespace mix::testing {

/// Columns [from, to) of every row of `t` [..., C], in t's dtype.
inline Tensor column_range(const Tensor& t, int64_t from, int64_t to) {
  const int64_t cols = t.dim(-1), rows = t.numel() / cols, width = to - from;
  Shape s = t.shape();
  s.back() = width;
  Tensor out = Tensor::zeros(s, t.dtype());
  const size_t es = dtype_size(t.dtype());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(out.raw()) + static_cast<size_t>(r * width) * es,
                static_cast<const char*>(t.raw()) + static_cast<size_t>(r * cols + from) * es,
                static_cast<size_t>(width) * es);
  return out;
}

/// `logits` [rows, classes] widened to [rows, padded] with `fill` in the new columns.
inline Tensor with_padding_columns(const Tensor& logits, int64_t padded, float fill) {
  const int64_t classes = logits.dim(-1), rows = logits.numel() / classes;
  const std::vector<float> v = logits.to_floats();
  std::vector<float> p(static_cast<size_t>(rows * padded), fill);
  for (int64_t r = 0; r < rows; ++r)
    std::copy(v.begin() + r * classes, v.begin() + (r + 1) * classes, p.begin() + r * padded);
  return to_dtype(Tensor::from_floats({rows, padded}, p), logits.dtype());
}

inline bool all_zero(const Tensor& t) {
  for (float v : t.to_floats())
    if (v != 0.f) return false;
  return true;
}

/// softmax_with_cross_entropy and top1_correct with attr valid_classes on
/// padded logits against the same ops on the unpadded logits, on `device`, in
/// every dtype pairing of the loss; rows of 10 classes (a warp per grad row on
/// the GPU) and of 3000 (a block), padded to the next multiple of 64.
inline void check_padded_classes(Device device) {
  for (const SoftmaxDtypes& pr : kSoftmaxDtypes)
    for (int64_t classes : {10, 3000}) {
      const int64_t padded = (classes + 63) / 64 * 64, rows = 6;
      const std::string what = dname(pr.logits) + " logits, " + dname(pr.softmax) + " softmax, " +
                               std::to_string(classes) + " classes padded to " + std::to_string(padded);
      INFO(what);
      const Tensor logits = to_dtype(uniform_tensor({rows, classes}, 17, -5.f, 5.f), pr.logits);
      // Far above every real logit: a leak into the max, sum or argmax changes everything.
      const Tensor padded_logits = with_padding_columns(logits, padded, 40.f);
      std::vector<int64_t> labels{0, classes - 1, 3, -100, 7, 1};  // row 3 ignored
      const Tensor label = i64_tensor({rows, 1}, labels);
      const CrossEntropyBothWays unpadded = cross_entropy_both_ways(logits, label, pr.softmax, {}, device);
      const CrossEntropyBothWays masked =
          cross_entropy_both_ways(padded_logits, label, pr.softmax, {{"valid_classes", classes}}, device);
      const Tensor& y = masked.stored.at("y");
      expect_identical(column_range(y, 0, classes), unpadded.stored.at("y"), "the softmax, " + what);
      CHECK(all_zero(column_range(y, classes, padded)));
      for (bool recomputed : {false, true}) {
        const auto& got = recomputed ? masked.recomputed : masked.stored;
        const auto& want = recomputed ? unpadded.recomputed : unpadded.stored;
        const std::string how = std::string(recomputed ? "recomputed" : "stored") + " softmax, " + what;
        expect_identical(got.at("loss"), want.at("loss"), "the loss, " + how);
        expect_identical(column_range(got.at("dx"), 0, classes), want.at("dx"), "Logits@GRAD, " + how);
        CHECK(all_zero(column_range(got.at("dx"), classes, padded)));
      }
      // The padding is never a prediction; without the attr it would be every row's.
      const Tensor top1_label = i64_tensor({rows, 1}, {0, classes - 1, 3, 2, 7, 1});
      auto count = [&](const Tensor& x, std::map<std::string, Attr> attrs) {
        const OneOp op{make_op("top1_correct", {{"Logits", {"logits"}}, {"Label", {"label"}}}, {{"Correct", {"n"}}},
                               std::move(attrs)),
                       {{"logits", x}, {"label", top1_label}}};
        return run_on(op, device, {"n"}).at("n").data<int64_t>()[0];
      };
      // Make some rows' real argmax their label, so the count is not 0 either way.
      std::vector<float> v = padded_logits.to_floats();
      for (int64_t r = 0; r < rows; r += 2) v[static_cast<size_t>(r * padded + top1_label.data<int64_t>()[r])] = 20.f;
      const Tensor predicted = to_dtype(Tensor::from_floats({rows, padded}, v), pr.logits);
      const int64_t want = count(column_range(predicted, 0, classes), {});
      CHECK(want >= 3);
      CHECK(count(predicted, {{"valid_classes", classes}}) == want);
      CHECK(count(predicted, {}) == 0);
    }
}

}  // namespace mix::testing
