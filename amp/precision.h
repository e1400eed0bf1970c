#pragma once
// The precision a training program runs in: fp32 everywhere; amp, the lists'
// white ops in FP16 with FP32 masters and a dynamic loss scaler; or bf16, the
// same lists in BF16, whose FP32-sized exponent needs no loss scaling by
// default (amp/lists.h, amp/rewrite.h, amp/loss_scaler.h).
#include "runtime/core/dtype.h"
#include "runtime/core/enum_names.h"

namespace mix::amp {

enum class Precision { fp32, amp, bf16 };

inline constexpr NamedValue<Precision> kPrecisionNames[] = {
    {Precision::fp32, "fp32"}, {Precision::amp, "amp"}, {Precision::bf16, "bf16"}};

inline std::string_view to_string(Precision p) { return name_of(p, kPrecisionNames); }

/// Whether the program is mixed: low-precision white ops, FP32 masters, a
/// finite check of every step's gradients (amp and bf16).
inline bool is_mixed(Precision p) { return p != Precision::fp32; }

/// The dtype of the white ops in a mixed precision.
inline DType low_dtype(Precision p) { return p == Precision::bf16 ? DType::bf16 : DType::f16; }

}  // namespace mix::amp
