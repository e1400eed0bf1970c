#pragma once
// The precision a training program runs in: fp32 everywhere, or amp, the
// lists' white ops in FP16 with FP32 masters and a loss scaler (amp/lists.h,
// amp/rewrite.h, amp/loss_scaler.h).
#include "runtime/core/enum_names.h"

namespace mix::amp {

enum class Precision { fp32, amp };

inline constexpr NamedValue<Precision> kPrecisionNames[] = {{Precision::fp32, "fp32"}, {Precision::amp, "amp"}};

inline std::string_view to_string(Precision p) { return name_of(p, kPrecisionNames); }

}  // namespace mix::amp
