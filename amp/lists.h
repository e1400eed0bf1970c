#pragma once
// The AMP op lists (Paddle 1.7's AutoMixedPrecisionLists, restated):
//   white  - run in FP16 (the GEMM ops that tensor cores speed up),
//   black  - run in FP32 (numerically sensitive: exp, log, softmax, reductions...),
//   gray   - follow their producers (see amp/rewrite.h),
//   any op in no list runs in FP32.
#include <set>
#include <string>
#include <vector>

namespace mix::amp {

enum class OpClass { white, black, gray, unlisted };

struct AmpLists {
  std::set<std::string> white, black, gray;

  /// The default lists (docs/design.md, "Precision rules").
  static AmpLists defaults();
  /// Moves `custom_white` ops to the white list and `custom_black` ops to the
  /// black list (out of whichever list held them). A name in both throws
  /// mix::Error naming it.
  AmpLists with_custom(const std::vector<std::string>& custom_white, const std::vector<std::string>& custom_black) const;
  OpClass classify(const std::string& op_type) const;
};

}  // namespace mix::amp
